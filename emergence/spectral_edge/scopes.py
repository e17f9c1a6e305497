"""The scopes of the edge, and each parameter cut into the cells the scopes are sums of.

Scopes (found from the module tree alone, so a model built on the meta device from the checkpoint's
config will do, ``meta_model``: nothing is allocated):

* ``model``: every trained parameter, once. ``named_parameters`` lists a tied tensor once (a tied
  ``lm_head`` that is the embedding does not count twice); buffers (rotary tables, masks) never count.
* ``embed``: the input embedding and any other embedding outside the decoder blocks (GPT-2's positions);
  ``unembed``: the output embedding where it is a tensor of its own (absent where tied).
* ``L<i>``: every parameter of decoder block i, and its groups (Xu's per-block grouping): ``L<i>.attn``
  (the attention module's parameters, q/k norms and biases included), ``L<i>.norm`` (the block's other
  normalisation layers), ``L<i>.mlp`` (the rest: the MLP, or the experts and their router).
* ``L<i>H<j>``: head j's weights, no biases: its rows of W_Q, W_K, W_V and its columns of W_O, as
  ``recipe.head_weights.layer_slices`` cuts them; under grouped-query attention a group's K/V rows
  belong to each of its heads.

A parameter is seen as a matrix [rows, cols] and cut into **cells**: one
rectangle per distinct head block (rows of W_Q/W_K/W_V, columns of W_O, or the transposed layouts), the
rest of it whole. Each cell lists every scope it belongs to (its head(s), group, layer, ``model``), so a
scope's Gram matrix is the sum of its cells' and each coordinate is touched once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from emergence.recipe.head_weights import layer_slices
from emergence.spectral_edge.records import MODEL_SCOPE

BLOCK_PREFIX = re.compile(r"^(.*?\.\d+)\.")  # "gpt_neox.layers.3.attention...." -> "gpt_neox.layers.3"
GROUPS = ("attn", "mlp", "norm")


@dataclass(frozen=True)
class Cell:
    """Rows [row0, row1) x columns [col0, col1) of one parameter's matrix, and the scopes it adds to."""

    name: str  # the parameter's name in ``named_parameters`` (its state-dict key)
    row0: int
    row1: int
    col0: int
    col1: int
    scopes: tuple[int, ...]  # indices into ``Layout.scopes``

    @property
    def numel(self) -> int:
        return (self.row1 - self.row0) * (self.col1 - self.col0)


@dataclass(frozen=True)
class Layout:
    """Every scope's name, and every trained parameter as a matrix cut into cells."""

    scopes: list[str]  # "model", "embed", ["unembed"], "L0", "L0.attn", "L0.mlp", "L0.norm", "L0H0", ...
    matrices: dict[str, tuple[int, int]]  # each parameter as [rows, cols], in named_parameters' order
    cells: dict[str, list[Cell]]  # per parameter: its cells, covering it once

    def numel(self, scope: str) -> int:
        index = self.scopes.index(scope)
        return sum(c.numel for cells in self.cells.values() for c in cells if index in c.scopes)


