"""The spectral edge of a checkpoint series: one window's spectrum, and ``edge.json``'s records
(Xu 2026, "Spectral Edge Dynamics of Training Trajectories", arXiv 2603.15678; docs/edge.md).

A window is W consecutive updates delta_1..delta_W of one scope's parameters, stacked as the rows of
D [W, dim]. Its Gram matrix G = D D^T [W, W] holds every inner product of two updates: the squared
singular values of D are G's eigenvalues, so the spectrum never needs D's (huge) right singular vectors,
and a random projection of the rows (``emergence/edge/projection``) keeps G, hence the ratios, nearly
unchanged. ``python -m emergence.edge`` computes it (``emergence/edge/``); the panel report reads
``edge.json`` for F6 (``panel/edge_findings.py``).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from emergence.core.atomic import atomic_write_text
from emergence.core.config import PanelEntry
from emergence.core.record import Record

EDGE_FILE = "edge.json"
MODEL_SCOPE = "model"  # the scope of every trained parameter (the others: "L<i>", "L<i>H<j>")


COLLAPSE_RATIO = 1.20  # the paper's tau: sigma_2/sigma_3 below it after its peak is the collapse


@dataclass(frozen=True)
class Spectrum:
    """What a window's Gram matrix says. A ratio whose denominator is zero (a window of lower rank) is None."""

    singular_values: list[float]  # sigma_1 >= ... >= sigma_W, sqrt(max(lambda_j, 0))
    r12: float | None  # sigma_1 / sigma_2
    r23: float | None  # sigma_2 / sigma_3: the paper's spectral edge
    k_star: int  # argmax_j sigma_j / sigma_{j+1}, 1-based: the signal rank
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
    sigma = np.sqrt(np.maximum(lam, 0.0))  # rounding can leave a zero eigenvalue slightly negative
    # sigma_j / sigma_{j+1}, infinite where sigma_{j+1} is zero: the window's rank is then its signal rank
    with np.errstate(divide="ignore", invalid="ignore"):
        gaps = np.where(sigma[1:] > 0, sigma[:-1] / np.where(sigma[1:] > 0, sigma[1:], 1.0), np.inf)
    total = float(np.maximum(lam, 0.0).sum())
    return Spectrum(
        singular_values=[float(s) for s in sigma],
        r12=ratio(sigma[0], sigma[1]),
        r23=ratio(sigma[1], sigma[2]),
        k_star=int(np.argmax(gaps)) + 1,
        pc1_share=float(max(lam[0], 0.0) / total) if total > 0 else 0.0,
        pc2_share=float(max(lam[1], 0.0) / total) if total > 0 else 0.0,
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


FIGURE_FILE = "edge.png"


@dataclass(frozen=True)
class EdgeWindow(Record):
    """One window of one scope: its W updates run from checkpoint ``first_step`` to ``last_step`` =
    first_step + W x spacing; the rest is its ``Spectrum``."""

    first_step: int
    last_step: int
    first_tokens: int | None  # None: the series states no tokens (nor model.tokens_per_step)
    last_tokens: int | None
    spacing: int  # steps between two consecutive checkpoints of the window
    singular_values: list[float]
    r12: float | None
    r23: float | None
    k_star: int
    pc1_share: float
    pc2_share: float
    drift_speed: float

    @classmethod
    def of(cls, first: PanelEntry, last: PanelEntry, spacing: int, spectrum: Spectrum) -> EdgeWindow:
        return cls(first.step, last.step, first.tokens, last.tokens, spacing, **dataclasses.asdict(spectrum))


@dataclass(frozen=True)
class Collapse(Record):
    """Where a scope's sigma_2/sigma_3 peaks, and its first window after the peak below the paper's 1.20:
    indices into the scope's windows (None: no ratio / no collapse)."""

    peak: int | None
    collapse: int | None

    @classmethod
    def of(cls, windows: list[EdgeWindow]) -> Collapse:
        return cls(*collapse([w.r23 for w in windows]))


@dataclass(frozen=True)
class Edge(Record):
    """``edge.json``: a series' windows, per scope, and where each scope's sigma_2/sigma_3 peaks and collapses."""

    model: str  # the model's key (``model=...``): the panel report places its edge on this model's axis
    window: int  # W
    projection: str  # jl | exact
    dim: int | None  # jl: the projection's dimension; exact: None
    scopes: dict[str, list[EdgeWindow]]  # "model", "L<i>", "L<i>H<j>"
    collapse: dict[str, Collapse]

    def save(self, directory: Path) -> Path:
        path = Path(directory) / EDGE_FILE
        atomic_write_text(path, json.dumps(self.to_json(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, directory: Path) -> Edge:
        return cls.from_json(json.loads((Path(directory) / EDGE_FILE).read_text()))
