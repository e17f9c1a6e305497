"""Steps 1 and 3's record: the per-head measurements of one probe pass, and its spectral estimates.

What the screen, the intervals and ablation read, and what the cache keeps (``run/cache.py``): it
depends on the checkpoint, the probe, the null's draws and the dtype, not on the thresholds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from jaxtyping import Float

from emergence.recipe import spectral
from emergence.recipe.ablation import METRICS


@dataclass(frozen=True)
class PassRecord:
    """Per-head results of one probe pass. Arrays are [layers, heads, ...] unless said."""

    targets: Float[np.ndarray, "n layers heads 7"]  # float32: per-sequence attention from T-1 to the targets
    null_sums: Float[np.ndarray, "layers heads draws"]  # the reference null's attention sums
    pr: Float[np.ndarray, "layers heads"]
    entropy_rank: Float[np.ndarray, "layers heads"]
    spectral_n: int
    clean_metrics: dict  # the clean model's metrics of B at T-1 (``ablation.METRICS``), means over sequences
    clean_loss: Float[np.ndarray, " n"]  # per-sequence clean loss of B, in probe order
    position_losses: Float[np.ndarray, "n T-1"] | None  # each token's loss (text and repeat probes; else None)
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

    @classmethod
    def of(cls, cap, spectral_estimates: spectral.SpectralEstimates, arch, probe_fingerprint: str) -> PassRecord:
        """Reduce a probe pass (``capture.Capture``, scored with ``ablation.metrics_per_sequence``) and its
        spectral estimates (step 3) to what the screen, interval and ablation steps keep."""
        clean_metrics = dict(zip(METRICS, cap.scores.mean(axis=0).tolist()))
        return cls(
            targets=cap.targets,
            null_sums=cap.null_sums,
            clean_loss=cap.scores[:, METRICS.index("loss")],
            position_losses=cap.position_losses,
            probe_fingerprint=probe_fingerprint,
            pr=spectral_estimates.pr,
            entropy_rank=spectral_estimates.entropy_rank,
            spectral_n=spectral_estimates.n_sequences,
            clean_metrics=clean_metrics,
            model_type=arch.model_type,
            n_layers=arch.n_layers,
            n_heads=arch.n_heads,
            head_dim=arch.head_dim,
        )


def sequence_mean(per_sequence: np.ndarray) -> np.ndarray:
    """[n, ...] float32 per-sequence values -> [...] their mean, accumulated in float64. numpy sums
    over axis 0 one sequence after another, so a float32 accumulator's rounding grows with n
    (up to 4e-5 relative over the paper probe's sequences); a float64 one adds none that float32 can show."""
    return per_sequence.mean(axis=0, dtype=np.float64)
