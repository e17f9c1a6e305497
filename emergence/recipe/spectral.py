"""Step 3 - the spectral signal of each head (docs/method.md section 5), pure numpy.

Both estimators work from the running sums that the capture step accumulates, so the
[n, head_dim] matrix X of a head's outputs is never held:
``gram`` = X^T X and ``total`` = sum of rows of X, over ``n`` rows.

* ``participation_ratio``: (sum l)^2 / sum l^2 over the eigenvalues l of the covariance
  of the centred X - the quantity the study names. Ranges from 1 to head_dim.
* ``entropy_rank``: exp(entropy) of p_i = s_i^2 / sum s^2 over the singular values s of
  the *uncentred* X - what the reference code actually computed. s_i^2 are the
  eigenvalues of X^T X, so it too comes from ``gram``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from jaxtyping import Float


@dataclass(frozen=True)
class SpectralEstimates:
    """Step 3's record: both estimators for every head."""

    pr: Float[np.ndarray, "layers heads"]  # participation ratio of the centred head outputs at T-1
    entropy_rank: Float[np.ndarray, "layers heads"]  # entropy effective rank of the uncentred ones
    n_sequences: int  # the sequences whose outputs entered the sums


def estimates(gram: np.ndarray, total: np.ndarray, n: int) -> SpectralEstimates:
    """[layers, heads, d, d] Gram matrices and [layers, heads, d] row sums over ``n`` sequences -> both estimators."""
    return SpectralEstimates(participation_ratio(gram, total, n), entropy_rank(gram), n)


def participation_ratio(gram: np.ndarray, total: np.ndarray, n: int) -> np.ndarray:
    """[..., d, d] Gram matrices, [..., d] row sums, row count -> [...] PR of the centred rows."""
    mean = total / n
    scatter = gram - n * mean[..., :, None] * mean[..., None, :]
    eig = np.clip(np.linalg.eigvalsh(scatter), 0.0, None)  # the 1/(n-1) factor cancels in the ratio
    return _ratio(eig.sum(-1) ** 2, (eig**2).sum(-1))


def entropy_rank(gram: np.ndarray) -> np.ndarray:
    """[..., d, d] Gram matrices of uncentred rows -> [...] exp(entropy of s^2 / sum s^2)."""
    eig = np.clip(np.linalg.eigvalsh(gram), 0.0, None)
    total = eig.sum(-1, keepdims=True)
    p = np.divide(eig, total, out=np.zeros_like(eig), where=total > 0)
    plogp = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    return np.exp(-plogp.sum(-1))


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    # A head whose output never varies has no spectrum: PR is undefined (NaN), not 0 or 1.
    return np.divide(num, den, out=np.full_like(num, np.nan), where=den > 0)
