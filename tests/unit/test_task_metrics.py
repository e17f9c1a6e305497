"""The task capability metrics: per prompt against numpy on hand-made logits, the summaries and
their bootstrap intervals against a hand-rolled bootstrap, and on tiny models against the
study-style reference (tests/helpers/task_reference.py)."""

import json

import numpy as np
import pytest
import torch

from emergence.core.errors import UsageError
from emergence.recipe import stats
from emergence.recipe.tasks.metrics import (
    SUMMARY_METRICS,
    ChoicePrompts,
    GreaterThanPrompts,
    SuccessorPrompts,
    TaskMetrics,
    concatenate,
    per_prompt,
    task_metrics,
)
from tests.helpers.task_reference import TINY_ARCHS, TINY_VOCAB, reference_metrics, tiny_task_model

V = 300


def random_logits(n, dtype, seed=0):
    return np.random.default_rng(seed).normal(0, 3, size=(n, V)).astype(dtype)


# --- per prompt -----------------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["ioi", "binding"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_choice_metrics_equal_numpy(task, dtype):
    n = 40
    logits = random_logits(n, dtype)
    rng = np.random.default_rng(1)
    target, distractor = rng.integers(0, V, n), rng.integers(0, V, n)
    target[:5] = logits[:5].argmax(axis=1)  # some prompts whose target is the argmax
    got = per_prompt(task, torch.from_numpy(logits), target, distractor)
    rows = np.arange(n)
    assert isinstance(got, ChoicePrompts)
    np.testing.assert_array_equal(got.top1, logits.argmax(axis=1) == target)
    assert got.top1[:5].all()
    np.testing.assert_array_equal(got.target_gt_distractor, logits[rows, target] > logits[rows, distractor])
    expected = (logits[rows, target] - logits[rows, distractor]).astype(np.float64)  # in the logits' dtype
    np.testing.assert_array_equal(got.logit_diff, expected)
    assert got.logit_diff.dtype == np.float64


def test_fp16_logit_diff_is_rounded_in_fp16():
    """2048 - 0.5 is 2047.5 exactly, but 2048 in fp16 (spacing 1 there; ties to even), as the study's."""
    logits = torch.zeros(1, 8, dtype=torch.float16)
    logits[0, 2], logits[0, 5] = 2048.0, 0.5
    got = per_prompt("ioi", logits, [2], [5])
    assert got.logit_diff[0] == 2048.0
    assert per_prompt("ioi", logits.float(), [2], [5]).logit_diff[0] == 2047.5


def test_argmax_ties_go_to_the_first_token():
    logits = torch.zeros(3, 6)
    logits[:, 1] = logits[:, 4] = 5.0  # tokens 1 and 4 share the maximum
    got = per_prompt("ioi", logits, target=[1, 4, 4], distractor=[4, 1, 0])
    np.testing.assert_array_equal(got.top1, [1, 0, 0])
    np.testing.assert_array_equal(got.target_gt_distractor, [0, 0, 1])  # equal logits: not greater
    np.testing.assert_array_equal(got.logit_diff, [0, 0, 5])
    succ = per_prompt("successor", logits, target=[1, 4, 0])
    np.testing.assert_array_equal(succ.top1, [1, 0, 0])
    np.testing.assert_array_equal(succ.target_rank, [0, 0, 2])  # strictly greater only


