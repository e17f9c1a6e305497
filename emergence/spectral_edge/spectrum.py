"""One window's spectrum from its Gram matrix: the maths of the spectral edge (Xu 2026, "Spectral Edge
Dynamics of Training Trajectories", arXiv 2603.15678; docs/edge.md).

A window is W consecutive updates delta_1..delta_W of one scope's parameters, stacked as the rows of
D [W, dim]. Its Gram matrix G = D D^T [W, W] holds every inner product of two updates: the squared
singular values of D are G's eigenvalues, so the spectrum never needs D's (huge) right singular vectors.
G is a sum over any partition of the coordinates of each part's own Gram matrix, which is what lets
``exact.py`` build it block by block of rows without holding a checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

COLLAPSE_RATIO = 1.20  # the paper's tau: sigma_2/sigma_3 below it after its peak is the collapse
K95_SHARE = 0.95  # k95: how many directions hold this share of the window's squared motion


@dataclass(frozen=True)
class Spectrum:
    """What a window's Gram matrix says. A ratio whose denominator is zero (a window of lower rank) is None."""

    singular_values: list[float]  # sigma_1 >= ... >= sigma_W, sqrt(lambda_j), rounding's zeroed
    r12: float | None  # sigma_1 / sigma_2
    r23: float | None  # sigma_2 / sigma_3: the paper's spectral edge
    k_star: int  # argmax_j sigma_j / sigma_{j+1}, 1-based: the signal rank
    k95: int  # the fewest directions whose lambda_j sum to >= 95% of sum(lambda) (0 for a window that does not move)
    pc1_share: float  # lambda_1 / sum(lambda): the share of the window's squared motion along one direction
    pc2_share: float
    drift_speed: float  # sqrt(sum(G)) / W = |delta_1 + ... + delta_W| / W: the mean update's length


def gram(deltas: np.ndarray) -> np.ndarray:
    """[W, dim] -> [W, W] float64: the inner products of the window's updates."""
    d = np.asarray(deltas, dtype=np.float64)
    return d @ d.T


def ratio(num: float, den: float) -> float | None:
    return float(num / den) if den > 0 else None


def spectrum(g: np.ndarray) -> Spectrum:
    """The spectrum of one window from its Gram matrix ``g`` [W, W] (symmetric, float64, W >= 3)."""
    w = g.shape[0]
    lam = np.linalg.eigvalsh(np.asarray(g, dtype=np.float64))[::-1]  # decreasing
    # A zero eigenvalue comes out as rounding of either sign, up to about W * eps * lambda_1 (the rank
    # tolerance of numpy's matrix_rank): zero it, or a window of rank 2 would show a third direction.
    lam = np.where(lam > w * np.finfo(np.float64).eps * max(lam[0], 0.0), lam, 0.0)
    sigma = np.sqrt(lam)
    # sigma_j / sigma_{j+1}, infinite where sigma_{j+1} is zero: the window's rank is then its signal rank
    with np.errstate(divide="ignore", invalid="ignore"):
        gaps = np.where(sigma[1:] > 0, sigma[:-1] / np.where(sigma[1:] > 0, sigma[1:], 1.0), np.inf)
    total = float(lam.sum())
    return Spectrum(
        singular_values=[float(s) for s in sigma],
        r12=ratio(sigma[0], sigma[1]),
        r23=ratio(sigma[1], sigma[2]),
        k_star=int(np.argmax(gaps)) + 1,
        k95=int(np.searchsorted(np.cumsum(lam), K95_SHARE * total) + 1) if total > 0 else 0,
        pc1_share=float(lam[0] / total) if total > 0 else 0.0,
        pc2_share=float(lam[1] / total) if total > 0 else 0.0,
        # sum(G) = |sum_i delta_i|^2 >= 0 up to rounding
        drift_speed=float(np.sqrt(max(float(g.sum()), 0.0) / w**2)),
    )


def collapse(r23: list[float | None], tau: float = COLLAPSE_RATIO) -> tuple[int | None, int | None]:
    """(the window where sigma_2/sigma_3 peaks, the first window after it where the ratio is below ``tau``),
    as indices into ``r23`` (None: no ratio at all / no collapse after the peak)."""
    known = [(v, i) for i, v in enumerate(r23) if v is not None]
    if not known:
        return None, None
    peak = max(known, key=lambda vi: (vi[0], -vi[1]))[1]  # the first of equal maxima
    after = next((i for i in range(peak + 1, len(r23)) if (v := r23[i]) is not None and v < tau), None)
    return peak, after
