import numpy as np
import pytest
import torch

from emergence.recipe import ablation, capture
from emergence.recipe.ablation import (
    METRICS,
    ablating,
    draw_controls,
    head_mask,
    metrics_per_sequence,
    run_ablation,
    set_aside_heads,
)
from emergence.recipe.capture import Architecture, PassOptions, Subject, run_probe
from emergence.recipe.probe import baseline_positions, make_probe_batch
from tests.helpers.tiny_models import ARCHS, VOCAB
from tests.unit.test_capture import capture_model

T = 64


@pytest.fixture(scope="module")
def batch():
    return make_probe_batch(6, T, 10, VOCAB, 7)


def last_logits(model, tokens):
    with torch.inference_mode():
        return model(tokens, logits_to_keep=1).logits[:, -1]


@pytest.mark.parametrize("arch", ARCHS)
def test_rows_without_ablation_are_bit_identical(arch, tiny_dirs, batch):
    model = capture_model(tiny_dirs[arch])
    info = Architecture.of(model)
    tokens = batch.tokens.repeat(2, 1)
    clean = last_logits(model, tokens)
    masks = torch.zeros(12, info.n_layers, info.n_heads, dtype=torch.bool)
    masks[6:, 0, 1] = True  # ablate L0H1 in the second copy only
    with ablating(info, masks.unbind(1)):
        mixed = last_logits(model, tokens)
    assert torch.equal(mixed[:6], clean[:6])
    assert not torch.allclose(mixed[6:], clean[6:])
    with ablating(info, torch.zeros_like(masks).unbind(1)):
        assert torch.equal(last_logits(model, tokens), clean)


@pytest.mark.parametrize("arch", ARCHS)
def test_ablating_a_whole_layer_removes_its_attention_output(arch, tiny_dirs, batch):
    model = capture_model(tiny_dirs[arch])
    info = Architecture.of(model)
    masks = torch.zeros(6, info.n_layers, info.n_heads, dtype=torch.bool)
    masks[:, 1, :] = True
    with ablating(info, masks.unbind(1)):
        ablated = last_logits(model, batch.tokens)
    proj = info.out_projs[1]

    def no_attention(module, args, out):  # what is left of the attention output: the bias
        bias = proj.bias if proj.bias is not None else torch.zeros_like(out[0][0, 0])
        return (torch.zeros_like(out[0]) + bias, *out[1:])

    hook = info.attentions[1].register_forward_hook(no_attention)
    removed = last_logits(model, batch.tokens)
    hook.remove()
    torch.testing.assert_close(ablated, removed, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(ablated, last_logits(model, batch.tokens))


def test_mean_ablation_with_a_heads_own_values_changes_nothing(tiny_dirs, batch):
    model = capture_model(tiny_dirs["olmo"])
    info = Architecture.of(model)
    one = make_probe_batch(1, T, 10, VOCAB, 3)
    cap = run_probe(
        Subject(model, info, one, 1),
        PassOptions(baseline_positions(T, 50), 1, keep_position_means=True),
        metrics_per_sequence,
    )
    masks = torch.ones(1, info.n_layers, info.n_heads, dtype=torch.bool)  # every head, every layer
    with ablating(info, masks.unbind(1), cap.position_mean):  # the batch mean of a batch of one is itself
        same = last_logits(model, one.tokens)
    torch.testing.assert_close(same, last_logits(model, one.tokens), rtol=1e-5, atol=1e-5)
    with ablating(info, masks.unbind(1)):  # while zeroing the same heads does change the prediction
        assert not torch.allclose(last_logits(model, one.tokens), same, atol=1e-3)


def separate_pass_scores(model, info, batch, heads):
    """Today's reference: one pass per head set, ablation hooks only, no shared prefix."""
    masks = head_mask(heads, info.n_layers, info.n_heads).expand(batch.n, -1, -1)
    with ablating(info, masks.unbind(1)):
        logits = last_logits(model, batch.tokens)
    rows = metrics_per_sequence(logits, batch.b)  # [n, metrics]
    return dict(zip(METRICS, rows.mean(0).tolist())), rows[:, 0].numpy()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    "head_sets",
    [
        [[(0, 1), (1, 2)], [(0, 3), (1, 0)], []],  # layer 0 ablated: nothing to share
        [[(1, 2)], [(1, 0), (1, 3)], [(1, 1)]],  # layer 0 runs once per minibatch
        [[(1, 2)], [], [(0, 3)], [(1, 0), (0, 1)]],  # sets join at layers 1, 0, 0; the empty one keeps clean rows
    ],
)
@pytest.mark.parametrize("per_pass", [1, 4, 6])
def test_stacked_head_sets_over_a_shared_prefix_equal_separate_passes(arch, head_sets, per_pass, tiny_dirs, batch):
    model = capture_model(tiny_dirs[arch])
    info = Architecture.of(model)
    stacked = run_ablation(model, info, batch, head_sets, batch_size=per_pass)
    assert stacked.n == batch.n and stacked.loss.shape == (len(head_sets), batch.n)
    for i, heads in enumerate(head_sets):
        expected, per_sequence = separate_pass_scores(model, info, batch, heads)
        for metric, value in expected.items():
            assert getattr(stacked.scores[i], metric) == pytest.approx(value, rel=1e-5, abs=1e-5)
        np.testing.assert_allclose(stacked.loss[i], per_sequence, rtol=1e-5, atol=1e-5)


