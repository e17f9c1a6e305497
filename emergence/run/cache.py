"""Reuse: the probe pass's per-head measurements of a checkpoint, and each measure's results, cached on disk.

Everything the screen, the spectral step and the intervals need (per-sequence attention to the targets,
the null's sums, both spectral estimators, the clean metrics) depends on
the checkpoint (the content of the weight files read, and its config), the probe, the null's draws, the
dtype and this code, not on the thresholds or the bootstrap. Keyed by those, a threshold re-sweep
(``-m threshold=paper,strict,lenient``) with ablation off runs no model at all.

Each chosen measure's results have an entry of their own, keyed by the checkpoint, the dtype, the
measure's name, version and settings, and the probe where the measure reads the pass: adding,
dropping or re-versioning one measure touches no other entry.

Files: ``<cache_dir>/measurements/<key>.npz`` (the pass), ``<cache_dir>/measures/<name>/<key>.npz``
(a measure's); delete the folders to clear the cache.
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
from emergence.measures import Chosen
from emergence.measures.plugin import MeasureResult
from emergence.recipe.pass_record import PassRecord

# Bump when the capture, the probe or what an entry holds changes: old entries then stop matching.
MEASUREMENT_VERSION = 7


# stored as arrays (an optional one only where measured); the rest as JSON
ARRAYS = ("targets", "null_sums", "pr", "entropy_rank", "clean_loss")
OPTIONAL_ARRAYS = ("position_losses",)
COLUMN_PREFIX = "column__"  # a measure's per-head column in its entry
SEQUENCE_PREFIX = "sequence__"  # a measure's per-sequence array in its entry


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


def _digest(content: dict) -> str:
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:32]


def key(identity: dict, probe: dict, null_draws: int, dtype: str) -> str:
    """The probe pass's entry."""
    return _digest(
        {
            "checkpoint": identity,
            "probe": probe,
            "null_draws": null_draws,
            "dtype": dtype,
            "version": [MEASUREMENT_VERSION, emergence.__version__],
        }
    )


def measure_entry_path(cfg, identity: dict | None, dtype: str, chosen: Chosen) -> Path | None:
    """Where ``chosen``'s results on the checkpoint ``identity`` are kept under the run ``cfg``; None without
    an identity or with reuse=false. The probe is part of the key only for a measure that reads the pass."""
    if identity is None or not cfg.reuse:
        return None
    content = {"checkpoint": identity, "dtype": dtype, "measure": chosen.identity()}
    if chosen.measure.in_pass:
        content["probe"] = asdict(cfg.probe)
    name = chosen.name
    return Path(cfg.cache_dir).expanduser() / "measures" / name / f"{_digest(content)}.npz"


def measures_missing(cfg, identity: dict | None, dtype: str) -> bool:
    """Whether the cache lacks the results of any measure ``cfg`` chooses."""
    paths = [measure_entry_path(cfg, identity, dtype, c) for c in measures.chosen(cfg.measures)]
    return any(path is None or not path.exists() for path in paths)


def load_result(path: Path | None) -> MeasureResult | None:
    """A measure's cached results (``measure_entry_path``); None if not there."""
    if path is None or not path.exists():
        return None
    with np.load(path) as data:
        per_head = {k.removeprefix(COLUMN_PREFIX): data[k] for k in data.files if k.startswith(COLUMN_PREFIX)}
        sequences = {k.removeprefix(SEQUENCE_PREFIX): data[k] for k in data.files if k.startswith(SEQUENCE_PREFIX)}
        return MeasureResult(per_head, json.loads(str(data["per_run"])), sequences)


def save_result(path: Path, result: MeasureResult) -> None:
    columns = {COLUMN_PREFIX + name: grid for name, grid in result.per_head.items()}
    sequences = {SEQUENCE_PREFIX + name: values for name, values in result.per_sequence.items()}
    atomic_write_bytes(path, npz_bytes(**columns, **sequences, per_run=json.dumps(result.per_run)))


def entry_of(cfg, identity: dict | None, dtype: str) -> str | None:
    """The key of the checkpoint named by ``identity`` (``checkpoint_identity``) under the run ``cfg``
    (a ``config.Config``): its probe, null and ``dtype`` ("float32", ...); None without an identity."""
    return None if identity is None else key(identity, asdict(cfg.probe), cfg.stats.n_null, dtype)


def has(cache_dir: str, entry: str | None) -> bool:
    return entry is not None and entry_path(cache_dir, entry).exists()


def needs_weights(cfg, measurements_cached: bool, measures_missing: bool) -> bool:
    """Whether a run of ``cfg`` loads the model: to measure what the cache lacks (the pass's
    measurements, a measure's results), to ablate (ablation depends on the thresholds, which pick the
    circuit, so it is never cached), or to run a task (``probe.task``, never cached)."""
    return not measurements_cached or measures_missing or cfg.ablate.enabled or cfg.probe.task is not None


def entry_path(cache_dir: str, entry: str) -> Path:
    """The file of a cache entry (``entry_of``) under ``cache_dir``."""
    return Path(cache_dir).expanduser() / "measurements" / f"{entry}.npz"


def load(path: Path) -> PassRecord | None:
    """The measurements of the cache entry ``path`` (``entry_path``); None if it is not there."""
    if not path.exists():
        return None
    with np.load(path) as data:
        meta = json.loads(str(data["meta"]))
        optional: dict[str, Any] = {name: data[name] if name in data.files else None for name in OPTIONAL_ARRAYS}
        return PassRecord(**{name: data[name] for name in ARRAYS}, **optional, **meta)


def save(path: Path, m: PassRecord) -> None:
    meta = {f.name: getattr(m, f.name) for f in fields(m) if f.name not in (*ARRAYS, *OPTIONAL_ARRAYS)}
    optional = {name: getattr(m, name) for name in OPTIONAL_ARRAYS if getattr(m, name) is not None}
    # atomic: a crash leaves no half entry
    arrays = {**{name: getattr(m, name) for name in ARRAYS}, **optional}
    atomic_write_bytes(path, npz_bytes(**arrays, meta=json.dumps(meta)))
