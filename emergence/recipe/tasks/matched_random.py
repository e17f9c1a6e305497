"""Head specs and the reference study's matched-random (MR) control, pure numpy.

A head spec maps layer -> heads, and its insertion order is part of it: the MR draw consumes
one random generator layer by layer in that order, so the same heads in another layer order
give other MR heads. A top-K screen walks its ranking (layers in order of first appearance,
heads in rank order: Pythia's name movers L13H1, L10H6, L10H5, L10H4, L11H7 give
{13: [1], 10: [6, 5, 4], 11: [7]}); a threshold circuit walks the heads layer-major (layers
and heads ascending).

The MR control of a spec ablates, in each of its layers, as many heads as the spec does there,
drawn uniformly from that layer's other heads. With the study's generator and order (one
``numpy.random.RandomState(seed)`` consumed across the layers; ``choice`` over the eligible
heads in ascending order; the draw sorted) seed 123 gives the MR heads its ablation files list,
and a fresh generator per seed the heads of its 10-seed sweep.

A layer with few other heads allows few distinct controls (3 of a layer's 4 heads: one), and
then fresh seeds repeat the same heads: ``distinct_draws`` keeps each distinct set once, and the
sweep's spread and ratio are stated only over at least ``MIN_DISTINCT_DRAWS`` of them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from emergence.core.errors import UsageError
from emergence.core.record import Record
from emergence.recipe.controls import HeadSpec, count_distinct, first_distinct, heads_of, matched_draw

MR_SEED = 123  # the study's seed for the one MR draw of every ablation
SWEEP_SEEDS = tuple(range(10))  # the study's 10-seed sweep
# The study's ratio rule, in percentage points of top-1: below this MR mean the ratio is not a
# number; it is infinite if the screen moved top-1 by more than INFINITE_RATIO_MIN_SCREEN_PP.
RATIO_MIN_MR_PP = 0.5
INFINITE_RATIO_MIN_SCREEN_PP = 1.0
# Below this many distinct draws a spread is not a spread (2 draws give one difference) and a
# ratio to their mean rests on one or two head sets: neither is stated.
MIN_DISTINCT_DRAWS = 3


def spec_from_ranking(heads: Iterable[tuple[int, int]]) -> HeadSpec:
    """A top-K screen's spec: (layer, head) pairs in rank order -> layers in order of first
    appearance, heads in rank order."""
    spec: HeadSpec = {}
    for layer, head in heads:
        spec.setdefault(int(layer), []).append(int(head))
    return spec


def spec_from_circuit(heads: Iterable[tuple[int, int]]) -> HeadSpec:
    """A threshold circuit's spec: layers ascending, heads ascending (the order in which the
    study walks its layer-major selectivity table), whatever the order of ``heads``."""
    return spec_from_ranking(sorted((int(layer), int(head)) for layer, head in heads))


def union(a: HeadSpec, b: HeadSpec) -> HeadSpec:
    """The heads of both specs: per layer the sorted set union; layers in ``a``'s order, then
    ``b``'s layers that ``a`` lacks, in ``b``'s order."""
    layers = list(a) + [layer for layer in b if layer not in a]
    return {layer: sorted(set(a.get(layer, [])) | set(b.get(layer, []))) for layer in layers}


def layers_of(spec: HeadSpec, n_heads: int) -> HeadSpec:
    """Every head of the spec's layers (the study's 'full name-mover layers' condition), in the
    spec's layer order."""
    return {layer: list(range(n_heads)) for layer in spec}


def _counts_and_pools(spec: HeadSpec, n_heads: int) -> tuple[dict[int, int], dict[int, list[int]]]:
    """The MR draw's counts (as many heads per layer as the spec, in its order) and pools (each
    layer's heads outside the spec, ascending)."""
    return (
        {layer: len(picks) for layer, picks in spec.items()},
        {layer: [head for head in range(n_heads) if head not in picks] for layer, picks in spec.items()},
    )


def matched_random(spec: HeadSpec, n_heads: int, rng: np.random.RandomState) -> HeadSpec:
    """The study's MR control of ``spec`` in a model of ``n_heads`` heads per layer.

    For each layer in the spec's insertion order: eligible = the layer's heads not in the spec,
    ascending; draw min(len(picks), len(eligible)) of them with ``rng.choice(..., replace=False)``
    and sort them (``controls.matched_draw``). ``rng`` is consumed across the layers (and is left
    advanced)."""
    return matched_draw(*_counts_and_pools(spec, n_heads), rng)


