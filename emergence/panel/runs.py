"""Reading a panel: per-head selectivities (and a spectral estimator, F5's PR) of one model at
several revisions.

Runs of a task (``probe.task``, docs/tasks.md) form a trajectory of their own per model and task,
"<model>-<task>", as runs of another probe do: each checkpoint carries its run's task summary, and
a revision measured for two tasks is a point of both trajectories (the synthetic probe's findings
F1-F5 of each are those of the same runs).

Two sources give the same ``Trajectory``:
* run directories written by ``python -m emergence`` (``summary.json`` + ``heads.csv``);
* the reference study's files (``per_revision/*.json`` + ``pr/*_trajectory.json``).
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np

from emergence import measures
from emergence.core.config import ModelConfig, compose_config
from emergence.hub.integrity import INTEGRITY_FILE, stored_verdicts
from emergence.recipe.screen import CLASSES
from emergence.recipe.stats import NullSummary
from emergence.recipe.tasks.step import TaskSummary
from emergence.run.results import HEAD_COLUMNS, PER_SEQUENCE_FILE, SUMMARY_FILE, is_duplicate, read_json, read_run

# Reference file prefixes -> our model keys, and how their revision names give tokens.
REFERENCE_PREFIXES = {"pythia1b": "pythia", "olmo": "olmo", "olmoe": "olmoe"}
REFERENCE_PR_FILES = {
    "pythia": "pythia_1b_phase1_trajectory.json",
    "olmo": "olmo_phase1_trajectory.json",
    "olmoe": "olmoe_phase1_trajectory.json",
}
REFERENCE_CLASSES = {"bos": "first-token"}  # the reference files' class names where ours differ (else _ -> -)
REFERENCE_DATA = Path(__file__).with_name("reference_data")  # the study's results, package data (its SOURCE.md)
REFINE_FOLDER = "refine"  # python -m emergence.refine writes its runs to <sweep>/refine/<model>/<revision>/
REFINED_FILE = "refined.json"  # ... and its answers to <sweep>/refined.json


@dataclass
class Checkpoint:
    """One revision of one model. ``sel`` [layers, heads, 6] (order ``CLASSES``); ``spectral``
    [layers, heads], the spectral estimator its trajectory names (F5's PR)."""

    revision: str
    tokens: float
    sel: np.ndarray
    spectral: np.ndarray | None = None
    targets: np.ndarray | None = None  # [n, layers, heads, 7] per-sequence attentions (run directories only)
    # the measures' per-sequence arrays (per_sequence.npz, ``MeasureResult.per_sequence``) by name, [n, ...]
    # (run directories only)
    sequences: dict[str, np.ndarray] = field(default_factory=dict)
    run_dir: Path | None = None  # the run directory it was read from (run directories only)
    refined: bool = False  # analysed by ``python -m emergence.refine`` (a run under <sweep>/refine/), not the panel
    # What its run recorded (run directories; the reference study's data states the dtypes only)
    dtype: str | None = None  # the dtype it was computed in
    reference_dtype: str | None = None  # the dtype the reference study ran its model in
    weights_sha256: str | None = None  # the fingerprint of the weights the run loaded
    null: NullSummary | None = None  # the run's null calibration
    task: TaskSummary | None = None  # probe.task: the task's capability, screens and ablations
    name_or_path: str | None = None  # the checkpoint's repository (run directories)
    # heads.csv's columns after the screen's (the task's and the measures', ``HeadRow.measure_columns``),
    # [layers, heads] each (run directories; NaN where not measured)
    measure_columns: dict[str, np.ndarray] = field(default_factory=dict)
    # the measures' per-run fields (summary.json ``measures``), by measure name (run directories)
    measure_fields: dict[str, dict] = field(default_factory=dict)

    def sink_values(self) -> np.ndarray | None:
        """[n, layers, heads]: the per-sequence values of the sink definition a measure declares
        (``measures.sink_share``: Gu et al.'s key-0 importance); None where its run has none."""
        share = measures.sink_share()
        return None if share is None else self.sequences.get(share.array)


@dataclass
class Trajectory:
    model: str  # the panel's name: the model key, with "-<task>" for runs of a task, "-seed<N>" when several
    # training seeds are compared and "-<probe>" for a probe other than the synthetic one
    checkpoints: list[Checkpoint]  # ordered by tokens
    spectral_estimator: str | None  # which estimator ``Checkpoint.spectral`` holds (heads.csv's column)
    thresholds: tuple[float, float] | None = None  # (class, circuit) the runs were screened with, if one pair
    family: str | None = None  # the model key shared by the seeds of one model (None: a single panel)
    probe: str = "synthetic"  # the runs' probe.kind: one trajectory per model, seed, probe and task
    task: str | None = None  # the runs' probe.task (every checkpoint has its summary); None: no task
    # what ``Checkpoint.tokens`` counts: tokens, or training steps where the runs recorded no tokens
    # (a local run's checkpoints without token counts and no model.tokens_per_step)
    unit: str = "tokens"

    @property
    def tokens(self) -> np.ndarray:
        return np.array([c.tokens for c in self.checkpoints], dtype=float)

    @property
    def sel(self) -> np.ndarray:
        """[revisions, layers, heads, 6]"""
        return np.stack([c.sel for c in self.checkpoints])


@functools.cache
def preset(model: str) -> ModelConfig:
    """``model``'s preset (``conf/model/<model>.yaml``) as a run composes it; once per model
    (composing takes a fifth of a second)."""
    return compose_config([f"model={model}"]).model


def reference_tokens(model: str, revision: str) -> float:
    """The tokens of a reference revision: Pythia's names give the step (its preset the tokens
    per step), the others' the tokens themselves."""
    if model == "pythia":
        step = re.fullmatch(r"step(\d+)", revision)
        tokens_per_step = preset(model).tokens_per_step
        assert step is not None and tokens_per_step is not None  # Pythia's branches and preset
        return int(step.group(1)) * tokens_per_step
    tokens = re.search(r"tokens(\d+)B", revision)
    assert tokens is not None  # the other reference models' branches
    return int(tokens.group(1)) * 1e9


def _head_of_key(key: str) -> tuple[int, int]:
    """ "L3_H7" -> (3, 7): a head as the reference data names it."""
    found = re.fullmatch(r"L(\d+)_H(\d+)", key)
    assert found is not None, key
    return int(found.group(1)), int(found.group(2))


def _head_grid(per_head: dict, value) -> np.ndarray:
    """{"L3_H7": x} -> [layers, heads, ...] array of value(x)."""
    index = {_head_of_key(k): v for k, v in per_head.items()}
    n_layers = 1 + max(l for l, _ in index)
    n_heads = 1 + max(h for _, h in index)
    return np.array([[value(index[(l, h)]) for h in range(n_heads)] for l in range(n_layers)], dtype=float)


def load_reference(root: Path) -> dict[str, Trajectory]:
    """The reference study's per-head results (format: its SOURCE.md)."""
    root = Path(root)
    files = sorted((root / "per_revision").glob("*_mechinterp_*.json"))
    if not files:
        raise FileNotFoundError(f"no per_revision/*_mechinterp_*.json under {root}")
    by_model: dict[str, list[Checkpoint]] = {}
    for path in files:
        prefix, revision = path.stem.split("_mechinterp_")
        model = REFERENCE_PREFIXES[prefix]
        data = read_json(path)
        sel = _head_grid(
            data["all_head_selectivity"], lambda d: [d[REFERENCE_CLASSES.get(c, c.replace("_", "-"))] for c in CLASSES]
        )
        dtype = preset(model).reference_dtype  # the study's own numbers: computed in the dtype it ran
        by_model.setdefault(model, []).append(
            Checkpoint(revision, reference_tokens(model, revision), sel, dtype=dtype, reference_dtype=dtype)
        )
    trajectories = {}
    for model, checkpoints in by_model.items():
        checkpoints.sort(key=lambda c: c.tokens)
        pr_path = root / "pr" / REFERENCE_PR_FILES[model]
        if pr_path.exists():
            pr_data = read_json(pr_path)
            for i, revision in enumerate(pr_data["revisions"]):
                pr = _head_grid(pr_data["pr"], lambda values: values[i])  # noqa: B023 (called here, with this i)
                for c in checkpoints:
                    if c.revision == revision:
                        c.spectral = pr
        trajectories[model] = Trajectory(model, checkpoints, "pr_entropy_rank" if pr_path.exists() else None)
    return trajectories


def find_runs(paths: list[Path]) -> dict[Path, bool]:
    """Complete run directories (with a summary, not a duplicate's) at or under the given paths, each with whether
    it is a refinement run (under a ``refine/`` folder of the path it was found in)."""
    found: dict[Path, bool] = {}
    for path in map(Path, paths):
        for summary in sorted(path.rglob(SUMMARY_FILE)) if path.is_dir() else []:
            run_dir = summary.parent
            if is_duplicate(run_dir):  # not analysed: its weights are a later branch's (``defective_checkpoints``)
                continue
            found[run_dir] = found.get(run_dir, False) or REFINE_FOLDER in run_dir.relative_to(path).parts[:1]
    return dict(sorted(found.items()))


def load_runs(paths: list[Path], spectral_estimator: str = "pr_entropy_rank") -> dict[str, Trajectory]:
    """Runs grouped by their summary's ``model``, by training seed where a model has several, by
    probe (a trajectory "<model>-text" for ``probe.kind=text``) and by task ("<model>-ioi" for
    ``probe.task=ioi``), ordered by tokens, with heads.csv's ``spectral_estimator`` column as the
    spectral one. A revision analysed twice (e.g. under two threshold presets) is kept once: the
    selectivities do not depend on it."""
    by_model: dict[tuple, dict[str, Checkpoint]] = {}
    used: dict[tuple, set] = {}
    first_tokens: dict[tuple, dict[str, list[str]]] = {}  # panel -> first token -> its revisions
    units: dict[tuple, dict[str, str]] = {}  # panel -> revision -> what its position counts (tokens or steps)
    for run_dir, refined in find_runs(paths).items():
        summary, rows = read_run(run_dir)
        if summary.tokens is None and summary.step is None:
            raise ValueError(
                f"{run_dir}: run has neither a token count nor a step (revision {summary.revision!r}); "
                "a panel needs revisions with a known place in training: analyse named revisions "
                "(revision=r0..r9 or revision=custom revision.name=<checkpoint>)"
            )
        position = summary.tokens if summary.tokens is not None else summary.step
        assert position is not None  # one of them (above)
        revision = cast(str, summary.revision)  # a run with a place in training names its revision
        n_layers, n_heads = summary.n_layers, summary.n_heads
        sel = np.zeros((n_layers, n_heads, len(CLASSES)))
        spectral = np.zeros((n_layers, n_heads))
        measure_columns = {
            column: np.full((n_layers, n_heads), np.nan) for column in rows[0] if column not in HEAD_COLUMNS
        }
        for r in rows:
            sel[r["layer"], r["head"]] = [r[f"sel_{c}"] for c in CLASSES]
            spectral[r["layer"], r["head"]] = r[spectral_estimator]
            for name, grid in measure_columns.items():
                grid[r["layer"], r["head"]] = r[name]
        classes = set(summary.thresholds.classes.values())
        panel = (
            summary.model,
            summary.training_seed,
            summary.probe.kind,
            None if summary.task is None else summary.task.name,
        )
        used.setdefault(panel, set()).add((classes.pop(), summary.thresholds.circuit) if len(classes) == 1 else None)
        first = "random" if summary.probe.first is None else summary.probe.first.kind  # before the field: the study's
        units.setdefault(panel, {})[revision] = "tokens" if summary.tokens is not None else "steps"
        first_tokens.setdefault(panel, {}).setdefault(first, []).append(revision)
        targets, sequences = None, {}
        if (run_dir / PER_SEQUENCE_FILE).exists():
            with np.load(run_dir / PER_SEQUENCE_FILE) as npz:
                targets = npz["targets"] if "targets" in npz else None
                sequences = {name: npz[name] for name in measures.sequence_arrays() if name in npz}
        by_model.setdefault(panel, {})[revision] = Checkpoint(
            revision,
            float(position),
            sel,
            spectral,
            targets,
            sequences,
            run_dir=run_dir,
            refined=refined,
            dtype=summary.dtype,
            reference_dtype=summary.reference_dtype,
            weights_sha256=summary.weights_sha256,
            null=summary.null,
            task=summary.task,
            name_or_path=summary.name_or_path,
            measure_columns=measure_columns,
            measure_fields=summary.measures,
        )
    if not by_model:
        raise FileNotFoundError(f"no run directories (with {SUMMARY_FILE}) under {', '.join(map(str, paths))}")
    for (model, _, probe, _), kinds in first_tokens.items():
        if len(kinds) > 1:  # a sink read behind a BOS and one read behind a random token are not one trajectory
            runs = "; ".join(
                f"{kind}: {', '.join(sorted(map(str, revisions)))}" for kind, revisions in sorted(kinds.items())
            )
            raise ValueError(
                f"the {model} {probe} runs differ in their first token ({runs}); rerun them with one "
                "probe.first_token (random or bos_token)"
            )
    for (model, _, probe, _), unit_of in units.items():
        if len(set(unit_of.values())) > 1:  # steps and tokens are not one axis
            without = sorted(r for r, u in unit_of.items() if u == "steps")
            raise ValueError(
                f"the {model} {probe} runs of {', '.join(without[:3])} have no token count while the "
                "others have: rerun them with model.tokens_per_step=<N>, or all without"
            )
    seeds = Counter((model, probe, task) for model, _, probe, task in by_model)
    trajectories = {}
    for (model, seed, probe, task), cs in sorted(
        by_model.items(), key=lambda item: (item[0][0], item[0][3] or "", item[0][1] or 0, item[0][2])
    ):
        several = seeds[(model, probe, task)] > 1
        family = model if task is None else f"{model}-{task}"  # a task's seeds are compared among themselves
        name = (f"{family}-seed{seed}" if several else family) + ("" if probe == "synthetic" else f"-{probe}")
        thresholds = used[(model, seed, probe, task)]
        trajectories[name] = Trajectory(
            name,
            sorted(cs.values(), key=lambda c: c.tokens),
            spectral_estimator,
            next(iter(thresholds)) if len(thresholds) == 1 else None,
            family=family if several else None,
            probe=probe,
            task=task,
            unit=next(iter(units[(model, seed, probe, task)].values())),
        )
    return trajectories


def defective_checkpoints(paths: list[Path]) -> dict[str, dict[str, str]]:
    """The branches the sweeps' integrity checks (their ``integrity.json``) found defective:
    {repo: {branch: verdict}}."""
    found: dict[str, dict[str, str]] = {}
    for path in map(Path, paths):
        for store in sorted(path.rglob(INTEGRITY_FILE)) if path.is_dir() else []:
            for repo, checks in stored_verdicts(store).items():
                found.setdefault(repo, {}).update({b: c.line for b, c in checks.items() if c.verdict != "ok"})
    return {repo: branches for repo, branches in found.items() if branches}


def load_refined(paths: list[Path]) -> dict[str, dict]:
    """The refinement answers (``python -m emergence.refine``) kept in the given sweep directories:
    {model: {milestone: answer}}."""
    refined: dict[str, dict] = {}
    for path in map(Path, paths):
        if (path / REFINED_FILE).is_file():
            for model, answers in read_json(path / REFINED_FILE).items():
                refined.setdefault(model, {}).update(answers)
    return refined


def shared_thresholds(trajectories: dict[str, Trajectory]) -> tuple[float, float] | None:
    """The (class, circuit) thresholds every run of every model was screened with, if one pair."""
    pairs = {t.thresholds for t in trajectories.values()}
    return pairs.pop() if len(pairs) == 1 else None
