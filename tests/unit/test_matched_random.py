"""Head specs and the matched-random control against the reference study's stored specs.

Screens (rank order) and their seed-123 MR specs are the study's published ablation rows (name
movers, S-Inhibition, greater-than, successor, binding and the prev-token circuit; package data,
``emergence/recipe/tasks/published.json``); the 10-seed sweeps are the study's
``cross_architecture/results/matched_random_sweep/{pythia1b_ioi_nm,olmoe_gt}_mr_sweep.json`` (in its
repository, ``skydancerosel/spectral-probe-circuits``). The procedure: docs/tasks.md, Ablations.
"""

import itertools
import math

import numpy as np
import pytest

from emergence.core.errors import UsageError
from emergence.recipe.tasks.matched_random import (
    check_heads,
    distinct_draws,
    heads_of,
    layers_of,
    matched_random,
    matched_random_seeds,
    possible_draws,
    seed_sweep,
    spec_from_circuit,
    spec_from_ranking,
    union,
)

N_HEADS = {"pythia": 8, "olmo": 16, "olmoe": 16}  # 16 layers each


def _heads(text: str) -> list[tuple[int, int]]:
    """'L13H1 L10H6' -> [(13, 1), (10, 6)]."""
    return [tuple(int(x) for x in name[1:].split("H")) for name in text.split()]


# (what, model, screen heads in rank order -- or the circuit, layer-major --, seed-123 MR spec as published)
SEED_123 = [
    ("name movers", "pythia", "L13H1 L10H6 L10H5 L10H4 L11H7", {13: [2], 10: [0, 2, 7], 11: [4]}),
    ("name movers", "olmo", "L12H9 L12H8 L12H4 L14H1 L13H10", {12: [5, 10, 13], 14: [7], 13: [13]}),
    ("name movers", "olmoe", "L12H14 L12H3 L12H10 L11H8 L9H1", {12: [5, 8, 12], 11: [6], 9: [13]}),
    ("s-inhibition", "pythia", "L12H1 L9H1 L8H7 L12H4 L9H6", {12: [2, 5], 9: [0, 5], 8: [3]}),
    ("s-inhibition", "olmo", "L13H3 L11H5 L11H8 L12H1 L10H15", {13: [8], 11: [6, 7], 12: [12], 10: [7]}),
    ("s-inhibition", "olmoe", "L13H2 L8H2 L13H5 L13H1 L11H13", {13: [7, 10, 13], 8: [7], 11: [12]}),
    ("greater-than", "pythia", "L8H5 L7H0 L6H7 L11H6 L4H1", {8: [1], 7: [5], 6: [3], 11: [5], 4: [4]}),
    ("greater-than", "olmo", "L12H8 L2H7 L2H11 L4H12 L8H1", {12: [7], 2: [5, 6], 4: [11], 8: [8]}),
    ("greater-than", "olmoe", "L10H5 L10H2 L5H10 L12H10 L7H0", {10: [9, 12], 5: [6], 12: [13], 7: [8]}),
    ("successor", "pythia", "L3H5 L2H1 L8H5 L1H4 L7H0", {3: [1], 2: [5], 8: [3], 1: [6], 7: [4]}),
    ("successor", "olmo", "L0H2 L0H10 L0H1 L0H0 L0H13", {0: [3, 7, 8, 11, 12]}),
    ("successor", "olmoe", "L0H15 L0H14 L10H5 L7H10 L1H4", {0: [7, 10], 10: [7], 7: [13], 1: [8]}),
    ("binding", "pythia", "L8H5 L13H1 L7H2 L8H7 L12H1", {8: [1, 3], 13: [5], 7: [4], 12: [6]}),
    ("binding", "olmo", "L2H7 L13H1 L12H8 L12H9 L14H15", {2: [8], 13: [7], 12: [12, 13], 14: [7]}),
    ("binding", "olmoe", "L12H15 L12H14 L13H8 L5H10 L9H10", {12: [7, 10], 13: [6], 5: [13], 9: [7]}),
    ("prev-token", "pythia", "L1H3 L2H1 L2H3 L2H5 L3H2 L3H5 L3H6 L6H3", {1: [1], 2: [0, 4, 7], 3: [0, 4, 7], 6: [4]}),
    (
        "prev-token",
        "olmo",
        "L0H5 L0H6 L0H12 L1H1 L1H2 L1H5 L1H7 L1H14 L11H10",
        {0: [4, 9, 13], 1: [4, 8, 9, 10, 12], 11: [9]},
    ),
    (
        "prev-token",
        "olmoe",
        "L0H1 L0H5 L1H5 L2H6 L4H12 L6H6 L8H10 L8H13",
        {0: [9, 12], 1: [7], 2: [13], 4: [7], 6: [9], 8: [12, 14]},
    ),
]


