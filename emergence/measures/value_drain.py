"""The value drain of the sink mechanism (Guo et al. 2024): an attention sink's value states shrink.

Per head, ``value_norm_ratio``: the mean norm of v at position 0 over its mean norm at the other
positions, on the probe (the head's KV head under grouped-query attention). The probe pass sums the
norms as it goes (``recipe.capture``'s ``Recorder``, ``recipe.mechanism``), since v is gone once a
layer's call returns; this measure is its column, its trajectory and its docs (docs/probes.md,
"The sink mechanism"). Measured on every probe.
"""

from __future__ import annotations

from emergence.measures.plugin import Column, Measure, MeasureInput, Trajectory
from emergence.recipe.measurements import MeasureResult


def compute(inputs: MeasureInput) -> MeasureResult:
    return MeasureResult({"value_norm_ratio": inputs.measured.value_norm_ratio}, {})


MEASURE = Measure(
    name="value_drain",
    version=1,
    needs=frozenset({"capture"}),
    columns=(Column("value_norm_ratio", "mean |v| at position 0 over its mean elsewhere: below 1, a drained sink"),),
    run_fields=(),
    trajectories=(Trajectory("value_norm_ratio", "min", "lowest |v_0| / |v|"),),
    compute=compute,
)
