"""The task ablations (recipe/tasks/ablation.py): the capability circuits on hand-made selectivities,
the conditions against the study's published specs, and the ablation runs on tiny models of three
architectures against an independent computation (the eager reference with the ablated heads' columns
of the output projection zeroed)."""

import dataclasses
import json

import numpy as np
import pytest
import torch

from emergence.core.config import AblateConfig, StatsConfig, ThresholdConfig
from emergence.core.errors import UsageError
from emergence.recipe.ablation import ablating, head_mask
from emergence.recipe.screen import CLASSES
from emergence.recipe.tasks.ablation import (
    AblationPlan,
    Condition,
    SweepStop,
    TaskAblation,
    best_class,
    build_conditions,
    capability_circuits,
    task_ablation,
    verdict,
)
from emergence.recipe.tasks.batches import build_task_batch
from emergence.recipe.tasks.matched_random import heads_of, matched_random_seeds, seed_sweep
from emergence.recipe.tasks.measure import TaskSubject, task_pass
from emergence.recipe.tasks.metrics import (
    SUMMARY_METRICS,
    ChoicePrompts,
    GreaterThanPrompts,
    MetricValue,
    SuccessorPrompts,
    TaskMetrics,
    capability_absent,
    chance_top1,
    task_metrics,
)
from emergence.recipe.tasks.published import load_published_tasks
from emergence.recipe.verdict import decided
from tests.helpers.task_reference import TINY_ARCHS
from tests.unit.test_task_pass import (
    TASK_NAMES,
    assert_values_equal,
    batch,
    eager_model,
    models,
    ours,
    reference_values,
    tokenizer,
)

SETTINGS = StatsConfig(n_boot=200, ci=0.9, seed=3)
HEAD_DIM = 8  # the tiny models': hidden 32 over 4 heads


# --- the capability circuits ----------------------------------------------------------------------


def selectivities(n_layers, n_heads, per_head):
    """[layers, heads, 6] all 1.0 but the given heads: (layer, head) -> {class: selectivity}."""
    sel = np.ones((n_layers, n_heads, len(CLASSES)))
    for (layer, head), values in per_head.items():
        for name, value in values.items():
            sel[layer, head, CLASSES.index(name)] = value
    return sel


def test_capability_circuits_thresholds_ties_and_nan():
    sel = selectivities(
        3,
        4,
        {
            (0, 0): {"previous_token": 100.0},  # exactly 100: in
            (0, 1): {"previous_token": 99.999},  # below: out
            (0, 2): {"previous_token": 200.0, "bos": 300.0},  # best class first token: out
            (0, 3): {"previous_token": 150.0, "duplicate_token": 150.0},  # tie: the study's order puts previous first
            (1, 0): {"previous_token": 150.0, "induction": 150.0},  # tie: induction first; induction >= 50: in
            (1, 1): {"induction": 50.0},  # exactly 50: in
            (1, 2): {"induction": 49.999, "previous_token": float("nan")},  # out of both
            (1, 3): {c: float("nan") for c in CLASSES} | {"previous_token": 500.0},  # NaN skipped: previous best
            (2, 1): {"induction": 80.0, "bos": 1000.0},  # induction has no best-class filter: in
            (2, 0): {"induction": float("nan"), "previous_token": 120.0},  # NaN induction: out; previous: in
        },
    )
    assert (ThresholdConfig.prev_token_circuit, ThresholdConfig.circuit) == (100.0, 50.0)  # the study's, by default
    prev_token, induction = capability_circuits(sel, prev_token_min=100.0, induction_min=50.0)
    assert list(prev_token.items()) == [(0, [0, 3]), (1, [3]), (2, [0])]
    assert list(induction.items()) == [(1, [0, 1]), (2, [1])]
    # Other levels (threshold.prev_token_circuit, threshold.circuit): the same rules at 150 and 80.
    prev_token, induction = capability_circuits(sel, prev_token_min=150.0, induction_min=80.0)
    assert list(prev_token.items()) == [(0, [3]), (1, [3])]
    assert list(induction.items()) == [(1, [0]), (2, [1])]


