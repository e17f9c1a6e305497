"""Reading a panel: per-head selectivities (and PR) of one model at several revisions.

Two sources give the same ``Trajectory``:
* run directories written by ``python -m emergence`` (``summary.json`` + ``heads.csv``);
* the reference study's files (``per_revision/*.json`` + ``pr/*_trajectory.json``).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from emergence.config import compose_config
from emergence.results import PER_SEQUENCE_FILE, SUMMARY_FILE, read_json, read_run
from emergence.screen import CLASSES

# Reference file prefixes -> our model keys, and how their revision names give tokens.
REFERENCE_PREFIXES = {"pythia1b": "pythia", "olmo": "olmo", "olmoe": "olmoe"}
REFERENCE_PR_FILES = {"pythia": "pythia_1b_phase1_trajectory.json", "olmo": "olmo_phase1_trajectory.json",
                      "olmoe": "olmoe_phase1_trajectory.json"}
PYTHIA_TOKENS_PER_STEP = 2_097_152
REFINE_FOLDER = "refine"  # python -m emergence.refine writes its runs to <sweep>/refine/<model>/<revision>/
REFINED_FILE = "refined.json"  # ... and its answers to <sweep>/refined.json


@dataclass
class Checkpoint:
    """One revision of one model. ``sel`` [layers, heads, 6] (order ``CLASSES``); ``pr`` [layers, heads]."""

    revision: str
    tokens: float
    sel: np.ndarray
    pr: np.ndarray | None = None
    extras: dict = field(default_factory=dict)  # e.g. the toy models' in-context score, the dtype it ran in
    targets: np.ndarray | None = None  # [n, layers, heads, 7] per-sequence attentions (run directories only)
    sink_importance: np.ndarray | None = None  # [n, layers, heads] Gu et al.'s key-0 importance (run directories)
    run_dir: Path | None = None  # the run directory it was read from (run directories only)
    refined: bool = False  # analysed by ``python -m emergence.refine`` (a run under <sweep>/refine/), not the panel


@dataclass
class Trajectory:
    model: str  # the panel's name: the model key, with "-seed<N>" when several training seeds are compared
    checkpoints: list[Checkpoint]  # ordered by tokens
    pr_estimator: str | None  # which spectral estimator ``pr`` holds
    thresholds: tuple[float, float] | None = None  # (class, circuit) the runs were screened with, if one pair
    family: str | None = None  # the model key shared by the seeds of one model (None: a single panel)

    @property
    def tokens(self) -> np.ndarray:
        return np.array([c.tokens for c in self.checkpoints], dtype=float)

    @property
    def sel(self) -> np.ndarray:
        """[revisions, layers, heads, 6]"""
        return np.stack([c.sel for c in self.checkpoints])


def reference_tokens(model: str, revision: str) -> float:
    if model == "pythia":
        return int(re.fullmatch(r"step(\d+)", revision).group(1)) * PYTHIA_TOKENS_PER_STEP
    return int(re.search(r"tokens(\d+)B", revision).group(1)) * 1e9


def reference_dtype(model: str) -> str | None:
    """The dtype the study ran ``model`` in: its preset's ``model.reference_dtype``."""
    return compose_config([f"model={model}"]).model.reference_dtype


def _head_grid(per_head: dict, value) -> np.ndarray:
    """{"L3_H7": x} -> [layers, heads, ...] array of value(x)."""
    index = {tuple(map(int, re.fullmatch(r"L(\d+)_H(\d+)", k).groups())): v for k, v in per_head.items()}
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
        sel = _head_grid(data["all_head_selectivity"],
                         lambda d: [d[c.replace("_", "-")] for c in CLASSES])
        dtype = reference_dtype(model)  # the study's own numbers: computed in the dtype it ran
        by_model.setdefault(model, []).append(Checkpoint(revision, reference_tokens(model, revision), sel,
                                                         extras={"dtype": dtype, "reference_dtype": dtype}))
    trajectories = {}
    for model, checkpoints in by_model.items():
        checkpoints.sort(key=lambda c: c.tokens)
        pr_path = root / "pr" / REFERENCE_PR_FILES[model]
        if pr_path.exists():
            pr_data = read_json(pr_path)
            for i, revision in enumerate(pr_data["revisions"]):
                pr = _head_grid(pr_data["pr"], lambda values: values[i])
                for c in checkpoints:
                    if c.revision == revision:
                        c.pr = pr
        trajectories[model] = Trajectory(model, checkpoints, "pr_entropy_rank" if pr_path.exists() else None)
    return trajectories


