"""The task capability metrics (the study's task-circuit extensions), pure functions.

Every task reads the logits of the last position T-1 (``logits`` [b, V]). Two steps:

1. ``per_prompt``: one minibatch's logits -> the per-prompt values of the task, a small record of
   float64 arrays [b] (``ChoicePrompts`` for IOI and binding, ``GreaterThanPrompts``,
   ``SuccessorPrompts``); ``concatenate`` joins the minibatches' records.
2. ``task_metrics``: all prompts' values -> ``TaskMetrics``, each summary metric (the study's
   names, ``SUMMARY_METRICS``) with a percentile bootstrap interval over prompts.
3. ``capability_absent``: whether a baseline shows a capability at all (top-1 against the chance
   of a uniform guess, ``chance_top1``, and the logit difference against 0).

Precision, as the study: comparisons (argmax, target > distractor, ranks) and the target -
distractor difference are computed in the logits' own dtype (the study's fp16, so its logit
differences are fp16-rounded); only greater-than's softmax is cast to float32, over the full
vocabulary. Ties in the argmax go to the first maximal token id (``torch.argmax``).

Greater-than with decade DD = 99 (outside the study's DD = 2..88): the "above" set DD+1..99 is
empty, so ``top1_above`` is 0, ``prob_above`` is 0 and ``logit_diff_above_below`` is undefined:
NaN for that prompt, where the study's code (a mean over an empty set) would give NaN too. The
summary ``logit_diff_above_below`` then averages over the prompts where it is defined (DD < 99),
in the value and in every bootstrap replicate alike; with no DD = 99 prompt, as in the study,
this is the plain mean.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TypeVar

import numpy as np
import torch
from jaxtyping import Float

from emergence.core.errors import UsageError
from emergence.core.record import Record
from emergence.recipe import stats
from emergence.recipe.tasks import TASKS, Task

N_ANSWERS = 100  # greater-than's answer tokens "00".."99"

# The study's summary names, per task, in its order.
SUMMARY_METRICS: dict[Task, tuple[str, ...]] = {
    "ioi": ("top1", "frac_target_gt_distractor", "logit_diff_mean", "logit_diff_median"),
    "binding": ("top1", "frac_target_gt_distractor", "logit_diff_mean", "logit_diff_median"),
    "greater_than": ("top1_above", "prob_above", "prob_below", "logit_diff_above_below"),
    "successor": ("top1", "target_logit_mean", "rank_mean", "rank_median"),
}
# Each task's top-1 metric (a share of prompts), and the logit measure a screen-vs-random verdict
# rests on: it moves where top-1 cannot (at 0 or 1 an ablation's effect on top-1 is cut off).
TOP1_METRIC: dict[Task, str] = {"ioi": "top1", "binding": "top1", "greater_than": "top1_above", "successor": "top1"}
VERDICT_METRIC: dict[Task, str] = {
    "ioi": "logit_diff_mean",
    "binding": "logit_diff_mean",
    "greater_than": "logit_diff_above_below",
    "successor": "target_logit_mean",
}
# The per-prompt value whose mean over prompts (NaN skipped) is the verdict metric.
VERDICT_VALUES: dict[Task, str] = {
    "ioi": "logit_diff",
    "binding": "logit_diff",
    "greater_than": "logit_diff_above_below",
    "successor": "target_logit",
}


# --- 1. per prompt --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChoicePrompts:
    """IOI and binding: the target (IO name / bound city) against the distractor (subject / other
    city). Every field float64 [n]; the booleans as 0.0 / 1.0."""

    top1: Float[np.ndarray, " n"]  # argmax over the full vocabulary == target
    target_gt_distractor: Float[np.ndarray, " n"]  # logit(target) > logit(distractor)
    logit_diff: Float[np.ndarray, " n"]  # logit(target) - logit(distractor), in the logits' dtype


@dataclass(frozen=True)
class GreaterThanPrompts:
    """Greater-than, decade DD: above = answers DD+1..99, below = 00..DD. Every field float64 [n]."""

    top1_above: Float[np.ndarray, " n"]  # argmax over the full vocabulary is an above answer
    prob_above: Float[np.ndarray, " n"]  # float32 full-vocabulary softmax, summed over the above answers
    prob_below: Float[np.ndarray, " n"]
    logit_diff_above_below: Float[np.ndarray, " n"]  # mean logit over above - over below; NaN where DD = 99


@dataclass(frozen=True)
class SuccessorPrompts:
    """Successor: the next item of the list. Every field float64 [n]."""

    top1: Float[np.ndarray, " n"]  # argmax over the full vocabulary == target
    target_logit: Float[np.ndarray, " n"]
    target_rank: Float[np.ndarray, " n"]  # vocabulary entries with a logit strictly above the target's (0: the argmax)


PromptMetrics = ChoicePrompts | GreaterThanPrompts | SuccessorPrompts
P = TypeVar("P", bound=PromptMetrics)  # one kind of per-prompt record, or any (a condition's)


def _numpy(values: torch.Tensor) -> np.ndarray:
    return values.detach().cpu().to(torch.float64).numpy()


def _index(ids, logits: torch.Tensor, name: str) -> torch.Tensor:
    """Token ids or positions ([b] or [100]) as an int64 tensor beside ``logits``."""
    if ids is None:
        raise UsageError(f"the task needs `{name}`; pass the batch's {name} ids")
    return torch.as_tensor(ids, dtype=torch.int64, device=logits.device)


def choice_prompts(logits: torch.Tensor, target, distractor) -> ChoicePrompts:
    """IOI / binding. ``logits`` [b, V] at T-1, ``target`` and ``distractor`` token ids [b]."""
    target, distractor = _index(target, logits, "target"), _index(distractor, logits, "distractor")
    rows = torch.arange(len(logits), device=logits.device)
    target_logit, distractor_logit = logits[rows, target], logits[rows, distractor]
    return ChoicePrompts(
        top1=_numpy(logits.argmax(dim=-1) == target),
        target_gt_distractor=_numpy(target_logit > distractor_logit),
        logit_diff=_numpy(target_logit - distractor_logit),
    )


def greater_than_prompts(logits: torch.Tensor, decade_value, answer_ids) -> GreaterThanPrompts:
    """Greater-than. ``logits`` [b, V] at T-1, ``decade_value`` [b] (DD, 0..99), ``answer_ids``
    [100] (the token id of "00".."99")."""
    decade, answers = _index(decade_value, logits, "decade_value"), _index(answer_ids, logits, "answer_ids")
    if answers.shape != (N_ANSWERS,):
        raise UsageError(f"answer_ids has shape {tuple(answers.shape)}; pass the {N_ANSWERS} ids of '00'..'99'")
    if bool(((decade < 0) | (decade >= N_ANSWERS)).any()):
        raise UsageError(f"decade_value must lie in 0..{N_ANSWERS - 1}; pass the two-digit decade DD")
    above = torch.arange(N_ANSWERS, device=logits.device)[None, :] > decade[:, None]  # [b, 100]
    below = ~above
    is_answer = logits.argmax(dim=-1)[:, None] == answers[None, :]  # [b, 100]
    probs = logits.float().softmax(dim=-1)[:, answers]  # [b, 100]
    answer_logits = logits[:, answers].double()  # [b, 100]: the dtype's values, averaged exactly
    mean_above = (answer_logits * above).sum(-1) / above.sum(-1)  # 0/0 = NaN where DD = 99
    mean_below = (answer_logits * below).sum(-1) / below.sum(-1)
    return GreaterThanPrompts(
        top1_above=_numpy((is_answer & above).any(dim=-1)),
        prob_above=_numpy((probs * above).sum(-1)),
        prob_below=_numpy((probs * below).sum(-1)),
        logit_diff_above_below=_numpy(mean_above - mean_below),
    )


def successor_prompts(logits: torch.Tensor, target) -> SuccessorPrompts:
    """Successor. ``logits`` [b, V] at T-1, ``target`` token ids [b]."""
    target = _index(target, logits, "target")
    target_logit = logits[torch.arange(len(logits), device=logits.device), target]  # [b]
    return SuccessorPrompts(
        top1=_numpy(logits.argmax(dim=-1) == target),
        target_logit=_numpy(target_logit),
        target_rank=_numpy((logits > target_logit[:, None]).sum(dim=-1)),
    )


def per_prompt(
    task: Task, logits: torch.Tensor, target=None, distractor=None, decade_value=None, answer_ids=None
) -> PromptMetrics:
    """One minibatch's per-prompt values of ``task`` from its logits at T-1 [b, V] (any float dtype).
    Ids and positions are int arrays or tensors: ``target``, ``distractor``, ``decade_value`` [b],
    ``answer_ids`` [100]; each task reads only what it needs (greater-than: decade and answers)."""
    if logits.ndim != 2 or not logits.is_floating_point():
        raise UsageError(
            f"logits must be float [b, vocab] (the last position's), got {logits.dtype} {tuple(logits.shape)}"
        )
    if task in ("ioi", "binding"):
        return choice_prompts(logits, target, distractor)
    if task == "greater_than":
        return greater_than_prompts(logits, decade_value, answer_ids)
    if task == "successor":
        return successor_prompts(logits, target)
    raise UsageError(f"unknown task {task!r}; use one of {', '.join(TASKS)}")


def concatenate(parts: list[P]) -> P:
    """The minibatches' per-prompt records as one, prompts in order."""
    kind = type(parts[0])
    return kind(**{f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(kind)})