def test_best_class_scans_the_study_order():
    def row(**values):
        return [values.get(c, 0.0) for c in CLASSES]

    assert best_class(row(duplicate_token=5.0, previous_token=5.0)) == "previous_token"  # CLASSES puts duplicate first
    assert best_class(row(self=7.0, bos=7.0)) == "bos"  # CLASSES puts self first
    assert best_class(row(induction=3.0, local=3.0)) == "induction"
    assert best_class(row(local=3.0, self=2.0)) == "local"
    assert best_class(row(induction=float("nan"), self=0.5)) == "self"
    assert best_class(row()) is None  # nothing above the start value 0
    assert best_class([float("nan")] * len(CLASSES)) is None


def test_capability_circuits_refuse_another_shape():
    with pytest.raises(UsageError, match=r"\[layers, heads, 6\]"):
        capability_circuits(np.ones((2, 4, 7)), prev_token_min=100.0, induction_min=50.0)


# --- the conditions ---------------------------------------------------------------------------------

# Pythia-1B (16 layers x 8 heads), docs/tasks.md, Ablations: the top-5 name movers and S-inhibition heads,
# the circuits, and the seed-123 matched-random specs the study stored.
PYTHIA = (16, 8)
PYTHIA_NAME_MOVERS = {13: [1], 10: [6, 5, 4], 11: [7]}
PYTHIA_S_INHIBITION = {12: [1, 4], 9: [1, 6], 8: [7]}
PYTHIA_PREV_TOKEN = {1: [3], 2: [1, 3, 5], 3: [2, 5, 6], 6: [3]}
PYTHIA_INDUCTION = {4: [4], 7: [0, 1]}


def ordered(spec):
    return list(spec.items())


def test_conditions_reproduce_the_study_specs():
    plan = AblationPlan(
        screens={"name_mover": PYTHIA_NAME_MOVERS, "s_inhibition": PYTHIA_S_INHIBITION},
        circuits=(PYTHIA_PREV_TOKEN, PYTHIA_INDUCTION),
        heads=["L5H2", "L0H7"],
        mr_seeds=2,
    )
    conditions = build_conditions(plan, *PYTHIA)
    by_name = {c.name: c for c in conditions}
    assert [c.name for c in conditions] == [
        "baseline",
        "screen:name_mover",
        "matched_random:name_mover:123",
        "full_layers:name_mover",
        "screen:s_inhibition",
        "matched_random:s_inhibition:123",
        "full_layers:s_inhibition",
        "screen_union",
        "prev_token_circuit",
        "induction_circuit",
        "circuit_union",
        "user",
        "matched_random:user:123",
        "matched_random_seed:name_mover:0",
        "matched_random_seed:name_mover:1",
        "matched_random_seed:s_inhibition:0",
        "matched_random_seed:s_inhibition:1",
        "matched_random_seed:user:0",
        "matched_random_seed:user:1",
    ]
    assert by_name["baseline"].spec == {}
    assert ordered(by_name["screen:name_mover"].spec) == ordered(PYTHIA_NAME_MOVERS)
    assert ordered(by_name["matched_random:name_mover:123"].spec) == [(13, [2]), (10, [0, 2, 7]), (11, [4])]
    assert ordered(by_name["matched_random:s_inhibition:123"].spec) == [(12, [2, 5]), (9, [0, 5]), (8, [3])]
    assert ordered(by_name["full_layers:name_mover"].spec) == [
        (13, list(range(8))),
        (10, list(range(8))),
        (11, list(range(8))),
    ]  # the study's 24 heads
    assert ordered(by_name["screen_union"].spec) == [
        (12, [1, 4]),
        (9, [1, 6]),
        (8, [7]),
        (13, [1]),
        (10, [4, 5, 6]),
        (11, [7]),
    ]  # S-inhibition layers first (1.6)
    assert ordered(by_name["circuit_union"].spec) == [*ordered(PYTHIA_PREV_TOKEN), (4, [4]), (7, [0, 1])]  # 1.3
    assert ordered(by_name["user"].spec) == [(5, [2]), (0, [7])]
    for seed in (0, 1):  # a fresh generator per seed, drawn here by hand
        rng = np.random.RandomState(seed)
        by_hand = {
            layer: sorted(rng.choice([h for h in range(8) if h not in picks], len(picks), replace=False))
            for layer, picks in PYTHIA_NAME_MOVERS.items()
        }
        assert ordered(by_name[f"matched_random_seed:name_mover:{seed}"].spec) == ordered(by_hand)
    assert [by_name[f"matched_random_seed:s_inhibition:{s}"].spec for s in (0, 1)] == matched_random_seeds(
        PYTHIA_S_INHIBITION, 8, (0, 1)
    )
    # the user's heads get a screen's controls: seed 123's draw in their order, and the fresh seeds
    rng = np.random.RandomState(123)
    assert ordered(by_name["matched_random:user:123"].spec) == [
        (layer, sorted(int(h) for h in rng.choice([h for h in range(8) if h != pick], 1, replace=False)))
        for layer, pick in ((5, 2), (0, 7))
    ]
    assert [by_name[f"matched_random_seed:user:{s}"].spec for s in (0, 1)] == matched_random_seeds(
        {5: [2], 0: [7]}, 8, (0, 1)
    )


