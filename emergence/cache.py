"""Reuse: the per-head measurements of a checkpoint, cached on disk.

Everything the screen and the spectral step need (batch-mean attention to the targets,
both spectral estimators, the clean metrics) depends on the checkpoint, the probe, the
dtype and this code, not on the thresholds. Keyed by those, a threshold re-sweep
(``-m threshold=paper,strict,lenient``) with ablation off runs no model at all.

Files: ``<cache_dir>/measurements/<key>.npz``; delete the folder to clear the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

import emergence
from emergence import spectral

# Bump when the capture or the probe changes numerically: old entries then stop matching.
MEASUREMENT_VERSION = 2  # 2: per-sequence clean loss of B (adaptive ablation pairs with it)


@dataclass(frozen=True)
class Measurements:
    """Per-head results of one probe pass. Arrays are [layers, heads, ...]."""

    mean_attention: np.ndarray  # [layers, heads, 7]
    pr: np.ndarray  # [layers, heads]
    entropy_rank: np.ndarray  # [layers, heads]
    spectral_n: int
    clean_metrics: dict
    clean_loss: np.ndarray  # [n] per-sequence clean loss of B, in probe order
    model_type: str
    n_layers: int
    n_heads: int
    head_dim: int

    @classmethod
    def of(cls, cap, arch, clean_loss: np.ndarray) -> "Measurements":
        """Reduce a probe pass (``capture.Capture``, with its per-sequence clean losses) to what
        the screen, spectral and ablation steps keep."""
        return cls(mean_attention=cap.mean_attention(),
                   pr=spectral.participation_ratio(cap.gram, cap.total, cap.spectral_n),
                   entropy_rank=spectral.entropy_rank(cap.gram),
                   spectral_n=cap.spectral_n, clean_metrics=cap.clean_metrics, clean_loss=clean_loss, model_type=arch.model_type,
                   n_layers=arch.n_layers, n_heads=arch.n_heads, head_dim=arch.head_dim)


ARRAYS = ("mean_attention", "pr", "entropy_rank", "clean_loss")  # stored as arrays; the rest as JSON


def checkpoint_identity(path: str, revision: str | None) -> list:
    """What names the weights: a local directory by its files' sizes and times, a Hub
    checkpoint by repo and revision."""
    local = Path(path).expanduser()
    if local.is_dir():
        return [str(local.resolve())] + [[f.name, f.stat().st_size, f.stat().st_mtime_ns]
                                         for f in sorted(local.glob("*")) if f.suffix in (".safetensors", ".json")]
    return [path, revision]


def key(identity: list, probe: dict, dtype: str) -> str:
    text = json.dumps({"checkpoint": identity, "probe": probe, "dtype": dtype,
                       "version": [MEASUREMENT_VERSION, emergence.__version__]}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _path(cache_dir: str, entry: str) -> Path:
    return Path(cache_dir).expanduser() / "measurements" / f"{entry}.npz"


def load(cache_dir: str, entry: str) -> Measurements | None:
    path = _path(cache_dir, entry)
    if not path.exists():
        return None
    with np.load(path) as data:
        meta = json.loads(str(data["meta"]))
        return Measurements(**{name: data[name] for name in ARRAYS}, **meta)


def save(cache_dir: str, entry: str, m: Measurements) -> None:
    path = _path(cache_dir, entry)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {k: v for k, v in asdict(m).items() if k not in ARRAYS}
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz")
    with os.fdopen(fd, "wb") as f:
        np.savez(f, **{name: getattr(m, name) for name in ARRAYS}, meta=json.dumps(meta))
    os.replace(tmp, path)  # atomic: a crash leaves no half entry
