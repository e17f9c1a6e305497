"""When the ablation's verdict is decided: a paired interval over sequences of the causal criterion.

The causal criterion of ``ablation.effect`` is g = r_c - f |r_r|: the circuit's rise of the
loss of B minus ``causal_factor`` (f) times the size of the controls' mean change. Since
-f|x| = min(-f x, +f x), g is the smaller of two *linear* functions of the per-condition
mean losses, g = min(m+, m-) with m+/- the means over sequences of the per-sequence values
(L_circuit - L_clean) -/+ f (mean over control sets of L_control - L_clean). Every sequence
gives a paired value of each branch, so each branch has an ordinary interval for its mean
(Student t over sequences: the per-sequence values are independent, since the probe's
sequences are independent draws, and with n >= 64 the mean is close to normal), and
[min(lo+, lo-), min(hi+, hi-)] covers g when both branch intervals cover theirs.

Looking at the data as it comes and stopping at the first decisive look would inflate the
error rate, so a sequential run looks on a fixed schedule of few looks (``look_sizes``: at
``first`` units, then at each doubling while below the total, then at the total) and the looks
share the error budget alpha = 1 - confidence equally: each of K looks spends alpha / K
(``alpha_spent``), split between the two branches (Bonferroni). By the union bound the chance
that any look's interval misses the criterion is at most alpha, whatever the correlation
between looks. Doubling keeps K small (4 looks from 64 to 500 units), so each look demands
little more than a single interval (t ~ 2.7 against 2.2 for the 2.5 % per branch of one),
while each look's interval is about 1/sqrt(2) as wide as the previous look's.
A single interval (``ablate.sequences=all``) spends all of alpha.
Pure numpy/scipy: no model here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np
from scipy import stats


def branches(clean: np.ndarray, circuit: np.ndarray, controls: np.ndarray, causal_factor: float) -> np.ndarray:
    """[2, n] per-sequence values whose means' minimum is the causal criterion g.

    ``clean`` and ``circuit`` [n] per-sequence losses of B; ``controls`` [sets, n]."""
    circuit_rise = circuit - clean
    control_change = controls.mean(axis=0) - clean
    return np.stack([circuit_rise - causal_factor * control_change, circuit_rise + causal_factor * control_change])


def look_sizes(first: int, total: int) -> list[int]:
    """The sample sizes a sequential run over ``total`` units looks at: ``first``, doubling while
    below ``total``, then ``total`` (only ``total`` where ``first`` reaches it)."""
    sizes = []
    while first < total:
        sizes.append(first)
        first *= 2
    return [*sizes, total]


def due_look(sizes: list[int], before: int, n: int) -> int | None:
    """The look (1-based, into ``sizes``) a run makes on going from ``before`` to ``n`` units: the
    last size in (before, n]; None where it passes none. (A run whose steps pass two sizes at once
    makes one look, the later: fewer looks than planned spend less than alpha.)"""
    passed = [look for look, size in enumerate(sizes, start=1) if before < size <= n]
    return passed[-1] if passed else None


def alpha_spent(confidence: float, looks: int = 1) -> float:
    """The error budget of each look of a sequential run of ``looks`` looks (equal shares); all of
    it for a single interval (``looks=1``)."""
    return (1 - confidence) / looks


def interval(values: np.ndarray, confidence: float, look: int | None = None, looks: int = 1) -> dict:
    """The criterion, the least of the branches' means, and its interval from [branches, n] values
    (``branches``' two; the task sweeps' one per draw): each branch's interval at a level that
    lets them hold together (Bonferroni), spending one share of the error budget where the
    interval is look ``look`` of ``looks`` (``alpha_spent``)."""
    n = values.shape[1]
    means = values.mean(axis=1)
    level = 1 - alpha_spent(confidence, looks) / len(values)
    half = (
        stats.t.ppf(1 - (1 - level) / 2, df=n - 1) * values.std(axis=1, ddof=1) / math.sqrt(n)
        if n > 1
        else np.full(len(values), np.inf)
    )
    return {
        "criterion": float(means.min()),
        "low": float((means - half).min()),
        "high": float((means + half).min()),
        "branch_level": level,
        "look": look,
        "looks": looks,
        "n": n,
    }


def decided(iv: dict) -> bool:
    """The interval excludes zero: the causal verdict (criterion > 0) is settled either way."""
    return iv["low"] > 0 or iv["high"] < 0


class SequentialStop:
    """The looks of a sequential run over ``total`` units (``look_sizes`` from ``first``) and the
    verdicts it watches, each by a name: at every due look (``due_look``) each verdict not yet
    decided gets its interval (``interval``, spending the look's share of ``confidence``'s error
    budget) and is decided once that interval excludes zero (``decided``). The induction ablation
    watches one verdict (``ablation.AdaptiveStop``), the task ablations one per sweep
    (``tasks.ablation.SweepStop``)."""

    def __init__(self, first: int, total: int, confidence: float):
        self.sizes = look_sizes(first, total)
        self.confidence = confidence
        self.seen = 0  # units measured at the previous look
        # verdict -> the interval of its last look (its "n": the units used): the decisive look's, or the last one's
        self.intervals: dict[str, dict] = {}

    def look(self, n: int, criteria: Mapping[str, Callable[[], np.ndarray]]) -> list[str]:
        """After ``n`` units: where a look is due, each verdict of ``criteria`` (name -> its
        criterion's values so far, [branches, units], computed only when looked at) that is not yet
        decided gets its interval. The verdicts decided at this look, in ``criteria``'s order."""
        look = due_look(self.sizes, self.seen, n)
        self.seen = n
        if look is None:
            return []
        settled = []
        for name, values in criteria.items():
            if name in self.intervals and decided(self.intervals[name]):
                continue
            self.intervals[name] = interval(values(), self.confidence, look, len(self.sizes))
            if decided(self.intervals[name]):
                settled.append(name)
        return settled