def test_each_head_set_joins_the_clean_rows_at_its_lowest_ablated_layer():
    """Four layers: set 0 ablates layer 2, set 1 nothing, set 2 layers 1 and 3, set 3 layer 2. The
    clean rows run to the top for set 1; the others join in order of their lowest layer."""
    masks = torch.zeros(4, 4, 3, dtype=torch.bool)
    masks[0, 2, 0] = masks[2, 1, 1] = masks[2, 3, 2] = masks[3, 2, 2] = True
    layout = ablation.StackLayout.of(masks, rows=2)
    C = ablation.CLEAN
    assert layout.blocks == [[C], [C, 2], [C, 2, 0, 3], [C, 2, 0, 3]]
    assert layout.gather(0) is None and layout.gather(3) is None
    assert layout.gather(1).tolist() == [0, 1, 0, 1] and layout.gather(2).tolist() == [0, 1, 2, 3, 0, 1, 0, 1]
    per_layer = layout.layer_masks(masks)
    assert [m.shape[0] for m in per_layer] == [2, 4, 8, 8]
    assert per_layer[3][:, 2].tolist() == [False] * 2 + [True] * 2 + [False] * 4  # set 2's rows, at layer 3
    top = torch.arange(8)  # the four blocks' rows at the top
    assert layout.by_set(top).tolist() == [[4, 5], [0, 1], [2, 3], [6, 7]]
    without_empty = ablation.StackLayout.of(masks[[0, 2, 3]], rows=2)  # the clean rows end where set 0 joins
    assert without_empty.blocks == [[C], [C, 1], [1, 0, 2], [1, 0, 2]]


def test_the_layers_below_the_first_ablated_one_run_once_per_minibatch(tiny_dirs, batch):
    model = capture_model(tiny_dirs["olmoe"])
    info = Architecture.of(model)
    rows = {}
    layers = info.decoder_layers

    def output_rows(i):
        def hook(module, args, out):
            rows.setdefault(i, []).append((out[0] if isinstance(out, tuple) else out).shape[0])

        return hook

    hooks = [layer.register_forward_hook(output_rows(i)) for i, layer in enumerate(layers)]
    run_ablation(model, info, batch, [[(1, 2)], [(1, 0)], [(1, 3)]], batch_size=2)
    for h in hooks:
        h.remove()
    assert rows == {0: [2, 2, 2], 1: [6, 6, 6]}  # 3 minibatches of 2 sequences x 3 head sets above layer 0


