"""Reuse: the per-head measurements of a checkpoint, cached on disk.

Everything the screen, the spectral step and the intervals need (per-sequence attention
to the targets and key 0's sink importance, the null's sums, both spectral estimators, the clean metrics,
the sink mechanism's value norms and residual-stream reductions, the plug-in measures' results) depends on
the checkpoint (the content of the weight files read, and its config), the probe, the null's
draws, the dtype and this code (with the registered measures' versions), not on the
thresholds or the bootstrap. Keyed by those, a threshold re-sweep
(``-m threshold=paper,strict,lenient``) with ablation off runs no model at all.

Files: ``<cache_dir>/measurements/<key>.npz``; delete the folder to clear the cache.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import numpy as np

import emergence
from emergence import measures
from emergence.core.atomic import atomic_write_bytes, npz_bytes
from emergence.hub import checkpoints
from emergence.recipe import mechanism
from emergence.recipe.measurements import Measurements, MeasureResult

# Bump when the capture, the probe or what an entry holds changes: old entries then stop matching.
MEASUREMENT_VERSION = 5


# stored as arrays (the residual's as residual_<field>; an optional one only where measured); the rest as JSON
ARRAYS = ("targets", "sink_importance", "null_sums", "pr", "entropy_rank", "clean_loss", "value_norm_ratio")
OPTIONAL_ARRAYS = ("position_losses", "prefix_matching")
RESIDUAL_PREFIX = "residual_"
PLUGIN_PREFIX = "plugin__"  # a plug-in measure's column: plugin__<measure>__<column>


def checkpoint_identity(src: checkpoints.Source, hf_config) -> dict | None:
    """What names the model a run measures: the content of the weight files the loader reads
    (``checkpoints.weights_identity``: a GGUF file by its sha256, a folder's, a cached or a Hub
    revision's shards by theirs), the weights format policy, and the config as transformers read it.
    None where the weights cannot be named (the Hub unreachable): such a run neither reads nor keeps
    an entry."""
    weights = checkpoints.weights_identity(src)
    if weights is None:
        return None
    return {"weights_sha256": weights, "weights_format": src.weights_format, "config": hf_config.to_json_string()}


def key(identity: dict, probe: dict, null_draws: int, dtype: str) -> str:
    # the plug-in measures and their versions: an entry holds each one's results (``Measurements.plugins``)
    text = json.dumps(
        {
            "checkpoint": identity,
            "probe": probe,
            "null_draws": null_draws,
            "dtype": dtype,
            "version": [MEASUREMENT_VERSION, emergence.__version__],
            "measures": measures.versions(),
        },
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def entry_of(cfg, identity: dict | None, dtype: str) -> str | None:
    """The key of the checkpoint named by ``identity`` (``checkpoint_identity``) under the run ``cfg``
    (a ``config.Config``): its probe, null and ``dtype`` ("float32", ...); None without an identity."""
    return None if identity is None else key(identity, asdict(cfg.probe), cfg.stats.n_null, dtype)


def has(cache_dir: str, entry: str | None) -> bool:
    return entry is not None and entry_path(cache_dir, entry).exists()


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
        residual = mechanism.ResidualStats(
            **{k.removeprefix(RESIDUAL_PREFIX): data[k] for k in data.files if k.startswith(RESIDUAL_PREFIX)}
        )
        optional: dict[str, Any] = {name: data[name] if name in data.files else None for name in OPTIONAL_ARRAYS}
        per_run = meta.pop("plugins")
        per_head: dict[str, dict[str, np.ndarray]] = {name: {} for name in per_run}
        for k in data.files:
            if k.startswith(PLUGIN_PREFIX):
                name, column = k.removeprefix(PLUGIN_PREFIX).split("__", 1)
                per_head[name][column] = data[k]
        plugins = {name: MeasureResult(per_head[name], fields) for name, fields in per_run.items()}
        return Measurements(
            **{name: data[name] for name in ARRAYS}, **optional, residual=residual, **meta, plugins=plugins
        )


def save(path: Path, m: Measurements) -> None:
    meta = {
        f.name: getattr(m, f.name)
        for f in fields(m)
        if f.name not in (*ARRAYS, *OPTIONAL_ARRAYS, "residual", "plugins")
    }
    meta["plugins"] = {name: r.per_run for name, r in m.plugins.items()}
    residual = {RESIDUAL_PREFIX + name: a for name, a in m.residual.arrays().items()}
    plugin_columns = {
        f"{PLUGIN_PREFIX}{name}__{column}": grid for name, r in m.plugins.items() for column, grid in r.per_head.items()
    }
    optional = {name: getattr(m, name) for name in OPTIONAL_ARRAYS if getattr(m, name) is not None}
    # atomic: a crash leaves no half entry
    arrays = {**{name: getattr(m, name) for name in ARRAYS}, **residual, **optional, **plugin_columns}
    atomic_write_bytes(path, npz_bytes(**arrays, meta=json.dumps(meta)))
