"""The reference study's published task results at the final checkpoints, as typed records.

``published.json`` (package data beside this module) holds what the study's
``cross_architecture/results/`` files report for Pythia-1B, OLMo-1B-0724 and OLMoE-1B-7B at their
final checkpoints, as its protocol notes quote them (3 to 4 significant digits):

* ablations: per model, task and experiment, each condition's heads and metrics (IOI's
  capability screen, name movers and S-Inhibition; the greater-than, successor and binding
  screens; the prev-token circuit on the synthetic induction batch);
* screens: the top-5 heads of the name-mover, S-Inhibition, greater-than, successor and
  binding screens with their scores;
* sweeps: the 10-seed matched-random summaries (top-1 deltas in percentage points).

Heads are [layer, head] pairs in the study's spec order (``spec_from_ranking`` of
``emergence.recipe.tasks.matched_random`` rebuilds its spec from them). Some published rows are
wrong: the study's greater-than and successor files of Pythia and OLMo ablate OLMoE's induction
and prev-token heads (for 8-head Pythia, heads 10 to 14 ablated nothing). Those conditions carry
``valid = False`` and say why; compare nothing with them.

Metric names: IOI and binding ``top1``, ``frac_target_gt_distractor``, ``logit_diff_mean``;
greater-than ``top1_above``, ``prob_above``, ``logit_diff_above_below`` (``prob_below``);
successor ``top1``, ``target_logit_mean``, ``rank_median`` (``rank_mean``); the induction batch
``loss``, ``top1``, ``top5``, ``logit_b``. A metric the study's notes do not quote is absent.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from emergence.core.record import Record

DATA = Path(__file__).with_name("published.json")

ModelKey = Literal["pythia", "olmo", "olmoe"]
# the task whose batch a row was measured on; "induction" is the synthetic induction batch
PublishedTask = Literal["ioi", "greater_than", "successor", "binding", "induction"]
Experiment = Literal["capability", "name_movers", "s_inhibition", "task_screen", "prev_token_circuit"]
# baseline: nothing ablated; screen: the experiment's top-5 heads (for "prev_token_circuit" the
# circuit); matched_random: the seed-123 control in the screen's layers; full_layers: every head
# of the screen's layers; union: capability = prev-token + induction circuits, s_inhibition = the
# S-Inhibition + name-mover top-5s
ConditionName = Literal[
    "baseline", "screen", "matched_random", "full_layers", "induction_circuit", "prev_token_circuit", "union"
]


@dataclass(frozen=True)
class PublishedSource(Record):
    repository: str
    folder: str  # the files' folder in the repository; each row names its file inside it


@dataclass(frozen=True)
class ModelShape(Record):
    hf_id: str
    n_layers: int
    n_heads: int


@dataclass(frozen=True)
class Condition(Record):
    name: ConditionName
    heads: list[list[int]]  # [[layer, head], ...] in spec order; [] for the baseline
    metrics: dict[str, float]
    valid: bool = True
    why: str | None = None  # why the row is not what its name says, where valid is False


@dataclass(frozen=True)
class Ablation(Record):
    model: ModelKey
    task: PublishedTask
    experiment: Experiment
    file: str  # inside PublishedSource.folder
    conditions: list[Condition]

    def condition(self, name: ConditionName) -> Condition:
        (found,) = [c for c in self.conditions if c.name == name]
        return found


@dataclass(frozen=True)
class ScreenHead(Record):
    layer: int
    head: int
    values: dict[str, float]  # the screen's score and the attentions the notes quote


@dataclass(frozen=True)
class Screen(Record):
    model: ModelKey
    task: PublishedTask
    experiment: Experiment
    file: str
    score: str  # the ranking's key in ``values``
    heads: list[ScreenHead]  # the top 5, best first


@dataclass(frozen=True)
class SweepSummary(Record):
    """A 10-seed matched-random sweep: deltas = ablated - baseline, top-1 in percentage points."""

    model: ModelKey
    task: PublishedTask
    experiment: Experiment
    file: str
    top1_metric: str
    screen_delta_top1_pp: float
    mr_delta_top1_mean_pp: float
    mr_delta_top1_std_pp: float  # ddof=1
    mr_delta_top1_min_pp: float
    mr_delta_top1_max_pp: float
    logit_metric: str
    screen_delta_logit: float
    mr_delta_logit_mean: float
    mr_delta_logit_std: float


@dataclass(frozen=True)
class PublishedTasks(Record):
    source: PublishedSource
    models: dict[str, ModelShape]  # ModelKey -> shape
    ablations: list[Ablation]
    screens: list[Screen]
    sweeps: list[SweepSummary]

    def ablation(self, model: ModelKey, task: PublishedTask, experiment: Experiment) -> Ablation:
        (found,) = [a for a in self.ablations if (a.model, a.task, a.experiment) == (model, task, experiment)]
        return found


@functools.cache
def load_published_tasks() -> PublishedTasks:
    """The package's ``published.json`` as records (read once)."""
    return PublishedTasks.from_json(json.loads(DATA.read_text()))