def test_eighteen_published_specs():
    assert len(SEED_123) == 18


@pytest.mark.parametrize("what, model, screen, published", SEED_123, ids=[f"{w}-{m}" for w, m, _, _ in SEED_123])
def test_seed_123_reproduces_the_published_spec(what, model, screen, published):
    make = spec_from_circuit if what == "prev-token" else spec_from_ranking
    control = matched_random(make(_heads(screen)), N_HEADS[model], np.random.RandomState(123))
    assert list(control.items()) == list(published.items())  # the layer order too


def test_ranking_and_circuit_orders():
    ranked = spec_from_ranking(_heads("L13H1 L10H6 L10H5 L10H4 L11H7"))
    assert list(ranked.items()) == [(13, [1]), (10, [6, 5, 4]), (11, [7])]  # docs/tasks.md, Ablations
    assert spec_from_ranking(heads_of(ranked)) == ranked and list(spec_from_ranking(heads_of(ranked))) == [13, 10, 11]
    circuit = spec_from_circuit(_heads("L3H6 L1H3 L3H2 L2H5"))
    assert list(circuit.items()) == [(1, [3]), (2, [5]), (3, [2, 6])]


def test_union_keeps_first_spec_layer_order_and_sorts_heads():
    # the study's Pythia "name_mover+s_inhibition union (10h)" (ioi/pythia1b_ioi_si_ablation.json)
    s_inhibition = spec_from_ranking(_heads("L12H1 L9H1 L8H7 L12H4 L9H6"))
    name_movers = spec_from_ranking(_heads("L13H1 L10H6 L10H5 L10H4 L11H7"))
    assert list(union(s_inhibition, name_movers).items()) == [
        (12, [1, 4]),
        (9, [1, 6]),
        (8, [7]),
        (13, [1]),
        (10, [4, 5, 6]),
        (11, [7]),
    ]
    # a shared layer merges, without duplicates
    assert list(union({2: [5, 1], 0: [3]}, {1: [0], 2: [1, 0]}).items()) == [(2, [0, 1, 5]), (0, [3]), (1, [0])]


def test_layers_of_gives_every_head_of_the_spec_layers():
    full = layers_of({13: [1], 10: [6, 5, 4], 11: [7]}, n_heads=8)
    assert list(full) == [13, 10, 11]
    assert sum(len(h) for h in full.values()) == 24  # the study's "24h" upper bound (published.json)
    assert full[10] == [0, 1, 2, 3, 4, 5, 6, 7]


def test_matched_random_avoids_the_spec_and_caps_at_the_layer():
    rng = np.random.RandomState(0)
    control = matched_random({0: [0, 1, 2], 1: [0, 1, 2, 3, 4, 5]}, n_heads=8, rng=rng)
    assert control[0] == sorted(control[0]) and not set(control[0]) & {0, 1, 2} and len(control[0]) == 3
    assert control[1] == [6, 7]  # only two heads of layer 1 are left


# 10-seed sweeps as stored by the study (fresh RandomState(seed) per seed).
SWEEP_PYTHIA_NAME_MOVERS = [
    {13: [7], 10: [1, 3, 7], 11: [6]},
    {13: [7], 10: [1, 2, 3], 11: [6]},
    {13: [5], 10: [1, 2, 7], 11: [1]},
    {13: [5], 10: [2, 3, 7], 11: [0]},
    {13: [5], 10: [0, 3, 7], 11: [6]},
    {13: [7], 10: [1, 2, 7], 11: [2]},
    {13: [5], 10: [1, 3, 7], 11: [5]},
    {13: [3], 10: [2, 3, 7], 11: [1]},
    {13: [3], 10: [1, 2, 7], 11: [6]},
    {13: [6], 10: [0, 3, 7], 11: [3]},
]
SWEEP_OLMOE_GREATER_THAN = [
    {10: [8, 10], 5: [2], 12: [6], 7: [14]},
    {10: [4, 9], 5: [8], 12: [13], 7: [11]},
    {10: [6, 13], 5: [11], 12: [12], 7: [6]},
    {10: [6, 9], 5: [9], 12: [12], 7: [8]},
    {10: [4, 6], 5: [5], 12: [3], 7: [10]},
    {10: [1, 7], 5: [11], 12: [15], 7: [11]},
    {10: [14, 15], 5: [0], 12: [11], 7: [1]},
    {10: [13, 14], 5: [1], 12: [6], 7: [3]},
    {10: [9, 12], 5: [5], 12: [11], 7: [6]},
    {10: [9, 15], 5: [3], 12: [14], 7: [2]},
]


