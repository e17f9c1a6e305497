"""What a per-checkpoint measure declares, and what it gets and gives (``emergence/measures``).

A measure is one module with a ``MEASURE``: its name and version, what it needs of the run
(``Need``), the per-head columns it adds to heads.csv (and W&B's head table), the per-run fields it
adds to summary.json's ``measures[<name>]`` (each logged to W&B as ``<name>/<field>``), and the
trajectories the panel report draws of it over a model's checkpoints (``Trajectory``). The run's
steps, the records, the measurement cache, W&B and the panel iterate over the registry
(``emergence.measures.MEASURES``) and know no measure by name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from emergence.recipe.measurements import Measurements, MeasureResult
from emergence.recipe.probe import ProbeBatch

# weights: the loaded model; capture: the probe pass's measurements; probe_batch: the probe's tokens;
# tokenizer: the text probe's tokenizer name
Need = Literal["weights", "capture", "probe_batch", "tokenizer"]

Reduction = Literal["max", "min", "mean"]
REDUCTIONS: dict[str, Callable[[np.ndarray], float]] = {"max": np.nanmax, "min": np.nanmin, "mean": np.nanmean}


def reduce_heads(grid: np.ndarray | None, how: Reduction) -> float | None:
    """``grid``'s max, min or mean over the values it holds (NaN: not measured); None where it holds none."""
    if grid is None or np.isnan(grid).all():
        return None
    return float(REDUCTIONS[how](grid))


@dataclass(frozen=True)
class MeasureInput:
    """What a checkpoint's run offers a measure: everything it may need (``Measure.needs``)."""

    model: Any | None  # the model, in eval mode on its device; None where the cache serves (no measure runs then)
    measured: Measurements  # the probe pass's per-head measurements (``recipe.measurements``)
    batch: ProbeBatch  # the probe's tokens
    tokenizer: str | None  # the text probe's tokenizer (repo@revision or bytes); None: other probes


@dataclass(frozen=True)
class Column:
    """A per-head column of heads.csv, [layers, heads]; NaN where a head has no value."""

    name: str
    meaning: str  # one line, for docs/outputs.md and the W&B table's readers


ProbeKind = Literal["synthetic", "repeat", "text"]  # ``probe.kind``


@dataclass(frozen=True)
class Trajectory:
    """What the panel report draws of a column over a model's checkpoints: its ``reduce`` over the heads
    (``max``, ``min`` or ``mean``) at each checkpoint, as a panel of the token axis (docs/probes.md), for
    the runs of the ``probes`` it is measured on."""

    column: str
    reduce: Reduction
    label: str  # the panel's axis label
    probes: tuple[ProbeKind, ...] = ("synthetic", "repeat", "text")

    @property
    def key(self) -> str:
        """Its name among the token axis's measures (``prefix_matching_max`` style)."""
        return f"{self.column}_{self.reduce}"

    def value(self, grid: np.ndarray | None) -> float | None:
        """Its value at a checkpoint whose column is ``grid`` [layers, heads]; None where not measured."""
        return reduce_heads(grid, self.reduce)


@dataclass(frozen=True)
class Measure:
    """A per-checkpoint measure: ``compute`` maps the run's ``MeasureInput`` to its ``MeasureResult``."""

    name: str  # summary.json measures[<name>], W&B <name>/<field>
    version: int  # bump when its results change: the cache's entries of the old one stop matching
    needs: frozenset[Need]
    columns: tuple[Column, ...]
    run_fields: tuple[str, ...]  # the per-run fields it returns
    trajectories: tuple[Trajectory, ...]
    compute: Callable[[MeasureInput], MeasureResult]

    def run(self, inputs: MeasureInput) -> MeasureResult:
        """``compute``, with what it returns checked against what it declares."""
        result = self.compute(inputs)
        shape = inputs.measured.pr.shape  # [layers, heads]
        columns = [c.name for c in self.columns]
        if sorted(result.per_head) != sorted(columns) or sorted(result.per_run) != sorted(self.run_fields):
            raise RuntimeError(
                f"measure {self.name!r} returned columns {sorted(result.per_head)} and fields "
                f"{sorted(result.per_run)}; it declares {sorted(columns)} and {sorted(self.run_fields)}"
            )
        wrong = [name for name, grid in result.per_head.items() if grid.shape != shape]
        if wrong:
            raise RuntimeError(f"measure {self.name!r}: columns {wrong} are not [layers, heads] {shape}")
        return result
