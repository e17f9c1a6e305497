"""The repeat probe's loss drop: how much better the span's second copy is predicted than its first
(``recipe.icl``, docs/probes.md).

From the probe pass's per-token losses (``icl.PositionLosses``), ``recipe.icl.repeat_scores``: per run,
``loss_drop`` (the mean loss on the first copy minus on the second, over the tokens the copy makes
predictable), both copies' losses and the drop's bootstrap interval over sequences. On the other probes
it reads nothing and its fields are None. Runs before the registry held these fields as summary.json
``repeat`` (``legacy``).
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np

from emergence.core.record import Record
from emergence.measures.icl import PositionLosses
from emergence.measures.plugin import Measure, RunTrajectory
from emergence.recipe import icl
from emergence.recipe.probe import RepeatLayout

FIELDS = tuple(f.name for f in fields(icl.RepeatScores))


class RepeatLosses(PositionLosses):
    probe = "repeat"
    field_names = FIELDS

    def scores(self, losses: np.ndarray) -> Record:
        return icl.repeat_scores(losses, RepeatLayout(self.inputs.batch.seq_len), self.inputs.stats)


def legacy(summary: dict) -> dict | None:
    """This measure's fields from a summary.json of schemas 2 to 4 (``repeat``); None: none there."""
    return summary.get("repeat")


MEASURE = Measure(
    name="repeat_loss",
    version=1,
    needs=frozenset({"pass"}),
    columns=(),
    run_fields=FIELDS,
    trajectories=(),
    accumulate=RepeatLosses,
    run_trajectories=(
        RunTrajectory(key="loss_drop", field="loss_drop", label="repeat loss drop (nats)", probes=("repeat",)),
    ),
    legacy=legacy,
)
