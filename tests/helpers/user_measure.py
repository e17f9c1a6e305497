"""A copy of emergence/measures/attention_entropy.py under another name: a user's measure outside the package
(tests/e2e/test_measures.py names it by ``_target_``), as docs/measures.md's worked example adds one.

``attention_entropy``: the entropy of each query's attention over the keys it sees, -sum_k p log p in
nats, averaged over the queries at positions 1..T-1 (position 0 sees itself alone) and the probe's
sequences. 0 for a head that always attends to one key (a sink head: to key 0), up to log(q + 1)
for a head that spreads evenly over the q + 1 keys it sees. Read at the probe pass's attention site,
``settings.block`` queries at a time, so no more than [b, heads, block, T] of a layer's pattern is
ever held; summed in float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from emergence.measures.plugin import Column, ColumnTrajectory, Measure, MeasureAccumulator, MeasureInput, MeasureResult
from emergence.recipe.sites import AttentionCall


@dataclass(frozen=True)
class Settings:
    block: int = 64  # queries whose pattern rows are held at a time (memory: b x heads x block x T floats)

    def __post_init__(self):
        if self.block < 1:
            raise ValueError(f"block={self.block}: must be >= 1 (queries per block)")


class EntropySums(MeasureAccumulator):
    """[layers, heads] float64: the entropies of the queries 1..T-1's rows, summed over queries and sequences."""

    sites = frozenset({"attention"})

    def __init__(self, inputs: MeasureInput):
        self.block = inputs.settings.block
        self.rows = inputs.batch.n * (inputs.batch.seq_len - 1)
        self.sums = torch.zeros(inputs.layers, inputs.heads, dtype=torch.float64, device=inputs.device)

    def attention(self, layer: int, call: AttentionCall) -> None:
        T = call.query.shape[2]
        for start in range(1, T, self.block):
            p = call.rows(slice(start, min(start + self.block, T)))  # [b, heads, block, T]
            entropy = -torch.special.xlogy(p, p).sum(-1)  # 0 log 0 = 0
            self.sums[layer] += entropy.sum((0, 2), dtype=torch.float64)

    def result(self) -> MeasureResult:
        return MeasureResult({"head_entropy": (self.sums / self.rows).cpu().numpy()}, {})


MEASURE = Measure(
    name="head_entropy",
    version=1,
    needs=frozenset({"pass"}),
    columns=(Column("head_entropy", "mean entropy (nats) of a query's attention over its keys, queries 1..T-1"),),
    run_fields=(),
    trajectories=(ColumnTrajectory("head_entropy", "mean", "mean attention entropy (nats)"),),
    accumulate=EntropySums,
    settings=Settings,
)