def first_prompts(values: P, n: int) -> P:
    """The per-prompt record of the first ``n`` prompts."""
    return type(values)(**{f.name: getattr(values, f.name)[:n] for f in fields(values)})


# --- 2. summary with bootstrap intervals ----------------------------------------------------------


@dataclass(frozen=True)
class MetricValue(Record):
    value: float
    ci: list[float]  # [low, high]: percentile bootstrap interval over prompts


@dataclass(frozen=True)
class TaskMetrics(Record):
    """One task's capability on one checkpoint: ``metrics`` maps the study's summary names
    (``SUMMARY_METRICS[task]``, in that order) to their values and intervals."""

    task: str
    n_prompts: int
    n_boot: int
    ci_level: float
    seed: int
    metrics: dict[str, MetricValue]


def _mean(values: np.ndarray, weights: np.ndarray, ci: float) -> MetricValue:
    """Mean over the prompts where ``values`` [n] is defined (not NaN); each replicate is the
    weighted mean over the same prompts, with the bootstrap ``weights`` [B, n]."""
    defined = ~np.isnan(values)
    filled = np.where(defined, values, 0.0)
    replicates = stats.replicate_means(filled, weights) / stats.replicate_means(defined.astype(float), weights)
    return MetricValue(
        value=float(filled.sum() / defined.sum()) if defined.any() else float("nan"), ci=stats.interval(replicates, ci)
    )


