"""Olsson et al.'s in-context learning score on the text probe (``recipe.icl``, docs/probes.md).

The probe pass's ``final`` site hands each minibatch's per-token losses [b, T-1] (the text probe's
curve positions, NaN elsewhere); ``PositionLosses`` keeps them, [n, T-1] float32 in all, and the
result is ``recipe.icl.text_scores`` on them: per run, ``icl_score`` (the mean loss at
``probe.icl_positions[1]`` minus at ``[0]``), its bootstrap interval over sequences, the loss curve
``loss_by_position`` and what it was measured on. On the other probes it reads nothing and its fields
are None. Runs before the registry held these fields as summary.json ``text`` (``legacy``).
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import torch

from emergence.core.record import Record
from emergence.measures.plugin import (
    Measure,
    MeasureAccumulator,
    MeasureInput,
    MeasureResult,
    ProbeKind,
    RunTrajectory,
)
from emergence.recipe import icl, text
from emergence.recipe.sites import Final

FIELDS = tuple(f.name for f in fields(icl.TextScores))


class PositionLosses(MeasureAccumulator):
    """The ``final`` site's per-token losses of every sequence, [n, T-1] float32, on the runs of ``probe``
    only; its result is ``scores`` of them (a record of the ``field_names``), each field None on other probes."""

    probe: ProbeKind
    field_names: tuple[str, ...]

    def __init__(self, inputs: MeasureInput):
        self.inputs = inputs
        self.reading = inputs.probe_kind == self.probe
        if self.reading:
            self.sites = frozenset({"final"})
        self.losses: list[torch.Tensor] = []

    def final(self, final: Final) -> None:
        assert final.losses is not None  # the text and repeat probes' passes compute them
        self.losses.append(final.losses.cpu())

    def scores(self, losses: np.ndarray) -> Record:
        raise NotImplementedError

    def result(self) -> MeasureResult:
        if not self.reading:
            return MeasureResult({}, dict.fromkeys(self.field_names))
        return MeasureResult({}, self.scores(torch.cat(self.losses).numpy()).to_json())


class TextLosses(PositionLosses):
    probe = "text"
    field_names = FIELDS

    def scores(self, losses: np.ndarray) -> Record:
        p, inputs = self.inputs.probe, self.inputs
        assert inputs.tokenizer is not None  # the text probe's (``batches.probe_batch``)
        return icl.text_scores(losses, list(p.icl_positions), inputs.stats, text.source_name(p), inputs.tokenizer)


def legacy(summary: dict) -> dict | None:
    """This measure's fields from a summary.json of schemas 2 to 4 (``text``); None: none there."""
    return summary.get("text")


MEASURE = Measure(
    name="icl",
    version=1,
    needs=frozenset({"pass"}),
    columns=(),
    run_fields=FIELDS,
    trajectories=(),
    accumulate=TextLosses,
    run_trajectories=(RunTrajectory(key="icl_score", field="icl_score", label="ICL score (nats)", probes=("text",)),),
    legacy=legacy,
)
