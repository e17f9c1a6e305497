"""Every window's spectrum, for each W, from the band Gram matrices of a series' updates.

``needed`` are the checkpoints some window reads, by step; the band holds the products of the updates
between consecutive ones. A window of W updates starting at checkpoint s is the Gram block of updates
pos(s) .. pos(s) + W - 1 (its checkpoints are consecutive in ``needed``: ``series.window_starts``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from emergence.core.config import PanelEntry
from emergence.core.errors import UsageError
from emergence.spectral_edge.exact import BandGram
from emergence.spectral_edge.records import MODEL_SCOPE, EdgeWindow, WindowSpectra
from emergence.spectral_edge.series import window_starts
from emergence.spectral_edge.spectrum import spectrum


def needed_checkpoints(entries: Sequence[PanelEntry], windows: Sequence[int]) -> list[int]:
    """The indices into ``entries`` of every checkpoint a window of any W reads, in order."""
    return sorted({i for w in windows for s in window_starts(entries, w) for i in range(s, s + w + 1)})


def band_of_vectors(vectors: np.ndarray, width: int) -> np.ndarray:
    """[checkpoints, scopes, dim] -> the band values [scopes, updates, width] of their updates (the sketch's,
    where each checkpoint is a few numbers per scope)."""
    deltas = np.diff(np.asarray(vectors, dtype=np.float64), axis=0)  # [updates, scopes, dim]
    updates = deltas.shape[0]
    out = np.zeros((deltas.shape[1], updates, width))
    for j in range(min(width, updates)):
        out[:, j:, j] = np.einsum("usd,usd->su", deltas[j:], deltas[: updates - j])
    return out


def spectra(
    entries: Sequence[PanelEntry], needed: Sequence[int], band: BandGram, windows: Sequence[int]
) -> list[WindowSpectra]:
    """Each W's windows of every scope (``band`` over the updates between consecutive ``needed``)."""
    position = {i: k for k, i in enumerate(needed)}
    model = band.scopes.index(MODEL_SCOPE)
    out = []
    for w in windows:
        scopes: dict[str, list[EdgeWindow]] = {s: [] for s in band.scopes}
        for start in window_starts(entries, w):
            first = position[start]
            for k in range(first, first + w):
                if band.values[model, k, 0] == 0:  # a zero update of every parameter
                    a, b = entries[needed[k]], entries[needed[k + 1]]
                    raise UsageError(
                        f"{a.revision} and {b.revision} hold identical weights: one is a copy of the other, "
                        "not a checkpoint of its own step; remove the duplicate"
                    )
            spacing = entries[start + 1].step - entries[start].step
            for s, scope in enumerate(band.scopes):
                found = spectrum(band.window(s, first, w))
                scopes[scope].append(EdgeWindow.of(entries[start], entries[start + w], spacing, found))
        out.append(WindowSpectra.of(w, scopes))
    return out
