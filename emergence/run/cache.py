"""Reuse: the per-head measurements of a checkpoint, cached on disk.

Everything the screen, the spectral step and the intervals need (per-sequence attention
to the targets and key 0's sink importance, the null's sums, both spectral estimators, the clean metrics,
the sink mechanism's value norms and residual-stream reductions) depends on
the checkpoint, the probe, the null's draws, the dtype and this code, not on the
thresholds or the bootstrap. Keyed by those, a threshold re-sweep
(``-m threshold=paper,strict,lenient``) with ablation off runs no model at all.

Files: ``<cache_dir>/measurements/<key>.npz``; delete the folder to clear the cache.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np

import emergence
from emergence.core.atomic import atomic_write_bytes, npz_bytes
from emergence.recipe import mechanism
from emergence.recipe.measurements import Measurements

# Bump when the capture, the probe or what an entry holds changes: old entries then stop matching.
MEASUREMENT_VERSION = 5


# stored as arrays (the residual's as residual_<field>; an optional one only where measured); the rest as JSON
ARRAYS = ("targets", "sink_importance", "null_sums", "pr", "entropy_rank", "clean_loss", "value_norm_ratio")
OPTIONAL_ARRAYS = ("position_losses", "prefix_matching")
RESIDUAL_PREFIX = "residual_"


def checkpoint_identity(path: str, revision: str | None) -> list:
    """What names the weights: a local directory by its files' sizes and times, a Hub
    checkpoint by repo and revision."""
    local = Path(path).expanduser()
    if local.is_dir():
        return [str(local.resolve())] + [[f.name, f.stat().st_size, f.stat().st_mtime_ns]
                                         for f in sorted(local.glob("*")) if f.suffix in (".safetensors", ".json")]
    return [path, revision]


def key(identity: list, probe: dict, null_draws: int, dtype: str) -> str:
    text = json.dumps({"checkpoint": identity, "probe": probe, "null_draws": null_draws, "dtype": dtype,
                       "version": [MEASUREMENT_VERSION, emergence.__version__]}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def entry_of(cfg, path: str, revision: str | None, dtype: str) -> str:
    """The key of the checkpoint ``path@revision`` under the run ``cfg`` (a ``config.Config``): its
    probe, null and ``dtype`` ("float32", ...)."""
    return key(checkpoint_identity(path, revision), asdict(cfg.probe), cfg.stats.n_null, dtype)


def has(cache_dir: str, entry: str) -> bool:
    return entry_path(cache_dir, entry).exists()


def needs_weights(cfg, measurements_cached: bool) -> bool:
    """Whether a run of ``cfg`` loads the model: to measure what the cache lacks, to ablate
    (ablation depends on the thresholds, which pick the circuit, so it is never cached), or to run
    a task (``probe.task``, never cached)."""
    return not measurements_cached or cfg.ablate.enabled or cfg.probe.task is not None


def entry_path(cache_dir: str, entry: str) -> Path:
    """The file of a cache entry (``entry_of``) under ``cache_dir``."""
    return Path(cache_dir).expanduser() / "measurements" / f"{entry}.npz"


def load(path: Path) -> Measurements | None:
    """The measurements of the cache entry ``path`` (``entry_path``); None if it is not there."""
    if not path.exists():
        return None
    with np.load(path) as data:
        meta = json.loads(str(data["meta"]))
        residual = mechanism.ResidualStats(**{k.removeprefix(RESIDUAL_PREFIX): data[k] for k in data.files
                                              if k.startswith(RESIDUAL_PREFIX)})
        optional = {name: data[name] if name in data.files else None for name in OPTIONAL_ARRAYS}
        return Measurements(**{name: data[name] for name in ARRAYS}, **optional, residual=residual, **meta)


def save(path: Path, m: Measurements) -> None:
    meta = {f.name: getattr(m, f.name) for f in fields(m) if f.name not in (*ARRAYS, *OPTIONAL_ARRAYS, "residual")}
    residual = {RESIDUAL_PREFIX + name: a for name, a in m.residual.arrays().items()}
    optional = {name: getattr(m, name) for name in OPTIONAL_ARRAYS if getattr(m, name) is not None}
    # atomic: a crash leaves no half entry
    arrays = {**{name: getattr(m, name) for name in ARRAYS}, **residual, **optional}
    atomic_write_bytes(path, npz_bytes(**arrays, meta=json.dumps(meta)))
