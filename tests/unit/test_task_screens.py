"""The task head screens: scores and rankings against numpy on hand-made attention rows (random,
planted, exact edge cases), and on tiny models against the study-style reference
(tests/helpers/task_reference.py), with a head planted in the model's weights."""

import numpy as np
import pytest
import torch

from emergence.core.errors import UsageError
from emergence.recipe.tasks.screens import SCREENS, ScreenSums, task_screen
from tests.helpers.task_reference import TINY_ARCHS, plant_marker_head, reference_screens, tiny_task_model

LAYERS, HEADS = 3, 4
STUDY_T = {"ioi": 14, "greater_than": 12, "successor": 5, "binding": 13}


def task_positions(task, n, T, rng):
    """The batch's named positions (name -> [n]) as the study's prompts place them, generalised to T."""
    end = np.full(n, T - 1)
    if task == "ioi":  # ABBA / BABA alternate: IO at 1 or 3, the first subject at the other, the second at 9
        io = np.where(np.arange(n) % 2 == 0, 1, 3)
        return {"io": io, "s1": 4 - io, "s2": np.full(n, 9), "end": end}
    if task == "greater_than":
        return {"century": np.full(n, 6), "decade": np.full(n, 7), "end": end}
    if task == "successor":
        return {"end": end}
    binding = rng.choice([3, 8], n)
    return {"binding": binding, "distractor": 11 - binding, "query_name": np.full(n, 10), "end": end}


def random_rows(n, T, seed):
    """[n, layers, heads, T] float32 attention rows (each sums to 1)."""
    return np.random.default_rng(seed).dirichlet(np.full(T, 0.5), size=(n, LAYERS, HEADS)).astype(np.float32)


def accumulate(task, rows, positions, batch=3):
    sums = ScreenSums.zeros(task, rows.shape[1], rows.shape[2])
    for start in range(0, len(rows), batch):
        sums.add(
            torch.from_numpy(rows[start : start + batch]),
            {name: p[start : start + batch] for name, p in positions.items()},
        )
    return sums


def numpy_scores(task, rows, positions, T):
    """The study's per-head scores written out with numpy over all prompts at once."""
    r = rows.astype(np.float64)
    prompts = np.arange(len(r))

    def mean_to(where):  # [layers, heads]
        return r[prompts, :, :, where].mean(axis=0)

    row = r.sum(axis=-1).mean(axis=0)
    if task == "ioi":
        io, s1, s2 = mean_to(positions["io"]), mean_to(positions["s1"]), mean_to(positions["s2"])
        subj = np.maximum(s1, s2)
        return {
            "io_attn": io,
            "s1_attn": s1,
            "s2_attn": s2,
            "other_attn": row - io - s1 - s2,
            "nm_sel": io / np.maximum(subj, 1e-6),
            "subj_max": subj,
            "subj_ratio": subj / np.maximum(io, 1e-6),
        }
    if task == "greater_than":
        decade, century = mean_to(positions["decade"]), mean_to(positions["century"])
        other = row - decade - century
        return {
            "decade_attn": decade,
            "century_attn": century,
            "other_attn": other,
            "gt_sel": decade / np.maximum(other / (T - 2), 1e-8),
        }
    if task == "successor":
        own, prev = r[..., T - 1].mean(axis=0), r[..., T - 2].mean(axis=0)
        other = r[..., : T - 2].sum(axis=-1).mean(axis=0)  # positions 0..T-3
        return {
            "self_attn": own,
            "prev_attn": prev,
            "other_attn": other,
            "succ_sel": own / np.maximum(other / (T - 2), 1e-8),
        }
    binding, distractor = mean_to(positions["binding"]), mean_to(positions["distractor"])
    query_name = mean_to(positions["query_name"])
    other = row - binding - distractor - query_name
    return {
        "binding_attn": binding,
        "distractor_attn": distractor,
        "query_name_attn": query_name,
        "other_attn": other,
        "vb_sel": binding / np.maximum(other / (T - 3), 1e-8),
    }


def python_top(score, k, keep=lambda lh: True):
    heads = [(l, h) for l in range(score.shape[0]) for h in range(score.shape[1]) if keep((l, h))]
    return sorted(heads, key=lambda lh: score[lh], reverse=True)[:k]


SELECTION = {"name_mover": "nm_sel", "greater_than": "gt_sel", "successor": "succ_sel", "binding": "vb_sel"}