def _median(values: np.ndarray, weights: np.ndarray, ci: float) -> MetricValue:
    """Median of ``values`` [n]; replicate b is the median of its resample, the multiset holding
    prompt i ``weights[b, i] * n`` times (the multinomial counts), read from the cumulative counts
    over the sorted values: the middle element (n odd) or the mean of the two middle ones (n even),
    as ``np.median`` of that multiset."""
    n = len(values)
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    counts_before = np.cumsum(np.rint(weights[:, order] * n), axis=1)  # [B, n]: resample size up to each value

    def element(rank: int) -> np.ndarray:  # [B]: the resample's value of 0-based rank ``rank``
        return sorted_values[(counts_before <= rank).sum(axis=1)]

    replicates = (element((n - 1) // 2) + element(n // 2)) / 2
    return MetricValue(value=float(np.median(values)), ci=stats.interval(replicates, ci))


def task_metrics(task: Task, per_prompt_values: PromptMetrics, n_boot: int, ci: float, seed: int) -> TaskMetrics:
    """The study's summary metrics of ``task`` over all prompts, each with a percentile interval
    (level ``ci``, e.g. 0.95) from ``n_boot`` resamples of the prompts (``stats.resample_weights``
    with ``seed``: the same resamples for every metric, and across checkpoints)."""
    expected = {
        "ioi": ChoicePrompts,
        "binding": ChoicePrompts,
        "greater_than": GreaterThanPrompts,
        "successor": SuccessorPrompts,
    }.get(task)
    if expected is None:
        raise UsageError(f"unknown task {task!r}; use one of {', '.join(TASKS)}")
    if not isinstance(per_prompt_values, expected):
        raise UsageError(
            f"task {task!r} needs {expected.__name__}, got {type(per_prompt_values).__name__}; "
            f"pass per_prompt({task!r}, ...)"
        )
    p = per_prompt_values
    n = len(getattr(p, fields(p)[0].name))  # every field holds one value per prompt
    if n == 0:
        raise UsageError(f"no prompts to summarise for task {task!r}; pass at least one minibatch")
    weights = stats.resample_weights(n, n_boot, seed)  # [B, n]
    if isinstance(p, ChoicePrompts):
        metrics = {
            "top1": _mean(p.top1, weights, ci),
            "frac_target_gt_distractor": _mean(p.target_gt_distractor, weights, ci),
            "logit_diff_mean": _mean(p.logit_diff, weights, ci),
            "logit_diff_median": _median(p.logit_diff, weights, ci),
        }
    elif isinstance(p, GreaterThanPrompts):
        metrics = {
            "top1_above": _mean(p.top1_above, weights, ci),
            "prob_above": _mean(p.prob_above, weights, ci),
            "prob_below": _mean(p.prob_below, weights, ci),
            "logit_diff_above_below": _mean(p.logit_diff_above_below, weights, ci),
        }
    else:
        metrics = {
            "top1": _mean(p.top1, weights, ci),
            "target_logit_mean": _mean(p.target_logit, weights, ci),
            "rank_mean": _mean(p.target_rank, weights, ci),
            "rank_median": _median(p.target_rank, weights, ci),
        }
    return TaskMetrics(task=task, n_prompts=n, n_boot=n_boot, ci_level=ci, seed=seed, metrics=metrics)


# --- 3. is there a capability to ablate ------------------------------------------------------------


def chance_top1(task: Task, vocab_size: int, decade=None) -> float:
    """The top-1 of a guess uniform over the ``vocab_size`` logits: its right answers' share of the
    vocabulary, averaged over prompts (greater-than: the DD+1..99 answers above each prompt's decade
    ``decade`` [n]; the other tasks: one target)."""
    if task == "greater_than":
        return float(np.mean(N_ANSWERS - 1 - np.asarray(decade, dtype=np.float64))) / vocab_size
    return 1.0 / vocab_size


def capability_absent(task: Task, baseline: TaskMetrics, chance: float) -> str | None:
    """Why the baseline ``baseline`` shows no capability whose loss an ablation could show; None where
    it shows one. Absent: top-1 below ``chance`` (``chance_top1``), or, for the tasks whose verdict
    metric is a difference (not successor's target logit, which has no zero: a softmax ignores a shift
    of every logit), that difference at or below 0 (the distractor or the "below" answers preferred)."""
    top1, top1_value = TOP1_METRIC[task], baseline.metrics[TOP1_METRIC[task]].value
    if top1_value < chance:
        return f"baseline {top1} {top1_value:.3f} below chance {chance:.3g}"
    metric = VERDICT_METRIC[task]
    value = baseline.metrics[metric].value
    if task != "successor" and not value > 0:  # NaN (no prompt defines it) is not a capability either
        return f"baseline {metric} {value:.3f} <= 0"
    return None