def test_conditions_of_a_one_screen_task():
    plan = AblationPlan(screens={"greater_than": {8: [5], 7: [0], 6: [7], 11: [6], 4: [1]}}, mr_seeds=0)
    conditions = build_conditions(plan, *PYTHIA)
    assert [c.name for c in conditions] == [
        "baseline",
        "screen:greater_than",
        "matched_random:greater_than:123",
        "full_layers:greater_than",
    ]
    # docs/tasks.md, Re-running a published row: the study's seed-123 control of Pythia's greater-than heads
    assert ordered(conditions[2].spec) == [(8, [1]), (7, [5]), (6, [3]), (11, [5]), (4, [4])]
    assert ordered(
        build_conditions(AblationPlan(screens=plan.screens, mr_seed=7, mr_seeds=0), *PYTHIA)[2].spec
    ) != ordered(conditions[2].spec)


@pytest.mark.parametrize(
    "plan",
    [
        AblationPlan(screens={"name_mover": {13: [1], 3: [10]}}),
        AblationPlan(screens={}, circuits=({2: [10]}, {})),
        AblationPlan(screens={}, circuits=({}, {16: [0]})),
        AblationPlan(screens={}, heads=["L0H1", "L0H10"]),
    ],
)
def test_a_head_outside_the_model_is_one_line(plan):
    with pytest.raises(UsageError) as error:
        build_conditions(plan, *PYTHIA)
    assert "\n" not in str(error.value)
    assert "outside the model (16 layers x 8 heads)" in str(error.value)


def test_user_heads_are_names_each_once():
    with pytest.raises(UsageError, match="'L0-H1' is not a head name"):
        build_conditions(AblationPlan(screens={}, heads=["L0-H1"]), *PYTHIA)
    with pytest.raises(UsageError, match="L0H1 is listed twice"):
        build_conditions(AblationPlan(screens={}, heads=["L0H1", "L2H2", "L00H01"]), *PYTHIA)


def test_plan_from_a_task_screen_keeps_rank_order():
    _, model, layout = models("olmo")
    screen = task_pass(model, layout, batch("ioi"), 5).screen(k=5)
    plan = AblationPlan.from_screen(screen, mr_seeds=1)
    assert list(plan.screens) == ["name_mover", "s_inhibition"]
    for name, ranked in screen.ranked.items():
        spec = plan.screens[name]
        assert list(spec) == list(dict.fromkeys(layer for layer, _ in ranked))  # layers by first appearance
        assert all(spec[layer] == [h for l, h in ranked if l == layer] for layer in spec)  # heads in rank order
    assert (plan.mr_seed, plan.mr_seeds, plan.circuits, plan.heads) == (123, 1, None, None)


# --- the ablation runs ----------------------------------------------------------------------------

PER_PROMPT = {
    "ioi": ChoicePrompts,
    "binding": ChoicePrompts,
    "greater_than": GreaterThanPrompts,
    "successor": SuccessorPrompts,
}
# summary metric -> (per-prompt reference column, how the study summarises it)
SUMMARIES = {
    "top1": ("top1", np.mean),
    "frac_target_gt_distractor": ("target_gt_distractor", np.mean),
    "logit_diff_mean": ("logit_diff", np.mean),
    "logit_diff_median": ("logit_diff", np.median),
    "top1_above": ("top1_above", np.mean),
    "prob_above": ("prob_above", np.mean),
    "prob_below": ("prob_below", np.mean),
    "logit_diff_above_below": ("logit_diff_above_below", np.mean),
    "target_logit_mean": ("target_logit", np.mean),
    "rank_mean": ("target_rank", np.mean),
    "rank_median": ("target_rank", np.median),
}