def matched_random_seeds(spec: HeadSpec, n_heads: int, seeds: Iterable[int] = SWEEP_SEEDS) -> list[HeadSpec]:
    """One MR control per seed, each from a fresh ``RandomState(seed)`` (the study's sweep)."""
    return [matched_random(spec, n_heads, np.random.RandomState(seed)) for seed in seeds]


def possible_draws(spec: HeadSpec, n_heads: int) -> int:
    """How many distinct MR controls of ``spec`` a model of ``n_heads`` heads per layer allows: per
    layer, the ways to choose its drawn heads among its other heads, multiplied over the layers."""
    return count_distinct(*_counts_and_pools(spec, n_heads))


def distinct_draws(spec: HeadSpec, n_heads: int, n: int) -> list[tuple[int, HeadSpec]]:
    """(seed, MR control) of up to ``n`` distinct controls of ``spec``: one fresh ``RandomState(seed)``
    per seed 0, 1, 2, ..., a draw whose heads an earlier seed drew skipped, until ``n`` are found or
    every distinct control the layers allow (``possible_draws``) is. Where seeds 0..n-1 draw ``n``
    distinct sets these are the study's sweep (``matched_random_seeds``)."""
    draws = ((seed, matched_random(spec, n_heads, np.random.RandomState(seed))) for seed in itertools.count())
    # ends: each draw is uniform over the ``possible_draws`` sets
    return first_distinct(draws, min(n, possible_draws(spec, n_heads)))


def check_heads(spec: HeadSpec, n_layers: int, n_heads: int, what: str) -> None:
    """Refuse a spec with a head outside a model of ``n_layers`` x ``n_heads``.

    The study's ablation hook did not check: head 10 of 8-head Pythia sliced nothing and was
    silently a no-op, so some of its published conditions ablated fewer heads than listed."""
    for layer, head in heads_of(spec):
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise UsageError(
                f"{what}: head L{layer}H{head} is outside the model ({n_layers} layers x {n_heads} heads); "
                f"list only heads L0-L{n_layers - 1}, H0-H{n_heads - 1} (heads taken from another model?)"
            )


@dataclass(frozen=True)
class SeedSweep(Record):
    """A screen's ablation effect against its distinct MR controls (deltas are ablated minus
    baseline; top-1 deltas in percentage points, other metrics in their own units)."""

    screen_delta: float
    deltas: list[float]  # [draws] the distinct MR controls' deltas, in seed order
    mean: float
    std: float | None  # ddof=1, as the study; None under MIN_DISTINCT_DRAWS draws (``why``)
    min: float
    max: float
    # Top-1 only: screen_delta / mean; inf where the MR mean is within 0.5 pp of zero and the
    # screen moved by more than 1 pp (the study prints an unsigned infinity); None where both are
    # that small (the study prints a dash), under MIN_DISTINCT_DRAWS draws, or for another metric.
    ratio: float | None
    why: str | None = None  # why std or ratio is None, in words; None where both are numbers or the dash


def seed_sweep(screen_delta: float, random_deltas: Sequence[float], top1: bool = True) -> SeedSweep:
    """The study's summary of a sweep of distinct draws (its ``build_mr_table.py``): mean, sample
    std, range and the specificity ratio, whose thresholds are in pp of top-1 (``top1``; another
    metric gets no ratio). Under ``MIN_DISTINCT_DRAWS`` draws neither std nor ratio is given."""
    deltas = np.asarray(random_deltas, dtype=np.float64)  # [draws]
    mean = float(deltas.mean())
    std: float | None = float(deltas.std(ddof=1)) if len(deltas) >= MIN_DISTINCT_DRAWS else None
    ratio: float | None = None
    why = None
    if std is None:
        why = (
            f"{len(deltas)} distinct matched-random draw{'s' if len(deltas) != 1 else ''}: no std or ratio "
            f"over fewer than {MIN_DISTINCT_DRAWS}"
        )
    elif not top1:
        why = "no ratio: the study's ratio rule is in percentage points of top-1"
    elif abs(mean) >= RATIO_MIN_MR_PP:
        ratio = screen_delta / mean
    elif abs(screen_delta) > INFINITE_RATIO_MIN_SCREEN_PP:
        ratio = math.inf
    return SeedSweep(
        screen_delta=float(screen_delta),
        deltas=[float(d) for d in deltas],
        mean=mean,
        std=std,
        min=float(deltas.min()),
        max=float(deltas.max()),
        ratio=ratio,
        why=why,
    )