@pytest.mark.parametrize(
    "screen, n_heads, published",
    [
        ("L13H1 L10H6 L10H5 L10H4 L11H7", 8, SWEEP_PYTHIA_NAME_MOVERS),
        ("L10H5 L10H2 L5H10 L12H10 L7H0", 16, SWEEP_OLMOE_GREATER_THAN),
    ],
)
def test_ten_seed_sweep_uses_a_fresh_generator_per_seed(screen, n_heads, published):
    controls = matched_random_seeds(spec_from_ranking(_heads(screen)), n_heads, range(10))
    assert [list(c.items()) for c in controls] == [list(p.items()) for p in published]


def test_one_shared_generator_is_not_the_sweep():
    # the sequential alternative (one generator over all seeds) gives other heads after the first
    spec = spec_from_ranking(_heads("L13H1 L10H6 L10H5 L10H4 L11H7"))
    rng = np.random.RandomState(0)
    shared = [matched_random(spec, 8, rng) for _ in range(10)]
    assert shared[0] == SWEEP_PYTHIA_NAME_MOVERS[0] and shared[1:] != SWEEP_PYTHIA_NAME_MOVERS[1:]


def test_seed_sweep_by_hand():
    sweep = seed_sweep(-12.0, [1.0, 2.0, 3.0, 6.0])
    assert sweep.deltas == [1.0, 2.0, 3.0, 6.0]
    assert sweep.mean == 3.0 and (sweep.min, sweep.max) == (1.0, 6.0)
    assert sweep.std == pytest.approx(math.sqrt((4 + 1 + 0 + 9) / 3))  # ddof=1
    assert sweep.ratio == -4.0


def test_seed_sweep_against_the_study_pythia_name_movers():
    # ioi/pythia1b_ioi_nm_ablation.json + matched_random_sweep/pythia1b_ioi_nm_mr_sweep.json (top-1)
    baseline, screen = 0.9039999842643738, 0.9760000109672546
    values = [
        0.9440000057220459,
        0.9679999947547913,
        0.9240000247955322,
        0.9620000123977661,
        0.949999988079071,
        0.921999990940094,
        0.843999981880188,
        0.972000002861023,
        0.8820000290870667,
        0.9419999718666077,
    ]
    sweep = seed_sweep((screen - baseline) * 100, [(v - baseline) * 100 for v in values])
    assert sweep.mean == pytest.approx(2.70000159740448, rel=1e-9)  # the study's stored delta summary
    assert sweep.std == pytest.approx(4.049965680269105, rel=1e-9)
    assert sweep.min == pytest.approx(-6.000000238418579, rel=1e-9)
    assert sweep.max == pytest.approx(6.800001859664917, rel=1e-9)
    assert sweep.ratio == pytest.approx(7.2 / 2.7, rel=1e-3)  # published.json's sweep: +7.2 vs +2.70


def test_seed_sweep_infinity_rule():
    # OLMoE greater-than: screen -4.6 pp, MR mean -0.02 pp -> the study's infinity
    values = [0.996] * 4 + [0.994] + [0.996] * 5
    sweep = seed_sweep((0.950 - 0.996) * 100, [(v - 0.996) * 100 for v in values])
    assert sweep.mean == pytest.approx(-0.02) and sweep.std == pytest.approx(0.06324555320336764)
    assert sweep.ratio == math.inf
    assert seed_sweep(-0.6, [0.0] * 10).ratio is None  # both small: the study's dash
    assert seed_sweep(2.0, [0.5, 0.5, 0.5]).ratio == 4.0  # at 0.5 pp the ratio is a number again