@pytest.mark.parametrize("arch", ["gpt2", "olmoe", "gemma2"])
def test_the_last_layer_attends_from_its_last_query_alone(arch, tiny_dirs, batch, monkeypatch):
    """``last_position_only`` (as ``run_ablation`` enters it) yields the forward's keyword arguments
    that hand the attention function the last layer: that layer's attention is computed for T-1
    alone, the others' for every query, and the logits at T-1 are the model's own."""
    model = capture_model(tiny_dirs[arch])
    info = Architecture.of(model)
    clean = last_logits(model, batch.tokens)
    queries = []

    def attend(query, *args, **kwargs):
        queries.append(query.shape[2])
        return real_attend(query, *args, **kwargs)

    real_attend = capture.attend
    monkeypatch.setattr(capture, "attend", attend)
    layers = info.decoder_layers
    with (
        torch.inference_mode(),
        ablation.last_position_only(layers[-1], info.out_projs[-1], info.attentions[-1]) as last_only,
    ):
        logits = model(batch.tokens, logits_to_keep=1, use_cache=False, **last_only).logits[:, -1]
    assert queries == [T] * (info.n_layers - 1) + [1]
    torch.testing.assert_close(logits, clean, rtol=1e-5, atol=1e-5)


def test_a_stop_rule_ends_the_run_after_a_minibatch(tiny_dirs, batch):
    model = capture_model(tiny_dirs["gpt_neox"])
    info = Architecture.of(model)
    seen = []
    run = run_ablation(
        model,
        info,
        batch,
        [[(1, 2)], [(1, 0)]],
        batch_size=2,
        stop=lambda loss: seen.append(loss.shape[1]) or loss.shape[1] >= 4,
    )
    assert seen == [2, 4] and run.n == 4 and run.loss.shape == (2, 4)
    full = run_ablation(model, info, batch, [[(1, 2)], [(1, 0)]], batch_size=2)
    np.testing.assert_allclose(run.loss, full.loss[:, :4], rtol=1e-6)
    assert run.scores[0].loss == pytest.approx(full.loss[0, :4].mean(), rel=1e-6)


def test_control_sets():
    circuit = [(2, 0), (2, 5), (4, 1)]
    drawn = draw_controls(circuit, n_layers=6, n_heads=8, n_sets=6, seed=0)
    sets = drawn.sets
    assert len(sets) == 6 and drawn.in_layer == 6 and drawn.fallback_layers == {} and drawn.note(6) is None
    for heads in sets:
        assert sorted(l for l, _ in heads) == [2, 2, 4]
        assert not set(heads) & set(circuit)
        assert len(set(heads)) == 3
    assert len({tuple(s) for s in sets}) == 6  # the sets differ
    assert sets == draw_controls(circuit, 6, 8, 6, 0).sets  # and are reproducible


def test_control_sets_are_distinct_and_widened_below_three():
    # 2 circuit heads of 4 leave one in-layer set: the fallback draws the rest from layer 0, all C(4, 2) = 6 there
    drawn = draw_controls([(1, 0), (1, 1)], n_layers=2, n_heads=4, n_sets=7, seed=0)
    assert drawn.sets[0] == [(1, 2), (1, 3)] and drawn.in_layer == 1 and drawn.fallback_layers == {1: 0}
    assert sorted(drawn.sets[1:]) == [[(0, a), (0, b)] for a in range(4) for b in range(a + 1, 4)]
    assert drawn.note(7) == "1 distinct in-layer sets exist"
    three = draw_controls([(0, 3)], n_layers=2, n_heads=4, n_sets=5, seed=0)  # one head of three others: enough
    assert sorted(three.sets) == [[(0, 0)], [(0, 1)], [(0, 2)]] and three.in_layer == 3
    assert three.note(5) == "3 distinct in-layer sets exist"


