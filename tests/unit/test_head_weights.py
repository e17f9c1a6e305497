"""Each head's weights (``recipe.head_weights``) on every tested architecture: equal to a per-family
reshape of the whole weights (``reference_impl.reference_head_weights``), and doing in the model's own
forward pass what they say: the values and the position-0 queries and keys its attention function
receives, its output projection's output and its logits."""

from __future__ import annotations

import pytest
import torch
from transformers import AttentionInterface, AutoModelForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from emergence.core.errors import UsageError
from emergence.recipe import head_weights
from tests.helpers.reference_impl import reference_head_weights
from tests.helpers.tiny_models import ARCHS, tiny_config, tiny_model

# q / k norms over the projection (OLMo 2, OLMoE, Qwen 3) stand between the weights and the attention function's
# queries and keys: there only values, outputs and logits are checked in the forward pass
QK_NORMED = ("olmo2", "olmoe", "qwen3")


def all_layers(model) -> list[head_weights.LayerWeights]:
    parameters = dict(model.named_parameters())
    return [head_weights.layer_weights(parameters, s) for s in head_weights.layer_slices(model)]


@pytest.mark.parametrize("arch", ARCHS)
def test_heads_equal_a_per_family_reshape(arch):
    model = tiny_model(arch)
    ours, reference = all_layers(model), reference_head_weights(model, arch)
    assert len(ours) == model.config.num_hidden_layers == len(reference)
    for layer, expected in zip(ours, reference):
        for name in ("W_Q", "W_K", "W_V", "W_O"):
            assert torch.equal(getattr(layer, name), expected[name]), (arch, name)


@pytest.mark.parametrize("arch", ARCHS)
def test_slices_come_from_the_module_tree_alone(arch):
    """A model on the meta device (no weights: what the edge reads a series' layout from) gives the same slices."""
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(tiny_config(arch))
    assert head_weights.layer_slices(skeleton) == head_weights.layer_slices(tiny_model(arch))


def _record_attention_calls():
    calls: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def keep(module, query, key, value, attention_mask, **kwargs):
        calls.append((query.detach().clone(), key.detach().clone(), value.detach().clone()))
        kwargs.pop("softcap", None)  # Gemma 2's cap changes the pattern only, not q, k, v
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("test_keep_qkv", keep)
    AttentionMaskInterface.register("test_keep_qkv", sdpa_mask)
    return calls


@pytest.mark.parametrize("arch", ARCHS)
def test_weights_do_what_the_forward_pass_does(arch):
    """Differences between two inputs cancel the biases: (x1 - x2) @ W_V[h] is the change in head h's
    values at every position, and in its query and key at position 0, where rotary embeddings turn
    nothing; the output projection's change is the heads' changes through W_O; the logits' through W_U."""
    model = tiny_model(arch)
    if getattr(model.config, "clip_qkv", None) is not None:
        model.config.clip_qkv = None  # OLMo's clip is a nonlinearity after the weights
    calls = _record_attention_calls()
    model.set_attn_implementation("test_keep_qkv")
    slices = head_weights.layer_slices(model)
    inputs: list[torch.Tensor] = []  # each attention module's hidden states
    outputs: list[tuple[torch.Tensor, torch.Tensor]] = []  # each output projection's (input, output)
    modules = dict(model.named_modules())
    hooks = []
    for s in slices:
        attention = modules[s.q[0].name.rsplit(".", 2)[0]]
        out_proj = modules[s.o[0].name.rsplit(".", 1)[0]]
        hooks.append(
            attention.register_forward_pre_hook(
                lambda m, args, kwargs: inputs.append((args[0] if args else kwargs["hidden_states"]).detach()),
                with_kwargs=True,
            )
        )
        hooks.append(out_proj.register_forward_hook(lambda m, args, out: outputs.append((args[0], out))))
    logits_io: list[tuple[torch.Tensor, torch.Tensor]] = []
    hooks.append(
        model.get_output_embeddings().register_forward_hook(lambda m, args, out: logits_io.append((args[0], out)))
    )
    tokens = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(tokens)
    for hook in hooks:
        hook.remove()
    layers = all_layers(model)
    assert len(calls) == len(layers) == len(inputs)
    with torch.no_grad():
        for (query, key, value), x, (z, o), w in zip(calls, inputs, outputs, layers):
            dx = x[0] - x[1]  # [T, d_model]
            heads, kv_heads = query.shape[1], value.shape[1]
            group = heads // kv_heads
            for h in range(heads):
                g = h // group
                torch.testing.assert_close(value[0, g] - value[1, g], dx @ w.W_V[h], rtol=1e-4, atol=1e-5)
                if arch not in QK_NORMED:
                    torch.testing.assert_close(query[0, h, 0] - query[1, h, 0], dx[0] @ w.W_Q[h], rtol=1e-4, atol=1e-5)
                    torch.testing.assert_close(key[0, g, 0] - key[1, g, 0], dx[0] @ w.W_K[h], rtol=1e-4, atol=1e-5)
            dz = (z[0] - z[1]).reshape(z.shape[1], heads, -1)  # [T, heads, d_head]
            torch.testing.assert_close(o[0] - o[1], torch.einsum("thd,hdm->tm", dz, w.W_O), rtol=1e-4, atol=1e-5)
        hidden, logits = logits_io[0]
        torch.testing.assert_close(hidden[0] @ head_weights.unembedding(model), logits[0], rtol=1e-4, atol=1e-5)
        embed = model.get_input_embeddings()
        scale = getattr(embed, "embed_scale", 1.0)  # Gemma's sqrt(d_model), in its forward: no weight of a head
        torch.testing.assert_close(head_weights.embedding(model)[tokens[0]] * scale, embed(tokens[0]))


def test_a_model_without_known_projections_is_one_line():
    model = tiny_model("llama")
    for layer in model.model.layers:
        layer.self_attn.q_proj, layer.self_attn.query = None, layer.self_attn.q_proj
    with pytest.raises(UsageError, match="heads' weights cannot be read"):
        head_weights.layer_slices(model)
