"""The registry of per-checkpoint measures beside the recipe's screen (``plugin.Measure``).

A run computes the measures its config chooses: ``measures`` maps a measure's name to its settings
(the ``measures`` config group, conf/measures/; ``measures=[value_drain,weight_circuits]`` on the
command line). A name is one of ``REGISTRY``, or any name with a ``_target_``: the import path of a
user's ``Measure`` (or of a function returning one), as Hydra's ``instantiate`` names a callback.
``chosen`` checks names and settings before any weights load (one ``UsageError`` line each).

Adding a measure to the package is its module here (with its ``MEASURE``), its entry in
``REGISTRY``, its file in conf/measures/, its test and its section in docs/measures.md: the run's
steps, the records, the cache, W&B and the panel read what it declares.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from emergence.core.config import one_line
from emergence.core.errors import UsageError
from emergence.measures import (
    attention_entropy,
    icl,
    llc,
    massive_activations,
    prefix_matching,
    repeat_loss,
    sink_importance,
    training_copy_loss,
    value_drain,
    weight_circuits,
)
from emergence.measures.plugin import (
    Column,
    ColumnTrajectory,
    Crossing,
    Measure,
    MeasureAccumulator,
    MeasureInput,
    MeasureResult,
    RunColumn,
    RunSeries,
    RunTrajectory,
    SinkShare,
    TrainingData,
)

REGISTRY: dict[str, Measure] = {
    m.name: m
    for m in (
        sink_importance.MEASURE,
        icl.MEASURE,
        repeat_loss.MEASURE,
        training_copy_loss.MEASURE,
        value_drain.MEASURE,
        prefix_matching.MEASURE,
        weight_circuits.MEASURE,
        massive_activations.MEASURE,
        attention_entropy.MEASURE,
        llc.MEASURE,
    )
}

TARGET = "_target_"


@dataclass(frozen=True)
class Chosen:
    """A measure a run computes, with its settings."""

    measure: Measure
    settings: Any  # an instance of ``measure.settings``

    @property
    def name(self) -> str:
        return self.measure.name

    def identity(self) -> dict:
        """What names its results besides the checkpoint and the probe: part of its cache key."""
        return {"name": self.name, "version": self.measure.version, "settings": dataclasses.asdict(self.settings)}


def _target(name: str, target: str) -> Measure:
    """The user's measure at the import path ``target`` (a ``Measure``, or a callable returning one)."""
    try:
        found = get_object(target)
        measure = found if isinstance(found, Measure) else instantiate({TARGET: target})
    except Exception as err:  # an import path that does not resolve: the user's to fix
        raise UsageError(
            f"measures.{name}._target_={target!r} does not load ({err}); give a Measure's import path"
        ) from None
    if not isinstance(measure, Measure):
        raise UsageError(f"measures.{name}._target_={target!r} is a {type(measure).__name__}, not a Measure")
    if measure.name != name:
        raise UsageError(
            f"measures.{name}._target_={target!r} is the measure {measure.name!r}: name it measures.{measure.name}"
        )
    return measure


def chosen(config: Mapping[str, Any]) -> list[Chosen]:
    """The measures ``config`` (``Config.measures``: name -> settings) chooses, in its order, with their
    settings checked: an unknown name, an unknown setting or a bad value is one ``UsageError``."""
    out = []
    for name, raw in config.items():
        given: dict[str, Any] = dict(
            cast(dict, OmegaConf.to_container(raw)) if isinstance(raw, DictConfig) else raw or {}
        )
        target = given.pop(TARGET, None)
        if target is not None:
            measure = _target(name, target)
        elif name in REGISTRY:
            measure = REGISTRY[name]
        else:
            raise UsageError(
                f"measures.{name}: no such measure; use one of {', '.join(REGISTRY)} "
                f"(or give your own with measures.{name}._target_=<module.MEASURE>)"
            )
        missing = [module for module in measure.requires if importlib.util.find_spec(module) is None]
        if missing:
            raise UsageError(
                f'measures.{name} needs {missing[0]}, which is not installed: pip install -e ".[{measure.extra}]" '
                "(Python >= 3.11), or drop the measure"
            )
        known = measure.settings_fields()
        unknown = sorted(set(given) - set(known))
        if unknown:
            takes = ", ".join(known) or "no settings"
            raise UsageError(f"measures.{name}.{unknown[0]}: {name} has no such setting (it takes {takes})")
        try:  # typed as its dataclass declares (OmegaConf converts "0.5" and refuses "abc")
            settings = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(measure.settings), given))
        except (ValueError, TypeError, OmegaConfBaseException) as err:
            raise UsageError(f"measures.{name}: {one_line(err)}") from None
        out.append(Chosen(measure, settings))
    return out


def crossings() -> list[Crossing]:
    """The per-head milestones the registry's measures declare (``plugin.Crossing``), in order."""
    return [c for m in REGISTRY.values() for c in m.crossings]


def run_trajectories() -> list[tuple[str, RunTrajectory]]:
    """(measure name, a per-run trajectory it declares) over the registry, in order."""
    return [(m.name, t) for m in REGISTRY.values() for t in m.run_trajectories]


def run_columns() -> list[tuple[str, RunColumn]]:
    """(measure name, a per-run number it shows per revision) over the registry, in order."""
    return [(m.name, c) for m in REGISTRY.values() for c in m.run_columns]


def legacy_fields(summary: dict) -> dict[str, dict]:
    """The registry's measures' fields an old summary.json (schemas 2 and 3) held under other names."""
    found = {}
    for m in REGISTRY.values():
        fields = None if m.legacy is None else m.legacy(summary)
        if fields is not None:
            found[m.name] = fields
    return found


def series() -> list[tuple[str, RunSeries]]:
    """(measure name, its per-run series) of the registry's measures that declare one (F7)."""
    return [(m.name, m.series) for m in REGISTRY.values() if m.series is not None]


def sequence_arrays() -> list[str]:
    """The per-sequence arrays (per_sequence.npz) the registry's measures write, in order."""
    return [name for m in REGISTRY.values() for name in m.sequences]


def sink_share() -> SinkShare | None:
    """The sink definition a registry measure declares for the panel (the first); None: none does."""
    return next((m.sink_share for m in REGISTRY.values() if m.sink_share is not None), None)


def columns(measures: list[Measure] | None = None) -> list[Column]:
    """The per-head columns of ``measures`` (the registry's by default), in order."""
    return [c for m in (measures if measures is not None else REGISTRY.values()) for c in m.columns]


def trajectories(measures: list[Measure] | None = None) -> list[ColumnTrajectory]:
    """The panel report's trajectories of ``measures`` (the registry's by default), in order."""
    return [t for m in (measures if measures is not None else REGISTRY.values()) for t in m.trajectories]


__all__ = [
    "REGISTRY",
    "Chosen",
    "Column",
    "Crossing",
    "Measure",
    "MeasureAccumulator",
    "MeasureInput",
    "MeasureResult",
    "RunSeries",
    "RunColumn",
    "RunTrajectory",
    "SinkShare",
    "TrainingData",
    "ColumnTrajectory",
    "chosen",
    "columns",
    "crossings",
    "legacy_fields",
    "run_columns",
    "run_trajectories",
    "sequence_arrays",
    "series",
    "sink_share",
    "trajectories",
]
