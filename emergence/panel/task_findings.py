"""Task circuits over training (docs/tasks.md): the findings of a trajectory of one task's runs
(``runs.Trajectory.task``), computed from its checkpoints' task summaries by pure functions.

* Capability: each metric's value and bootstrap interval over prompts per revision, as the runs
  measured them (``summary.json`` ``task.metrics``).
* Emergence (``task_<task>``, a milestone like F3's): the first revision at which every level of
  ``EMERGENCE_LEVELS`` is cleared by its metric's interval, its low end strictly above the level;
  a revision whose value is above a level but whose interval reaches down to it has not cleared it.
* First entry: for each head of a screen's top-k at the final revision, the first revision whose
  top-k holds it.
* Overlaps: per revision and screen, the screen's heads in the run's own induction and
  previous-token circuits (``task.circuits``) and among the BOS heads of that revision at the
  report's class threshold (the sinks the report's BOS fraction counts).
* Verdicts: at the final revision, per screen (and the user's heads), the run's sweep of its
  ablation against its distinct matched-random draws, with the verdict the run gave
  (``task.ablation.sweeps``, ``recipe.tasks.ablation.screen_sweep``).
* Published: for one of the study's models (its repository) at the study's final revision, measured
  on the study's own words (``task.words``), our final numbers beside ``published.json``'s,
  the invalid published rows marked.
"""

from __future__ import annotations

import numpy as np

from emergence.panel.records import (
    CircuitOverlap,
    EmergenceLevel,
    HeadEntry,
    Milestone,
    PublishedComparison,
    PublishedRow,
    PublishedScreenHeads,
    PublishedSweep,
    TaskFindings,
    TaskRevision,
)
from emergence.panel.runs import Checkpoint, Trajectory, preset
from emergence.panel.uncertainty import bracket
from emergence.recipe.screen import CLASSES, head_name
from emergence.recipe.tasks.ablation import ConditionResult, TaskAblation
from emergence.recipe.tasks.metrics import SUMMARY_METRICS, TASKS, MetricValue
from emergence.recipe.tasks.published import Ablation, PublishedTasks, load_published_tasks
from emergence.recipe.tasks.step import TaskSummary

BOS = CLASSES.index("bos")

IOI_LOGIT_DIFF_LEVEL = 1.0  # nats: IOI's mean logit difference, target (indirect object) - subject
TOP1_LEVEL = 0.5  # share of prompts whose argmax is right (greater-than: an "above" year)
EMERGENCE_LEVELS: dict[str, tuple[EmergenceLevel, ...]] = {
    "ioi": (EmergenceLevel("logit_diff_mean", IOI_LOGIT_DIFF_LEVEL), EmergenceLevel("top1", TOP1_LEVEL)),
    "greater_than": (EmergenceLevel("top1_above", TOP1_LEVEL),),
    "successor": (EmergenceLevel("top1", TOP1_LEVEL),),
    "binding": (EmergenceLevel("top1", TOP1_LEVEL),),
}


def milestone_name(task: str) -> str:
    """The task's emergence milestone (``ModelFindings.milestones``, ``--milestones`` of refine)."""
    return f"task_{task}"


TASK_MILESTONES = tuple(milestone_name(task) for task in TASKS)


# --- per revision (pure) -------------------------------------------------------------------------


def clears(metrics: dict[str, MetricValue], levels: tuple[EmergenceLevel, ...]) -> bool:
    """Every level's metric has its interval's low end strictly above the level (NaN: not)."""
    return all(metrics[level.metric].ci[0] > level.level for level in levels)


def _task(c: Checkpoint) -> TaskSummary:
    """The task of a checkpoint of a task trajectory (each of them has it: ``runs`` groups them so)."""
    assert c.task is not None
    return c.task


