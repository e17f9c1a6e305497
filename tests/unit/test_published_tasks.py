"""The study's published task numbers (package data) against its published text and against
themselves: the spot values are the study's stated numbers; the matched-random heads, the screens' deltas and the
head counts are recomputed from other rows of the file."""

import json

import numpy as np
import pytest

from emergence.recipe.tasks.matched_random import MR_SEED, heads_of, matched_random, spec_from_ranking
from emergence.recipe.tasks.published import DATA, Ablation, Condition, PublishedTasks, load_published_tasks

MODELS = ("pythia", "olmo", "olmoe")
METRICS = {
    "ioi": {
        "top1",
        "frac_target_gt_distractor",
        "logit_diff_mean",
        "logit_diff_median",
        "target_logit_mean",
        "distractor_logit_mean",
    },
    "binding": {"top1", "frac_target_gt_distractor", "logit_diff_mean"},
    "greater_than": {"top1_above", "prob_above", "logit_diff_above_below", "prob_below"},
    "successor": {"top1", "target_logit_mean", "rank_median", "rank_mean"},
    "induction": {"loss", "top1", "top5", "logit_b"},
}
# docs/tasks.md, What differs from the study: the greater-than and successor files of Pythia and OLMo
# ablate OLMoE's circuits
WRONG_CIRCUIT = {
    (model, task, name)
    for model in ("pythia", "olmo")
    for task in ("greater_than", "successor")
    for name in ("induction_circuit", "prev_token_circuit")
}


@pytest.fixture(scope="module")
def published() -> PublishedTasks:
    return load_published_tasks()


def _rows(published):
    return [(ablation, condition) for ablation in published.ablations for condition in ablation.conditions]


def test_the_file_loads_into_records(published):
    assert isinstance(published, PublishedTasks)
    assert published.source.repository == "skydancerosel/spectral-probe-circuits"
    assert published.source.folder == "cross_architecture/results/"
    assert {m: (s.hf_id, s.n_layers, s.n_heads) for m, s in published.models.items()} == {
        "pythia": ("EleutherAI/pythia-1b", 16, 8),
        "olmo": ("allenai/OLMo-1B-0724-hf", 16, 16),
        "olmoe": ("allenai/OLMoE-1B-7B-0924", 16, 16),
    }
    # 7 experiments x 3 models; 5 screens x 3; 4 sweeps x 3
    assert len(published.ablations) == 21 and len(published.screens) == 15 and len(published.sweeps) == 12
    for ablation, condition in _rows(published):
        assert isinstance(ablation, Ablation) and isinstance(condition, Condition)
        assert ablation.file.endswith(".json") and ablation.model in MODELS
        assert set(condition.metrics) <= METRICS[ablation.task] and condition.metrics
        assert (condition.name == "baseline") == (condition.heads == [])
    assert published.to_json() == json.loads(DATA.read_text())  # nothing lost reading the records


def test_heads_outside_the_model_are_exactly_the_documented_ones(published):
    outside = set()
    for ablation, condition in _rows(published):
        shape = published.models[ablation.model]
        if any(not (0 <= layer < shape.n_layers and 0 <= head < shape.n_heads) for layer, head in condition.heads):
            outside.add((ablation.model, ablation.task, condition.name))
    assert outside == {row for row in WRONG_CIRCUIT if row[0] == "pythia"}
    invalid = {(a.model, a.task, c.name) for a, c in _rows(published) if not c.valid}
    assert invalid == WRONG_CIRCUIT
    # each says why, citing the repository's own account of it
    assert all(
        c.why and "docs/tasks.md, What differs from the study" in c.why for a, c in _rows(published) if not c.valid
    )
    for screen in published.screens:
        shape = published.models[screen.model]
        assert all(h.layer < shape.n_layers and h.head < shape.n_heads for h in screen.heads)


def test_the_invalid_rows_hold_olmoe_circuits(published):
    olmoe = published.ablation("olmoe", "ioi", "capability")
    for model, task, name in WRONG_CIRCUIT:
        row = published.ablation(model, task, "task_screen").condition(name)
        assert row.heads == olmoe.condition(name).heads
    assert published.ablation("olmoe", "greater_than", "task_screen").condition("induction_circuit").heads == [
        [5, 10],
        [7, 0],
        [9, 8],
        [12, 14],
    ]


