"""The scopes of the edge: the whole model, each decoder block, each attention head.

A scope is a list of pieces, each a whole trained parameter or one head's block of one
(``recipe.head_weights.ParameterSlice``). The pieces are found from the module tree alone, so a model
built on the meta device from the checkpoint's config will do (``meta_model``): nothing is allocated.

* ``model``: every trained parameter, once. ``named_parameters`` lists a tied tensor once (GPT-NeoX's
  untied ``embed_out`` counts, a tied ``lm_head`` that is the embedding does not count twice); buffers
  (rotary tables, masks) are not parameters and never count.
* ``L<i>``: every parameter of layer i's decoder block (attention, MLP, norms, biases).
* ``L<i>H<j>``: head j's weights, no biases: its rows of W_Q, W_K, W_V and its columns of W_O, as
  ``layer_slices`` cuts them; under grouped-query attention a group's K/V rows belong to each of its heads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from emergence.recipe.edge import MODEL_SCOPE
from emergence.recipe.head_weights import ParameterSlice, layer_slices

BLOCK_PREFIX = re.compile(r"^(.*?\.\d+)\.")  # "gpt_neox.layers.3.attention...." -> "gpt_neox.layers.3"


@dataclass(frozen=True)
class Piece:
    """A whole parameter (``part`` None) or one head's block of it."""

    name: str  # the parameter's name in ``named_parameters`` (its state-dict key)
    part: ParameterSlice | None = None

    def of(self, weight: torch.Tensor) -> torch.Tensor:
        """The piece's values, flattened [numel] (a view where the layout allows)."""
        return (weight if self.part is None else self.part.of(weight)).reshape(-1)

    def numel(self, shapes: dict[str, torch.Size]) -> int:
        shape = shapes[self.name]
        if self.part is None:
            return shape.numel()
        return shape.numel() // shape[self.part.dim] * (self.part.stop - self.part.start)


def meta_model(hf_config, trust_remote_code: bool = False) -> torch.nn.Module:
    """The checkpoint's architecture on the meta device: its parameters' names and shapes, no memory."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(hf_config, trust_remote_code=trust_remote_code)


def scopes_of(model: torch.nn.Module) -> dict[str, list[Piece]]:
    """Every scope's pieces, in the order ``model``, ``L0``, ``L0H0``, ``L0H1``, ..., ``L1``, ..."""
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    scopes = {MODEL_SCOPE: [Piece(n) for n in names]}
    for i, heads in enumerate(layer_slices(model)):
        found = BLOCK_PREFIX.match(heads.q[0].name)
        if found is None:  # an attention module outside a numbered list of blocks
            raise ValueError(f"{heads.q[0].name}: no decoder block index in the parameter's name")
        block = found.group(1) + "."
        scopes[f"L{i}"] = [Piece(n) for n in names if n.startswith(block)]
        for j in range(heads.n_heads):
            scopes[f"L{i}H{j}"] = [Piece(s.name, s) for s in heads.of_head(j)]
    return scopes
