"""The task ablations (the study's task-circuit extensions): which head sets to ablate, and their effect.

Three steps:

1. ``capability_circuits``: the induction and previous-token circuits from the 6-class
   selectivities of the induction probe, the study's way (docs/tasks.md, Ablations).
2. ``build_conditions``: an ``AblationPlan`` (the task screen's top-k specs, the circuits, a
   user's heads, the matched-random seeds) and the model's shape -> the conditions, each a named
   head spec (``Condition``). Pure; every spec is checked against the model before anything runs.
3. ``task_ablation``: every condition's heads zero-ablated at all positions (docs/tasks.md, Ablations), the
   conditions stacked along the batch so that they share each forward pass
   (``recipe.ablation.stacked_logits``) -> ``TaskAblation``: each condition's ``TaskMetrics`` and its
   change against the baseline, and per screen (and the user's heads) the sweep of its distinct
   matched-random draws (docs/tasks.md, Screen against matched random) with the verdict. With
   ``ablate.sequences=adaptive`` a sweep's draws stop once its verdict is decided (``SweepStop``);
   every other condition runs over every prompt.

Conditions (docs/tasks.md, Ablations), in this order:

* ``baseline``: nothing ablated;
* per screen (IOI: ``name_mover``, ``s_inhibition``; the other tasks their one screen):
  ``screen`` (its top-k heads), ``matched_random`` (as many heads per layer, drawn from the
  layer's other heads with one ``RandomState(mr_seed)`` consumed across the layers, docs/tasks.md, Ablations),
  ``full_layers`` (every head of the screen's layers);
* IOI: ``screen_union``, the S-inhibition and name-mover heads together (S-inhibition layers first);
* ``prev_token_circuit``, ``induction_circuit`` and ``circuit_union`` (previous-token layers first);
* ``user``: the heads the user listed, in their order, and its ``matched_random`` (named ``user``
  as its screen) drawn as a screen's: a published screen spec given as the user's heads gets the
  study's control of it;
* per screen, then for the user's heads, ``mr_seeds`` distinct ``matched_random_seed`` draws, each
  from a fresh ``RandomState(seed)`` (``matched_random.distinct_draws``: fewer where the layers
  allow fewer distinct sets).

The verdict of a screen (or the user's heads) against its draws rests on the task's logit measure
(``metrics.VERDICT_METRIC``), with top-1 beside it: "specific" when the screen's change is below
every distinct draw's; none where the baseline shows no capability (``metrics.capability_absent``)
or fewer than ``MIN_DISTINCT_DRAWS`` distinct draws exist.

A condition whose spec holds no head (a circuit no head reaches, an S-inhibition screen no head
passes, a union one of whose sides is empty) is not run: ``TaskAblation.not_run`` names it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from tqdm.auto import tqdm

from emergence.core.config import AblateConfig, StatsConfig
from emergence.core.errors import UsageError
from emergence.core.record import Record
from emergence.recipe import capture
from emergence.recipe.ablation import head_mask, stacked_logits
from emergence.recipe.controls import HeadSpec, heads_of
from emergence.recipe.screen import CLASSES, TIE_ORDER, head_name, parse_head_name
from emergence.recipe.tasks.batches import TaskBatch
from emergence.recipe.tasks.matched_random import (
    MIN_DISTINCT_DRAWS,
    MR_SEED,
    SWEEP_SEEDS,
    SeedSweep,
    check_heads,
    distinct_draws,
    layers_of,
    matched_random,
    possible_draws,
    seed_sweep,
    spec_from_circuit,
    spec_from_ranking,
    union,
)
from emergence.recipe.tasks.measure import TaskPass, TaskSubject, minibatch_values, task_pass
from emergence.recipe.tasks.metrics import (
    TOP1_METRIC,
    VERDICT_METRIC,
    VERDICT_VALUES,
    PromptMetrics,
    Task,
    TaskMetrics,
    capability_absent,
    chance_top1,
    concatenate,
    first_prompts,
    task_metrics,
)
from emergence.recipe.tasks.screens import TaskScreen
from emergence.recipe.verdict import SequentialStop, interval

# --- 1. the capability circuits (docs/tasks.md, Ablations) ------------------------------------------

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


def capability_circuits(
    selectivity: np.ndarray, prev_token_min: float, induction_min: float
) -> tuple[HeadSpec, HeadSpec]:
    """(previous-token circuit, induction circuit) from the 6-class selectivities
    [layers, heads, 6] (``CLASSES`` order): the heads whose previous-token selectivity is at least
    ``prev_token_min`` (``threshold.prev_token_circuit``, the study's 100) and is their best class,
    and the heads whose induction selectivity is at least ``induction_min`` (``threshold.circuit``,
    the study's 50); NaN is neither. Specs layer-major,
    heads ascending (``spec_from_circuit``)."""
    selectivity = np.asarray(selectivity, dtype=np.float64)
    if selectivity.ndim != 3 or selectivity.shape[-1] != len(CLASSES):
        raise UsageError(
            f"selectivity has shape {selectivity.shape}; pass [layers, heads, {len(CLASSES)}] "
            f"(classes {', '.join(CLASSES)})"
        )
    layers, heads = selectivity.shape[:2]
    all_heads = [(layer, head) for layer in range(layers) for head in range(heads)]
    previous = selectivity[..., CLASSES.index("previous_token")]
    induction = selectivity[..., CLASSES.index("induction")]
    prev_token = [
        lh for lh in all_heads if previous[lh] >= prev_token_min and best_class(selectivity[lh]) == "previous_token"
    ]
    induction_heads = [lh for lh in all_heads if induction[lh] >= induction_min]
    return spec_from_circuit(prev_token), spec_from_circuit(induction_heads)


# --- 2. the conditions -------------------------------------------------------------------------------

ConditionKind = Literal[
    "baseline",
    "screen",
    "matched_random",
    "full_layers",
    "screen_union",
    "prev_token_circuit",
    "induction_circuit",
    "circuit_union",
    "user",
    "matched_random_seed",
]
# IOI's two screens, in the study's layer order (docs/tasks.md, Ablations)
SCREEN_UNION = ("s_inhibition", "name_mover")
USER = "user"  # the user's heads, as the screen their matched-random draws derive from
BASELINE = "baseline"  # the baseline condition's name (nothing ablated)


@dataclass(frozen=True)
class AblationPlan:
    """What to ablate for one task (the module docstring lists the conditions it gives)."""

    screens: dict[str, HeadSpec]  # screen name -> its top-k heads in rank order (``from_screen``)
    mr_seed: int = MR_SEED  # the one matched-random draw per screen
    mr_seeds: int = len(SWEEP_SEEDS)  # distinct fresh draws per screen (``distinct_draws``); 0 for none
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
    screen: str | None = None  # the screen it derives from (screen, matched_random*, full_layers); USER: the user's
    seed: int | None = None  # the matched-random draws' seed

    @property
    def name(self) -> str:
        """ "baseline", "screen:name_mover", "matched_random_seed:greater_than:3", ..."""
        return ":".join(str(part) for part in (self.kind, self.screen, self.seed) if part is not None)


def user_spec(names: Sequence[str]) -> HeadSpec:
    """The user's heads ("L13H1", ...) as a spec in their order; a name twice or not of that form is refused."""
    parsed = [parse_head_name(name) for name in names]
    bad = [name for name, head in zip(names, parsed) if head is None]
    if bad:
        raise UsageError(f"ablation heads: {bad[0]!r} is not a head name; write heads as L<layer>H<head>, e.g. L13H1")
    heads = [head for head in parsed if head is not None]  # every one of them
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
        conditions += [
            Condition("screen", spec, screen=name),
            Condition(
                "matched_random",
                matched_random(spec, n_heads, np.random.RandomState(plan.mr_seed)),
                screen=name,
                seed=plan.mr_seed,
            ),
            Condition("full_layers", layers_of(spec, n_heads), screen=name),
        ]
    if all(name in plan.screens for name in SCREEN_UNION):
        first, second = SCREEN_UNION
        conditions.append(Condition("screen_union", _union_of_both(plan.screens[first], plan.screens[second])))
    if plan.circuits is not None:
        prev_token, induction = plan.circuits
        conditions += [
            Condition("prev_token_circuit", prev_token),
            Condition("induction_circuit", induction),
            Condition("circuit_union", _union_of_both(prev_token, induction)),
        ]
    controlled = dict(plan.screens)  # the specs with matched-random draws, by the screen they are named after
    if plan.heads is not None:
        controlled[USER] = user_spec(plan.heads)
        conditions += [
            Condition("user", controlled[USER]),
            Condition(
                "matched_random",
                matched_random(controlled[USER], n_heads, np.random.RandomState(plan.mr_seed)),
                screen=USER,
                seed=plan.mr_seed,
            ),
        ]
    for name, spec in controlled.items():
        conditions += [
            Condition("matched_random_seed", control, screen=name, seed=seed)
            for seed, control in distinct_draws(spec, n_heads, plan.mr_seeds)
        ]
    return conditions


# --- 3. running them ---------------------------------------------------------------------------------

# Top-1 is a share of prompts: the sweep states its changes in percentage points, and its
# ratio's thresholds are in those points (docs/tasks.md, Screen against matched random).
PERCENT = 100.0
Verdict = Literal["specific", "not_specific", "capability_absent", "too_few_draws"]


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
    """A screen's (or the user's heads') ablation against its distinct matched-random draws, and the
    verdict. Runs written before verdicts were stored read with the fields after ``sweeps`` None."""

    screen: str  # the screen's name; USER: the user's heads
    seeds: list[int]  # the seeds of the distinct draws, in order (a seed repeating an earlier draw is skipped)
    # metric -> the screen's and the draws' changes: the verdict metric in its units, top-1 in percentage points
    sweeps: dict[str, SeedSweep]
    n_distinct: int  # distinct draws (len(seeds)): fewer than ablate.mr_seeds only where ``all_drawn``
    all_drawn: bool  # the draws are every distinct control the screen's layers allow
    screen_heads: int
    control_heads: int  # each draw's heads: fewer than the screen's where a layer has too few other heads
    smaller: bool  # control_heads < screen_heads
    verdict_metric: str  # the metric the verdict rests on (``metrics.VERDICT_METRIC``)
    verdict: Verdict | None  # None: a run written before verdicts were stored (``sweep_text`` says so)
    why: str  # the verdict in words (what it rests on, or why there is none)
    # The first prompts the sweep's numbers rest on (the draws ran on these alone), and whether that
    # is fewer than the batch (``SweepStop``); None: a run written before the adaptive stop.
    prompts_used: int | None = None
    stopped_early: bool | None = None
    # The criterion min over draws of (draw - screen) in the verdict metric, with its interval
    # (``recipe.verdict.interval``): at the last look (``SweepStop``), else over every prompt used; None under
    # MIN_DISTINCT_DRAWS draws.
    interval: dict | None = None


@dataclass(frozen=True)
class TaskAblation(Record):
    """A task's ablation conditions on one checkpoint."""

    task: str
    n_prompts: int
    conditions: list[ConditionResult]  # in the order given
    sweeps: list[ScreenSweep]  # per screen (and the user's heads) with matched_random_seed conditions
    not_run: list[str]  # conditions with no head to ablate (module docstring)
    chance_top1: float | None = None  # top-1 of a uniform guess over the vocabulary (``metrics.chance_top1``)
    capability_absent: str | None = None  # why the baseline shows no capability (no verdicts); None: it shows one


class SweepStop(SequentialStop):
    """``ablate.sequences=adaptive`` for the task ablations: a sweep's draws stop once its verdict is
    decided, as the induction ablation stops (``recipe.ablation.AdaptiveStop``, docs/adaptive-ablation.md).

    The verdict "specific" says the screen's change of the verdict metric is below every draw's,
    over the same prompts and baseline: the criterion, the least over draws of the mean per-prompt
    difference draw - screen, is above zero. Each draw's difference gets a Student-t interval over
    prompts (Bonferroni over the draws), and over a batch of ``total`` prompts the looks follow
    ``recipe.verdict.look_sizes`` (``min_sequences`` prompts, doubling, then the last prompt), each
    spending its share of the error budget (``recipe.verdict.interval``). A sweep with fewer than
    ``MIN_DISTINCT_DRAWS`` draws gets no verdict, and runs every prompt."""

    def __init__(self, task: Task, sweeps: dict[str, tuple[str, list[str]]], settings: AblateConfig, total: int):
        super().__init__(settings.min_sequences, total, settings.confidence)
        self.field = VERDICT_VALUES[task]
        self.sweeps = {name: members for name, members in sweeps.items() if len(members[1]) >= MIN_DISTINCT_DRAWS}

    def __call__(self, values: dict[str, list[PromptMetrics]], n: int) -> list[str]:
        """After ``n`` prompts (``values``: each running condition's minibatches so far): the draw
        conditions to stop now."""

        def differences(ablated: str, draws: list[str]) -> Callable[[], np.ndarray]:
            return lambda: criterion_differences(
                self.field, {c: concatenate(values[c]) for c in [ablated, *draws]}, ablated, draws
            )

        settled = self.look(n, {name: differences(*members) for name, members in self.sweeps.items()})
        return [draw for name in settled for draw in self.sweeps[name][1]]


def criterion_differences(field: str, values: dict[str, PromptMetrics], ablated: str, draws: list[str]) -> np.ndarray:
    """``SweepStop``'s criterion's values, [draws, prompts], over the prompts every one of ``draws``
    and ``ablated`` has measured: per draw the per-prompt difference draw - ablated of ``field``
    (prompts where it is undefined, greater-than's NaN, dropped). Their means' least is the criterion
    (``recipe.verdict.interval``)."""
    per_condition = {name: getattr(values[name], field) for name in [ablated, *draws]}
    n = min(len(v) for v in per_condition.values())
    differences = np.stack([per_condition[d][:n] - per_condition[ablated][:n] for d in draws])  # [draws, n]
    return differences[:, ~np.isnan(differences).any(axis=0)]


def _ablated_values(
    model,
    arch: capture.Architecture,
    batch: TaskBatch,
    batch_size: int,
    conditions: Sequence[Condition],
    stop: SweepStop | None,
) -> dict[str, PromptMetrics]:
    """Per condition, the per-prompt values over the prompts it ran on: the conditions stacked along
    the batch (``stacked_logits``), each pass on ``batch_size`` // (conditions running) prompts (at
    least one), so that it holds about ``batch_size`` rows where every condition has joined; after
    each pass, the last included, ``stop`` may end some (their values then cover the first prompts)."""
    masks = {c.name: head_mask(heads_of(c.spec), arch.n_layers, arch.n_heads) for c in conditions}
    parts: dict[str, list[PromptMetrics]] = {name: [] for name in masks}
    running = list(masks)
    n = len(batch.tokens)
    done = 0
    with torch.inference_mode(), tqdm(total=n, desc=f"ablate {batch.task}", unit="prompt", leave=False) as bar:
        while done < n and running:
            rows = slice(done, min(n, done + max(1, batch_size // len(running))))
            logits = stacked_logits(model, arch, batch.tokens[rows], torch.stack([masks[c] for c in running]))
            if not torch.isfinite(logits).all():
                raise capture.non_finite(model.dtype)
            for name, per_condition in zip(running, logits):  # [b, V] each
                parts[name].append(minibatch_values(batch.task, per_condition, batch, rows))
            bar.update(rows.stop - done)
            done = rows.stop
            if stop is not None:
                ended = stop(parts, done)
                running = [name for name in running if name not in ended]
    return {name: concatenate(p) for name, p in parts.items()}


def verdict(metric: str, sweep: SeedSweep, absent: str | None) -> tuple[Verdict, str]:
    """The verdict of a screen against its distinct draws on ``metric`` (``sweep``: its changes) and
    why: none where the baseline shows no capability (``absent``, ``metrics.capability_absent``) or
    under ``MIN_DISTINCT_DRAWS`` draws; else "specific" when the screen's change is below every
    draw's (with n exchangeable draws, a chance of 1 in n + 1)."""
    n = len(sweep.deltas)
    if absent is not None:
        return "capability_absent", f"capability absent: no verdict ({absent})"
    if n < MIN_DISTINCT_DRAWS:
        return "too_few_draws", f"no std, ratio or verdict over fewer than {MIN_DISTINCT_DRAWS} distinct draws"
    below = sweep.screen_delta < sweep.min
    return (
        "specific" if below else "not_specific",
        f"{metric} {sweep.screen_delta:+.3f} {'below' if below else 'not below'} every one of {n} distinct "
        f"draws (lowest {sweep.min:+.3f})",
    )


@dataclass(frozen=True)
class SweepExtent:
    """How far a sweep's draws ran (``SweepStop``): over the first ``used`` of the batch's ``total``
    prompts, with the criterion's interval (None: fewer draws than it needs)."""

    used: int
    total: int
    criterion: dict | None


def screen_sweep(
    task: Task,
    ablated: ConditionResult,
    spec: HeadSpec,
    draws: list[ConditionResult],
    n_heads: int,
    absent: str | None,
    extent: SweepExtent | None = None,
) -> ScreenSweep:
    """The sweep of ``ablated`` (a screen or the user's heads; ``spec`` its heads) against its distinct
    ``draws`` in a model of ``n_heads`` heads per layer, and its verdict (``verdict``): all measured
    over the same first prompts (``extent``; None: not recorded)."""
    metric, top1 = VERDICT_METRIC[task], TOP1_METRIC[task]
    sweeps = {
        metric: seed_sweep(ablated.delta[metric], [r.delta[metric] for r in draws], top1=False),
        top1: seed_sweep(PERCENT * ablated.delta[top1], [PERCENT * r.delta[top1] for r in draws]),
    }
    decision, why = verdict(metric, sweeps[metric], absent)
    control_heads = len(draws[0].heads)  # every draw holds as many heads per layer (``matched_random``)
    seeds = [r.seed for r in draws if r.seed is not None]  # every draw's (a matched_random_seed condition's)
    return ScreenSweep(
        screen=ablated.screen or USER,
        seeds=seeds,
        sweeps=sweeps,
        n_distinct=len(draws),
        all_drawn=len(draws) == possible_draws(spec, n_heads),
        screen_heads=len(ablated.heads),
        control_heads=control_heads,
        smaller=control_heads < len(ablated.heads),
        verdict_metric=metric,
        verdict=decision,
        why=why,
        prompts_used=None if extent is None else extent.used,
        stopped_early=None if extent is None else extent.used < extent.total,
        interval=None if extent is None else extent.criterion,
    )


@dataclass(frozen=True)
class _Measured:
    """Every condition's per-prompt values (``values``; the draws a sweep stopped cover its first
    prompts), summarised on demand over the first n prompts against the baseline over them."""

    task: Task
    conditions: dict[str, Condition]
    values: dict[str, PromptMetrics]
    settings: StatsConfig  # the run's: n_boot, ci, seed

    def result(self, name: str, n: int | None = None) -> ConditionResult:
        c = self.conditions[name]
        metrics, baseline = (
            task_metrics(
                self.task,
                first_prompts(self.values[key], n or self.n(name)),
                self.settings.n_boot,
                self.settings.ci,
                self.settings.seed,
            )
            for key in (name, BASELINE)
        )
        return ConditionResult(
            name=name,
            kind=c.kind,
            screen=c.screen,
            seed=c.seed,
            heads=[head_name(layer, head) for layer, head in heads_of(c.spec)],
            metrics=metrics,
            delta={metric: value.value - baseline.metrics[metric].value for metric, value in metrics.metrics.items()},
        )

    def n(self, name: str) -> int:
        """The prompts condition ``name`` ran on."""
        return len(getattr(self.values[name], VERDICT_VALUES[self.task]))


def sweep_members(conditions: Sequence[Condition]) -> dict[str, tuple[str, list[str]]]:
    """Per screen, then the user's heads (``USER``), with draws among ``conditions``: (the ablated
    condition's name, its draws' names), in the conditions' order."""
    members = {}
    for c in conditions:
        if c.kind in ("screen", "user"):
            screen = c.screen or USER
            draws = [d.name for d in conditions if d.kind == "matched_random_seed" and d.screen == screen]
            if draws:
                members[screen] = (c.name, draws)
    return members


def _sweeps(
    measured: _Measured,
    results: dict[str, ConditionResult],
    members: dict[str, tuple[str, list[str]]],
    n_heads: int,
    absent: str | None,
    stop: SweepStop | None,
    confidence: float,
) -> list[ScreenSweep]:
    """Each sweep of ``members`` (``sweep_members``): its ``screen_sweep`` over the first prompts its
    draws ran on, with the criterion's interval (``stop``'s last look where it ran: the decisive one,
    or the one at the last prompt; else one interval over every prompt)."""
    sweeps = []
    for screen, (ablated, draw_names) in members.items():
        draws = [results[d] for d in draw_names]
        used = draws[0].metrics.n_prompts
        iv = stop.intervals.get(screen) if stop is not None else None
        if iv is None and len(draws) >= MIN_DISTINCT_DRAWS:
            iv = interval(
                criterion_differences(VERDICT_VALUES[measured.task], measured.values, ablated, draw_names), confidence
            )
        sweeps.append(
            screen_sweep(
                measured.task,
                measured.result(ablated, used),
                measured.conditions[ablated].spec,
                draws,
                n_heads,
                absent,
                SweepExtent(used, measured.n(BASELINE), iv),
            )
        )
    return sweeps


def _changes(metric: str, s: SeedSweep) -> str:
    """One metric's changes: top-1 in percentage points to 0.1 with its ratio, a logit measure in
    nats to 0.001; a std not given (``SeedSweep.why``) as "-"."""
    pp = metric in TOP1_METRIC.values()
    digits, unit = (".1f", " pp") if pp else (".3f", "")
    std = "-" if s.std is None else format(s.std, digits)
    ratio = f" (ratio {'-' if s.ratio is None else format(s.ratio, '.3g')})" if pp else ""
    return (
        f"{metric} {s.screen_delta:+{digits}}{unit} vs matched-random {s.mean:+{digits}} +- {std}{unit} "
        f"[{s.min:+{digits}}, {s.max:+{digits}}]{ratio}"
    )


def sweep_text(s: ScreenSweep) -> str:
    """A sweep in words: the verdict metric's and top-1's changes against the draws', and the
    verdict (the run's printed line and the report say the same)."""
    if s.verdict is None:  # a run written before verdicts were stored: its sweeps are top-1's
        return (
            "; ".join(f"{_changes(metric, sweep)} over {len(sweep.deltas)} seeds" for metric, sweep in s.sweeps.items())
            + "; no verdict stored (a run of an earlier version: rerun it)"
        )
    heads = f"{s.control_heads} heads against the screen's {s.screen_heads}: smaller" if s.smaller else ""
    draws = f"{s.n_distinct} distinct draw{'s' if s.n_distinct != 1 else ''}" + (
        " (every one the layers allow)" if s.all_drawn else ""
    )
    if s.stopped_early:
        draws += f", on the first {s.prompts_used} prompts (the verdict decided there: ablate.sequences=adaptive)"
    changes = "; ".join(_changes(metric, sweep) for metric, sweep in s.sweeps.items())
    return "; ".join(part for part in (f"{changes} over {draws}", heads, s.why) if part)


def task_ablation(
    subject: TaskSubject,
    conditions: Sequence[Condition],
    settings: StatsConfig,
    ablate: AblateConfig | None = None,
    clean: TaskPass | None = None,
) -> TaskAblation:
    """Run every condition (``build_conditions``) over the ``subject``'s prompts (about its ``batch_size``
    rows per forward) and summarise each with ``task_metrics`` (``settings``: the run's ``StatsConfig``,
    its ``n_boot``, ``ci`` and ``seed``: the same resamples for every condition). Every spec is
    checked before the first forward pass; a condition other than the baseline that has no head is not
    run. ``clean``: the clean model's pass where one was run (the task pass), else one is run for the
    baseline. ``ablate``: the run's ``AblateConfig``; with ``sequences=adaptive`` each sweep's draws
    stop once its verdict is decided (``SweepStop``), and its ``confidence`` is the level of the
    criterion's interval (else ``settings.ci``).
    Each screen (and the user's heads) with draws gets its ``screen_sweep``, judged against the
    baseline's capability (``metrics.capability_absent``)."""
    model, arch, batch, batch_size = subject.model, subject.arch, subject.batch, subject.batch_size
    check_conditions(conditions, arch.n_layers, arch.n_heads)
    baselines = [c for c in conditions if c.kind == "baseline"]
    if len(baselines) != 1 or heads_of(baselines[0].spec):
        raise UsageError(
            f"the ablation conditions hold {len(baselines)} baseline(s); give exactly one baseline, "
            "with no heads (as build_conditions does)"
        )
    names = [c.name for c in conditions]
    if len(set(names)) != len(names):
        raise UsageError("two ablation conditions have the same name; give each condition once")
    to_run = {c.name: c for c in conditions if c.kind == "baseline" or heads_of(c.spec)}
    clean = clean if clean is not None else task_pass(model, arch, batch, batch_size, screen=False)
    confidence = settings.ci if ablate is None else ablate.confidence
    ablated = [c for c in to_run.values() if c.kind != "baseline"]
    members = sweep_members(ablated)
    adaptive = ablate is not None and ablate.sequences == "adaptive"
    stop = SweepStop(batch.task, members, ablate, len(batch.tokens)) if ablate is not None and adaptive else None
    values = {BASELINE: clean.values, **_ablated_values(model, arch, batch, batch_size, ablated, stop)}
    measured = _Measured(batch.task, to_run, values, settings)
    results = {name: measured.result(name) for name in to_run}
    chance = chance_top1(batch.task, clean.vocab_size, batch.decade)
    absent = capability_absent(batch.task, results[BASELINE].metrics, chance)
    return TaskAblation(
        task=batch.task,
        n_prompts=len(batch.tokens),
        conditions=list(results.values()),
        sweeps=_sweeps(measured, results, members, arch.n_heads, absent, stop, confidence),
        not_run=[name for name in names if name not in to_run],
        chance_top1=chance,
        capability_absent=absent,
    )