@pytest.mark.parametrize("task", ["ioi", "greater_than", "successor", "binding"])
def test_scores_and_ranks_equal_numpy(task):
    n, T = 11, STUDY_T[task]
    rows = random_rows(n, T, seed=1)
    positions = task_positions(task, n, T, np.random.default_rng(2))
    got = task_screen(task, accumulate(task, rows, positions), T, k=4)
    expected = numpy_scores(task, rows, positions, T)
    assert set(got.scores) == set(expected)
    for name, values in expected.items():
        assert got.scores[name].shape == (LAYERS, HEADS)
        np.testing.assert_allclose(got.scores[name], values, rtol=1e-12, atol=1e-15, err_msg=name)
    assert list(got.ranked) == list(SCREENS[task])
    for screen, heads in got.ranked.items():
        if screen == "s_inhibition":
            s = expected
            keep = lambda lh, s=s: s["subj_ratio"][lh] >= 2.0 and s["subj_max"][lh] >= 0.1  # noqa: E731
            assert heads == python_top(s["subj_max"], 4, keep)
        else:
            assert heads == python_top(expected[SELECTION[screen]], 4)
            assert len(heads) == 4
    assert (got.n_prompts, got.seq_len) == (n, T)


def test_a_head_that_attends_to_io_is_the_top_name_mover():
    n, T = 12, 14
    rows = random_rows(n, T, seed=3)
    positions = task_positions("ioi", n, T, None)
    planted = np.full(T, 0.1 / (T - 1), dtype=np.float32)
    for i, io in enumerate(positions["io"]):
        rows[i, 1, 2] = planted
        rows[i, 1, 2, io] = 0.9
    got = task_screen("ioi", accumulate("ioi", rows, positions), T)
    assert got.ranked["name_mover"][0] == (1, 2)
    assert got.scores["io_attn"][1, 2] == pytest.approx(0.9)
    assert got.scores["nm_sel"][1, 2] == pytest.approx(0.9 / (0.1 / 13))


def exact_rows(n, T, per_head):
    """Rows with dyadic attentions (exact in float32 and in their float64 mean): every prompt the same;
    ``per_head`` maps (layer, head) -> {position: attention}, the rest of the row on position 0."""
    rows = np.zeros((n, LAYERS, HEADS, T), dtype=np.float32)
    rows[..., 0] = 1.0
    for (layer, head), attention in per_head.items():
        rows[:, layer, head, 0] = 1.0 - sum(attention.values())
        for position, value in attention.items():
            rows[:, layer, head, position] = value
    return rows


def test_s_inhibition_keeps_the_study_thresholds_and_order():
    n, T = 4, 14
    positions = {"io": np.full(n, 1), "s1": np.full(n, 3), "s2": np.full(n, 9), "end": np.full(n, 13)}
    rows = exact_rows(
        n,
        T,
        {
            (0, 0): {1: 0.125, 9: 0.25},  # ratio exactly 2, subject 0.25: kept
            (0, 1): {1: 0.25, 9: 0.25},  # ratio 1: dropped
            (0, 2): {1: 0.015625, 9: 0.0625},  # ratio 4 but subject 0.0625 < 0.1: dropped
            (1, 0): {3: 0.5},  # io 0: ratio 0.5 / 1e-6; subject first occurrence 0.5: kept, first
            (1, 3): {1: 0.125, 9: 0.25},  # the same as L0H0: after it (layer-major)
            (2, 1): {1: 0.03125, 3: 0.125},  # subject exactly 0.125 (>= 0.1): kept, last
        },
    )
    got = task_screen("ioi", accumulate("ioi", rows, positions), T, k=5)
    assert got.ranked["s_inhibition"] == [(1, 0), (0, 0), (1, 3), (2, 1)]
    assert got.scores["subj_ratio"][0, 0] == 2.0
    assert got.scores["subj_ratio"][1, 0] == 0.5 / 1e-6
    assert got.scores["nm_sel"][0, 3] == 0.0  # no attention to io or the subjects: 0 / 1e-6
    assert got.scores["nm_sel"][0, 1] == 1.0
    assert task_screen("ioi", accumulate("ioi", rows, positions), T, k=2).ranked["s_inhibition"] == [(1, 0), (0, 0)]


@pytest.mark.parametrize(
    "task, T",
    [("greater_than", 12), ("greater_than", 9), ("successor", 5), ("successor", 8), ("binding", 13), ("binding", 16)],
)
def test_uniform_attention_has_selectivity_one(task, T):
    """Uniform attention gives every key 1/T: the key over the mean of the other keys is 1 only with
    the study's counts of other keys (T - 2, T - 2, T - 3: 10, 3, 10 at its T)."""
    n = 6
    rows = np.full((n, LAYERS, HEADS, T), 1.0 / T, dtype=np.float32)
    positions = task_positions(task, n, T, np.random.default_rng(4))
    got = task_screen(task, accumulate(task, rows, positions), T)
    np.testing.assert_allclose(got.scores[SELECTION[SCREENS[task][0]]], 1.0, rtol=1e-6)