def test_spot_values(published):
    ioi = published.ablation("pythia", "ioi", "capability")
    assert ioi.condition("baseline").metrics["top1"] == 0.904
    assert ioi.condition("baseline").metrics["target_logit_mean"] == 13.961
    assert published.ablation("olmo", "ioi", "s_inhibition").condition("union").metrics["logit_diff_mean"] == 0.695
    assert published.ablation("pythia", "ioi", "s_inhibition").condition("union").metrics["logit_diff_mean"] == -0.474
    gt = published.ablation("olmoe", "greater_than", "task_screen")
    assert gt.condition("prev_token_circuit").metrics["prob_above"] == 0.7338
    assert gt.condition("baseline").metrics["prob_below"] == 0.0166
    succ = published.ablation("olmo", "successor", "task_screen")
    assert succ.condition("screen").metrics == {"top1": 0.0, "target_logit_mean": 6.347, "rank_median": 135}
    assert succ.condition("induction_circuit").metrics == {"top1": 0.8051}
    assert published.ablation("pythia", "binding", "task_screen").condition("screen").metrics["top1"] == 0.864
    assert (
        published.ablation("olmoe", "induction", "prev_token_circuit").condition("induction_circuit").metrics["logit_b"]
        == 0.0097
    )
    name_movers = next(s for s in published.screens if (s.model, s.experiment) == ("pythia", "name_movers"))
    top = name_movers.heads[0]
    assert (top.layer, top.head, top.values["nm_sel"], top.values["io_attn"]) == (13, 1, 19.930, 0.547)
    succ_sweep = next(s for s in published.sweeps if (s.model, s.task) == ("olmo", "successor"))
    assert (succ_sweep.mr_delta_top1_mean_pp, succ_sweep.mr_delta_top1_std_pp) == (-57.54, 18.06)


@pytest.mark.parametrize("model", MODELS)
def test_successor_top1_is_a_count_of_118(published, model):
    count = {"pythia": 93, "olmo": 95, "olmoe": 90}[model]
    baseline = published.ablation(model, "successor", "task_screen").condition("baseline")
    assert baseline.metrics["top1"] == pytest.approx(count / 118, abs=5e-5)


def test_matched_random_rows_are_the_seed_123_draw_of_their_screen(published):
    checked = 0
    for ablation in published.ablations:
        names = [c.name for c in ablation.conditions]
        if "matched_random" not in names:
            continue
        screen = "prev_token_circuit" if ablation.experiment == "prev_token_circuit" else "screen"
        spec = spec_from_ranking(ablation.condition(screen).heads)
        control = matched_random(spec, published.models[ablation.model].n_heads, np.random.RandomState(MR_SEED))
        assert [list(pair) for pair in heads_of(control)] == ablation.condition("matched_random").heads
        checked += 1
    assert checked == 18


def test_screens_are_the_ablated_top_5(published):
    for screen in published.screens:
        assert len(screen.heads) == 5
        assert [h.values[screen.score] for h in screen.heads] == sorted(
            (h.values[screen.score] for h in screen.heads), reverse=True
        )
        ablated = published.ablation(screen.model, screen.task, screen.experiment).condition("screen").heads
        # the ablated spec groups the ranking by layer (layers in order of first appearance)
        spec = spec_from_ranking((h.layer, h.head) for h in screen.heads)
        assert [list(pair) for pair in heads_of(spec)] == ablated


def test_head_counts_of_the_composite_conditions(published):
    def count(model, task, experiment, name):
        heads = published.ablation(model, task, experiment).condition(name).heads
        assert len({tuple(h) for h in heads}) == len(heads)  # no head twice
        return len(heads)

    # the study's stated sizes: capability union "11h/12h/12h", full layers "24h/48h/48h", union "10h"
    assert [count(m, "ioi", "capability", "union") for m in MODELS] == [11, 12, 12]
    assert [count(m, "ioi", "name_movers", "full_layers") for m in MODELS] == [24, 48, 48]
    assert [count(m, "ioi", "s_inhibition", "union") for m in MODELS] == [10, 10, 10]
    assert [count(m, "binding", "task_screen", "prev_token_circuit") for m in MODELS] == [8, 9, 8]


def test_sweep_screen_deltas_match_the_ablation_rows(published):
    for sweep in published.sweeps:
        ablation = published.ablation(sweep.model, sweep.task, sweep.experiment)
        baseline, screen = ablation.condition("baseline").metrics, ablation.condition("screen").metrics
        top1 = (screen[sweep.top1_metric] - baseline[sweep.top1_metric]) * 100
        assert top1 == pytest.approx(sweep.screen_delta_top1_pp, abs=0.06), sweep.file
        logit = screen[sweep.logit_metric] - baseline[sweep.logit_metric]
        assert logit == pytest.approx(sweep.screen_delta_logit, abs=1.5e-3), sweep.file
        assert sweep.mr_delta_top1_min_pp <= sweep.mr_delta_top1_mean_pp <= sweep.mr_delta_top1_max_pp
