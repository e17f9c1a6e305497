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


def test_the_looks_double_from_the_minimum_and_end_at_the_last_sequence():
    assert verdict.look_sizes(64, 500) == [64, 128, 256, 500]
    assert verdict.look_sizes(64, 512) == [64, 128, 256, 512]
    assert verdict.look_sizes(64, 513) == [64, 128, 256, 512, 513]
    assert verdict.look_sizes(64, 64) == [64] and verdict.look_sizes(64, 10) == [10]
    assert verdict.look_sizes(8, 20) == [8, 16, 20]
    sizes = [64, 128, 256, 500]
    assert verdict.due_look(sizes, 0, 63) is None and verdict.due_look(sizes, 62, 64) == 1
    assert verdict.due_look(sizes, 64, 127) is None and verdict.due_look(sizes, 126, 130) == 2
    assert verdict.due_look(sizes, 100, 300) == 3  # steps passing two sizes make one look, the later
    assert verdict.due_look(sizes, 496, 500) == 4 and verdict.due_look(sizes, 500, 500) is None


def test_the_looks_share_the_error_budget_equally():
    assert verdict.alpha_spent(0.95) == pytest.approx(0.05)
    assert verdict.alpha_spent(0.95, 4) == pytest.approx(0.0125)
    values = np.random.default_rng(5).normal([[1.0], [0.3]], 1.0, (2, 100))
    iv = verdict.interval(values, confidence=0.95, look=2, looks=4)
    per_branch = [stats.t.interval(1 - 0.05 / 4 / 2, 99, loc=v.mean(), scale=stats.sem(v)) for v in values]
    assert iv["low"] == pytest.approx(min(lo for lo, _ in per_branch))
    assert iv["high"] == pytest.approx(min(hi for _, hi in per_branch))
    assert (iv["look"], iv["looks"], iv["n"]) == (2, 4, 100)
    assert verdict.decided({"low": 0.1, "high": 2}) and verdict.decided({"low": -2, "high": -0.1})
    assert not verdict.decided({"low": -0.1, "high": 0.1})


class Settings:
    min_sequences, causal_factor, confidence = 64, 3.0, 0.95


def adaptive(clean, circuit, controls, step=2, settings=Settings):
    """``run_ablation``'s use of ``AdaptiveStop``: the stop called after every minibatch of ``step``
    sequences, the last included; (decided, sequences used, the last look's interval)."""
    loss = np.vstack([circuit, controls])
    stop = ablation.AdaptiveStop(settings, clean)
    n_total = len(clean)
    for n in range(step, n_total + step, step):
        n = min(n, n_total)
        if stop(loss[:, :n]):
            return True, n, stop.last
    return False, n_total, stop.last


def test_the_looks_keep_the_error_rate_when_the_criterion_is_zero():
    """Criterion exactly 0 (r_c = 0.9, controls -0.3, f = 3): any look whose interval excludes zero,
    the one at the last sequence included, is wrong. The union bound holds the rate to 5 %."""
    rng = np.random.default_rng(2)
    runs = 2000
    wrong = 0
    for _ in range(runs):
        decided, n, iv = adaptive(*losses(rng, 500, 0.9, -0.3, sd=1.5, sets=1), step=4)
        wrong += decided
    # Measured: 1.65 % (the union bound is conservative); binomial noise of 2000 runs at 5 % is 0.5 %.
    assert wrong / runs < 0.05


def test_the_expected_number_of_sequences_under_the_default_runs_effect():
    """An effect like the default run's (g ~ +0.5 with the 95 % interval over 500 sequences about
    +-0.25 wide): most runs stop at the look at 256 sequences or before, every decided one causal;
    a clear effect mostly stops at the first look, and the null (criterion 0) ends at the last sequence."""
    rng = np.random.default_rng(6)
    used, wrong = [], 0
    for _ in range(300):
        clean, circuit, controls = losses(rng, 500, 1.36, -0.28, sd=0.85, sets=1)
        decided, n, iv = adaptive(clean, circuit, controls)
        used.append(n)
        wrong += decided and iv["high"] < 0
    used = np.array(used)
    assert wrong == 0 and set(used) <= {64, 128, 256, 500}
    # Measured: mean 288 sequences; 66 % of the runs stop before the last (31, 74, 92 at 64, 128, 256).
    assert used.mean() < 320 and (used < 500).mean() > 0.6
    clear = [adaptive(*losses(rng, 500, 1.4, -0.05, sd=0.8, sets=1))[1] for _ in range(50)]
    assert np.mean(clear) < 100  # measured: 81 (37 of 50 at 64)
    null = [adaptive(*losses(rng, 500, 0.9, -0.3, sd=1.5, sets=1))[1] for _ in range(50)]
    assert np.mean(null) > 450  # measured: 488


def test_a_clear_effect_stops_early_and_agrees_with_all_sequences():
    clean, circuit, controls = losses(np.random.default_rng(3), 500, 1.4, -0.05, sd=0.8, sets=1)
    values = verdict.branches(clean, circuit, controls, 3.0)
    decided, n, iv = adaptive(clean, circuit, controls)
    assert decided and n == 64 and iv["low"] > 0 and (iv["look"], iv["looks"]) == (1, 4)
    assert values.mean(axis=1).min() > 0  # all 500 sequences give the same verdict


def test_the_adaptive_stop_looks_on_its_schedule_the_last_sequence_included():
    class Small:
        min_sequences, causal_factor, confidence = 4, 3.0, 0.95

    clean = np.zeros(10)  # looks at 4, 8, 10
    stop = ablation.AdaptiveStop(Small, clean)
    assert stop.sizes == [4, 8, 10]
    assert stop(np.stack([np.full(2, 1.0), np.zeros(2)])) is False and stop.last is None  # rows: circuit, a control
    rng = np.random.default_rng(4)
    noise = np.stack([rng.normal(0, 1, 10), rng.normal(0, 1, 10)])
    assert stop(noise[:, :5]) is False and stop.last["look"] == 1 and stop.last["n"] == 5
    assert stop(noise[:, :7]) is False and stop.last["look"] == 1  # no size passed: no look
    stop(noise)
    assert (stop.last["look"], stop.last["looks"], stop.last["n"]) == (3, 3, 10)  # one look, the later
    clear = ablation.AdaptiveStop(Small, clean)
    decided = clear(np.stack([5 + rng.normal(0, 0.1, 6), rng.normal(0, 0.1, 6)]))
    assert decided and clear.last["low"] > 0 and clear.last["look"] == 1
    assert math.isfinite(clear.last["high"])
