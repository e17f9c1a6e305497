"""The sink mechanism (massive activations, the value drain) vs hooks on the model's own hidden
states and the values its attention receives, reduced with plain numpy."""

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from emergence.measures import MeasureInput, massive_activations, value_drain
from emergence.recipe import mechanism
from emergence.recipe.ablation import metrics_per_sequence
from emergence.recipe.capture import Architecture, PassOptions, Subject, register_attention, run_probe
from emergence.recipe.probe import baseline_positions, make_probe_batch
from tests.helpers.reference_impl import DECODER_LAYERS, eager_residual_and_values
from tests.helpers.tiny_models import ARCHS, VOCAB

T = 64


@pytest.fixture(scope="module")
def probe_batch():
    return make_probe_batch(12, T, 10, VOCAB, 42), baseline_positions(T, 50)


def captured(path, batch, baseline):
    """The model, its layout, and the massive activations' records of one probe pass over ``batch``."""
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation=register_attention()
    ).eval()
    arch = Architecture.of(model)
    return model, arch, massive_records(model, arch, batch, baseline)


def massive_records(model, arch, batch, baseline) -> list[dict]:
    inputs = MeasureInput(model, arch.n_layers, arch.n_heads, batch, "synthetic", None, torch.device("cpu"), None)
    reduced = massive_activations.MassiveActivations(inputs)  # the measure's accumulator
    run_probe(Subject(model, arch, batch, 5), PassOptions(baseline, 12), metrics_per_sequence, [reduced])
    return reduced.result().per_run["layers"]


@pytest.mark.parametrize("arch", ARCHS)
def test_decoder_layers_are_the_families_own(arch, tiny_dirs):
    model = AutoModelForCausalLM.from_pretrained(tiny_dirs[arch], attn_implementation=register_attention())
    found = Architecture.of(model).decoder_layers
    assert len(found) == 2 and all(a is b for a, b in zip(found, DECODER_LAYERS[arch](model)))


@pytest.mark.parametrize("arch", ARCHS)
def test_massive_activations_equal_hooks_on_the_hidden_states(arch, tiny_dirs, probe_batch):
    batch, baseline = probe_batch
    _, _, records = captured(tiny_dirs[arch], batch, baseline)
    hidden, _ = eager_residual_and_values(tiny_dirs[arch], arch, batch.tokens)
    assert [r["layer"] for r in records] == [0, 1]
    for record, h in zip(records, hidden):  # h [n, T, D]
        magnitude = np.abs(h)
        position, dimension = np.unravel_index(magnitude.max(axis=0).argmax(), magnitude.shape[1:])
        flat = np.sort(magnitude.reshape(len(h), -1), axis=1)
        median = flat[:, (flat.shape[1] - 1) // 2].mean()  # each sequence's lower median, averaged
        norms = np.linalg.norm(h, axis=-1)
        assert record["top"] == pytest.approx(magnitude.max(), rel=1e-5)
        assert (record["position"], record["dimension"]) == (position, dimension)
        assert record["median"] == pytest.approx(median, rel=1e-5)
        assert record["ratio"] == pytest.approx(magnitude.max() / median, rel=1e-5)
        ratio = norms[:, 0].mean() / norms[:, 1:].mean()
        assert record["first_position_norm_ratio"] == pytest.approx(ratio, rel=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_value_norm_ratio_equals_the_values_the_attention_receives(arch, tiny_dirs, probe_batch):
    batch, baseline = probe_batch
    model, info, _ = captured(tiny_dirs[arch], batch, baseline)
    inputs = MeasureInput(model, info.n_layers, info.n_heads, batch, "synthetic", None, torch.device("cpu"), None)
    norms_summed = value_drain.ValueNorms(inputs)  # the measure's accumulator, in a pass of its own here
    run_probe(Subject(model, info, batch, 5), PassOptions(baseline, 12), metrics_per_sequence, [norms_summed])
    ratio = norms_summed.result().per_head["value_norm_ratio"]
    _, values = eager_residual_and_values(tiny_dirs[arch], arch, batch.tokens)
    assert ratio.shape == (2, info.n_heads)
    for layer, v in enumerate(values):  # v [n, h_kv, T, d]
        norms = np.linalg.norm(v, axis=-1)
        per_kv_head = norms[:, :, 0].mean(0) / norms[:, :, 1:].mean((0, 2))
        expected = np.repeat(per_kv_head, info.n_heads // v.shape[1])  # query head h reads KV head h // n_rep
        np.testing.assert_allclose(ratio[layer], expected, rtol=1e-5)


def test_a_massive_activation_planted_at_the_first_position_is_found(tiny_dirs, probe_batch):
    """A residual direction pushed 5000x at position 0 (its embedding scaled along one dimension,
    as Sun et al. find in trained models) gives a ratio over 1000 at that position and dimension."""
    batch, baseline = probe_batch
    model = AutoModelForCausalLM.from_pretrained(
        tiny_dirs["llama"], dtype=torch.float32, attn_implementation=register_attention()
    ).eval()
    arch = Architecture.of(model)

    def plant(module, args, output):
        output = output.clone()
        output[:, 0, 5] = 5000.0 * output.abs().median()
        return output

    handle = model.model.embed_tokens.register_forward_hook(plant)
    first = massive_records(model, arch, batch, baseline)[0]
    handle.remove()
    assert (first["position"], first["dimension"]) == (0, 5) and first["ratio"] > 1000
    assert first["first_position_norm_ratio"] > 10


def test_the_median_of_a_long_sequence_is_taken_over_an_even_sample_of_every_dimension():
    """Past ``MEDIAN_SAMPLE`` activations a sequence's median is the sample's (every k-th, k
    coprime with D): within 1% of the whole median on a 512 x 768 residual stream whose
    dimensions differ in scale, and exact below it."""
    torch.manual_seed(0)
    hidden = torch.randn(3, 512, 768) * torch.linspace(0.1, 3.0, 768)  # each dimension its own scale
    stride = mechanism.median_stride(512, 768)
    assert stride > 1 and np.gcd(stride, 768) == 1
    rec = mechanism.ResidualRecorder(1, torch.device("cpu"))
    rec.resid_post(0, hidden)
    whole = np.median(np.abs(hidden.numpy()).reshape(3, -1), axis=1).mean()
    assert rec.result().median[0] == pytest.approx(whole, rel=1e-2)
    assert mechanism.median_stride(64, 32) == 1
