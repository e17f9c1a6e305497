"""The repeat probe's prefix-matching score (Olsson et al. 2022), per head.

``prefix_matching``: the mean attention from each token of the span's second copy to the token after
its earlier occurrence (docs/probes.md, "Repeat probe"). The probe pass sums it where the probe is
``repeat`` (``recipe.capture``); on the other probes the column is NaN and nothing is drawn.
"""

from __future__ import annotations

import numpy as np

from emergence.measures.plugin import Column, Measure, MeasureInput, Trajectory
from emergence.recipe.measurements import MeasureResult


def compute(inputs: MeasureInput) -> MeasureResult:
    score = inputs.measured.prefix_matching
    return MeasureResult({"prefix_matching": np.full(inputs.measured.pr.shape, np.nan) if score is None else score}, {})


MEASURE = Measure(
    name="prefix_matching",
    version=1,
    needs=frozenset({"capture"}),
    columns=(
        Column(
            "prefix_matching",
            "probe=repeat: attention from the copy to the token after its first occurrence; NaN on other probes",
        ),
    ),
    run_fields=(),
    trajectories=(Trajectory("prefix_matching", "max", "top prefix matching", probes=("repeat",)),),
    compute=compute,
)