def zeroed(arch, spec):
    """The eager reference model with each ablated head's columns of its output projection's weight set to
    zero: the projection then ignores that head's slice of its input, at every position."""
    model = eager_model(arch)
    with torch.no_grad():
        for layer, head in heads_of(spec):
            proj = (
                model.gpt_neox.layers[layer].attention.dense
                if arch == "gpt_neox"
                else model.model.layers[layer].self_attn.o_proj
            )
            proj.weight[:, head * HEAD_DIM : (head + 1) * HEAD_DIM] = 0.0
    return model


def summary(values):
    return {metric: reducer(values[column]) for metric, (column, reducer) in SUMMARIES.items() if column in values}


ABLATED = {1: [2, 0], 0: [3]}


@pytest.mark.parametrize("arch", TINY_ARCHS)
@pytest.mark.parametrize("task", TASK_NAMES)
def test_zero_ablation_equals_the_zeroed_output_projection(arch, task):
    _, model, layout = models(arch)
    b = batch(task)
    expected = reference_values(zeroed(arch, ABLATED), b)
    with ablating(layout, head_mask(heads_of(ABLATED), layout.n_layers, layout.n_heads)[None].unbind(1)):
        assert_values_equal(task_pass(model, layout, b, 4, screen=False).values, expected)

    result = task_ablation(
        TaskSubject(model, layout, b, 4), [Condition("baseline", {}), Condition("user", ABLATED)], SETTINGS
    )
    baseline, ablated = result.conditions
    assert (baseline.name, ablated.name, ablated.heads) == ("baseline", "user", ["L1H2", "L1H0", "L0H3"])
    clean = summary(reference_values(models(arch)[0], b))
    for metric, value in summary(expected).items():
        assert ablated.metrics.metrics[metric].value == pytest.approx(value, abs=1e-5), metric
        assert ablated.delta[metric] == pytest.approx(value - clean[metric], abs=1e-5), metric
        assert baseline.delta[metric] == 0.0
    wired = task_metrics(task, PER_PROMPT[task](**expected), SETTINGS.n_boot, SETTINGS.ci, SETTINGS.seed)
    assert (ablated.metrics.n_boot, ablated.metrics.ci_level, ablated.metrics.seed) == (200, 0.9, 3)
    for metric, value in wired.metrics.items():
        np.testing.assert_allclose(ablated.metrics.metrics[metric].ci, value.ci, atol=1e-5, err_msg=metric)


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_baseline_is_the_unablated_pass_and_a_full_layer_changes_the_logits(arch):
    _, model, layout = models(arch)
    b = batch("successor")
    full_layer = {1: list(range(layout.n_heads))}
    result = task_ablation(
        TaskSubject(model, layout, b, 5), [Condition("baseline", {}), Condition("full_layers", full_layer)], SETTINGS
    )
    clean = task_metrics(
        "successor", task_pass(model, layout, b, 5).values, SETTINGS.n_boot, SETTINGS.ci, SETTINGS.seed
    )
    assert result.conditions[0].metrics == clean
    assert abs(result.conditions[1].delta["target_logit_mean"]) > 1e-3
    with ablating(layout, head_mask(heads_of(full_layer), layout.n_layers, layout.n_heads)[None].unbind(1)):
        ablated = task_pass(model, layout, b, 5, screen=False).values
    assert np.abs(ablated.target_logit - task_pass(model, layout, b, 5).values.target_logit).min() > 1e-4
    assert_values_equal(ablated, reference_values(zeroed(arch, full_layer), b))


def test_a_head_outside_the_model_stops_before_any_forward():
    _, model, layout = models("gpt_neox")
    forwards = []
    hook = model.register_forward_pre_hook(lambda module, args: forwards.append(1))
    try:
        with pytest.raises(UsageError, match="L1H10") as error:
            task_ablation(
                TaskSubject(model, layout, batch("ioi"), 4),
                [
                    Condition("baseline", {}),
                    Condition("screen", {0: [1]}, screen="name_mover"),
                    Condition("user", {1: [10]}),
                ],
                SETTINGS,
            )
        with pytest.raises(UsageError, match="L0H10"):
            build_conditions(
                AblationPlan(screens={"name_mover": {0: [1]}}, heads=["L0H10"]), layout.n_layers, layout.n_heads
            )
    finally:
        hook.remove()
    assert "\n" not in str(error.value)
    assert forwards == []


