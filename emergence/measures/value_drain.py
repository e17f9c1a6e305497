"""The value drain of the sink mechanism (Guo et al. 2024): an attention sink's value states shrink.

Per head, ``value_norm_ratio``: the mean norm of v at position 0 over its mean norm at the other
positions, on the probe (the head's KV head under grouped-query attention). Summed at the probe
pass's attention site as the pass goes (v is gone once a layer's call returns), in float64.
Measured on every probe (docs/probes.md, "The sink mechanism").
"""

from __future__ import annotations

import torch

from emergence.measures.plugin import Column, ColumnTrajectory, Measure, MeasureAccumulator, MeasureInput, MeasureResult
from emergence.recipe import mechanism
from emergence.recipe.sites import AttentionCall


class ValueNorms(MeasureAccumulator):
    """[2, layers, heads] float64: the norms of v at position 0 and at the other positions, summed over
    sequences (each KV head's for the query heads it serves)."""

    sites = frozenset({"attention"})

    def __init__(self, inputs: MeasureInput):
        self.sums = torch.zeros(2, inputs.layers, inputs.heads, dtype=torch.float64, device=inputs.device)
        self.n, self.seq_len = inputs.batch.n, inputs.batch.seq_len

    def attention(self, layer: int, call: AttentionCall) -> None:
        norms = call.value.float().norm(dim=-1)  # [b, kv_heads, T]
        first_and_rest = torch.stack(
            [norms[..., 0].sum(0, dtype=torch.float64), norms[..., 1:].sum((0, 2), dtype=torch.float64)]
        )  # [2, kv_heads]
        self.sums[:, layer] += first_and_rest.repeat_interleave(call.query.shape[1] // call.value.shape[1], dim=1)

    def result(self) -> MeasureResult:
        ratio = mechanism.first_over_rest(self.sums[0], self.sums[1], self.n, self.seq_len)
        return MeasureResult({"value_norm_ratio": ratio}, {})


MEASURE = Measure(
    name="value_drain",
    version=1,
    needs=frozenset({"pass"}),
    columns=(
        Column(
            "value_norm_ratio",
            "the value drain: mean norm of v at position 0 over its mean norm elsewhere (the head's KV head "
            "under grouped-query attention); below 1, a drained sink",
        ),
    ),
    run_fields=(),
    trajectories=(ColumnTrajectory("value_norm_ratio", "min", "lowest |v_0| / |v|"),),
    accumulate=ValueNorms,
)