def test_under_three_distinct_draws_no_std_or_ratio_and_a_reason():
    for deltas in ([-3.0], [-3.0, 1.0]):
        sweep = seed_sweep(-40.0, deltas)
        assert sweep.std is None and sweep.ratio is None
        assert (
            sweep.why == f"{len(deltas)} distinct matched-random draw{'s' if len(deltas) > 1 else ''}: no std or "
            "ratio over fewer than 3"
        )
        assert (sweep.mean, sweep.min, sweep.max) == (np.mean(deltas), min(deltas), max(deltas))
    three = seed_sweep(-40.0, [-3.0, 1.0, 5.0])
    assert three.std == pytest.approx(4.0) and three.ratio == -40.0 and three.why is None
    logit = seed_sweep(-2.0, [-0.5, 0.1, 0.3], top1=False)  # a logit measure: the ratio rule is top-1's
    assert logit.ratio is None and logit.std == pytest.approx(np.std([-0.5, 0.1, 0.3], ddof=1))
    assert logit.why == "no ratio: the study's ratio rule is in percentage points of top-1"


def _all_controls(spec, n_heads):
    """Every control of ``spec`` the layers allow, enumerated (no generator): per layer each choice
    of as many other heads (fewer where the layer has fewer), combined over the layers."""
    per_layer = []
    for picks in spec.values():
        others = [h for h in range(n_heads) if h not in picks]
        per_layer.append(list(itertools.combinations(others, min(len(picks), len(others)))))
    return {
        frozenset((layer, h) for layer, chosen in zip(spec, combo) for h in chosen)
        for combo in itertools.product(*per_layer)
    }


@pytest.mark.parametrize(
    "spec, n_heads",
    [
        ({1: [0, 2, 3], 0: [1, 2]}, 4),
        ({0: [1]}, 4),
        ({0: [0, 1], 1: [3]}, 4),
        ({13: [1], 10: [6, 5, 4], 11: [7]}, 8),
        ({0: [0, 1, 2, 3]}, 4),
    ],
)
def test_possible_draws_counts_every_control_the_layers_allow(spec, n_heads):
    assert possible_draws(spec, n_heads) == len(_all_controls(spec, n_heads))


def test_distinct_draws_skip_repeats_and_stop_at_every_set_the_layers_allow():
    # 3 of a 4-head layer's heads and 2 of the other's: one control, whatever the seed (issue 41's binding)
    (only,) = distinct_draws({1: [0, 2, 3], 0: [1, 2]}, 4, 10)
    assert only == (0, {1: [1], 0: [0, 3]})
    # one head of 4: three controls; seeds drawn in order, each kept the first time its head comes up
    spec, found = {0: [1]}, distinct_draws({0: [1]}, 4, 10)
    by_hand, seen, seed = [], set(), 0
    while len(seen) < 3:
        head = int(np.random.RandomState(seed).choice([0, 2, 3], 1, replace=False)[0])
        if head not in seen:
            seen.add(head)
            by_hand.append((seed, {0: [head]}))
        seed += 1
    assert found == by_hand and {frozenset(heads_of(c)) for _, c in found} == _all_controls(spec, 4)
    assert len(distinct_draws({0: [1]}, 4, 2)) == 2  # fewer asked than allowed: as many as asked


def test_distinct_draws_of_distinct_seeds_are_the_study_sweep():
    spec = spec_from_ranking(_heads("L13H1 L10H6 L10H5 L10H4 L11H7"))
    assert [seed for seed, _ in distinct_draws(spec, 8, 10)] == list(range(10))
    assert [c for _, c in distinct_draws(spec, 8, 10)] == SWEEP_PYTHIA_NAME_MOVERS


def test_seed_sweep_round_trips_as_a_record():
    sweep = seed_sweep(-4.6, [0.0, -0.2])
    assert type(sweep).from_json(sweep.to_json()) == sweep


def test_check_heads_refuses_a_head_outside_the_model():
    pythia_gt_induction = {5: [10], 7: [0], 9: [8], 12: [14]}  # OLMoE's heads, as the study ablated in Pythia
    with pytest.raises(UsageError) as refused:
        check_heads(pythia_gt_induction, n_layers=16, n_heads=8, what="induction circuit")
    message = str(refused.value)
    assert "\n" not in message and "L5H10" in message and "16 layers x 8 heads" in message
    assert message.startswith("induction circuit:")
    check_heads(pythia_gt_induction, n_layers=16, n_heads=16, what="induction circuit")  # fits OLMoE
    with pytest.raises(UsageError, match="L16H0"):
        check_heads({16: [0]}, n_layers=16, n_heads=8, what="screen")
