"""``python -m emergence.refine SWEEP_DIR``: locate each milestone of a panel sweep to one
interval between adjacent existing checkpoints.

    python -m emergence.refine outputs/multirun/toy_2026-12-01                 # bisection
    python -m emergence.refine SWEEP --milestones induction_onset bos_50 --parallel 3
    python -m emergence.refine SWEEP --scan                                    # every checkpoint
    python -m emergence.refine SWEEP hydra/launcher=slurm                      # rounds as cluster jobs

A panel places a milestone (the induction onset, a BOS-fraction level, a recall level, a task's
emergence ``task_<task>`` on a sweep of task runs, a measure's series half-way up, ``llc_rise`` on runs
of the LLC: F7's rising stage; named with ``--milestones``) in a bracket:
after the panel revision before it, by the one where it is first seen. Many published
checkpoints may lie inside (OLMo publishes one every 1,000 steps). Refinement analyses K of
them per round, evenly spaced by count (K=1: bisection, the middle one), and keeps the part
whose ends disagree, until the bracket is one interval between adjacent checkpoints: at most
floor(log2(n)) + 1 analyses for n checkpoints inside, instead of n. One analysed checkpoint
serves every milestone whose bracket holds it.

Each round is one Hydra multirun of ``python -m emergence`` per model, with the panel runs' own
overrides (plus the command line's), into ``SWEEP_DIR/refine/<model>/<revision>/``, ablation off
unless the command line turns it on (the milestones come from the screen). The report, resume and
the measurement cache see these runs like any other. The state is what the sweep directory
holds: a killed refinement, run again, continues from the runs that finished and analyses
nothing twice.

Writes ``SWEEP_DIR/refined.json``: ``{model: {milestone: answer}}`` (``Refinement``).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from emergence import measures
from emergence.core.atomic import atomic_write_text
from emergence.core.config import PanelEntry, ThresholdConfig, compose_config
from emergence.core.errors import CommandParser, UsageError
from emergence.hub.integrity import INTEGRITY_FILE, check
from emergence.hub.revisions import existing_checkpoints
from emergence.panel.findings import BOS_MILESTONES, RECALL_MILESTONES, milestone_reached, model_findings
from emergence.panel.runs import REFINE_FOLDER, REFINED_FILE, Trajectory, load_runs
from emergence.panel.stage_findings import RISE, series_reached
from emergence.panel.task_findings import TASK_MILESTONES
from emergence.panel.uncertainty import replicates
from emergence.recipe import sinks
from emergence.run.results import SUMMARY_FILE
from emergence.run.sweep import FAILED_FILE

MILESTONES = (
    "induction_onset",
    *(f"bos_{p}" for p in BOS_MILESTONES),
    *RECALL_MILESTONES,
    *(f"sink_{p}" for p in BOS_MILESTONES),
    *TASK_MILESTONES,
    *(f"{name}{RISE}" for name, _ in measures.series()),  # a measure's series half-way up (F7's rise)
)
DEFAULT_MILESTONES = (
    "induction_onset",
    *(f"bos_{p}" for p in BOS_MILESTONES),
    "recall_67",
    *(f"sink_{p}" for p in BOS_MILESTONES),
)


# --- the search: pure functions of names and what the analysed ones showed -------------------


@dataclass(frozen=True)
class Narrowing:
    """Where one milestone's search stands. Positions index ``[panel low, *inside, panel high]``."""

    low: int  # the last position known not to have reached the milestone
    high: int  # the first position known to have reached it (within the bracket)
    evaluated: list[str]  # the checkpoints inside the bracket this search has analysed, in order
    pending: list[str]  # the checkpoints it needs next (empty: done, or nothing inside)
    rounds: int  # rounds of analyses it took (or has taken so far)


