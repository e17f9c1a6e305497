"""The task step of a run (``probe.task``): one pass over the task's batch gives its capability metrics
and head screens; then the study's ablations, with the capability circuits of the same checkpoint
(from the synthetic probe's screen of this run) and matched-random controls."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from emergence.core.config import Config
from emergence.core.record import Record
from emergence.recipe.capture import Subject
from emergence.recipe.controls import heads_of
from emergence.recipe.screen import head_name
from emergence.recipe.tasks.ablation import (
    AblationPlan,
    TaskAblation,
    build_conditions,
    capability_circuits,
    task_ablation,
)
from emergence.recipe.tasks.batches import TaskBatch, TaskWords
from emergence.recipe.tasks.measure import TaskSubject, task_pass
from emergence.recipe.tasks.metrics import TaskMetrics, task_metrics
from emergence.recipe.tasks.screens import TaskScreen


@dataclass
class TaskSummary(Record):
    """``summary.json`` ``task``: the task's batch, capability and screens on this checkpoint."""

    name: str  # ioi | greater_than | successor | binding
    n_prompts: int
    seq_len: int  # T: every prompt's length in the checkpoint's tokenizer
    tokenizer: str  # repo@revision of the tokenizer the batch was built with
    prompts_sha1: str  # of the prompts' texts joined by newlines (the study's check values: docs/tasks.md)
    fingerprint: str  # sha256 of the task and its token ids
    metrics: TaskMetrics  # capability at T-1, each with its bootstrap interval over prompts
    screens: dict[str, list[str]]  # screen -> its top-k heads ("L13H1"), best first
    # previous_token (best class, >= threshold.prev_token_circuit) and induction (>= threshold.circuit) heads
    # of this run
    circuits: dict[str, list[str]]
    ablation: TaskAblation | None = None  # each condition with its heads and capability; None: ablation off
    words: TaskWords | None = None  # the words mode, kept and dropped; None: a run before probe.task_words (study)


@dataclass(frozen=True)
class TaskResult:
    """The task step's record: the summary, and the per-head scores for heads.csv."""

    summary: TaskSummary
    screen: TaskScreen  # scores [layers, heads] by name (heads.csv columns) and the ranked screens


def measure_task(
    subject: Subject, batch: TaskBatch, tokenizer: str, selectivity: np.ndarray, cfg: Config
) -> TaskResult:
    """The task on ``subject`` (``capture.Subject``: the loaded model; its batch size is used),
    ``selectivity`` [layers, heads, 6] the synthetic probe's screen of the same checkpoint (its
    capability circuits), ``cfg`` the run's ``Config`` (``probe.task_top_k``, ``ablate``,
    ``stats``, ``threshold``)."""
    model, arch, batch_size, ablate, stats = (subject.model, subject.arch, subject.batch_size, cfg.ablate, cfg.stats)
    passed = task_pass(model, arch, batch, batch_size)  # one pass: the metrics and the screens
    screen = passed.screen(cfg.probe.task_top_k)
    prev_token, induction = capability_circuits(selectivity, cfg.threshold.prev_token_circuit, cfg.threshold.circuit)
    ablation = None
    if ablate.enabled:
        plan = AblationPlan.from_screen(
            screen,
            mr_seed=ablate.mr_seed,
            mr_seeds=ablate.mr_seeds,
            circuits=(prev_token, induction),
            heads=ablate.heads,
        )
        ablation = task_ablation(
            TaskSubject(model, arch, batch, batch_size),
            build_conditions(plan, arch.n_layers, arch.n_heads),
            stats,
            ablate,
            clean=passed,
        )
    summary = TaskSummary(
        name=batch.task,
        n_prompts=len(batch.tokens),
        seq_len=batch.tokens.shape[1],
        tokenizer=tokenizer,
        prompts_sha1=batch.prompts_sha1(),
        fingerprint=batch.fingerprint(),
        metrics=task_metrics(batch.task, passed.values, stats.n_boot, stats.ci, stats.seed),
        screens={name: [head_name(*h) for h in ranked] for name, ranked in screen.ranked.items()},
        circuits={
            "previous_token": [head_name(*h) for h in heads_of(prev_token)],
            "induction": [head_name(*h) for h in heads_of(induction)],
        },
        ablation=ablation,
        words=batch.words,
    )
    return TaskResult(summary, screen)