def task_reached(traj: Trajectory) -> dict[str, np.ndarray]:
    """``{"task_<task>": [revisions] bool}``: whether each revision clears the task's levels; empty
    for a trajectory without a task."""
    if traj.task is None:
        return {}
    levels = EMERGENCE_LEVELS[traj.task]
    return {
        milestone_name(traj.task): np.array(
            [clears(_task(c).metrics.metrics, levels) for c in traj.checkpoints], dtype=bool
        )
    }


def sink_heads(c: Checkpoint, class_threshold: float) -> set[str]:
    """The BOS heads of a checkpoint: first-token selectivity >= the class threshold."""
    return {head_name(int(l), int(h)) for l, h in np.argwhere(c.sel[..., BOS] >= class_threshold)}


def overlap(screen: list[str], circuits: dict[str, list[str]], sinks: set[str]) -> CircuitOverlap:
    """The screen's heads (rank order) in each capability circuit and among the sinks."""
    return CircuitOverlap(
        induction=[h for h in screen if h in circuits["induction"]],
        previous_token=[h for h in screen if h in circuits["previous_token"]],
        sink=[h for h in screen if h in sinks],
    )


def task_revision(c: Checkpoint, levels: tuple[EmergenceLevel, ...], class_threshold: float) -> TaskRevision:
    task = _task(c)
    sinks = sink_heads(c, class_threshold)
    return TaskRevision(
        revision=c.revision,
        tokens=c.tokens,
        metrics=task.metrics.metrics,
        cleared=clears(task.metrics.metrics, levels),
        screens=task.screens,
        overlaps={name: overlap(heads, task.circuits, sinks) for name, heads in task.screens.items()},
        refined=c.refined,
    )


# --- over the trajectory -------------------------------------------------------------------------


def _milestone(traj: Trajectory, index: int) -> Milestone:
    c = traj.checkpoints[index]
    return Milestone(c.revision, c.tokens, bracket(traj.tokens, index))


def emergence(traj: Trajectory) -> Milestone | None:
    """The first revision clearing every level of the task (``task_reached``); None: none does."""
    (reached,) = task_reached(traj).values()
    hits = np.flatnonzero(reached)
    return _milestone(traj, int(hits[0])) if len(hits) else None


def first_entries(traj: Trajectory, screen: str) -> list[HeadEntry]:
    """Each head of ``screen``'s top-k at the final revision, in rank order, with the first revision
    whose top-k holds it."""
    final = _task(traj.checkpoints[-1]).screens[screen]
    entries = []
    for rank, head in enumerate(final, start=1):
        first = next(i for i, c in enumerate(traj.checkpoints) if head in _task(c).screens.get(screen, []))
        entries.append(HeadEntry(head=head, rank=rank, entered=_milestone(traj, first)))
    return entries


# --- the study's published numbers beside ours ---------------------------------------------------------

# The study's experiment -> our screen's name (None: the task's own screen, named as the task)
EXPERIMENT_SCREEN = {"name_movers": "name_mover", "s_inhibition": "s_inhibition", "task_screen": None}
# its "union" condition -> our condition kind: the capability circuits' union, IOI's two screens' union
UNION_KIND = {"capability": "circuit_union", "s_inhibition": "screen_union"}
SCREEN_KINDS = ("screen", "matched_random", "full_layers")


def study_model(c: Checkpoint, published: PublishedTasks) -> str | None:
    """The study's model key whose repository and final revision (its preset's last panel revision)
    the checkpoint is; None otherwise."""
    for key, shape in published.models.items():
        if c.name_or_path == shape.hf_id and c.revision == preset(key).panel[-1].revision:
            return key
    return None


def matches(ours: ConditionResult, published: Ablation, condition: str) -> bool:
    """Our condition is the published experiment's ``condition`` (the same task's)."""
    if condition in SCREEN_KINDS:
        return ours.kind == condition and ours.screen == (EXPERIMENT_SCREEN.get(published.experiment) or published.task)
    if condition == "union":
        return ours.kind == UNION_KIND.get(published.experiment)
    return ours.kind == condition  # baseline, induction_circuit, prev_token_circuit


