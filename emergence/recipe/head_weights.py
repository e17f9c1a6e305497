"""Each head's weights, for every supported architecture (docs/glossary.md names the dimensions).

The conventions are TransformerLens's (Elhage et al. 2021), so that a circuit reads as written:

* ``W_Q[h]``, ``W_K[h]``, ``W_V[h]``: [d_model, d_head]; head h's query is ``x @ W_Q[h]`` (biases,
  layer norms, q/k norms and rotary embeddings are not weights of a head, and are left out).
  Under grouped- and multi-query attention head h reads its group's key and value rows:
  group ``h // (heads // kv_heads)``, shared by every head of the group.
* ``W_O[h]``: [d_head, d_model]; head h's share of the attention output is ``z_h @ W_O[h]``.
* ``W_E``: [d_vocab, d_model], the input embedding; ``W_U``: [d_model, d_vocab], the unembedding
  (the output embedding transposed: the same tensor where they are tied).

Where a head sits in its layer's parameters is a ``ParameterSlice``: the parameter's name (its
state-dict key), the dimension it is cut along and the range. ``layer_slices`` finds them from the
module tree alone (a model on the meta device will do), for the projections transformers writes:

* ``q_proj`` / ``k_proj`` / ``v_proj`` (Linear, weight [out, in]): Llama, Mistral, Qwen, Gemma,
  OLMo, OLMoE, ...; output ``o_proj`` (Linear [d_model, heads * d_head]);
* ``qkv_proj`` (Phi-3): one Linear, rows q | k | v, with kv_heads heads each for k and v;
* ``query_key_value`` (GPT-NeoX): one Linear whose rows hold, head after head, that head's q | k | v;
  output ``dense``;
* ``c_attn`` (GPT-2): one Conv1D, weight [d_model, 3 d_model], columns q | k | v; output ``c_proj``
  (Conv1D, weight [heads * d_head, d_model]).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float

from emergence.core.errors import UsageError

# The attention module's projections by how they are laid out; its output projection's name.
SEPARATE, PHI3_FUSED, NEOX_FUSED, GPT2_FUSED = (
    ("q_proj", "k_proj", "v_proj"),
    ("qkv_proj",),
    ("query_key_value",),
    ("c_attn",),
)
OUTPUT_NAMES = ("o_proj", "dense", "c_proj")


@dataclass(frozen=True)
class ParameterSlice:
    """One head's block of one weight: ``weight.narrow(dim, start, stop - start)``, transposed where
    ``transpose`` (so that W_Q / W_K / W_V read [d_model, d_head] and W_O [d_head, d_model])."""

    name: str  # the parameter's name in ``model.named_parameters()`` (its state-dict key)
    dim: int  # the dimension the head's block is cut along
    start: int
    stop: int
    transpose: bool

    def of(self, weight: torch.Tensor) -> torch.Tensor:
        """The head's block of ``weight`` (the parameter this slice names), a view."""
        block = weight.narrow(self.dim, self.start, self.stop - self.start)
        return block.T if self.transpose else block


@dataclass(frozen=True)
class HeadSlices:
    """Where each head of one attention layer sits: per head, in head order."""

    q: list[ParameterSlice]
    k: list[ParameterSlice]  # under grouped-query attention a group's heads share one slice
    v: list[ParameterSlice]
    o: list[ParameterSlice]

    @property
    def n_heads(self) -> int:
        return len(self.q)

    def of_head(self, head: int) -> list[ParameterSlice]:
        """The head's four blocks, W_Q, W_K, W_V, W_O."""
        return [self.q[head], self.k[head], self.v[head], self.o[head]]


@dataclass(frozen=True)
class LayerWeights:
    """One attention layer's weights by head (views of the model's parameters where the layout allows)."""

    W_Q: Float[torch.Tensor, "heads d_model d_head"]
    W_K: Float[torch.Tensor, "heads d_model d_head"]  # a group's heads repeat its rows
    W_V: Float[torch.Tensor, "heads d_model d_head"]
    W_O: Float[torch.Tensor, "heads d_head d_model"]


