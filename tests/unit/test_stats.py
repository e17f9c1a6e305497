"""Intervals and the reference null against independent computations (docs/method.md section 9)."""

import numpy as np
import pytest
import torch
from scipy import stats as scipy_stats

from emergence.core.config import compose_config
from emergence.main import analyse
from emergence.recipe.probe import baseline_positions, make_probe_batch
from emergence.recipe.screen import CLASSES
from emergence.recipe.stats import null_positions, percentile_interval, replicate_means, resample_weights
from emergence.run.results import read_run
from tests.helpers.reference_impl import eager_model, eager_targets

N, T = 48, 64
SMALL = [
    "probe=paper",
    f"probe.n_sequences={N}",
    f"probe.seq_len={T}",
    "probe.vocab_low=10",
    "probe.vocab_high=500",
    "probe.batch_size=16",
    "model.dtype=float32",
    "wandb.mode=disabled",
    "ablate.enabled=false",
    "stats.n_null=40",
    "stats.n_boot=1000",
]


def reference_null_positions(ab, seq_len, n_draws, seed=2026):
    """The reference script's loop, one draw at a time."""
    rng = np.random.RandomState(seed)
    special = {0, seq_len - 1, seq_len - 2, *range(seq_len - 6, seq_len - 2)}
    out = np.empty((n_draws, len(ab)), dtype=int)
    for d in range(n_draws):
        for i, a in enumerate(ab):
            rp = rng.randint(1, seq_len - 1)
            while rp in special or rp in (a, a + 1):
                rp = rng.randint(1, seq_len - 1)
            out[d, i] = rp
    return out


def test_null_positions_are_the_reference_draws():
    ab = make_probe_batch(300, 256, 100, 10000, 42).ab.numpy()
    np.testing.assert_array_equal(null_positions(ab, 256, 30), reference_null_positions(ab, 256, 30))


def test_resampled_means_are_weighted_means_of_resampled_rows():
    data = np.random.default_rng(1).normal(size=(40, 3, 2))
    weights = resample_weights(40, 50, seed=7)
    assert np.allclose(weights.sum(1), 1) and np.array_equal(weights, resample_weights(40, 50, seed=7))
    counts = np.rint(weights * 40).astype(int)
    direct = np.stack([np.repeat(data, c, axis=0).mean(0) for c in counts])
    np.testing.assert_allclose(replicate_means(data, weights, chunk=7), direct, rtol=1e-12)


@pytest.fixture(scope="module")
def run(tiny_dirs, tmp_path_factory):
    out = tmp_path_factory.mktemp("stats_run")
    summary = analyse(compose_config(["model=local", f"model.name_or_path={tiny_dirs['gpt_neox']}", *SMALL]), out)
    batch = make_probe_batch(N, T, 10, 500, 42)
    model = eager_model(tiny_dirs["gpt_neox"])
    targets = eager_targets(
        model, batch.tokens, batch.ab.numpy(), baseline_positions(T, 50)
    )  # [n, layers, heads, 7], float64, from full eager patterns
    return summary, read_run(out)[1], targets, batch, model


def test_selectivity_intervals_agree_with_an_independent_percentile_bootstrap(run):
    summary, rows, targets, _, _ = run
    checked = 0
    for r in rows:
        for i, c in enumerate(CLASSES):
            if r[f"sel_{c}"] < 0.5:  # tiny selectivities: a 10% band is below the noise of the endpoint itself
                continue
            numerator, base = targets[:, r["layer"], r["head"], i], targets[:, r["layer"], r["head"], -1]
            ref = scipy_stats.bootstrap(
                (numerator, base),
                lambda a, b: a.mean() / b.mean(),
                paired=True,
                vectorized=False,
                n_resamples=1000,
                method="percentile",
                confidence_level=0.95,
                random_state=np.random.default_rng(5),
            )
            low, high = ref.confidence_interval
            assert r[f"sel_{c}_ci_low"] == pytest.approx(low, rel=0.1), (r["layer"], r["head"], c)
            assert r[f"sel_{c}_ci_high"] == pytest.approx(high, rel=0.1), (r["layer"], r["head"], c)
            assert r[f"sel_{c}_ci_low"] <= r[f"sel_{c}"] <= r[f"sel_{c}_ci_high"]
            checked += 1
    assert checked >= 10