def spaced(candidates: list[int], per_round: int) -> list[int]:
    """``per_round`` of the candidates cutting them into per_round + 1 parts of nearly equal count
    (one: the middle one); all of them when there are no more than that."""
    n = len(candidates)
    if n <= per_round:
        return list(candidates)
    return sorted({candidates[(j * (n + 1)) // (per_round + 1) - 1] for j in range(1, per_round + 1)})


def narrow(inside: list[str], reached: dict[str, bool], per_round: int = 1, scan: bool = False) -> Narrowing:
    """Replay the search over the checkpoints ``inside`` a panel bracket (ordered by step), given
    which analysed checkpoints have reached the milestone (``reached``: name -> bool; the panel's
    ends are known: the low one has not, the high one has). Each round analyses ``per_round``
    evenly spaced checkpoints of the current bracket (``scan``: all of them) and keeps the part
    from the last one below to the first one reached. The replay is a function of the names and
    the analysed values only, so a search resumed from a sweep directory asks for exactly what a
    search that had not stopped would have asked for."""
    low, high = 0, len(inside) + 1
    evaluated: list[str] = []
    rounds = 0
    while high - low > 1:
        candidates = list(range(low + 1, high))
        picks = candidates if scan else spaced(candidates, per_round)
        names = [inside[p - 1] for p in picks]
        missing = [n for n in names if n not in reached]
        if missing:
            return Narrowing(low, high, evaluated, missing, rounds)
        evaluated += names
        rounds += 1
        hits = [p for p in picks if reached[inside[p - 1]]]
        if hits:
            high = hits[0]
            low = max([p for p in picks if p < high], default=low)
        else:
            low = picks[-1]
    return Narrowing(low, high, evaluated, [], rounds)


def monotone(values: list[bool]) -> bool:
    """False...False True...True: the milestone, once reached, stays reached."""
    return all(a <= b for a, b in zip(values, values[1:]))


# --- one milestone's answer ----------------------------------------------------------------


@dataclass(frozen=True)
class Refinement:
    """One milestone of one model: its panel bracket and the interval the refinement narrowed it to.

    ``interval`` [revision before, revision of the first crossing] and ``tokens`` their token
    counts; ``evaluations`` checkpoints analysed for it out of ``inside_bracket`` that exist
    strictly inside the panel bracket; ``probability`` the bootstrap share of replicates whose
    first crossing (over every analysed revision) is the interval's upper end;
    ``first_crossing_guaranteed`` holds when every checkpoint of the bracket below that end was
    analysed (``--scan``), so no earlier crossing can hide between analysed points; ``monotone``
    whether the analysed points of the bracket, once reached, stay reached (bisection assumes it).
    ``reason`` says why a milestone has no bracket to refine (never reached, or at the first revision)
    or nothing inside it to analyse."""

    milestone: str
    panel_bracket: list[str] | None
    panel_bracket_tokens: list[float] | None
    interval: list[str] | None
    tokens: list[float] | None
    evaluations: int
    evaluated: list[str]
    inside_bracket: int
    rounds: int
    method: str
    complete: bool
    monotone: bool | None = None
    first_crossing_guaranteed: bool | None = None
    probability: float | None = None
    reason: str | None = None

    @classmethod
    def without_bracket(cls, milestone: str, method: str, reason: str) -> Refinement:
        return cls(milestone, None, None, None, None, 0, [], 0, 0, method, True, reason=reason)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ModelPlan:
    """A model's milestones in one round: their answers so far and the checkpoints still needed."""

    refinements: dict[str, Refinement]
    pending: list[str]  # revision names, ordered by step
    # the panel's revisions and those inside its brackets
    considered: list[str] = dataclasses.field(default_factory=list)


def method_name(per_round: int, scan: bool) -> str:
    return "scan" if scan else "bisection" if per_round == 1 else f"{per_round} per round"


def plan_model(
    traj: Trajectory,
    existing: list[PanelEntry],
    milestones: list[str],
    per_round: int,
    scan: bool,
    thresholds: tuple[float, float],
    sink_epsilon: float,
) -> ModelPlan:
    """Each milestone's search on ``traj`` (panel and refinement runs together) over the checkpoints
    that exist (``existing``, ordered by step)."""
    step_of = {e.revision: e.step for e in existing}
    panel = dataclasses.replace(traj, checkpoints=[c for c in traj.checkpoints if not c.refined])
    unknown = [c.revision for c in panel.checkpoints if c.revision not in step_of]
    if unknown:
        raise UsageError(
            f"{traj.model}: panel revision {unknown[0]!r} is not among the model's existing checkpoints "
            f"({len(existing)} listed); refine needs the panel's revisions to exist"
        )
    reached_panel = {**milestone_reached(panel, *thresholds, sink_epsilon), **series_reached(panel, panel)}
    reached_all = {**milestone_reached(traj, *thresholds, sink_epsilon), **series_reached(traj, panel)}
    index_of = {c.revision: i for i, c in enumerate(traj.checkpoints)}
    tokens_of = {c.revision: c.tokens for c in traj.checkpoints}
    method = method_name(per_round, scan)
    refinements, pending, considered = {}, set(), {c.revision for c in panel.checkpoints}
    for name in milestones:
        if name not in reached_panel:  # sink_* without key-0 importances in the runs, task_* without the task
            refinements[name] = Refinement.without_bracket(name, method, "not measured by these runs")
            continue
        hits = np.flatnonzero(reached_panel[name])
        if len(hits) == 0 or hits[0] == 0:
            refinements[name] = Refinement.without_bracket(
                name,
                method,
                "not reached by the panel's last revision"
                if len(hits) == 0
                else "reached at the panel's first revision: nothing before it brackets the crossing",
            )
            continue
        lo, hi = panel.checkpoints[hits[0] - 1], panel.checkpoints[hits[0]]
        inside = [e.revision for e in existing if step_of[lo.revision] < e.step < step_of[hi.revision]]
        considered.update(inside)
        analysed = {r: bool(reached_all[name][index_of[r]]) for r in inside if r in index_of}
        search = narrow(inside, analysed, per_round, scan)
        ends = [lo.revision, *inside, hi.revision]
        done = not search.pending
        seen = [False, *[analysed[r] for r in inside if r in analysed], True]
        refinements[name] = Refinement(
            name,
            [lo.revision, hi.revision],
            [lo.tokens, hi.tokens],
            interval=[ends[search.low], ends[search.high]] if done else None,
            tokens=[tokens_of[ends[search.low]], tokens_of[ends[search.high]]] if done else None,
            evaluations=len(search.evaluated),
            evaluated=search.evaluated,
            inside_bracket=len(inside),
            rounds=search.rounds,
            method=method,
            complete=done,
            monotone=monotone(seen),
            first_crossing_guaranteed=all(r in analysed for r in inside[: search.high - 1]) and done,
            reason=None
            if inside
            else "no checkpoint exists inside the panel bracket: it is one interval already "
            "(a toy saves more with model.toy.save_every=N)",
        )
        pending.update(search.pending)
    return ModelPlan(
        refinements,
        [e.revision for e in existing if e.revision in pending],
        [e.revision for e in existing if e.revision in considered],
    )


def with_probabilities(
    traj: Trajectory, plan: ModelPlan, thresholds: tuple[float, float], sink_epsilon: float
) -> ModelPlan:
    """The finished answers with the bootstrap probability of their interval (one shared resample
    over every analysed revision, as the report's milestone probabilities)."""
    reps = replicates(traj, *thresholds, sink_epsilon)
    if reps is None:
        return plan
    milestones = model_findings(traj, *thresholds, reps, sink_epsilon).milestones()
    out = {}
    for name, r in plan.refinements.items():
        milestone = milestones.get(name) if r.interval else None
        probability = None if milestone is None else milestone.probability
        out[name] = dataclasses.replace(
            r,
            probability=None
            if probability is None or r.interval is None
            else float(probability.get(r.interval[1], 0.0)),
        )
    return ModelPlan(out, plan.pending, plan.considered)


# --- the rounds: multiruns of python -m emergence into the sweep directory --------------------


def override_key(override: str) -> str:
    """The key an override sets (``ablate.enabled``, ``model``, ``hydra/launcher``), by Hydra's own parser."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_override(override).get_key_element().lstrip("+~")


def merge_overrides(*groups: list[str]) -> list[str]:
    """Overrides in order, a later one replacing an earlier one of the same key."""
    merged: dict[str, str] = {}
    for group in groups:
        for override in group:
            merged.pop(override_key(override), None)
            merged[override_key(override)] = override
    return list(merged.values())


def is_revision(key: str) -> bool:
    return key == "revision" or key.startswith("revision.")


def is_hydra(key: str) -> bool:
    return key.startswith(("hydra.", "hydra/"))


def run_overrides(run_dir: Path) -> tuple[list[str], list[str]]:
    """(task overrides without the revision, Hydra overrides without the sweep's own folders) that
    ``run_dir``'s job was started with (its ``.hydra/``)."""
    hydra_dir = run_dir / ".hydra"
    if not (hydra_dir / "overrides.yaml").exists():
        raise UsageError(f"{run_dir}: no .hydra/overrides.yaml; refine needs runs written by python -m emergence")
    task = [str(o) for o in OmegaConf.load(hydra_dir / "overrides.yaml") if not is_revision(override_key(str(o)))]
    launch = list(OmegaConf.load(hydra_dir / "hydra.yaml").hydra.overrides.hydra)
    own = ("hydra.sweep.", "hydra.run.", "hydra.mode", "hydra.job.num")
    return task, [o for o in launch if not override_key(o).startswith(own)]


def panel_overrides(traj: Trajectory) -> tuple[list[str], list[str]]:
    """The one configuration the panel runs of ``traj`` share (bar the revision)."""
    found: dict[tuple[str, ...], tuple[list[str], list[str]]] = {}
    for c in traj.checkpoints:
        if not c.refined:
            assert c.run_dir is not None  # runs, not the reference data
            task, launch = run_overrides(c.run_dir)
            found.setdefault(tuple(task), (task, launch))
    if len(found) != 1:
        settings = " | ".join(" ".join(t) for t in found)
        raise UsageError(
            f"{traj.model}: the panel runs differ in their settings ({settings}); "
            "refine one configuration at a time: give a sweep directory of one configuration per model"
        )
    return next(iter(found.values()))


def launch_round(
    sweep_dir: Path, model: str, panel: tuple[list[str], list[str]], revisions: list[str], extra: list[str]
) -> None:
    """One multirun of ``python -m emergence`` over ``revisions`` with the panel runs' configuration
    (``panel``: their task and launcher overrides, ``panel_overrides``)."""
    task, launch = panel
    user_task = [o for o in extra if not is_hydra(override_key(o))]
    user_launch = [o for o in extra if is_hydra(override_key(o))]
    asks_for_ablation = any(override_key(o).startswith("ablate.") for o in user_task)
    overrides = merge_overrides(
        [f"wandb.group={sweep_dir.name}"],  # one W&B group with the panel's runs (unless the runs name another)
        task,
        [] if asks_for_ablation else ["ablate.enabled=false"],
        ["revision=custom", f"revision.name={','.join(revisions)}"],
        user_task,
        launch,
        user_launch,
        # The jobs' own folder (with its multirun.yaml and list of failures) inside the sweep's.
        [f"hydra.sweep.dir={sweep_dir / REFINE_FOLDER / model}", "hydra.sweep.subdir=${revision.name}"],
    )
    subprocess.run([sys.executable, "-m", "emergence", "-m", *overrides], check=False)


def failures(sweep_dir: Path, model: str, revisions: list[str]) -> list[str]:
    """Why each of ``revisions`` has no complete run after its round (its FAILED file, if any)."""
    out = []
    for revision in revisions:
        run_dir = sweep_dir / REFINE_FOLDER / model / revision
        if not (run_dir / SUMMARY_FILE).exists():
            failed = run_dir / FAILED_FILE
            out.append(f"{revision}: {failed.read_text().strip() if failed.exists() else 'no results written'}")
    return out


def write_refined(sweep_dir: Path, plans: dict[str, ModelPlan]) -> dict:
    refined = {model: {name: r.to_dict() for name, r in plan.refinements.items()} for model, plan in plans.items()}
    atomic_write_text(sweep_dir / REFINED_FILE, json.dumps(refined, indent=2) + "\n")
    return refined


def refine(
    sweep_dir: Path,
    milestones: list[str],
    per_round: int = 1,
    scan: bool = False,
    overrides: Sequence[str] = (),
    sink_epsilon: float = sinks.EPSILON,
) -> dict:
    """Rounds until every milestone of every model is one interval (or has no bracket); returns
    and writes ``refined.json``."""
    sweep_dir = Path(sweep_dir).resolve()
    # Per model, read once: the panel runs' overrides and the checkpoints that exist.
    configuration: dict[str, tuple[list[str], list[str]]] = {}
    existing: dict[str, list[PanelEntry]] = {}  # the distinct checkpoints: no duplicate or defective branch
    for round_number in itertools.count(1):
        trajectories = load_runs([sweep_dir])
        plans = {}
        for model, traj in trajectories.items():
            if model not in existing:
                configuration[model] = panel_overrides(traj)
                task = configuration[model][0]
                cfg = compose_config(merge_overrides(task, [o for o in overrides if not is_hydra(override_key(o))]))
                every = existing_checkpoints(cfg)
                considered = plan_model(
                    traj, every, milestones, per_round, scan, thresholds_of(traj), sink_epsilon
                ).considered
                defective = defective_branches(cfg, every, considered, sweep_dir)
                existing[model] = [e for e in every if e.revision not in defective]
            distinct = {e.revision for e in existing[model]}
            traj = trajectories[model] = dataclasses.replace(
                traj, checkpoints=[c for c in traj.checkpoints if c.revision in distinct]
            )
            plans[model] = plan_model(
                traj, existing[model], milestones, per_round, scan, thresholds_of(traj), sink_epsilon
            )
        if not any(plan.pending for plan in plans.values()):
            break
        write_refined(sweep_dir, plans)  # what is known so far, marked incomplete
        for model, plan in plans.items():
            if plan.pending:
                open_milestones = [name for name, r in plan.refinements.items() if not r.complete]
                print(
                    f"refine round {round_number}: {model}: analysing {', '.join(plan.pending)} "
                    f"for {', '.join(open_milestones)}",
                    flush=True,
                )
                launch_round(sweep_dir, model, configuration[model], plan.pending, list(overrides))
                failed = failures(sweep_dir, model, plan.pending)
                if failed:
                    raise RuntimeError(
                        f"{model}: {len(failed)} refinement job(s) failed ({'; '.join(failed)}); "
                        "fix the cause and run refine again (finished jobs are kept)"
                    )
    plans = {
        m: with_probabilities(trajectories[m], plan, thresholds_of(trajectories[m]), sink_epsilon)
        for m, plan in plans.items()
    }
    return write_refined(sweep_dir, plans)


def defective_branches(cfg, existing: list[PanelEntry], names: list[str], sweep_dir: Path) -> set[str]:
    """The branches among ``names`` that are not distinct checkpoints (a duplicate of a later branch)
    or hold wrong weights (``integrity.check``, kept in the sweep's ``integrity.json``): no milestone
    interval may end on one, and the bisection steps over them. A toy has none."""
    if cfg.model.toy is not None:
        return set()
    step_of = {e.revision: e.step for e in existing}
    checks = check(
        cfg.model.name_or_path, {n: step_of[n] for n in names}, cfg.model.architecture, sweep_dir / INTEGRITY_FILE
    )
    defective = {branch for branch, c in checks.items() if c.verdict == "duplicate" or c.fails}
    for branch in sorted(defective, key=lambda b: step_of[b]):
        print(f"refine: {cfg.model.key}: stepping over {branch} ({checks[branch].line})", flush=True)
    return defective


def thresholds_of(traj: Trajectory) -> tuple[float, float]:
    """The (class, circuit) thresholds the runs were screened with (the schema's defaults if they differ)."""
    return traj.thresholds or (ThresholdConfig.class_default, ThresholdConfig.circuit)


def main(argv=None) -> None:
    p = CommandParser("python -m emergence.refine", __doc__)
    p.add_argument("sweep_dir", type=Path, help="a panel sweep directory (hydra.sweep.dir of python -m emergence -m)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for the refinement jobs (e.g. hydra/launcher=slurm)")
    p.add_argument(
        "--milestones",
        nargs="+",
        default=list(DEFAULT_MILESTONES),
        metavar="NAME",
        help=f"milestones to refine (default: {' '.join(DEFAULT_MILESTONES)}; any of {' '.join(MILESTONES)})",
    )
    p.add_argument(
        "--parallel",
        type=int,
        default=1,
        metavar="K",
        help="checkpoints analysed per milestone per round (default 1: bisection)",
    )
    p.add_argument(
        "--scan",
        action="store_true",
        help="analyse every checkpoint of each bracket: the first crossing is then certain",
    )
    p.add_argument(
        "--sink-epsilon",
        type=float,
        default=sinks.EPSILON,
        help="Gu et al.'s sink level for the sink_* milestones (default %(default)s)",
    )
    args = p.parse_intermixed_args(argv)  # overrides may come before or after the options
    # A Hydra override right after --milestones is read as one more milestone: give it back.
    args.overrides += [m for m in args.milestones if "=" in m]
    args.milestones = [m for m in args.milestones if "=" not in m]
    unknown = sorted(set(args.milestones) - set(MILESTONES))
    if unknown:
        p.error(f"unknown milestone(s) {', '.join(unknown)}: choose from {' '.join(MILESTONES)}")
    if args.parallel < 1:
        p.error("--parallel must be >= 1")
    if not 0 < args.sink_epsilon < 1:  # also refuses nan
        p.error("--sink-epsilon must be in (0, 1): a share of attention")
    if not args.sweep_dir.is_dir():
        p.error(f"{args.sweep_dir} is not a directory: give the sweep directory of a panel multirun")
    try:
        refined = refine(args.sweep_dir, args.milestones, args.parallel, args.scan, args.overrides, args.sink_epsilon)
    except (UsageError, FileNotFoundError, ValueError, ConnectionError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2 if not isinstance(err, RuntimeError) else 1)
    for model, answers in refined.items():
        for name, r in answers.items():
            if r["interval"]:
                print(
                    f"{model} {name}: {r['panel_bracket'][0]}..{r['panel_bracket'][1]} -> "
                    f"{r['interval'][0]}..{r['interval'][1]} ({r['evaluations']} of {r['inside_bracket']} "
                    f"checkpoints inside analysed"
                    + ("" if r["probability"] is None else f", P = {r['probability']:.2f}")
                    + ")"
                )
            elif r["reason"]:
                print(f"{model} {name}: {r['reason']}")
    print(f"refined: {args.sweep_dir / REFINED_FILE}")


if __name__ == "__main__":
    main()
