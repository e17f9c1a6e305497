"""Control head sets: the one way both ablations draw them, pure numpy.

A control matches a head set layer by layer: in each of its layers, as many heads as the set holds
there, drawn without replacement from that layer's pool of eligible heads (``matched_draw``). The
induction ablation draws its controls with one generator from pools that leave out the circuit and
the heads set aside (``ablation.draw_controls``); the task ablations draw the study's matched-random
control with one ``RandomState(seed)`` per seed from pools that leave out the screen's heads
(``tasks.matched_random``). Either keeps the first draws whose heads no earlier draw holds
(``first_distinct``), as many as asked or as the pools allow (``count_distinct``).

Both generators (``numpy.random.Generator`` and ``RandomState``) have the same ``choice``, so one
draw serves both, each consuming its generator layer by layer in the order the counts are given.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol, TypeVar

import numpy as np

HeadSpec = dict[int, list[int]]  # layer -> heads; the dict's insertion order is the order a draw walks the layers
Key = TypeVar("Key")


class Chooser(Protocol):
    """A numpy generator's ``choice``: ``Generator`` and ``RandomState`` alike."""

    def choice(self, a: Sequence[int], size: int, replace: bool) -> np.ndarray: ...


def heads_of(spec: HeadSpec) -> list[tuple[int, int]]:
    """The spec as (layer, head) pairs, in its order."""
    return [(layer, head) for layer, heads in spec.items() for head in heads]


def matched_draw(counts: Mapping[int, int], pools: Mapping[int, Sequence[int]], rng: Chooser) -> HeadSpec:
    """One control: per layer of ``counts`` (layer -> how many heads), in its order, min(count, pool
    size) heads of the layer's ``pools`` entry drawn without replacement, sorted. ``rng`` is consumed
    across the layers (and is left advanced)."""
    return {
        layer: sorted(int(head) for head in rng.choice(pools[layer], size=min(k, len(pools[layer])), replace=False))
        for layer, k in counts.items()
    }


def count_distinct(counts: Mapping[int, int], pools: Mapping[int, Sequence[int]]) -> int:
    """How many distinct controls ``matched_draw`` can give: per layer, the ways to choose its heads
    from its pool, multiplied over the layers."""
    return math.prod(math.comb(len(pools[layer]), min(k, len(pools[layer]))) for layer, k in counts.items())


def first_distinct(draws: Iterable[tuple[Key, HeadSpec]], wanted: int) -> list[tuple[Key, HeadSpec]]:
    """The first ``wanted`` of ``draws`` ((key, control), drawn lazily) whose heads no earlier draw
    holds; ``draws`` must hold that many distinct controls (ask no more than ``count_distinct``)."""
    found: list[tuple[Key, HeadSpec]] = []
    seen: set[frozenset[tuple[int, int]]] = set()
    draws = iter(draws)
    while len(found) < wanted:  # checked before each draw: a draw not needed is not made
        key, control = next(draws)
        heads = frozenset(heads_of(control))
        if heads not in seen:
            seen.add(heads)
            found.append((key, control))
    return found
