"""The series read checkpoint by checkpoint into every scope's windows.

Only what a window needs is held: the previous checkpoint's vectors and the last W deltas per scope
(``projection``: ``dim`` numbers each with ``jl``). A checkpoint no window needs is never read.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

import numpy as np
from tqdm.auto import tqdm

from emergence.core.config import PanelEntry
from emergence.core.errors import UsageError
from emergence.edge.series.windows import check_series, window_starts
from emergence.recipe.edge import MODEL_SCOPE, EdgeWindow, gram, spectrum

# one checkpoint's vectors: {scope: [dim] float64}
Reader = Callable[[PanelEntry], dict[str, np.ndarray]]


def stream_windows(entries: Sequence[PanelEntry], read: Reader, window: int) -> dict[str, list[EdgeWindow]]:
    """Every window of every scope, in order (``entries`` by step; ``read`` gives a checkpoint's vectors)."""
    check_series(entries)
    starts = window_starts(entries, window)
    ends = {s + window for s in starts}
    needed = {i for s in starts for i in range(s, s + window + 1)}
    out: dict[str, list[EdgeWindow]] = {}
    deltas: dict[str, deque[np.ndarray]] = {}
    previous: dict[str, np.ndarray] = {}
    for i in tqdm(sorted(needed), desc="edge", unit="checkpoint"):
        vectors = read(entries[i])
        if previous and i - 1 in needed:  # the delta from the checkpoint before
            a, b = entries[i - 1], entries[i]
            if not np.any(vectors[MODEL_SCOPE] != previous[MODEL_SCOPE]):
                raise UsageError(
                    f"{a.revision} and {b.revision} hold identical weights: one is a copy of the other, "
                    "not a checkpoint of its own step; remove the duplicate"
                )
            for scope, v in vectors.items():
                deltas.setdefault(scope, deque(maxlen=window)).append(v - previous[scope])
        else:  # a new run of checkpoints: no delta reaches back over the gap
            deltas.clear()
        previous = vectors
        if i in ends:  # the last W deltas are one window's, at one spacing (window_starts)
            first, last = entries[i - window], entries[i]
            spacing = entries[i].step - entries[i - 1].step
            for scope, d in deltas.items():
                out.setdefault(scope, []).append(EdgeWindow.of(first, last, spacing, spectrum(gram(np.stack(d)))))
    return out
