"""Massive activations of the residual stream (Sun et al. 2024): the sink mechanism's other half.

A few activations of the residual stream, over 1000x its median magnitude, at the first token and in
fixed dimensions. An accumulator of the probe pass's ``resid_post`` site reduces each decoder layer's
output h [b, T, d_model] as the pass goes (``recipe.mechanism.ResidualRecorder``: the largest |h| with
its position and dimension, the median |h|, the mean norm at position 0 over elsewhere). Per run,
``layers`` (one record per decoder layer) and ``top_ratio`` (the largest top / median over layers);
the token axis draws ``top_ratio`` (log scale) and marks the first revision over 1000x.
Measured on every probe. Runs before the registry held ``layers`` as summary.json
``massive_activations``: they read as this measure's (``legacy``).
"""

from __future__ import annotations

import torch

from emergence.measures.plugin import Measure, MeasureAccumulator, MeasureInput, MeasureResult, RunTrajectory
from emergence.recipe.mechanism import ResidualRecorder

MASSIVE_RATIO = 1000.0  # a massive activation: top |h| over this many times the median (Sun et al. 2024)


class MassiveActivations(MeasureAccumulator):
    """The residual reductions of ``ResidualRecorder``, as a measure's accumulator."""

    sites = frozenset({"resid_post"})

    def __init__(self, inputs: MeasureInput):
        self.recorder = ResidualRecorder(inputs.layers, inputs.device)

    def resid_post(self, layer: int, hidden: torch.Tensor) -> None:
        self.recorder.resid_post(layer, hidden)

    def result(self) -> MeasureResult:
        layers = [r.to_json() for r in self.recorder.result().records()]
        return MeasureResult({}, {"layers": layers, "top_ratio": max(r["ratio"] for r in layers)})


def legacy(summary: dict) -> dict | None:
    """This measure's fields from a summary.json of schema 2 or 3 (``massive_activations``); None: none there."""
    layers = summary.get("massive_activations")
    if not layers:
        return None
    return {"layers": layers, "top_ratio": max(r["ratio"] for r in layers)}


MEASURE = Measure(
    name="massive_activations",
    version=1,
    needs=frozenset({"pass"}),
    columns=(),
    run_fields=("layers", "top_ratio"),
    trajectories=(),
    accumulate=MassiveActivations,
    run_trajectories=(
        RunTrajectory(
            key="massive_activation_ratio",
            field="top_ratio",
            label="top / median |h|",
            level=MASSIVE_RATIO,
            event="massive_activation",
            log_scale=True,
        ),
    ),
    legacy=legacy,
)
