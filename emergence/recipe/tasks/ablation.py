"""The task ablations (the study's task-circuit extensions): which head sets to ablate, and their effect.

Three steps:

1. ``capability_circuits``: the induction and previous-token circuits from the 6-class
   selectivities of the induction probe, the study's way (TASKS.md 0.5).
2. ``build_conditions``: an ``AblationPlan`` (the task screen's top-k specs, the circuits, a
   user's heads, the matched-random seeds) and the model's shape -> the conditions, each a named
   head spec (``Condition``). Pure; every spec is checked against the model before anything runs.
3. ``task_ablation``: one task pass (``measure.task_pass``, no screen) per condition with its heads
   zero-ablated at all positions (``recipe.ablation.ablating``, TASKS.md 0.2) -> ``TaskAblation``:
   each condition's ``TaskMetrics`` and its change against the baseline, and per screen the
   matched-random seed sweep (TASKS.md 6.1).

Conditions (TASKS.md 1.3, 1.5, 1.6, 2.4, 3.4, 4.4), in this order:

* ``baseline``: nothing ablated;
* per screen (IOI: ``name_mover``, ``s_inhibition``; the other tasks their one screen):
  ``screen`` (its top-k heads), ``matched_random`` (as many heads per layer, drawn from the
  layer's other heads with one ``RandomState(mr_seed)`` consumed across the layers, TASKS.md 0.4),
  ``full_layers`` (every head of the screen's layers);
* IOI: ``screen_union``, the S-inhibition and name-mover heads together (S-inhibition layers first);
* ``prev_token_circuit``, ``induction_circuit`` and ``circuit_union`` (previous-token layers first);
* ``user``: the heads the user listed, in their order;
* per screen and seed of ``mr_seeds``: ``matched_random_seed``, from a fresh ``RandomState(seed)``.

A condition whose spec holds no head (a circuit no head reaches, an S-inhibition screen no head
passes, a union one of whose sides is empty) is not run: ``TaskAblation.not_run`` names it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from emergence.core.errors import UsageError
from emergence.core.record import Record
from emergence.recipe.ablation import ablating, head_mask
from emergence.recipe.screen import CLASSES, TIE_ORDER, head_name, parse_head_name
from emergence.recipe.tasks.batches import TaskBatch
from emergence.recipe.tasks.matched_random import (
    MR_SEED,
    SWEEP_SEEDS,
    HeadSpec,
    SeedSweep,
    check_heads,
    heads_of,
    layers_of,
    matched_random,
    seed_sweep,
    spec_from_circuit,
    spec_from_ranking,
    union,
)
from emergence.recipe.tasks.measure import task_pass
from emergence.recipe.tasks.metrics import TaskMetrics, task_metrics
from emergence.recipe.tasks.screens import TaskScreen

# --- 1. the capability circuits (TASKS.md 0.5) -----------------------------------------------------

# The study scans the classes in its order (screen.TIE_ORDER: induction, previous token, duplicate
# token, first token, self, local), so a tie goes to the earlier one there, not in CLASSES' order.
_STUDY_COLUMNS = [CLASSES.index(c) for c in TIE_ORDER]


def best_class(selectivity: Sequence[float]) -> str | None:
    """The study's best class of one head from its six selectivities (``CLASSES`` order): scanning
    the study's class order from 0, the largest by strict ">" (a tie keeps the earlier class), NaN
    skipped, no 30x threshold; None where no selectivity is above 0."""
    best, best_value = None, 0.0
    for column in _STUDY_COLUMNS:
        value = float(selectivity[column])
        if not math.isnan(value) and value > best_value:
            best, best_value = CLASSES[column], value
    return best


def capability_circuits(selectivity: np.ndarray, prev_token_min: float,
                        induction_min: float) -> tuple[HeadSpec, HeadSpec]:
    """(previous-token circuit, induction circuit) from the 6-class selectivities
    [layers, heads, 6] (``CLASSES`` order): the heads whose previous-token selectivity is at least
    ``prev_token_min`` (``threshold.prev_token_circuit``, the study's 100) and is their best class,
    and the heads whose induction selectivity is at least ``induction_min`` (``threshold.circuit``,
    the study's 50); NaN is neither. Specs layer-major,
    heads ascending (``spec_from_circuit``)."""
    selectivity = np.asarray(selectivity, dtype=np.float64)
    if selectivity.ndim != 3 or selectivity.shape[-1] != len(CLASSES):
        raise UsageError(f"selectivity has shape {selectivity.shape}; pass [layers, heads, {len(CLASSES)}] "
                         f"(classes {', '.join(CLASSES)})")
    layers, heads = selectivity.shape[:2]
    all_heads = [(layer, head) for layer in range(layers) for head in range(heads)]
    previous = selectivity[..., CLASSES.index("previous_token")]
    induction = selectivity[..., CLASSES.index("induction")]
    prev_token = [lh for lh in all_heads
                  if previous[lh] >= prev_token_min and best_class(selectivity[lh]) == "previous_token"]
    induction_heads = [lh for lh in all_heads if induction[lh] >= induction_min]
    return spec_from_circuit(prev_token), spec_from_circuit(induction_heads)


# --- 2. the conditions -------------------------------------------------------------------------------

ConditionKind = Literal["baseline", "screen", "matched_random", "full_layers", "screen_union", "prev_token_circuit",
                        "induction_circuit", "circuit_union", "user", "matched_random_seed"]
SCREEN_UNION = ("s_inhibition", "name_mover")  # IOI's two screens, in the study's layer order (TASKS.md 1.6)


@dataclass(frozen=True)
class AblationPlan:
    """What to ablate for one task (the module docstring lists the conditions it gives)."""

    screens: dict[str, HeadSpec]  # screen name -> its top-k heads in rank order (``from_screen``)
    mr_seed: int = MR_SEED  # the one matched-random draw per screen
    mr_seeds: tuple[int, ...] = SWEEP_SEEDS  # the seed sweep, a fresh RandomState each; () for none
    circuits: tuple[HeadSpec, HeadSpec] | None = None  # (previous-token, induction): ``capability_circuits``
    heads: list[str] | None = None  # the user's heads, "L13H1", ..., in rank order

    @classmethod
    def from_screen(cls, screen: TaskScreen, **options) -> AblationPlan:
        """The plan of a task screen's ranked heads (each of its screens' top k); ``options`` as the fields."""
        return cls(screens={name: spec_from_ranking(ranked) for name, ranked in screen.ranked.items()}, **options)


@dataclass(frozen=True)
class Condition:
    """One head set to ablate (an empty spec: the baseline)."""

    kind: ConditionKind
    spec: HeadSpec
    screen: str | None = None  # the screen it derives from (screen, matched_random*, full_layers)
    seed: int | None = None  # the matched-random draws' seed

    @property
    def name(self) -> str:
        """"baseline", "screen:name_mover", "matched_random_seed:greater_than:3", ..."""
        return ":".join(str(part) for part in (self.kind, self.screen, self.seed) if part is not None)


def user_spec(names: Sequence[str]) -> HeadSpec:
    """The user's heads ("L13H1", ...) as a spec in their order; a name twice or not of that form is refused."""
    heads = [parse_head_name(name) for name in names]
    bad = [name for name, head in zip(names, heads) if head is None]
    if bad:
        raise UsageError(f"ablation heads: {bad[0]!r} is not a head name; write heads as L<layer>H<head>, e.g. L13H1")
    repeated = [head for i, head in enumerate(heads) if head in heads[:i]]
    if repeated:
        raise UsageError(f"ablation heads: {head_name(*repeated[0])} is listed twice; list each head once")
    return spec_from_ranking(heads)


def check_conditions(conditions: Sequence[Condition], n_layers: int, n_heads: int) -> None:
    """Refuse any condition with a head outside a model of ``n_layers`` x ``n_heads`` (``check_heads``)."""
    for condition in conditions:
        check_heads(condition.spec, n_layers, n_heads, f"ablation condition {condition.name}")


def _union_of_both(a: HeadSpec, b: HeadSpec) -> HeadSpec:
    """``union(a, b)`` where both hold heads; else no head (the union would repeat the other condition)."""
    return union(a, b) if heads_of(a) and heads_of(b) else {}


def build_conditions(plan: AblationPlan, n_layers: int, n_heads: int) -> list[Condition]:
    """The plan's conditions for a model of ``n_layers`` x ``n_heads`` (module docstring, in that
    order). Every spec the plan gives is checked first (``UsageError``, one line, naming the head and
    the condition)."""
    given = [Condition("screen", spec, screen=name) for name, spec in plan.screens.items()]
    if plan.circuits is not None:
        prev_token, induction = plan.circuits
        given += [Condition("prev_token_circuit", prev_token), Condition("induction_circuit", induction)]
    if plan.heads is not None:
        given.append(Condition("user", user_spec(plan.heads)))
    check_conditions(given, n_layers, n_heads)

    conditions = [Condition("baseline", {})]
    for name, spec in plan.screens.items():
        conditions += [Condition("screen", spec, screen=name),
                       Condition("matched_random", matched_random(spec, n_heads, np.random.RandomState(plan.mr_seed)),
                                 screen=name, seed=plan.mr_seed),
                       Condition("full_layers", layers_of(spec, n_heads), screen=name)]
    if all(name in plan.screens for name in SCREEN_UNION):
        first, second = SCREEN_UNION
        conditions.append(Condition("screen_union", _union_of_both(plan.screens[first], plan.screens[second])))
    if plan.circuits is not None:
        prev_token, induction = plan.circuits
        conditions += [Condition("prev_token_circuit", prev_token), Condition("induction_circuit", induction),
                       Condition("circuit_union", _union_of_both(prev_token, induction))]
    if plan.heads is not None:
        conditions.append(Condition("user", user_spec(plan.heads)))
    for name, spec in plan.screens.items():
        conditions += [Condition("matched_random_seed", matched_random(spec, n_heads, np.random.RandomState(seed)),
                                 screen=name, seed=seed) for seed in plan.mr_seeds]
    return conditions


# --- 3. running them ---------------------------------------------------------------------------------

# Metrics that are shares of prompts whose top-1 prediction is right: the seed sweep states their
# changes in percentage points, and its ratio's thresholds are in those points (TASKS.md 6.1).
TOP1_METRICS = ("top1", "top1_above")
PERCENT = 100.0


@dataclass(frozen=True)
class ConditionResult(Record):
    """One condition's capability, and its change against the baseline."""

    name: str
    kind: str
    screen: str | None
    seed: int | None
    heads: list[str]  # "L13H1", ..., in the spec's order
    metrics: TaskMetrics
    delta: dict[str, float]  # metric -> value minus the baseline's (the metric's own units; 0 for the baseline)


@dataclass(frozen=True)
class ScreenSweep(Record):
    """A screen's ablation against its matched-random controls over the plan's seeds."""

    screen: str
    seeds: list[int]
    sweeps: dict[str, SeedSweep]  # top-1 metric -> screen and controls' changes in percentage points, and the ratio


@dataclass(frozen=True)
class TaskAblation(Record):
    """A task's ablation conditions on one checkpoint."""

    task: str
    n_prompts: int
    conditions: list[ConditionResult]  # in the order given
    sweeps: list[ScreenSweep]  # per screen with matched_random_seed conditions
    not_run: list[str]  # conditions with no head to ablate (module docstring)


def _condition_values(model, arch, batch: TaskBatch, batch_size: int, condition: Condition):
    """The per-prompt values of ``batch`` with the condition's heads zero-ablated."""
    mask = head_mask(heads_of(condition.spec), arch.n_layers, arch.n_heads)  # [layers, heads]
    with ablating(arch, mask[None]):  # one row of masks, broadcast over every prompt
        return task_pass(model, arch, batch, batch_size, screen=False).values


def _sweeps(results: list[ConditionResult]) -> list[ScreenSweep]:
    """Per screen, the seed sweep of each top-1 metric (changes in percentage points)."""
    screens = {r.screen: r for r in results if r.kind == "screen"}
    sweeps = []
    for screen, screen_result in screens.items():
        seeded = [r for r in results if r.kind == "matched_random_seed" and r.screen == screen]
        if not seeded:
            continue
        sweeps.append(ScreenSweep(
            screen=screen, seeds=[r.seed for r in seeded],
            sweeps={metric: seed_sweep(PERCENT * screen_result.delta[metric],
                                       [PERCENT * r.delta[metric] for r in seeded])
                    for metric in screen_result.delta if metric in TOP1_METRICS},
        ))
    return sweeps


def task_ablation(model, arch, batch: TaskBatch, batch_size: int, conditions: Sequence[Condition],
                  settings) -> TaskAblation:
    """Run every condition (``build_conditions``) over ``batch`` (``model`` loaded with
    ``capture.register_attention()``, ``arch`` its ``checkpoints.Architecture``, ``batch_size`` prompts
    per forward) and summarise each with ``task_metrics`` (``settings``: the run's ``StatsConfig``,
    its ``n_boot``, ``ci`` and ``seed``: the same resamples for every condition). Every spec is
    checked before the first forward pass; a condition other than the baseline that has no head is not run."""
    check_conditions(conditions, arch.n_layers, arch.n_heads)
    baselines = [c for c in conditions if c.kind == "baseline"]
    if len(baselines) != 1 or heads_of(baselines[0].spec):
        raise UsageError(f"the ablation conditions hold {len(baselines)} baseline(s); give exactly one baseline, "
                         "with no heads (as build_conditions does)")
    names = [c.name for c in conditions]
    if len(set(names)) != len(names):
        raise UsageError("two ablation conditions have the same name; give each condition once")
    to_run = [c for c in conditions if c.kind == "baseline" or heads_of(c.spec)]
    run = {c.name for c in to_run}
    measured = {c.name: task_metrics(batch.task, _condition_values(model, arch, batch, batch_size, c),
                                     settings.n_boot, settings.ci, settings.seed) for c in to_run}
    baseline = measured[baselines[0].name].metrics
    results = [ConditionResult(
        name=c.name, kind=c.kind, screen=c.screen, seed=c.seed,
        heads=[head_name(layer, head) for layer, head in heads_of(c.spec)],
        metrics=measured[c.name],
        delta={metric: value.value - baseline[metric].value for metric, value in measured[c.name].metrics.items()},
    ) for c in to_run]
    return TaskAblation(task=batch.task, n_prompts=len(batch.tokens), conditions=results, sweeps=_sweeps(results),
                        not_run=[name for name in names if name not in run])