def test_a_layer_full_of_circuit_heads_draws_from_the_nearest_layer_with_room():
    # L1 holds 3 circuit heads of 4: its 3 heads come from L0 (L2, as near, keeps the circuit's own L2 head)
    circuit = [(1, 0), (1, 1), (1, 2), (2, 0)]
    drawn = draw_controls(circuit, n_layers=4, n_heads=4, n_sets=5, seed=0)
    assert drawn.in_layer == 0 and drawn.fallback_layers == {1: 0} and len(drawn.sets) == 5
    for heads in drawn.sets:
        assert sorted(l for l, _ in heads) == [0, 0, 0, 2] and not set(heads) & set(circuit)
    # ties go to the higher layer (not the previous-token heads below); a layer without room is passed over
    assert draw_controls([(2, h) for h in range(4)], 5, 4, 5, 0).fallback_layers == {2: 3}
    assert draw_controls([(2, h) for h in range(4)] + [(3, 0), (3, 1), (3, 2)], 5, 4, 5, 0).fallback_layers == {
        2: 1,
        3: 4,
    }
    assert draw_controls([(2, h) for h in range(4)] + [(1, 0), (1, 1)], 5, 4, 5, 0).fallback_layers == {1: 0, 2: 3}
    # every layer full: no control set at all, and the note says why
    nothing = draw_controls([(l, h) for l in range(2) for h in range(4)], 2, 4, 5, 0)
    assert nothing.sets == [] and nothing.note(5).startswith("no control set")
    # two circuit layers never trade places: that would draw the in-layer set (the only one) again
    swap = draw_controls([(0, 0), (0, 1), (1, 0), (1, 1)], 2, 4, 5, 0)
    assert swap.sets == [[(0, 2), (0, 3), (1, 2), (1, 3)]] and swap.fallback_layers == {}
    assert swap.note(5) == (
        "1 distinct in-layer sets exist; no layer has room for the fallback; the verdict rests on 1 (fewer than 3)"
    )
    one = draw_controls([(0, h) for h in range(4)], 2, 4, 5, 0)  # layer 1's four heads: one set
    assert one.sets == [[(1, 0), (1, 1), (1, 2), (1, 3)]]
    assert one.note(5).endswith("the verdict rests on 1 (fewer than 3)")


def test_a_head_near_the_circuit_level_is_never_a_control():
    sel = np.ones((3, 8))
    sel[1, 1] = 60.0  # the circuit (50x)
    sel[1, 0] = 25.0  # exactly half the circuit level: set aside
    sel[1, 2] = 24.9  # just under: an ordinary control
    sel[0, 5] = 40.0  # another layer's near-circuit head: set aside too
    set_aside = set_aside_heads(sel, 0.5 * 50.0, [(1, 1)])
    assert set_aside == [(0, 5), (1, 0)]
    seen = set()
    for seed in range(20):
        for heads in draw_controls([(1, 1)], 3, 8, 5, seed, set_aside).sets:
            seen |= set(heads)
    assert seen == {(1, h) for h in (2, 3, 4, 5, 6, 7)}  # every eligible head of L1 in some set, L1H0 in none


def test_effect_ratio_only_over_a_positive_control_rise():
    rise = ablation.effect(2.0, 5.0, [2.5, 2.0, 2.3], causal_factor=3.0)
    assert (rise.circuit_loss_increase, rise.controls_loss_increase_mean, rise.ratio, rise.causal) == pytest.approx(
        (3.0, 0.8 / 3, 3.0 / (0.8 / 3), True)
    )
    assert ablation.effect(2.0, 5.0, [2.5, 2.0, 2.3], causal_factor=12.0).causal is False  # 11.25x
    fall = ablation.effect(2.0, 5.0, [1.9, 2.0], causal_factor=3.0)
    assert fall.controls_loss_increase_mean == pytest.approx(-0.05) and fall.ratio is None
    assert fall.causal is True
    noise = ablation.effect(2.0, 2.1, [1.9, 2.0], causal_factor=3.0)  # +0.1 against a 0.05 fall
    assert noise.causal is False
    none = ablation.effect(2.0, 5.0, [], causal_factor=3.0)
    assert none.ratio is None and none.causal is None
