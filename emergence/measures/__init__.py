"""The registry of per-checkpoint measures beside the recipe's screen (``plugin.Measure``).

Adding a measure is its module here (with its ``MEASURE``), its entry in ``MEASURES``, its
config fields if it has settings, its test and its docs: the run's steps (``main.analyse``,
``run/steps.py``), the records (``run/results.py``), the measurement cache (``run/cache.py``), W&B
(``run/tracking.py``) and the panel (``panel/``) read what it declares. docs/measures.md lists them.
"""

from __future__ import annotations

from emergence.measures import prefix_matching, value_drain, weight_circuits
from emergence.measures.plugin import Column, Measure, MeasureInput, Trajectory
from emergence.recipe.measurements import MeasureResult

# heads.csv holds their columns in this order, after the screen's
MEASURES: tuple[Measure, ...] = (value_drain.MEASURE, prefix_matching.MEASURE, weight_circuits.MEASURE)


def measure_all(inputs: MeasureInput) -> dict[str, MeasureResult]:
    """Every registered measure's results on one checkpoint, by name."""
    return {m.name: m.run(inputs) for m in MEASURES}


def versions() -> dict[str, int]:
    """Each measure's version by name: part of the measurement cache's key."""
    return {m.name: m.version for m in MEASURES}


def columns() -> list[Column]:
    """Every measure's per-head columns, in registry order (heads.csv's after the screen's)."""
    return [c for m in MEASURES for c in m.columns]


def trajectories() -> list[Trajectory]:
    """Every measure's trajectories for the panel report, in registry order."""
    return [t for m in MEASURES for t in m.trajectories]


__all__ = [
    "MEASURES",
    "Column",
    "Measure",
    "MeasureInput",
    "MeasureResult",
    "Trajectory",
    "columns",
    "measure_all",
    "trajectories",
    "versions",
]