def test_the_conditions_need_one_baseline_and_distinct_names():
    _, model, layout = models("llama")
    with pytest.raises(UsageError, match=r"0 baseline\(s\)"):
        task_ablation(TaskSubject(model, layout, batch("ioi"), 4), [Condition("user", {0: [1]})], SETTINGS)
    with pytest.raises(UsageError, match="same name"):
        task_ablation(
            TaskSubject(model, layout, batch("ioi"), 4),
            [Condition("baseline", {}), Condition("user", {0: [1]}), Condition("user", {0: [2]})],
            SETTINGS,
        )
    with pytest.raises(UsageError, match="with no heads"):
        task_ablation(TaskSubject(model, layout, batch("ioi"), 4), [Condition("baseline", {0: [1]})], SETTINGS)


def sweep_model():
    """Greater-than on a tiny GPT-NeoX whose answer tokens' unembedding is tripled: its argmax is mostly a
    two-digit answer, above the start decade for about half the prompts, so ablations move top-1."""
    b = build_task_batch("greater_than", tokenizer(), n=20)
    eager = eager_model("gpt_neox")
    with torch.no_grad():
        eager.get_output_embeddings().weight[b.answer_tokens] *= 3
    return (*ours(eager), b)


def test_seed_sweep_draws_distinct_sets_from_fresh_generators():
    """The run's seeded controls are the screen's distinct draws (drawn here by hand: a fresh generator
    per seed, a seed repeating an earlier set skipped), and the sweep summarises their changes: the
    verdict metric (the logit difference) in its units, top-1 in percentage points."""
    model, layout, b = sweep_model()
    plan = AblationPlan.from_screen(task_pass(model, layout, b, 5).screen(k=2), mr_seeds=6)
    result = task_ablation(
        TaskSubject(model, layout, b, 5), build_conditions(plan, layout.n_layers, layout.n_heads), SETTINGS
    )
    by_name = {r.name: r for r in result.conditions}
    spec = plan.screens["greater_than"]
    by_hand, seen, seed = [], set(), 0
    while len(by_hand) < 6:
        rng = np.random.RandomState(seed)
        heads = [
            (layer, int(h))
            for layer, picks in spec.items()
            for h in sorted(rng.choice([h for h in range(layout.n_heads) if h not in picks], len(picks), replace=False))
        ]
        if frozenset(heads) not in seen:
            seen.add(frozenset(heads))
            by_hand.append((seed, heads))
        seed += 1
    seeds = [seed for seed, _ in by_hand]
    assert seeds != list(range(6))  # a seed repeated a set: the test exercises the skipping
    for seed, heads in by_hand:
        assert by_name[f"matched_random_seed:greater_than:{seed}"].heads == [f"L{l}H{h}" for l, h in heads]

    def change(name, metric):
        return by_name[name].metrics.metrics[metric].value - by_name["baseline"].metrics.metrics[metric].value

    (sweep,) = result.sweeps
    assert (sweep.screen, sweep.seeds, sweep.n_distinct, sweep.all_drawn) == ("greater_than", seeds, 6, False)
    assert (sweep.screen_heads, sweep.control_heads, sweep.smaller) == (2, 2, False)
    for metric, scale in (("logit_diff_above_below", 1.0), ("top1_above", 100.0)):
        random = [scale * change(f"matched_random_seed:greater_than:{s}", metric) for s in seeds]
        got = sweep.sweeps[metric]
        assert got.screen_delta == pytest.approx(scale * change("screen:greater_than", metric))
        assert got.deltas == pytest.approx(random)
        assert (got.mean, got.std, got.min, got.max) == pytest.approx(
            (np.mean(random), np.std(random, ddof=1), min(random), max(random))
        )
    assert sweep.sweeps["top1_above"].ratio == pytest.approx(
        sweep.sweeps["top1_above"].screen_delta / np.mean(sweep.sweeps["top1_above"].deltas)
    )
    assert sweep.sweeps["logit_diff_above_below"].ratio is None  # the ratio rule is top-1's
    # this model prefers the "below" answers: no capability to ablate, and no verdict
    ld = by_name["baseline"].metrics.metrics["logit_diff_above_below"].value
    assert ld < 0 and result.capability_absent == f"baseline logit_diff_above_below {ld:.3f} <= 0"
    assert (sweep.verdict_metric, sweep.verdict) == ("logit_diff_above_below", "capability_absent")
    assert sweep.why == f"capability absent: no verdict (baseline logit_diff_above_below {ld:.3f} <= 0)"
    assert result.chance_top1 == pytest.approx(np.mean(99 - b.decade.numpy()) / model.config.vocab_size)
    assert TaskAblation.from_json(json.loads(json.dumps(result.to_json()))) == result


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_stacked_conditions_equal_one_pass_per_condition(arch):
    """Every condition of a plan (screens, draws, circuits, full layers, a user's heads: their lowest
    layers differ) stacked along the batch equals its own pass with the heads ablated, over a batch
    size that splits the prompts unevenly."""
    _, model, layout = models(arch)
    b = batch("ioi")
    plan = AblationPlan.from_screen(
        task_pass(model, layout, b, 5).screen(k=2), mr_seeds=3, circuits=({0: [1]}, {1: [3]}), heads=["L1H0", "L0H2"]
    )
    conditions = build_conditions(plan, layout.n_layers, layout.n_heads)
    result = task_ablation(TaskSubject(model, layout, b, 7), conditions, SETTINGS)
    by_name = {r.name: r for r in result.conditions}
    ran = [c for c in conditions if c.name in by_name]
    assert len(ran) > 8 and {min(layer for layer, _ in heads_of(c.spec)) for c in ran if c.spec} == {0, 1}
    for condition in ran:
        with ablating(layout, head_mask(heads_of(condition.spec), layout.n_layers, layout.n_heads)[None].unbind(1)):
            alone = task_metrics(
                "ioi", task_pass(model, layout, b, 3, screen=False).values, SETTINGS.n_boot, SETTINGS.ci, SETTINGS.seed
            )
        for metric, value in alone.metrics.items():
            assert by_name[condition.name].metrics.metrics[metric].value == pytest.approx(value.value, abs=1e-5)