def test_selectivity_guard_when_nothing_else_is_attended():
    n, T = 4, 12
    positions = task_positions("greater_than", n, T, None)
    rows = exact_rows(n, T, {(0, 0): {7: 0.5, 6: 0.5}, (2, 3): {7: 0.25, 6: 0.75}})
    got = task_screen("greater_than", accumulate("greater_than", rows, positions), T, k=3)
    assert got.scores["gt_sel"][0, 0] == 0.5 / 1e-8  # other is 0: the guard
    assert got.scores["gt_sel"][2, 3] == 0.25 / 1e-8
    assert got.ranked["greater_than"] == [(0, 0), (2, 3), (0, 1)]  # then the all-zero heads, layer-major


def test_equal_scores_keep_layer_major_order():
    n, T = 3, 5
    rows = np.repeat(random_rows(n, T, seed=5)[:, :1, :1], LAYERS, axis=1).repeat(HEADS, axis=2)  # every head alike
    got = task_screen("successor", accumulate("successor", rows, {"end": np.full(n, T - 1)}), T)
    assert got.ranked["successor"] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0)]


def test_successor_reads_the_query_and_the_key_before_it():
    n, T = 4, 5
    rows = exact_rows(n, T, {(0, 0): {4: 0.5, 3: 0.25}})
    got = task_screen("successor", accumulate("successor", rows, {"end": np.full(n, 4)}), T)
    assert (got.scores["self_attn"][0, 0], got.scores["prev_attn"][0, 0], got.scores["other_attn"][0, 0]) == (
        0.5,
        0.25,
        0.25,
    )
    assert got.scores["succ_sel"][0, 0] == 0.5 / (0.25 / 3)


def test_bad_inputs_are_usage_errors():
    rows = random_rows(2, 14, seed=6)
    positions = task_positions("ioi", 2, 14, None)
    sums = ScreenSums.zeros("ioi", LAYERS, HEADS)
    with pytest.raises(UsageError, match="no attention rows"):
        task_screen("ioi", sums, 14)
    with pytest.raises(UsageError, match="'s2'"):
        sums.add(rows, {"io": positions["io"], "s1": positions["s1"]})
    with pytest.raises(UsageError, match="shape"):
        sums.add(rows[:, :2], positions)
    with pytest.raises(UsageError, match="do not fit"):
        sums.add(rows, dict(positions, s2=np.array([9, 14])))
    sums.add(rows, positions)
    with pytest.raises(UsageError, match="accumulated for 'ioi'"):
        task_screen("binding", sums, 14)
    with pytest.raises(UsageError, match="unknown task"):
        ScreenSums.zeros("induction", LAYERS, HEADS)


# --- a tiny model against the study-style reference ------------------------------------------------

MARKERS = np.arange(120, 128)  # the planted head's keys: tokens that occur only at the IO position
PLANTED_HEAD = 2


@pytest.mark.parametrize("arch", TINY_ARCHS)
@pytest.mark.parametrize("task", ["ioi", "greater_than", "successor", "binding"])
def test_tiny_model_screen_equals_reference(arch, task):
    """Layer 0's head 2 is planted (``plant_marker_head``): it attends to the marker tokens, which
    the IOI prompts hold at the IO position; on IOI it must be the top name mover."""
    model = tiny_task_model(arch)
    plant_marker_head(model, arch, PLANTED_HEAD, MARKERS)
    rng = np.random.default_rng(7)
    n, T = 10, STUDY_T[task]
    tokens = rng.integers(0, MARKERS[0], size=(n, T))
    positions = task_positions(task, n, T, rng)
    if task == "ioi":
        tokens[np.arange(n), positions["io"]] = rng.choice(MARKERS, n)
    expected_scores, expected_ranked = reference_screens(model, task, tokens, positions)
    sums = ScreenSums.zeros(task, model.config.num_hidden_layers, model.config.num_attention_heads)
    with torch.no_grad():  # minibatches of 3: another split than the reference's 4
        for start in range(0, n, 3):
            attentions = model(torch.from_numpy(tokens[start : start + 3]), output_attentions=True).attentions
            rows = torch.stack([a[:, :, -1, :] for a in attentions], dim=1)  # [b, layers, heads, T]
            sums.add(rows, {name: p[start : start + 3] for name, p in positions.items()})
    got = task_screen(task, sums, T)
    assert set(got.scores) == set(expected_scores)
    for name, values in expected_scores.items():
        np.testing.assert_allclose(got.scores[name], values, rtol=1e-6, atol=1e-6, err_msg=name)
    assert got.ranked == expected_ranked
    if task == "ioi":
        assert got.ranked["name_mover"][0] == (0, PLANTED_HEAD)
        assert got.scores["io_attn"][0, PLANTED_HEAD] > 0.99
