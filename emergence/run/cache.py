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
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

import emergence
from emergence.core.atomic import atomic_write_bytes, npz_bytes
from emergence.recipe import mechanism, spectral
from emergence.recipe.ablation import METRICS

# Bump when the capture, the probe or what an entry holds changes: old entries then stop matching.
MEASUREMENT_VERSION = 5


@dataclass(frozen=True)
class Measurements:
    """Per-head results of one probe pass. Arrays are [layers, heads, ...] unless said."""

    targets: np.ndarray  # [n, layers, heads, 7] float32: per-sequence attention from T-1 to the targets
    sink_importance: np.ndarray  # [n, layers, heads] float32: key 0's mean attention over the queries that see it
    null_sums: np.ndarray  # [layers, heads, draws]: the reference null's attention sums
    pr: np.ndarray  # [layers, heads]
    entropy_rank: np.ndarray  # [layers, heads]
    spectral_n: int
    clean_metrics: dict  # the clean model's metrics of B at T-1 (``ablation.METRICS``), means over sequences
    clean_loss: np.ndarray  # [n] per-sequence clean loss of B, in probe order
    value_norm_ratio: np.ndarray  # [layers, heads]: the value drain (``mechanism``)
    residual: mechanism.ResidualStats  # [layers] each: the decoder layers' massive activations
    position_losses: np.ndarray | None  # [n, T-1]: each token's loss (text and repeat probes; else None)
    prefix_matching: np.ndarray | None  # [layers, heads]: the repeat probe's prefix-matching score (else None)
    probe_fingerprint: str  # the probe batch's sha256 (``ProbeBatch.fingerprint``): a text probe's batch is
    # named by its dataset, whose content can change under the same name
    model_type: str
    n_layers: int
    n_heads: int
    head_dim: int

    @property
    def mean_attention(self) -> np.ndarray:
        """[layers, heads, 7] float64 batch-mean attention to each target."""
        return sequence_mean(self.targets)

    @property
    def mean_sink_importance(self) -> np.ndarray:
        """[layers, heads] float64 batch-mean key-0 importance."""
        return sequence_mean(self.sink_importance)

    @classmethod
    def of(cls, cap, arch, probe_fingerprint: str) -> "Measurements":
        """Reduce a probe pass (``capture.Capture``, scored with ``ablation.metrics_per_sequence``) to
        what the screen, spectral, interval and ablation steps keep."""
        clean_metrics = dict(zip(METRICS, cap.scores.mean(axis=0).tolist()))
        return cls(targets=cap.targets, sink_importance=cap.sink_importance, null_sums=cap.null_sums,
                   clean_loss=cap.scores[:, METRICS.index("loss")], value_norm_ratio=cap.value_norm_ratio,
                   residual=cap.residual, position_losses=cap.position_losses,
                   prefix_matching=cap.prefix_matching, probe_fingerprint=probe_fingerprint,
                   pr=spectral.participation_ratio(cap.gram, cap.total, cap.spectral_n),
                   entropy_rank=spectral.entropy_rank(cap.gram),
                   spectral_n=cap.spectral_n, clean_metrics=clean_metrics, model_type=arch.model_type,
                   n_layers=arch.n_layers, n_heads=arch.n_heads, head_dim=arch.head_dim)


def sequence_mean(per_sequence: np.ndarray) -> np.ndarray:
    """[n, ...] float32 per-sequence values -> [...] their mean, accumulated in float64. numpy sums
    over axis 0 one sequence after another, so a float32 accumulator's rounding grows with n
    (up to 4e-5 relative over the paper probe's sequences); a float64 one adds none that float32 can show."""
    return per_sequence.mean(axis=0, dtype=np.float64)


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
    return _path(cache_dir, entry).exists()


def needs_weights(cfg, measurements_cached: bool) -> bool:
    """Whether a run of ``cfg`` loads the model: to measure what the cache lacks, or to ablate
    (ablation depends on the thresholds, which pick the circuit, so it is never cached)."""
    return not measurements_cached or cfg.ablate.enabled


def _path(cache_dir: str, entry: str) -> Path:
    return Path(cache_dir).expanduser() / "measurements" / f"{entry}.npz"


def load(cache_dir: str, entry: str) -> Measurements | None:
    path = _path(cache_dir, entry)
    if not path.exists():
        return None
    with np.load(path) as data:
        meta = json.loads(str(data["meta"]))
        residual = mechanism.ResidualStats(**{k.removeprefix(RESIDUAL_PREFIX): data[k] for k in data.files
                                              if k.startswith(RESIDUAL_PREFIX)})
        optional = {name: data[name] if name in data.files else None for name in OPTIONAL_ARRAYS}
        return Measurements(**{name: data[name] for name in ARRAYS}, **optional, residual=residual, **meta)


def save(cache_dir: str, entry: str, m: Measurements) -> None:
    meta = {f.name: getattr(m, f.name) for f in fields(m) if f.name not in (*ARRAYS, *OPTIONAL_ARRAYS, "residual")}
    residual = {RESIDUAL_PREFIX + name: a for name, a in m.residual.arrays().items()}
    optional = {name: getattr(m, name) for name in OPTIONAL_ARRAYS if getattr(m, name) is not None}
    # atomic: a crash leaves no half entry
    arrays = {**{name: getattr(m, name) for name in ARRAYS}, **residual, **optional}
    atomic_write_bytes(_path(cache_dir, entry), npz_bytes(**arrays, meta=json.dumps(meta)))