def test_ioi_runs_both_screens_and_reports_the_empty_ones():
    """On the tiny model no head passes the S-inhibition thresholds: its conditions and the union are not
    run, and named; the name movers' are, with their seed sweep."""
    _, model, layout = models("olmo")
    b = batch("ioi")
    plan = AblationPlan.from_screen(task_pass(model, layout, b, 5).screen(k=3), mr_seeds=2, circuits=({1: [3]}, {}))
    assert heads_of(plan.screens["name_mover"]) and not heads_of(plan.screens["s_inhibition"])
    result = task_ablation(
        TaskSubject(model, layout, b, 5), build_conditions(plan, layout.n_layers, layout.n_heads), SETTINGS
    )
    assert [r.name for r in result.conditions] == [
        "baseline",
        "screen:name_mover",
        "matched_random:name_mover:123",
        "full_layers:name_mover",
        "prev_token_circuit",
        "matched_random_seed:name_mover:0",
        "matched_random_seed:name_mover:1",
    ]
    assert result.not_run == [
        "screen:s_inhibition",
        "matched_random:s_inhibition:123",
        "full_layers:s_inhibition",
        "screen_union",
        "induction_circuit",
        "circuit_union",
        "matched_random_seed:s_inhibition:0",
    ]  # an empty screen has one (empty) draw
    assert [s.screen for s in result.sweeps] == ["name_mover"]
    assert (result.task, result.n_prompts) == ("ioi", 10)
    assert TaskAblation.from_json(json.loads(json.dumps(result.to_json()))) == result


# --- the adaptive stop ----------------------------------------------------------------------------


def choice_values(logit_diff):
    logit_diff = np.asarray(logit_diff, dtype=np.float64)
    return ChoicePrompts(
        top1=np.zeros_like(logit_diff), target_gt_distractor=np.zeros_like(logit_diff), logit_diff=logit_diff
    )


