"""The adaptive ablation's statistics, without a model."""

import math

import numpy as np
import pytest
from scipy import stats

from emergence.recipe import ablation, verdict


def losses(rng, n, circuit_rise, control_change, sd=1.0, sets=2):
    clean = rng.gamma(2.0, 1.0, n)
    circuit = clean + circuit_rise + rng.normal(0, sd, n)
    controls = clean + control_change + rng.normal(0, sd, (sets, n))
    return clean, circuit, controls


@pytest.mark.parametrize("control_change", [-0.35, 0.0, 0.4])
def test_the_branches_give_the_criterion_of_ablation_effect(control_change):
    clean, circuit, controls = losses(np.random.default_rng(0), 200, 1.3, control_change)
    values = verdict.branches(clean, circuit, controls, causal_factor=3.0)
    e = ablation.effect(clean.mean(), circuit.mean(), list(controls.mean(axis=1)), causal_factor=3.0)
    criterion = e.circuit_loss_increase - 3.0 * abs(e.controls_loss_increase_mean)
    assert values.mean(axis=1).min() == pytest.approx(criterion)
    assert (criterion > 0) == e.causal


def test_the_interval_is_each_branchs_t_interval_at_the_bonferroni_level():
    values = np.random.default_rng(1).normal([[1.0], [0.3]], 1.0, (2, 100))
    iv = verdict.interval(values, confidence=0.9)
    per_branch = [stats.t.interval(0.95, 99, loc=v.mean(), scale=stats.sem(v)) for v in values]
    assert iv["low"] == pytest.approx(min(lo for lo, _ in per_branch))
    assert iv["high"] == pytest.approx(min(hi for _, hi in per_branch))
    assert iv["criterion"] == pytest.approx(values.mean(axis=1).min())


def test_the_looks_share_the_error_budget():
    assert sum(verdict.alpha_spent(0.95, j) for j in range(1, 100_000)) == pytest.approx(0.05, rel=1e-4)
    assert verdict.alpha_spent(0.95, None) == pytest.approx(0.05)
    assert verdict.alpha_spent(0.95, 1) > verdict.alpha_spent(0.95, 2) > verdict.alpha_spent(0.95, 3)
    assert verdict.decided({"low": 0.1, "high": 2}) and verdict.decided({"low": -2, "high": -0.1})
    assert not verdict.decided({"low": -0.1, "high": 0.1})


def sequential(values, confidence=0.95, first=64, step=16):
    """The adaptive rule: looks from ``first`` on, every ``step`` sequences; (stopped, n, interval)."""
    n_total = values.shape[1]
    for look, n in enumerate(range(first, n_total, step), start=1):
        iv = verdict.interval(values[:, :n], confidence, look)
        if verdict.decided(iv):
            return True, n, iv
    return False, n_total, verdict.interval(values, confidence)


def test_sequential_looks_keep_the_error_rate_when_the_criterion_is_zero():
    rng = np.random.default_rng(2)
    wrong = 0
    runs = 400
    for _ in range(runs):  # criterion exactly 0: r_c = 0.9, controls -0.3, f = 3
        clean, circuit, controls = losses(rng, 500, 0.9, -0.3, sd=1.5, sets=1)
        stopped, _, _ = sequential(verdict.branches(clean, circuit, controls, 3.0))
        wrong += stopped
    # Either decision is wrong here; the budget is 5 %, binomial noise of 400 runs allows ~8 %.
    assert wrong / runs < 0.08


def test_a_clear_effect_stops_early_and_agrees_with_all_sequences():
    clean, circuit, controls = losses(np.random.default_rng(3), 500, 1.4, -0.05, sd=0.8, sets=1)
    values = verdict.branches(clean, circuit, controls, 3.0)
    stopped, n, iv = sequential(values)
    assert stopped and n < 125 and iv["low"] > 0
    assert values.mean(axis=1).min() > 0  # all 500 sequences give the same verdict


def test_the_adaptive_stop_looks_only_from_the_minimum_on():
    class Settings:
        min_sequences, causal_factor, confidence = 4, 3.0, 0.95

    clean = np.zeros(10)
    stop = ablation.AdaptiveStop(Settings, clean)
    assert stop(np.stack([np.full(2, 1.0), np.zeros(2)])) is False and stop.looks == 0  # rows: circuit, a control
    rng = np.random.default_rng(4)
    decided = stop(np.stack([5 + rng.normal(0, 0.1, 6), rng.normal(0, 0.1, 6)]))
    assert decided and stop.looks == 1 and stop.last["low"] > 0 and stop.last["look"] == 1
    assert math.isfinite(stop.last["high"])