def _attention_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(name, module) of every attention module, in layer order: a module with one of the known
    projection layouts among its children."""
    found = []
    for name, module in model.named_modules():
        children = {n for n, _ in module.named_children()}
        if any(set(layout) <= children for layout in (SEPARATE, PHI3_FUSED, NEOX_FUSED, GPT2_FUSED)):
            found.append((name, module))
    return found


def _rows(
    weight: str,
    first: int,
    d_head: int,
    count: int,
    stride: int,
    dim: int,
    transpose: bool,
) -> list[ParameterSlice]:
    """``count`` consecutive blocks of ``d_head`` along ``dim``, the i-th at ``first + i * stride``."""
    return [
        ParameterSlice(weight, dim, first + i * stride, first + i * stride + d_head, transpose) for i in range(count)
    ]


def _grouped(per_group: list[ParameterSlice], n_heads: int) -> list[ParameterSlice]:
    """Per-head slices from per-group ones: head h reads group h // (heads // groups)."""
    group_size = n_heads // len(per_group)
    return [per_group[h // group_size] for h in range(n_heads)]


def _linear_out(module) -> int:
    return module.weight.shape[0]


def layer_slices(model) -> list[HeadSlices]:
    """Every attention layer's ``HeadSlices``, in layer order, found from the module tree (the heads
    from the config, d_head and the key-value heads from the projections' shapes); a layout none of
    those above is ``UsageError``."""
    n_heads = model.config.num_attention_heads
    layers = []
    for prefix, attention in _attention_modules(model):
        child: dict[str, Any] = dict(attention.named_children())
        out_name = next((n for n in OUTPUT_NAMES if n in child), None)
        if out_name is None:
            raise UsageError(
                f"model architecture {model.config.model_type!r}: {type(attention).__name__} has no "
                f"output projection named {' or '.join(OUTPUT_NAMES)}, so its heads' weights cannot be "
                "read"
            )
        p = f"{prefix}." if prefix else ""
        out = child[out_name]
        is_conv1d = out_name == "c_proj"  # GPT-2's Conv1D: weight [in, out]
        heads_times_d = out.weight.shape[0] if is_conv1d else out.weight.shape[1]
        d_head = heads_times_d // n_heads
        o = _rows(f"{p}{out_name}.weight", 0, d_head, n_heads, d_head, 0 if is_conv1d else 1, not is_conv1d)
        if set(SEPARATE) <= child.keys():
            q = _rows(f"{p}q_proj.weight", 0, d_head, n_heads, d_head, 0, True)
            kv_heads = _linear_out(child["k_proj"]) // d_head
            k = _grouped(_rows(f"{p}k_proj.weight", 0, d_head, kv_heads, d_head, 0, True), n_heads)
            v = _grouped(_rows(f"{p}v_proj.weight", 0, d_head, kv_heads, d_head, 0, True), n_heads)
        elif "qkv_proj" in child:
            name, q_rows = f"{p}qkv_proj.weight", n_heads * d_head
            kv_heads = (_linear_out(child["qkv_proj"]) - q_rows) // (2 * d_head)
            q = _rows(name, 0, d_head, n_heads, d_head, 0, True)
            k = _grouped(_rows(name, q_rows, d_head, kv_heads, d_head, 0, True), n_heads)
            v = _grouped(_rows(name, q_rows + kv_heads * d_head, d_head, kv_heads, d_head, 0, True), n_heads)
        elif "query_key_value" in child:  # rows: head 0's q | k | v, head 1's q | k | v, ...
            name = f"{p}query_key_value.weight"
            q, k, v = (_rows(name, part * d_head, d_head, n_heads, 3 * d_head, 0, True) for part in range(3))
        else:  # GPT-2's c_attn, Conv1D: columns q | k | v, each heads * d_head wide
            name = f"{p}c_attn.weight"
            q, k, v = (_rows(name, part * heads_times_d, d_head, n_heads, d_head, 1, False) for part in range(3))
        layers.append(HeadSlices(q, k, v, o))
    if not layers:
        raise UsageError(
            f"model architecture {model.config.model_type!r}: no attention module with projections "
            f"named {', '.join(SEPARATE + PHI3_FUSED + NEOX_FUSED + GPT2_FUSED)}, so its heads' "
            "weights cannot be read"
        )
    return layers


def layer_weights(parameters: dict[str, torch.Tensor], slices: HeadSlices) -> LayerWeights:
    """One layer's weights by head, cut from ``parameters`` (``dict(model.named_parameters())``)."""

    def stack(per_head: list[ParameterSlice]) -> torch.Tensor:
        return torch.stack([s.of(parameters[s.name]) for s in per_head])

    return LayerWeights(stack(slices.q), stack(slices.k), stack(slices.v), stack(slices.o))


def embedding(model) -> torch.Tensor:
    """W_E [d_vocab, d_model] (Gemma's sqrt(d_model) input scale is the model's forward, not a weight)."""
    return model.get_input_embeddings().weight


def unembedding(model) -> torch.Tensor:
    """W_U [d_model, d_vocab]: the output embedding, transposed (a view)."""
    return model.get_output_embeddings().weight.T