def test_a_sweep_stops_at_the_first_look_whose_interval_excludes_zero():
    """Three draws, each 1.0 +- 0.1 above the screen on every prompt: the first look (at 8 prompts) is
    decisive, "specific". A sweep whose draws scatter around the screen is not decided, nor is one of
    two draws (no verdict under 3)."""
    rng = np.random.default_rng(0)
    n = 8
    screen = rng.normal(size=n)
    clear = {f"d{i}": [choice_values(screen + 1.0 + 0.1 * rng.normal(size=n))] for i in range(3)}
    noise = {f"e{i}": [choice_values(screen + rng.normal(size=n))] for i in range(3)}
    values = {"screen": [choice_values(screen)], **clear, **noise}
    sweeps = {"clear": ("screen", list(clear)), "noise": ("screen", list(noise)), "two": ("screen", ["d0", "d1"])}
    stop = SweepStop("ioi", sweeps, AblateConfig(min_sequences=8, confidence=0.95), total=n)
    assert stop.sizes == [8]  # min_sequences reaches the batch: one look, at its last prompt
    assert stop(values, 4) == []  # before min_sequences: no look
    assert stop(values, 8) == list(clear)
    iv = stop.intervals["clear"]
    assert iv["low"] > 0 and (iv["look"], iv["looks"], iv["n"]) == (1, 1, 8)
    differences = np.stack([v[0].logit_diff - screen for v in clear.values()])
    assert iv["criterion"] == pytest.approx(differences.mean(axis=1).min())
    assert not decided(stop.intervals["noise"]) and "two" not in stop.intervals
    assert SweepStop("ioi", sweeps, AblateConfig(min_sequences=8), total=20).sizes == [8, 16, 20]


def first_of(b, n):
    """The task batch of ``b``'s first ``n`` prompts."""

    def cut(t):
        return None if t is None else t[:n]

    return dataclasses.replace(
        b,
        prompts=b.prompts[:n],
        tokens=b.tokens[:n],
        target=b.target[:n],
        distractor=cut(b.distractor),
        decade=cut(b.decade),
        positions={k: v[:n] for k, v in b.positions.items()},
    )


def test_adaptive_draws_are_the_full_runs_first_prompts(monkeypatch):
    """With ``ablate.sequences=adaptive`` a decided sweep's draws ran on the first prompts only: they and
    the sweep are a full run's over those prompts, every other condition is the full run's over every
    prompt, and the sweep says how many prompts it used. (The tiny model's screen is not told apart
    from its draws in 20 prompts, so the first look is made decisive.)"""
    model, layout, b = sweep_model()
    plan = AblationPlan.from_screen(task_pass(model, layout, b, 5).screen(k=2), mr_seeds=4)
    conditions = build_conditions(plan, layout.n_layers, layout.n_heads)
    monkeypatch.setattr("emergence.recipe.verdict.decided", lambda iv: True)  # the one stopping engine's
    adaptive = task_ablation(
        TaskSubject(model, layout, b, 5), conditions, SETTINGS, AblateConfig(sequences="adaptive", min_sequences=4)
    )
    monkeypatch.undo()
    (sweep,) = adaptive.sweeps
    n = sweep.prompts_used
    assert sweep.stopped_early and 4 <= n < 10 and sweep.interval["n"] == n and sweep.interval["look"] == 1
    full, first = (
        task_ablation(TaskSubject(model, layout, batch, 5), conditions, SETTINGS) for batch in (b, first_of(b, n))
    )
    assert (full.sweeps[0].prompts_used, full.sweeps[0].stopped_early) == (len(b.tokens), False)
    for got, whole, on_first in zip(adaptive.conditions, full.conditions, first.conditions):
        expected = on_first if got.kind == "matched_random_seed" else whole
        assert got.metrics.n_prompts == expected.metrics.n_prompts
        assert got.delta == pytest.approx(expected.delta, abs=1e-5)
    for metric, s in sweep.sweeps.items():
        expected_sweep = first.sweeps[0].sweeps[metric]
        assert s.screen_delta == pytest.approx(expected_sweep.screen_delta, abs=1e-4)
        assert s.deltas == pytest.approx(expected_sweep.deltas, abs=1e-4)


# --- the verdict ----------------------------------------------------------------------------------

SEEDS = [-1.0, -0.2, 0.05, -1.2]  # four distinct draws' changes of the logit difference


