"""The one engine both ablations draw controls and stop with (``recipe.controls``,
``recipe.verdict.SequentialStop``); that it gives each ablation's own draws and verdicts is
tests/unit/test_ablation.py's, test_matched_random.py's, test_adaptive_verdict.py's and
test_task_ablation.py's."""

import itertools
import math

import numpy as np
import pytest

from emergence.recipe.controls import count_distinct, first_distinct, heads_of, matched_draw
from emergence.recipe.verdict import SequentialStop


@pytest.mark.parametrize("make_rng", [np.random.default_rng, np.random.RandomState])
def test_a_matched_draw_takes_each_layer_from_its_pool_in_the_counts_order(make_rng):
    counts, pools = {3: 2, 0: 1, 1: 5}, {0: [1, 2, 3], 1: [0, 4], 3: [0, 2, 5, 7]}
    drawn = matched_draw(counts, pools, make_rng(7))
    assert list(drawn) == [3, 0, 1]
    assert len(drawn[3]) == 2 and len(drawn[0]) == 1 and drawn[1] == [0, 4]  # a pool short of room: all of it
    assert all(set(heads) <= set(pools[layer]) and heads == sorted(heads) for layer, heads in drawn.items())
    rng = make_rng(7)  # the same generator walked by hand, layer by layer
    assert drawn == {
        layer: sorted(rng.choice(pools[layer], size=min(k, len(pools[layer])), replace=False).tolist())
        for layer, k in counts.items()
    }


def test_count_distinct_counts_every_draw_there_is():
    counts, pools = {0: 2, 2: 1, 5: 3}, {0: [0, 1, 2, 3], 2: [4, 6], 5: [1, 2]}
    every = {
        frozenset((layer, h) for layer, picks in zip(counts, choice) for h in picks)
        for choice in itertools.product(
            *(itertools.combinations(pools[layer], min(k, len(pools[layer]))) for layer, k in counts.items())
        )
    }
    assert count_distinct(counts, pools) == len(every) == math.comb(4, 2) * 2 * 1


def test_first_distinct_keeps_the_first_of_each_set_and_draws_no_more_than_it_needs():
    made = []

    def draws():
        for key, spec in enumerate([{0: [1]}, {0: [1]}, {0: [2]}, {1: [1]}, {0: [3]}]):
            made.append(key)
            yield key, spec

    assert first_distinct(draws(), 3) == [(0, {0: [1]}), (2, {0: [2]}), (3, {1: [1]})]
    assert made == [0, 1, 2, 3]  # the fifth draw was never made
    made.clear()
    assert first_distinct(draws(), 0) == [] and made == []
    assert heads_of({2: [0, 3], 0: [1]}) == [(2, 0), (2, 3), (0, 1)]


def test_the_sequential_stop_looks_on_its_schedule_and_closes_a_decided_verdict():
    stop = SequentialStop(first=4, total=10, confidence=0.95)
    assert stop.sizes == [4, 8, 10]
    asked = []

    def values(name, centre):
        def compute():
            asked.append(name)
            return np.array([centre + np.linspace(-0.1, 0.1, stop.seen)])

        return compute

    criteria = {"clear": values("clear", 5.0), "null": values("null", 0.0)}
    assert stop.look(3, criteria) == [] and asked == []  # no size passed: no look, nothing computed
    assert stop.look(5, criteria) == ["clear"] and asked == ["clear", "null"]
    clear, null = stop.intervals["clear"], stop.intervals["null"]
    assert clear["low"] > 0 and (clear["look"], clear["n"]) == (1, 5) and null["low"] < 0 < null["high"]
    assert stop.look(10, criteria) == [] and asked == ["clear", "null", "null"]  # a decided verdict: not looked at
    null = stop.intervals["null"]
    assert (null["look"], null["looks"], null["n"]) == (3, 3, 10)