def as_matrix(shape: tuple[int, ...], cut: bool) -> tuple[int, int]:
    """A parameter as [rows, cols]: a weight cut into heads as its own matrix; any other as one column
    [numel, 1], so that it is read in blocks of any size (an expert tensor's row can be huge)."""
    numel = 1
    for d in shape:
        numel *= int(d)
    return (int(shape[0]), numel // int(shape[0])) if cut else (numel, 1)


def meta_model(hf_config, trust_remote_code: bool = False) -> torch.nn.Module:
    """The checkpoint's architecture on the meta device: its parameters' names and shapes, no memory."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(hf_config, trust_remote_code=trust_remote_code)


def modules_parameters(model: torch.nn.Module, getter: str) -> list[torch.nn.Parameter]:
    """The parameters of the module a transformers model's ``getter`` returns (none where it has none)."""
    module = getattr(model, getter)()
    return [] if module is None else list(module.parameters())


def _owner(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else ""


def layout_of(model: torch.nn.Module) -> Layout:
    """The scopes and cells of ``model`` (its parameters' names and shapes, and its heads' slices)."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    modules = dict(model.named_modules())
    heads = layer_slices(model)
    blocks: list[str] = []
    for layer in heads:
        found = BLOCK_PREFIX.match(layer.q[0].name)
        if found is None:  # an attention module outside a numbered list of blocks
            raise ValueError(f"{layer.q[0].name}: no decoder block index in the parameter's name")
        blocks.append(found.group(1) + ".")
    attention = [_owner(_owner(layer.q[0].name)) + "." for layer in heads]  # "....layers.3.attention."

    embeddings = {id(p) for p in modules_parameters(model, "get_input_embeddings")}
    unembeddings = {id(p) for p in modules_parameters(model, "get_output_embeddings")} - embeddings

    def whole_scopes(name: str) -> list[str]:
        for i, block in enumerate(blocks):
            if name.startswith(block):
                if name.startswith(attention[i]):
                    group = "attn"
                elif "norm" in type(modules[_owner(name)]).__name__.lower():
                    group = "norm"
                else:
                    group = "mlp"
                return [MODEL_SCOPE, f"L{i}", f"L{i}.{group}"]
        p = params[name]
        if id(p) in unembeddings:
            return [MODEL_SCOPE, "unembed"]
        if id(p) in embeddings or isinstance(modules[_owner(name)], torch.nn.Embedding):
            return [MODEL_SCOPE, "embed"]
        return [MODEL_SCOPE]  # the final norm: the model's only

    scopes = [MODEL_SCOPE, "embed", *(["unembed"] if any(id(p) in unembeddings for p in params.values()) else [])]
    for i, layer in enumerate(heads):
        scopes += [f"L{i}", *(f"L{i}.{g}" for g in GROUPS)]
        scopes += [f"L{i}H{j}" for j in range(layer.n_heads)]
    index = {s: k for k, s in enumerate(scopes)}

    # per parameter: (dimension of the matrix it is cut along, start, stop) -> the heads holding that block
    parts: dict[str, dict[tuple[int, int, int], list[str]]] = {}
    for i, layer in enumerate(heads):
        for j in range(layer.n_heads):
            for s in layer.of_head(j):
                parts.setdefault(s.name, {}).setdefault((s.dim, s.start, s.stop), []).append(f"L{i}H{j}")

    cells: dict[str, list[Cell]] = {}
    matrices: dict[str, tuple[int, int]] = {}
    for name, p in params.items():
        whole = [index[s] for s in whole_scopes(name) if s in index]
        cut = parts.get(name, {})
        rows, cols = matrices[name] = as_matrix(tuple(p.shape), bool(cut))
        dims = {dim for dim, _, _ in cut}
        if len(dims) > 1 or (cut and p.dim() != 2):
            raise ValueError(f"{name}: head blocks cut along {sorted(dims)} of a {p.dim()}-d parameter")
        along = next(iter(dims), 0)
        length = rows if along == 0 else cols
        pieces: list[tuple[int, int, tuple[int, ...]]] = []  # (start, stop, scopes) along ``along``
        at = 0
        for (_, start, stop), holders in sorted(cut.items(), key=lambda kv: kv[0][1]):
            if start < at:
                raise ValueError(f"{name}: head blocks overlap at {start}")
            if start > at:
                pieces.append((at, start, tuple(whole)))
            pieces.append((start, stop, tuple(whole + [index[h] for h in holders])))
            at = stop
        if at < length:
            pieces.append((at, length, tuple(whole)))
        cells[name] = [
            Cell(name, a, b, 0, cols, s) if along == 0 else Cell(name, 0, rows, a, b, s) for a, b, s in pieces
        ]
    # a group with no parameters (OLMo's norms have no weights) is no scope
    used = sorted({k for cs in cells.values() for c in cs for k in c.scopes})
    renumber = {old: new for new, old in enumerate(used)}
    return Layout(
        [scopes[k] for k in used],
        matrices,
        {
            n: [Cell(c.name, c.row0, c.row1, c.col0, c.col1, tuple(renumber[k] for k in c.scopes)) for c in cs]
            for n, cs in cells.items()
        },
    )
