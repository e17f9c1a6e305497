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

Looking at the data after every minibatch and stopping at the first decisive look would
inflate the error rate, so the looks share the error budget alpha = 1 - confidence: look j
(j = 1, 2, ...) spends alpha_j = alpha x 6 / (pi^2 j^2) (these sum to alpha over any number of
looks, so the schedule need not be known in advance, and early looks, where a clear verdict
stops the run, get the largest shares), split between the two branches (Bonferroni). A
single interval over the whole probe (``ablate.sequences=all``) spends all of alpha.
Pure numpy/scipy: no model here.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats


def branches(clean: np.ndarray, circuit: np.ndarray, controls: np.ndarray, causal_factor: float) -> np.ndarray:
    """[2, n] per-sequence values whose means' minimum is the causal criterion g.

    ``clean`` and ``circuit`` [n] per-sequence losses of B; ``controls`` [sets, n]."""
    circuit_rise = circuit - clean
    control_change = controls.mean(axis=0) - clean
    return np.stack([circuit_rise - causal_factor * control_change, circuit_rise + causal_factor * control_change])


def alpha_spent(confidence: float, look: int | None) -> float:
    """The error budget of look ``look`` (1-based) of a sequential run; all of it for a single interval (None)."""
    alpha = 1 - confidence
    return alpha if look is None else alpha * 6 / (math.pi ** 2 * look ** 2)


def interval(values: np.ndarray, confidence: float, look: int | None = None) -> dict:
    """The criterion, the least of the branches' means, and its interval from [branches, n] values
    (``branches``' two; the task sweeps' one per draw): each branch's interval at a level that
    lets them hold together (Bonferroni)."""
    n = values.shape[1]
    means = values.mean(axis=1)
    level = 1 - alpha_spent(confidence, look) / len(values)
    half = (stats.t.ppf(1 - (1 - level) / 2, df=n - 1) * values.std(axis=1, ddof=1) / math.sqrt(n) if n > 1
            else np.full(2, np.inf))
    return {"criterion": float(means.min()), "low": float((means - half).min()), "high": float((means + half).min()),
            "branch_level": level, "look": look, "n": n}


def decided(iv: dict) -> bool:
    """The interval excludes zero: the causal verdict (criterion > 0) is settled either way."""
    return iv["low"] > 0 or iv["high"] < 0