def our_condition(ablation: TaskAblation, published: Ablation, condition: str) -> ConditionResult | None:
    """Our condition matching a published one (None: not run)."""
    return next((r for r in ablation.conditions if matches(r, published, condition)), None)


def _names(heads: list[list[int]]) -> list[str]:
    return [head_name(layer, head) for layer, head in heads]


def published_rows(ablation: TaskAblation | None, published: Ablation) -> list[PublishedRow]:
    """Each metric of each condition of one published experiment, beside ours; the metrics the study
    quotes beyond the task's own (``SUMMARY_METRICS``) are left out."""
    rows = []
    # the task's own metrics (the induction batch's experiment, which no task compares, has none of them)
    kept = () if published.task == "induction" else SUMMARY_METRICS[published.task]
    for condition in published.conditions:
        ours = None if ablation is None else our_condition(ablation, published, condition.name)
        for metric, value in condition.metrics.items():
            if metric not in kept:
                continue
            mine = None if ours is None else ours.metrics.metrics[metric]
            rows.append(
                PublishedRow(
                    experiment=published.experiment,
                    condition=condition.name,
                    metric=metric,
                    published=value,
                    published_heads=_names(condition.heads),
                    ours=None if ours is None else ours.name,
                    value=None if mine is None else mine.value,
                    ci=None if mine is None else mine.ci,
                    heads=None if ours is None else ours.heads,
                    valid=condition.valid,
                    why=condition.why,
                )
            )
    return rows


def published_comparison(c: Checkpoint) -> PublishedComparison | None:
    """The final checkpoint ``c`` of a task trajectory beside the study's numbers for its model and
    task; None when it is not one of the study's models at the study's final revision, or its batch
    was not the study's (filtered words: other prompts than those the study measured)."""
    published = load_published_tasks()
    model = study_model(c, published)
    task = _task(c)
    if model is None or (task.words is not None and task.words.mode != "study"):  # None: a run before the field
        return None
    ablations = [a for a in published.ablations if a.model == model and a.task == task.name]
    screens = [s for s in published.screens if s.model == model and s.task == task.name]
    ours_sweeps = {s.screen: s for s in task.ablation.sweeps} if task.ablation else {}
    sweeps = []
    for s in (s for s in published.sweeps if s.model == model and s.task == task.name):
        screen = EXPERIMENT_SCREEN.get(s.experiment) or task.name
        ours = ours_sweeps.get(screen)
        sweeps.append(
            PublishedSweep(screen=screen, published=s, ours=None if ours is None else ours.sweeps.get(s.top1_metric))
        )
    heads = []
    for published_screen in screens:
        screen = EXPERIMENT_SCREEN.get(published_screen.experiment) or task.name
        shown = [head_name(h.layer, h.head) for h in published_screen.heads]
        ours_heads = task.screens.get(screen, [])
        heads.append(
            PublishedScreenHeads(
                screen=screen, published=shown, ours=ours_heads, shared=[h for h in ours_heads if h in shown]
            )
        )
    return PublishedComparison(
        study_model=model,
        revision=c.revision,
        rows=[row for a in ablations for row in published_rows(task.ablation, a)],
        screens=heads,
        sweeps=sweeps,
    )


def task_findings(traj: Trajectory, class_threshold: float) -> TaskFindings | None:
    """The task findings of a trajectory of task runs (module docstring); None without a task."""
    if traj.task is None:
        return None
    levels = EMERGENCE_LEVELS[traj.task]
    final = traj.checkpoints[-1]
    final_ablation = _task(final).ablation
    coverages = {_task(c).metrics.ci_level for c in traj.checkpoints}
    return TaskFindings(
        task=traj.task,
        levels=list(levels),
        ci_level=coverages.pop() if len(coverages) == 1 else None,
        revisions=[task_revision(c, levels, class_threshold) for c in traj.checkpoints],
        emergence=emergence(traj),
        first_entry={screen: first_entries(traj, screen) for screen in _task(final).screens},
        verdicts=final_ablation.sweeps if final_ablation else [],
        published=published_comparison(final),
    )
