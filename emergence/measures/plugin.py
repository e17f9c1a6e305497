"""What a per-checkpoint measure declares, and what it gets and gives (``emergence/measures``).

A measure is one module with a ``MEASURE``: its name and version, what it needs of the run
(``Need``), its settings (a dataclass the config's ``measures.<name>`` fills), the per-head columns
it adds to heads.csv (and W&B's head table), the per-run fields it adds to summary.json's
``measures[<name>]`` (each scalar logged to W&B as ``<name>/<field>``), the per-sequence arrays it adds
to per_sequence.npz, and what the panel report reads of it over a model's checkpoints (trajectories,
crossings, a series, a sink definition). It computes in one of two ways:

* ``accumulate``: an accumulator subscribed to the probe pass's hook sites (``recipe.sites``), which
  reduces minibatch by minibatch as the one forward pass runs, then gives its ``result()``;
* ``compute``: after the pass, from the weights (``needs`` has ``weights`` and not ``pass``).

The run's steps, the records, the cache, W&B and the panel iterate over the chosen measures
(``emergence.measures.chosen``) and know no measure by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from emergence.core.config import ProbeConfig, StatsConfig
from emergence.recipe.probe import ProbeBatch
from emergence.recipe.sites import Accumulator

# weights: the loaded model; pass: the probe pass's hook sites (an ``accumulate``); tokenizer: the
# text probe's tokenizer name; gradients: backward passes through the model; data: sequences beyond the
# probe (``MeasureInput.training_data``)
Need = Literal["weights", "pass", "tokenizer", "gradients", "data"]

Reduction = Literal["max", "min", "mean"]
REDUCTIONS: dict[str, Callable[[np.ndarray], float]] = {"max": np.nanmax, "min": np.nanmin, "mean": np.nanmean}

ProbeKind = Literal["synthetic", "repeat", "text"]  # ``probe.kind``


def reduce_heads(grid: np.ndarray | None, how: Reduction) -> float | None:
    """``grid``'s max, min or mean over the values it holds (NaN: not measured); None where it holds none."""
    if grid is None or np.isnan(grid).all():
        return None
    return float(REDUCTIONS[how](grid))


@dataclass(frozen=True)
class MeasureResult:
    """One measure's results on one checkpoint (``emergence/measures``)."""

    per_head: dict[str, np.ndarray]  # heads.csv column -> [layers, heads] float64
    per_run: dict[str, Any]  # summary.json ``measures[<name>]``: field -> a JSON value (a number, a list, a dict)
    # per_sequence.npz arrays (``Measure.sequences``): name -> [n, ...], one row per probe sequence
    per_sequence: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class NoSettings:
    """The settings of a measure that has none."""


@dataclass(frozen=True)
class TrainingData:
    """Sequences from the distribution the model was trained on, where the tool knows it (a toy's corpus)."""

    name: str  # what they are, for the run's record
    sample: Callable[[int, int], torch.Tensor]  # (sequences, seed) -> [sequences, T] int64 token ids
    # what the training recorded at this checkpoint, by name (a toy's manifest: ``train_loss``, ``copy_loss_drop``)
    recorded: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class MeasureInput:
    """What a checkpoint's run offers a measure (``Measure.needs`` says what it reads)."""

    model: Any  # the model, in eval mode on its device
    layers: int  # the model's attention layers
    heads: int  # query heads per layer
    batch: ProbeBatch  # the probe's tokens
    probe_kind: ProbeKind
    tokenizer: str | None  # the text probe's tokenizer (repo@revision or bytes); None: other probes
    device: torch.device
    settings: Any  # the measure's settings (its ``Measure.settings``, filled from ``measures.<name>``)
    training_data: TrainingData | None = None  # None: the training distribution is not known to the tool
    # a folder inside the run directory a measure may write its scratch files to (the run removes it once
    # the measures ran); None: the system's temporary folder
    scratch: Path | None = None
    probe: ProbeConfig = field(default_factory=ProbeConfig)  # the run's probe settings (fitted to the model)
    stats: StatsConfig = field(default_factory=StatsConfig)  # the run's bootstrap settings (its intervals)


class MeasureAccumulator(Accumulator):
    """An ``Accumulator`` of the probe pass that ends with a measure's result."""

    def result(self) -> MeasureResult:
        raise NotImplementedError


@dataclass(frozen=True)
class Column:
    """A per-head column of heads.csv, [layers, heads]; NaN where a head has no value."""

    name: str
    meaning: str  # one line: docs/outputs.md's table of columns is generated from it


@dataclass(frozen=True)
class ColumnTrajectory:
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
class RunTrajectory:
    """What the panel report draws of a per-run number over a model's checkpoints (``summary.json``
    ``measures[<name>][field]``): a panel of the token axis, and, where ``level`` is given, the event
    ``event`` at the first checkpoint over it."""

    key: str  # its name among the token axis's measures
    field: str
    label: str  # the panel's axis label
    level: float | None = None
    event: str | None = None  # the token axis's event name for the first checkpoint over ``level``
    log_scale: bool = False
    probes: tuple[ProbeKind, ...] = ("synthetic", "repeat", "text")