def test_membership_probability_and_counts_come_from_reclassified_replicates(run):
    summary, rows, targets, _, _ = run
    # Recompute by hand with the same resample matrix: P(first-token selectivity >= threshold).
    weights = resample_weights(N, 1000, seed=0)
    means = replicate_means(targets, weights)
    sel_bos = means[..., CLASSES.index("bos")] / np.maximum(means[..., -1], 1e-8)  # [B, layers, heads]
    threshold = summary.thresholds.classes["bos"]
    for r in rows:
        p = (sel_bos[:, r["layer"], r["head"]] >= threshold).mean()
        assert r["p_bos_member"] == pytest.approx(p, abs=0.02)
    fraction = (sel_bos >= threshold).mean(axis=(1, 2))
    low, high = percentile_interval(fraction, 0.95)
    assert summary.bos_fraction_ci == pytest.approx([low, high], abs=1 / 8 + 1e-9)  # within one head of 8
    assert summary.bos_fraction_ci[0] <= summary.bos_fraction <= summary.bos_fraction_ci[1]
    assert set(summary.intervals.class_counts) == {*CLASSES, "unclassified"}


def test_the_null_equals_an_independent_implementation(run):
    summary, rows, _, batch, model = run
    positions = reference_null_positions(batch.ab.numpy(), T, 40)
    with torch.no_grad():
        attentions = model(batch.tokens, output_attentions=True).attentions
    rows_last = np.stack([a[:, :, T - 1, :].double().numpy() for a in attentions], 1)  # [n, layers, heads, T]
    baseline = rows_last[:, :, :, baseline_positions(T, 50)].mean(-1).mean(0)  # [layers, heads]
    null = np.stack([rows_last[np.arange(N), :, :, positions[d]].mean(0) for d in range(40)], -1)
    null_sel = null / np.maximum(baseline, 1e-8)[..., None]  # [layers, heads, draws]
    p95, p99 = np.percentile(null_sel, [95, 99])
    assert summary.null.p99 == pytest.approx(p99, rel=1e-4)
    assert summary.null.p95 == pytest.approx(p95, rel=1e-4)
    assert summary.null.draws == 40 and summary.null.floor == pytest.approx(max(2.0, p99), rel=1e-4)
    for r in rows:
        assert r["null_p99"] == pytest.approx(np.percentile(null_sel[r["layer"], r["head"]], 99), rel=1e-4)


def test_ablation_effect_intervals_agree_with_an_independent_paired_bootstrap():
    from emergence.core.config import StatsConfig
    from emergence.recipe.stats import effect_intervals

    rng = np.random.default_rng(3)
    clean = rng.gamma(2.0, 1.5, size=300)
    circuit = clean + rng.normal(1.2, 1.0, size=300)  # ablating the circuit raises the loss
    controls = clean + rng.normal(0.1, 0.8, size=(5, 300))
    ours = effect_intervals(clean, circuit, controls, 3.0, StatsConfig())

    def reference(statistic):
        result = scipy_stats.bootstrap(
            (clean, circuit, controls.mean(0)),
            statistic,
            paired=True,
            vectorized=False,
            n_resamples=2000,
            method="percentile",
            random_state=np.random.default_rng(1),
        )
        return result.confidence_interval

    rise = reference(lambda a, b, c: (b - a).mean())
    control = reference(lambda a, b, c: (c - a).mean())
    margin = reference(lambda a, b, c: (b - a).mean() - 3.0 * abs((c - a).mean()))
    for name, ref in (
        ("circuit_loss_increase", rise),
        ("controls_loss_increase_mean", control),
        ("causal_margin", margin),
    ):
        width = ref.high - ref.low
        assert ours[name][0] == pytest.approx(ref.low, abs=0.1 * width), name
        assert ours[name][1] == pytest.approx(ref.high, abs=0.1 * width), name
    assert 0 < ours["p_causal"] <= 1 and ours["circuit_loss_increase"][0] > 0