@pytest.mark.parametrize("screen_delta, decided", [(-3.0, "specific"), (-1.2, "not_specific"), (0.5, "not_specific")])
def test_the_verdict_is_specific_only_below_every_distinct_draw(screen_delta, decided):
    decision, why = verdict("logit_diff_mean", seed_sweep(screen_delta, SEEDS, top1=False), absent=None)
    assert decision == decided
    assert why == (
        f"logit_diff_mean {screen_delta:+.3f} {'below' if decided == 'specific' else 'not below'} every "
        "one of 4 distinct draws (lowest -1.200)"
    )


def test_no_verdict_without_a_capability_or_on_fewer_than_three_draws():
    assert verdict("top1", seed_sweep(-3.0, SEEDS[:2], top1=False), absent=None) == (
        "too_few_draws",
        "no std, ratio or verdict over fewer than 3 distinct draws",
    )
    absent = "baseline top1 0.000 below chance 0.002"
    for draws in (SEEDS, SEEDS[:1]):  # the capability comes first: it says why no number can be read
        assert verdict("logit_diff_mean", seed_sweep(-3.0, draws, top1=False), absent) == (
            "capability_absent",
            f"capability absent: no verdict ({absent})",
        )


def task_values(task, **values):
    """The task's summary metrics: ``values`` where given, 0 elsewhere (intervals irrelevant here)."""
    return TaskMetrics(
        task=task,
        n_prompts=10,
        n_boot=1,
        ci_level=0.9,
        seed=0,
        metrics={name: MetricValue(values.get(name, 0.0), [0.0, 0.0]) for name in SUMMARY_METRICS[task]},
    )


def test_capability_absent_below_chance_or_without_a_positive_difference():
    chance = chance_top1("ioi", 500)
    assert chance == 1 / 500
    assert (
        capability_absent("ioi", task_values("ioi", top1=0.0, logit_diff_mean=2.0), chance)
        == "baseline top1 0.000 below chance 0.002"
    )
    assert (
        capability_absent("binding", task_values("binding", top1=0.4, logit_diff_mean=-0.1), chance)
        == "baseline logit_diff_mean -0.100 <= 0"
    )
    assert (
        capability_absent("binding", task_values("binding", top1=0.4, logit_diff_mean=0.0), chance)
        == "baseline logit_diff_mean 0.000 <= 0"
    )
    assert capability_absent("ioi", task_values("ioi", top1=0.01, logit_diff_mean=0.3), chance) is None
    # successor's target logit has no zero (a softmax ignores a shift): only top-1 decides
    assert capability_absent("successor", task_values("successor", top1=0.3, target_logit_mean=-5.0), chance) is None
    # greater-than: the chance of hitting an answer above each prompt's decade, and a difference no prompt defines
    decades = np.array([2, 88, 99])
    assert chance_top1("greater_than", 1000, decades) == pytest.approx((97 + 11 + 0) / 3 / 1000)
    nan = task_values("greater_than", top1_above=0.5, logit_diff_above_below=float("nan"))
    assert capability_absent("greater_than", nan, 0.01) == "baseline logit_diff_above_below nan <= 0"


# --- a published screen spec given as the user's heads (issue 44) ---------------------------------------

PUBLISHED = load_published_tasks()
CONTROLLED = [a for a in PUBLISHED.ablations if {"screen", "matched_random"} <= {c.name for c in a.conditions}]


def test_every_task_has_a_published_control():
    assert {a.task for a in CONTROLLED} >= {"ioi", "greater_than", "successor", "binding"}


@pytest.mark.parametrize("published", CONTROLLED, ids=[f"{a.model}-{a.task}-{a.experiment}" for a in CONTROLLED])
def test_a_published_screen_given_as_heads_gets_the_published_control(published):
    shape = PUBLISHED.models[published.model]
    names = [f"L{layer}H{head}" for layer, head in published.condition("screen").heads]  # as a user types them
    conditions = build_conditions(AblationPlan(screens={}, heads=names, mr_seeds=0), shape.n_layers, shape.n_heads)
    by_name = {c.name: c for c in conditions}
    assert [list(pair) for pair in heads_of(by_name["matched_random:user:123"].spec)] == published.condition(
        "matched_random"
    ).heads