@dataclass(frozen=True)
class RunColumn:
    """A per-run number the panel report shows per revision where measured (``summary.json``
    ``measures[<name>][field]``): a column of report.md's revisions table, a panel of the per-revision figure
    (trajectories.png) and findings.json's ``revisions[].run_values[field]``."""

    field: str
    label: str  # the column's and the panel's label
    fmt: str = ".2f"  # the table's format of a value


@dataclass(frozen=True)
class Crossing:
    """A per-head milestone a measure declares: the first checkpoint where a head's ``column`` reaches
    ``level``. The panel's F6 orders it against the head's induction selectivity crossing."""

    column: str
    level: float


@dataclass(frozen=True)
class SinkShare:
    """A second sink definition the panel follows beside the BOS fraction (``sinks_gu`` in its findings:
    Sink_0 per revision and layer, F1-F3 under it, where the two disagree): the share of (sequence, layer,
    head) whose value in the per-sequence ``array`` [n, layers, heads] exceeds the report's level
    (``--sink-epsilon``), with its bootstrap over sequences."""

    array: str  # one of the measure's ``sequences``
    definition: str  # the share, in words


@dataclass(frozen=True)
class RunSeries:
    """A per-run number a measure declares for the panel's stages (F7): ``summary.json``
    ``measures[<name>][field]`` at each checkpoint, with its spread and why it failed (None: it did not)."""

    field: str
    label: str  # the panel's axis label
    spread: str  # the field holding its standard deviation over independent chains
    failed: str  # the field holding why the value is not reported (None where it is)


@dataclass(frozen=True)
class Measure:
    """A per-checkpoint measure (see the module docstring)."""

    name: str  # summary.json measures[<name>], W&B <name>/<field>, the config's measures.<name>
    version: int  # bump when its results change: its cached entries of the old one stop matching
    needs: frozenset[Need]
    columns: tuple[Column, ...]
    run_fields: tuple[str, ...]  # the per-run fields it returns (JSON values: numbers, lists, dicts)
    trajectories: tuple[ColumnTrajectory, ...]
    compute: Callable[[MeasureInput], MeasureResult] | None = None  # after the pass
    accumulate: Callable[[MeasureInput], MeasureAccumulator] | None = None  # in the pass
    settings: type = NoSettings  # a frozen dataclass; ``__post_init__`` raises ValueError on a bad value
    crossings: tuple[Crossing, ...] = ()  # per-head milestones the panel places (F6)
    series: RunSeries | None = None  # a per-run number the panel finds stages in (F7)
    run_trajectories: tuple[RunTrajectory, ...] = ()  # per-run numbers the token axis draws
    run_columns: tuple[RunColumn, ...] = ()  # per-run numbers the report shows per revision
    # its per-run fields from an old summary.json (schemas 2 and 3) that held them under other names; None:
    # none there (``RunSummary.read``)
    legacy: Callable[[dict], dict | None] | None = None
    sequences: tuple[str, ...] = ()  # the per-sequence arrays it returns (per_sequence.npz, [n, ...])
    sink_share: SinkShare | None = None  # a sink definition the panel follows (on ``sequences``)
    requires: tuple[str, ...] = ()  # modules of an optional extra it imports when it runs
    extra: str | None = None  # that extra's name: pip install -e ".[<extra>]"

    def __post_init__(self):
        if (self.compute is None) == (self.accumulate is None):
            raise TypeError(f"measure {self.name!r} gives exactly one of compute and accumulate")
        if (self.accumulate is not None) != ("pass" in self.needs):
            raise TypeError(f"measure {self.name!r}: an accumulate, and only it, needs the pass")

    @property
    def in_pass(self) -> bool:
        """Whether it reads the probe pass's sites."""
        return self.accumulate is not None

    def checked(self, result: MeasureResult, shape: tuple[int, int]) -> MeasureResult:
        """``result`` once it holds what the measure declares: its columns [layers, heads], run fields and
        per-sequence arrays."""
        columns = [c.name for c in self.columns]
        returned = (sorted(result.per_head), sorted(result.per_run), sorted(result.per_sequence))
        declared = (sorted(columns), sorted(self.run_fields), sorted(self.sequences))
        if returned != declared:
            raise RuntimeError(
                f"measure {self.name!r} returned columns, fields and per-sequence arrays {returned}; "
                f"it declares {declared}"
            )
        wrong = [name for name, grid in result.per_head.items() if grid.shape != shape]
        if wrong:
            raise RuntimeError(f"measure {self.name!r}: columns {wrong} are not [layers, heads] {shape}")
        return result

    def run(self, inputs: MeasureInput) -> MeasureResult:
        """``compute``'s result on ``inputs``, checked (a measure computed after the pass)."""
        assert self.compute is not None  # not an accumulate: those run in the pass
        return self.checked(self.compute(inputs), (inputs.layers, inputs.heads))

    def settings_fields(self) -> dict[str, Any]:
        """Its settings' names and defaults."""
        return {f.name: f.default for f in dataclasses.fields(self.settings)}
