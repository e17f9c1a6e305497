"""The windows of a checkpoint series, and the series it refuses.

A window is W consecutive updates at one spacing: checkpoints first, first + s, ..., first + W s. A window
never spans a change of spacing (Pythia saves log-spaced early steps, then one every 1,000): the updates
of one window then are comparable, each the motion of s training steps. Rolling windows advance by one
checkpoint. A series is refused, in one line, where it names a step twice, where a checkpoint is missing
from a regular spacing (s, k s, s with k >= 2: the gap's checkpoints were lost, or not all copied), or
where no spacing has the W + 1 checkpoints one window needs.
"""

from __future__ import annotations

from collections.abc import Sequence

from emergence.core.config import PanelEntry
from emergence.core.errors import UsageError


def check_series(entries: Sequence[PanelEntry]) -> None:
    """Refuse a step named twice and a checkpoint missing from a regular spacing (``entries`` by step)."""
    for a, b in zip(entries, entries[1:]):
        if a.step == b.step:
            raise UsageError(
                f"the series names step {a.step} twice ({a.revision} and {b.revision}); remove one of them"
            )
    gaps = [b.step - a.step for a, b in zip(entries, entries[1:])]
    for i in range(1, len(gaps) - 1):
        s = gaps[i - 1]
        if gaps[i + 1] == s and gaps[i] != s and gaps[i] % s == 0:
            a, b = entries[i], entries[i + 1]
            lost = ", ".join(f"step {a.step + k * s}" for k in range(1, gaps[i] // s))
            raise UsageError(
                f"checkpoint(s) missing between {a.revision} and {b.revision}: the series saves one every "
                f"{s} steps around them, but not {lost}; restore them, or give only the checkpoints on "
                "one side of the gap"
            )


def window_starts(entries: Sequence[PanelEntry], window: int) -> list[int]:
    """The index of each window's first checkpoint: every run of ``window`` + 1 checkpoints at one spacing
    (``entries`` by step). A UsageError where there is none."""
    gaps = [b.step - a.step for a, b in zip(entries, entries[1:])]
    starts: list[int] = []
    longest = (0, 0)  # (updates, index of the first checkpoint) of the longest run at one spacing
    first = 0
    while first < len(gaps):  # gaps first .. last are equal: checkpoints first .. last + 1 at one spacing
        last = first
        while last + 1 < len(gaps) and gaps[last + 1] == gaps[first]:
            last += 1
        updates = last - first + 1
        starts += range(first, first + updates - window + 1)
        longest = max(longest, (updates, first), key=lambda run: run[0])
        first = last + 1
    if not starts:
        updates, at = longest
        where = f" (every {gaps[at]} steps from {entries[at].revision})" if updates else ""
        raise UsageError(
            f"edge.window={window} needs {window + 1} checkpoints at one spacing; the series has at most "
            f"{updates + 1 if updates else len(entries)}{where}; use a smaller edge.window, or save "
            "checkpoints more often (a toy: model.toy.save_every=N)"
        )
    return starts