def find_runs(paths: list[Path]) -> dict[Path, bool]:
    """Complete run directories (with a summary) at or under the given paths, each with whether
    it is a refinement run (under a ``refine/`` folder of the path it was found in)."""
    found = {}
    for path in map(Path, paths):
        for summary in sorted(path.rglob(SUMMARY_FILE)) if path.is_dir() else []:
            run_dir = summary.parent
            found[run_dir] = found.get(run_dir, False) or REFINE_FOLDER in run_dir.relative_to(path).parts[:1]
    return dict(sorted(found.items()))


def load_runs(paths: list[Path], pr_estimator: str = "pr_entropy_rank") -> dict[str, Trajectory]:
    """Runs grouped by ``summary['model']`` (and by training seed where a model has several),
    ordered by tokens. A revision analysed twice (e.g. under two threshold presets) is kept
    once: the selectivities do not depend on it."""
    by_model: dict[tuple, dict[str, Checkpoint]] = {}
    used: dict[tuple, set] = {}
    for run_dir, refined in find_runs(paths).items():
        summary, rows = read_run(run_dir)
        if summary["tokens"] is None:
            raise ValueError(f"{run_dir}: run has no token count (revision {summary['revision']!r}); "
                             "a panel needs revisions with known tokens: rerun with model.tokens_per_step=<N> "
                             "where the family's tokens per step are known")
        n_layers, n_heads = summary["n_layers"], summary["n_heads"]
        sel = np.zeros((n_layers, n_heads, len(CLASSES)))
        pr = np.zeros((n_layers, n_heads))
        for r in rows:
            sel[r["layer"], r["head"]] = [r[f"sel_{c}"] for c in CLASSES]
            pr[r["layer"], r["head"]] = r[pr_estimator]
        extras = {k: summary[k] for k in ("icl_score", "weights_sha256", "dtype", "reference_dtype", "null")
                  if summary.get(k) is not None}
        classes = set(summary.get("thresholds", {}).get("classes", {}).values())
        panel = (summary["model"], summary.get("training_seed"))
        used.setdefault(panel, set()).add(
            (classes.pop(), summary["thresholds"]["circuit"]) if len(classes) == 1 else None)
        arrays = {}
        if (run_dir / PER_SEQUENCE_FILE).exists():
            with np.load(run_dir / PER_SEQUENCE_FILE) as npz:
                arrays = {name: npz[name] for name in ("targets", "sink_importance") if name in npz}
        by_model.setdefault(panel, {})[summary["revision"]] = Checkpoint(
            summary["revision"], float(summary["tokens"]), sel, pr, extras, **arrays, run_dir=run_dir, refined=refined)
    if not by_model:
        raise FileNotFoundError(f"no run directories (with {SUMMARY_FILE}) under {', '.join(map(str, paths))}")
    seeds = Counter(model for model, _ in by_model)
    trajectories = {}
    for (model, seed), cs in sorted(by_model.items(), key=lambda item: (item[0][0], item[0][1] or 0)):
        several = seeds[model] > 1
        name = f"{model}-seed{seed}" if several else model
        trajectories[name] = Trajectory(name, sorted(cs.values(), key=lambda c: c.tokens), pr_estimator,
                                        next(iter(used[(model, seed)])) if len(used[(model, seed)]) == 1 else None,
                                        family=model if several else None)
    return trajectories


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
