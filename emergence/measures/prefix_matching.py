"""The repeat probe's prefix-matching score (Olsson et al. 2022), per head.

``prefix_matching``: the mean attention from each token of the span's second copy to the token after
its earlier occurrence (docs/probes.md, "Repeat probe"), read off the attention kernel at the probe
pass's attention site (``Reads.lag``: each query's attention to the key ``RepeatLayout.lag`` back)
and summed in float64. On the other probes the column is NaN and nothing is drawn.
"""

from __future__ import annotations

import numpy as np
import torch

from emergence.measures.plugin import Column, ColumnTrajectory, Measure, MeasureAccumulator, MeasureInput, MeasureResult
from emergence.recipe.probe import RepeatLayout
from emergence.recipe.sites import AttentionCall, Reads


class PrefixSums(MeasureAccumulator):
    """[layers, heads] float64: the attention from the copy's tokens to their earlier successors, summed
    over the copy and the sequences (the repeat probe; elsewhere it reads nothing)."""

    def __init__(self, inputs: MeasureInput):
        self.shape = (inputs.layers, inputs.heads)
        self.n = inputs.batch.n
        self.layout = RepeatLayout(inputs.batch.seq_len) if inputs.probe_kind == "repeat" else None
        if self.layout is not None:
            self.sites = frozenset({"attention"})
            self.reads = Reads(lag=self.layout.lag)
        self.sums = torch.zeros(self.shape, dtype=torch.float64, device=inputs.device)

    def attention(self, layer: int, call: AttentionCall) -> None:
        assert self.layout is not None and call.to_lagged is not None  # our reads ask for it
        self.sums[layer] += call.to_lagged[..., -self.layout.span :].sum((0, 2), dtype=torch.float64)

    def result(self) -> MeasureResult:
        if self.layout is None:
            return MeasureResult({"prefix_matching": np.full(self.shape, np.nan)}, {})
        return MeasureResult({"prefix_matching": (self.sums / (self.n * self.layout.span)).cpu().numpy()}, {})


MEASURE = Measure(
    name="prefix_matching",
    version=1,
    needs=frozenset({"pass"}),
    columns=(
        Column(
            "prefix_matching",
            "`probe=repeat`: mean attention from each token of the copy to the token after its earlier "
            "occurrence; empty (NaN) on other probes",
        ),
    ),
    run_fields=(),
    trajectories=(ColumnTrajectory("prefix_matching", "max", "top prefix matching", probes=("repeat",)),),
    accumulate=PrefixSums,
)