def numpy_greater_than(logits, decade, answer_ids):
    """Per prompt, written out: the answer sets, a float32 softmax, means over the sets."""
    out = {"top1_above": [], "prob_above": [], "prob_below": [], "logit_diff_above_below": []}
    for row, dd in zip(logits, decade):
        above, below = answer_ids[dd + 1 :], answer_ids[: dd + 1]
        z = row.astype(np.float32)
        p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        out["top1_above"].append(row.argmax() in above)
        out["prob_above"].append(p[above].sum())
        out["prob_below"].append(p[below].sum())
        mean_above = row[above].astype(np.float64).mean() if len(above) else np.nan
        out["logit_diff_above_below"].append(mean_above - row[below].astype(np.float64).mean())
    return {k: np.array(v, dtype=np.float64) for k, v in out.items()}


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_greater_than_metrics_equal_numpy(dtype):
    n = 30
    logits = random_logits(n, dtype, seed=2)
    rng = np.random.default_rng(3)
    answer_ids = rng.permutation(V)[:100]
    decade = rng.integers(0, 100, n)
    decade[:3] = [0, 99, 98]  # below = {00}; above empty; above = {99}
    logits[3, answer_ids[50]] = 100  # prompt 3's argmax: answer 50, above iff DD < 50
    decade[3] = 49
    logits[4, answer_ids[50]] = 100
    decade[4] = 50
    got = per_prompt("greater_than", torch.from_numpy(logits), decade_value=decade, answer_ids=answer_ids)
    assert isinstance(got, GreaterThanPrompts)
    expected = numpy_greater_than(logits, decade, answer_ids)
    np.testing.assert_array_equal(got.top1_above, expected["top1_above"])
    assert got.top1_above[3] == 1 and got.top1_above[4] == 0
    np.testing.assert_allclose(got.prob_above, expected["prob_above"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got.prob_below, expected["prob_below"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got.logit_diff_above_below, expected["logit_diff_above_below"], rtol=1e-12)
    assert np.isnan(got.logit_diff_above_below[1]) and got.prob_above[1] == 0 and got.top1_above[1] == 0
    assert np.isfinite(np.delete(got.logit_diff_above_below, 1)).all()


def test_successor_metrics_equal_numpy():
    n = 25
    logits = random_logits(n, np.float16, seed=4)
    target = np.random.default_rng(5).integers(0, V, n)
    target[0] = logits[0].argmax()
    got = per_prompt("successor", torch.from_numpy(logits), target)
    assert isinstance(got, SuccessorPrompts)
    rows = np.arange(n)
    np.testing.assert_array_equal(got.top1, logits.argmax(axis=1) == target)
    np.testing.assert_array_equal(got.target_logit, logits[rows, target].astype(np.float64))
    np.testing.assert_array_equal(got.target_rank, [(logits[i] > logits[i, target[i]]).sum() for i in rows])
    assert got.target_rank[0] == 0 and got.top1[0] == 1


def test_bfloat16_logits_are_read_in_their_dtype():
    logits = torch.randn(6, 50).to(torch.bfloat16)
    got = per_prompt("ioi", logits, target=np.arange(6), distractor=np.arange(6) + 10)
    rows = torch.arange(6)
    np.testing.assert_array_equal(got.logit_diff, (logits[rows, rows] - logits[rows, rows + 10]).double().numpy())


def test_concatenate_keeps_prompt_order():
    logits = torch.from_numpy(random_logits(9, np.float32, seed=6))
    target = np.arange(9)
    whole = per_prompt("successor", logits, target)
    parts = concatenate([per_prompt("successor", logits[a:b], target[a:b]) for a, b in [(0, 4), (4, 8), (8, 9)]])
    for name in ("top1", "target_logit", "target_rank"):
        np.testing.assert_array_equal(getattr(parts, name), getattr(whole, name))


def test_bad_inputs_are_usage_errors():
    logits = torch.zeros(2, 120)
    with pytest.raises(UsageError, match="distractor"):
        per_prompt("ioi", logits, target=[0, 1])
    with pytest.raises(UsageError, match="answer_ids"):
        per_prompt("greater_than", logits, decade_value=[1, 2], answer_ids=np.arange(99))
    with pytest.raises(UsageError, match="decade_value"):
        per_prompt("greater_than", logits, decade_value=[1, 100], answer_ids=np.arange(100))
    with pytest.raises(UsageError, match="unknown task"):
        per_prompt("induction", logits, target=[0, 1])
    with pytest.raises(UsageError, match="SuccessorPrompts"):
        task_metrics("successor", per_prompt("ioi", logits, [0, 1], [1, 0]), 10, 0.95, 0)


# --- summaries and bootstrap intervals ------------------------------------------------------------


def hand_rolled(values, n_boot, ci, seed, statistic):
    """The bootstrap written out: replicate b is ``statistic`` of the prompts drawn with their
    multinomial counts (the weights times n), then the percentile interval."""
    n = len(values)
    counts = np.rint(stats.resample_weights(n, n_boot, seed) * n).astype(int)
    replicates = [statistic(np.repeat(values, c)) for c in counts]
    tail = 100 * (1 - ci) / 2
    return np.percentile(replicates, [tail, 100 - tail])


def choice_values(n, seed):
    rng = np.random.default_rng(seed)
    logit_diff = rng.normal(1.0, 2.0, n)
    return ChoicePrompts(
        top1=(rng.random(n) < 0.7).astype(float),
        target_gt_distractor=(logit_diff > 0).astype(float),
        logit_diff=logit_diff,
    )


@pytest.mark.parametrize("n", [101, 100])  # an odd and an even count: one or two middle elements
def test_choice_summary_equals_hand_rolled_bootstrap(n):
    values = choice_values(n, seed=7)
    got = task_metrics("ioi", values, n_boot=400, ci=0.9, seed=11)
    assert list(got.metrics) == list(SUMMARY_METRICS["ioi"])
    expected = {
        "top1": (values.top1, np.mean),
        "frac_target_gt_distractor": (values.target_gt_distractor, np.mean),
        "logit_diff_mean": (values.logit_diff, np.mean),
        "logit_diff_median": (values.logit_diff, np.median),
    }
    for name, (per_prompt_values, statistic) in expected.items():
        metric = got.metrics[name]
        assert metric.value == pytest.approx(statistic(per_prompt_values), rel=1e-12)
        np.testing.assert_allclose(metric.ci, hand_rolled(per_prompt_values, 400, 0.9, 11, statistic), rtol=1e-10)
        assert metric.ci[0] <= metric.value <= metric.ci[1]
    assert (got.n_prompts, got.n_boot, got.ci_level, got.seed) == (n, 400, 0.9, 11)


def test_successor_summary_equals_hand_rolled_bootstrap():
    rng = np.random.default_rng(8)
    ranks = rng.geometric(0.3, 60).astype(float) - 1  # many ties at rank 0, 1, ...
    values = SuccessorPrompts(top1=(ranks == 0).astype(float), target_logit=rng.normal(12, 1, 60), target_rank=ranks)
    got = task_metrics("successor", values, n_boot=300, ci=0.95, seed=3)
    assert list(got.metrics) == list(SUMMARY_METRICS["successor"])
    assert got.metrics["rank_median"].value == np.median(ranks)
    assert got.metrics["rank_mean"].value == pytest.approx(ranks.mean())
    assert got.metrics["target_logit_mean"].value == pytest.approx(values.target_logit.mean())
    np.testing.assert_allclose(got.metrics["rank_median"].ci, hand_rolled(ranks, 300, 0.95, 3, np.median))
    np.testing.assert_allclose(got.metrics["top1"].ci, hand_rolled(values.top1, 300, 0.95, 3, np.mean), rtol=1e-10)


def test_greater_than_summary_leaves_out_undefined_prompts():
    rng = np.random.default_rng(9)
    n = 80
    logit_diff = rng.normal(4, 1, n)
    logit_diff[[3, 40]] = np.nan  # DD = 99
    values = GreaterThanPrompts(
        top1_above=np.ones(n), prob_above=rng.random(n), prob_below=rng.random(n), logit_diff_above_below=logit_diff
    )
    got = task_metrics("greater_than", values, n_boot=300, ci=0.95, seed=5)
    assert list(got.metrics) == list(SUMMARY_METRICS["greater_than"])
    metric = got.metrics["logit_diff_above_below"]
    assert metric.value == pytest.approx(np.nanmean(logit_diff), rel=1e-12)
    # each replicate: the mean over the defined prompts it drew
    n_all = len(logit_diff)
    counts = np.rint(stats.resample_weights(n_all, 300, 5) * n_all).astype(int)
    defined = ~np.isnan(logit_diff)
    replicates = [np.repeat(logit_diff[defined], c[defined]).mean() for c in counts]
    np.testing.assert_allclose(metric.ci, np.percentile(replicates, [2.5, 97.5]), rtol=1e-10)
    assert got.metrics["prob_above"].value == pytest.approx(values.prob_above.mean())


def test_intervals_are_deterministic_for_a_seed():
    values = choice_values(50, seed=10)
    first, again = (task_metrics("binding", values, 200, 0.95, seed=1) for _ in range(2))
    assert first == again
    other = task_metrics("binding", values, 200, 0.95, seed=2)
    assert other.metrics["logit_diff_mean"].ci != first.metrics["logit_diff_mean"].ci
    assert other.metrics["logit_diff_mean"].value == first.metrics["logit_diff_mean"].value


def test_task_metrics_round_trip_through_json():
    got = task_metrics("ioi", choice_values(30, seed=12), 100, 0.95, 0)
    assert TaskMetrics.from_json(json.loads(json.dumps(got.to_json()))) == got


# --- a tiny model against the study-style reference ------------------------------------------------


def task_inputs(task, n, rng):
    """Random tokens of the task's length with its targets (the reference study's T)."""
    T = {"ioi": 14, "greater_than": 12, "successor": 5, "binding": 13}[task]
    tokens = rng.integers(0, 110, size=(n, T))
    inputs = {
        "target": rng.integers(0, TINY_VOCAB, n),
        "distractor": rng.integers(0, TINY_VOCAB, n),
        "decade_value": rng.integers(0, 100, n),
        "answer_ids": rng.permutation(np.arange(10, 110)),
    }
    inputs["decade_value"][:2] = [0, 99]
    return (
        tokens,
        {
            "ioi": ("target", "distractor"),
            "binding": ("target", "distractor"),
            "greater_than": ("decade_value", "answer_ids"),
            "successor": ("target",),
        }[task],
        inputs,
    )


@pytest.mark.parametrize("arch", TINY_ARCHS)
@pytest.mark.parametrize("task", ["ioi", "greater_than", "successor", "binding"])
def test_tiny_model_metrics_equal_reference(arch, task):
    model = tiny_task_model(arch)
    tokens, needed, inputs = task_inputs(task, n=10, rng=np.random.default_rng(13))
    kwargs = {name: inputs[name] for name in needed}
    reference = reference_metrics(model, task, tokens, **kwargs)
    parts = []
    with torch.no_grad():  # minibatches of 3: another split than the reference's 4
        for start in range(0, len(tokens), 3):
            logits = model(torch.from_numpy(tokens[start : start + 3])).logits[:, -1]
            batch = {name: (v if name == "answer_ids" else v[start : start + 3]) for name, v in kwargs.items()}
            parts.append(per_prompt(task, logits, **batch))
    got = concatenate(parts)
    assert set(reference) == {name for name in got.__dataclass_fields__}
    for name, expected in reference.items():
        np.testing.assert_allclose(getattr(got, name), expected, atol=1e-6, rtol=0, equal_nan=True, err_msg=name)
    summary = task_metrics(task, got, n_boot=50, ci=0.95, seed=0)
    means = {
        "ioi": {"top1": "top1", "frac_target_gt_distractor": "target_gt_distractor", "logit_diff_mean": "logit_diff"},
        "greater_than": {
            "top1_above": "top1_above",
            "prob_above": "prob_above",
            "prob_below": "prob_below",
            "logit_diff_above_below": "logit_diff_above_below",
        },
        "successor": {"top1": "top1", "target_logit_mean": "target_logit", "rank_mean": "target_rank"},
    }
    means["binding"] = means["ioi"]
    for name, column in means[task].items():
        assert summary.metrics[name].value == pytest.approx(np.nanmean(reference[column]), abs=1e-6)
    median = {
        "ioi": ("logit_diff_median", "logit_diff"),
        "binding": ("logit_diff_median", "logit_diff"),
        "successor": ("rank_median", "target_rank"),
    }.get(task)
    if median:
        assert summary.metrics[median[0]].value == pytest.approx(np.median(reference[median[1]]), abs=1e-6)
