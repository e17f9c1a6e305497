"""Gu et al.'s key-0 importance per head and sequence, and their Sink_eps (``recipe.sinks``, docs/sinks.md).

An accumulator of the probe pass's attention site that asks the kernel for every query's attention to
key 0 (``Reads.first_key``) and keeps each layer's importance of key 0 (its mean attention over the
queries that see it, ``sinks.first_key_importance``), [n, layers, heads] float32 per sequence. Column
``sink_importance``: its mean over sequences (in float64). Per run, Sink_eps (``sinks.sink_metric``: the
share of (sequence, layer, head) over ``epsilon``, its bootstrap interval and its share per layer). The
per-sequence values go to per_sequence.npz, where the panel's second sink definition reads them
(``SinkShare``: Sink_0 beside the BOS fraction, F1-F3 under it). Runs before the registry held the
per-run fields as summary.json ``sink_metric`` (``legacy``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from emergence.measures.plugin import Column, Measure, MeasureAccumulator, MeasureInput, MeasureResult, SinkShare
from emergence.recipe import sinks
from emergence.recipe.capture import non_finite
from emergence.recipe.pass_record import sequence_mean
from emergence.recipe.sites import AttentionCall, BatchSlice, Reads

COLUMN = "sink_importance"


@dataclass(frozen=True)
class Settings:
    epsilon: float = sinks.EPSILON  # a head is a sink on a sequence when key 0's importance exceeds it

    def __post_init__(self):
        if not 0 < self.epsilon < 1:  # also refuses nan
            raise ValueError(f"epsilon={self.epsilon}: must be in (0, 1), a share of attention")


class FirstKeyImportance(MeasureAccumulator):
    """[n, layers, heads] float32: key 0's importance per sequence, layer and head."""

    sites = frozenset({"attention"})
    reads = Reads(first_key=True)

    def __init__(self, inputs: MeasureInput):
        self.inputs = inputs
        self.importance = torch.zeros(inputs.batch.n, inputs.layers, inputs.heads, dtype=torch.float32)
        self._layers: list = [None] * inputs.layers  # this minibatch's [b, heads] per layer
        self._start = 0

    def begin_batch(self, batch: BatchSlice) -> None:
        self._start = batch.start

    def attention(self, layer: int, call: AttentionCall) -> None:
        assert call.to_key0 is not None  # our reads ask for it
        self._layers[layer] = sinks.first_key_importance(call.to_key0, None if call.mask is None else call.mask[..., 0])

    def end_batch(self) -> None:
        importance = torch.stack(self._layers, dim=1)  # [b, layers, heads]
        self._layers = [None] * len(self._layers)
        if not torch.isfinite(importance).all():
            raise non_finite(self.inputs.model.dtype)
        self.importance[self._start : self._start + len(importance)] = importance.cpu()

    def result(self) -> MeasureResult:
        importance = self.importance.numpy()
        metric = sinks.sink_metric(importance, self.inputs.settings.epsilon, self.inputs.stats)
        return MeasureResult({COLUMN: sequence_mean(importance)}, metric.to_json(), {COLUMN: importance})


def legacy(summary: dict) -> dict | None:
    """This measure's fields from a summary.json of schemas 2 to 4 (``sink_metric``); None: none there."""
    return summary.get("sink_metric")


MEASURE = Measure(
    name="sink_importance",
    version=1,
    needs=frozenset({"pass"}),
    columns=(
        Column(
            COLUMN,
            "Gu et al.'s importance of key 0: its mean attention over every query that sees it, averaged over "
            "sequences ([sinks.md](sinks.md))",
        ),
    ),
    run_fields=tuple(f.name for f in dataclasses.fields(sinks.SinkMetric)),
    trajectories=(),
    accumulate=FirstKeyImportance,
    settings=Settings,
    sequences=(COLUMN,),
    sink_share=SinkShare(array=COLUMN, definition=sinks.SINK_DEFINITION),
    legacy=legacy,
)
