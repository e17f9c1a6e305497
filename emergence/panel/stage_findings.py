"""F7: stages without a probe, from a measure's per-run series (the learning coefficient) on the token axis.

Hoogland et al. (2024, "The Developmental Landscape of In-Context Learning") cut training into stages
where the LLC's slope against log tokens changes: a plateau, a rise, a fall. Between two neighbouring
checkpoints the series rises or falls where its step exceeds ``JUMP_MULTIPLE`` times the larger of
the two checkpoints' spreads over chains (else it is flat: within the chains' noise); a **boundary**
is a checkpoint where the step into it and the step out of it differ in class. It is bracketed by the
measured checkpoints around it, and placed against every activation milestone (induction onset, 67 %
of the final circuit, BOS 50 %, ...) and the edge's phases (F6): the signed distance in tokens, and
whether the two brackets touch or overlap. A checkpoint whose estimate failed (its ``failed`` reason:
a diverged chain, a negative estimate, chains that disagree) is left out, never drawn as a number.

Per asked head (the measure's per-head column), whether its refined series' first rise comes before,
at or after its induction selectivity crosses the circuit threshold.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from emergence import measures
from emergence.measures import RunSeries
from emergence.panel.findings import INDUCTION, first_index, milestone_at
from emergence.panel.records import F7, HeadStage, Milestone, PanelFindings, StageBoundary, StagePoint
from emergence.panel.runs import Trajectory
from emergence.recipe.screen import head_name

JUMP_MULTIPLE = 2.0  # a step between checkpoints over this many chain spreads ...
RELATIVE_STEP = 0.1  # ... and this share of the series' range over the panel is a rise or a fall


def points(traj: Trajectory, name: str, series: RunSeries) -> list[StagePoint]:
    """The series at every checkpoint of ``traj`` (measure ``name``'s per-run fields)."""
    out = []
    for c in traj.checkpoints:
        fields = c.measure_fields.get(name)
        if fields is None:
            out.append(StagePoint(c.revision, c.tokens, None, None, None))
            continue
        failed = fields.get(series.failed)
        value = None if failed else fields.get(series.field)
        out.append(StagePoint(c.revision, c.tokens, value, fields.get(series.spread), failed))
    return out


def step_class(a: float, b: float, noise: float, scale: float, jump_multiple: float) -> str:
    """The step from ``a`` to ``b``, "rising", "falling" or "flat", against the chains' spread ``noise``
    and the series' range ``scale``."""
    step = b - a
    if abs(step) <= max(jump_multiple * noise, RELATIVE_STEP * scale):
        return "flat"
    return "rising" if step > 0 else "falling"


def boundaries(
    measured: list[StagePoint], milestones: dict[str, Milestone | None], jump_multiple: float
) -> list[StageBoundary]:
    """Every checkpoint of ``measured`` (in token order) where the step's class changes, placed against
    ``milestones``."""
    values = [p.value for p in measured if p.value is not None]
    scale = max(values) - min(values)
    spreads = [p.spread or 0.0 for p in measured]
    classes = [
        step_class(values[i], values[i + 1], max(spreads[i], spreads[i + 1]), scale, jump_multiple)
        for i in range(len(values) - 1)
    ]
    found = []
    for i in range(1, len(measured) - 1):
        if classes[i - 1] == classes[i]:
            continue
        at, low, high = measured[i], measured[i - 1].tokens, measured[i + 1].tokens
        distances: dict[str, float | None] = {}
        touches: dict[str, bool] = {}
        for name, m in milestones.items():
            if m is None or m.tokens is None:
                continue
            distances[name] = m.tokens - at.tokens
            m_low = m.bracket_tokens[0] if m.bracket_tokens and m.bracket_tokens[0] is not None else m.tokens
            touches[name] = m_low <= high and m.tokens >= low
        found.append(StageBoundary(at.revision, at.tokens, [low, high], classes[i - 1], classes[i], distances, touches))
    return found


def head_stages(
    traj: Trajectory, name: str, column: str, circuit_threshold: float, jump_multiple: float
) -> dict[str, HeadStage]:
    """Per head the series' column holds values for: its first rise against its selectivity's crossing."""
    grids = [c.measure_columns.get(column) for c in traj.checkpoints]
    if not any(g is not None and np.isfinite(g).any() for g in grids):
        return {}
    shape = next(g.shape for g in grids if g is not None)
    out = {}
    for layer in range(shape[0]):
        for head in range(shape[1]):
            values = [None if g is None or not np.isfinite(g[layer, head]) else float(g[layer, head]) for g in grids]
            if all(v is None for v in values):
                continue
            label = head_name(layer, head)
            spreads = [
                ((c.measure_fields.get(name) or {}).get("heads") or {}).get(label, {}).get("std")
                for c in traj.checkpoints
            ]
            rise = None
            for i in range(len(values) - 1):
                a, b = values[i], values[i + 1]
                if (
                    a is not None
                    and b is not None
                    and b - a > jump_multiple * max(spreads[i] or 0, spreads[i + 1] or 0)
                ):
                    rise = i + 1
                    break
            crossed = first_index(traj.sel[:, layer, head, INDUCTION] >= circuit_threshold)
            order = None
            if rise is not None and crossed is not None:
                order = "before" if rise < crossed else "at" if rise == crossed else "after"
            out[label] = HeadStage(milestone_at(traj, rise), milestone_at(traj, crossed), order, values)
    return out


def f7(traj: Trajectory, milestones: dict[str, Milestone | None], circuit_threshold: float) -> F7 | None:
    """F7 of one trajectory: the first registered series its runs measured; None where none did."""
    for name, series in measures.series():
        found = points(traj, name, series)
        measured = [p for p in found if p.value is not None]
        if not measured:
            continue
        columns = [c.name for c in measures.REGISTRY[name].columns]
        heads = {}
        for column in columns:
            heads.update(head_stages(traj, name, column, circuit_threshold, JUMP_MULTIPLE))
        placed = boundaries(measured, milestones, JUMP_MULTIPLE)
        return F7(name, series.label, JUMP_MULTIPLE, RELATIVE_STEP, found, placed, heads)
    return None


RISE = "_rise"  # a series' milestone for refine: <measure>_rise


def series_reached(traj: Trajectory, panel: Trajectory) -> dict[str, np.ndarray]:
    """Per registered series the runs measured, ``<measure>_rise``: [revisions] whether each revision of
    ``traj`` has reached half-way from the lowest to the highest value over ``panel`` (its panel runs: the
    level stays put while refinement adds runs); a revision not measured, or failed, has not. Refinement
    brackets it to one interval (``python -m emergence.refine --milestones llc_rise``): the middle of a
    rising stage."""
    out = {}
    for name, series in measures.series():
        values = [p.value for p in points(panel, name, series) if p.value is not None]
        if not values:
            continue
        level = min(values) + (max(values) - min(values)) / 2
        here = [p.value for p in points(traj, name, series)]
        out[f"{name}{RISE}"] = np.array([v is not None and v >= level for v in here])
    return out


def edge_milestones(f6) -> dict[str, Milestone | None]:
    """F6's edge phases as milestones (their last checkpoint, bracketed by their window's span)."""
    if f6 is None:
        return {}
    return {f"edge_{p.name}": Milestone(p.name, p.last, [p.first, p.last]) for p in f6.phases if p.last is not None}


def with_f7(findings: PanelFindings, trajectories: dict[str, Trajectory], circuit_threshold: float) -> PanelFindings:
    """Every model's F7, against its milestones and its edge's phases (F6: call ``with_f6`` first)."""
    models = {}
    for name, f in findings.models.items():
        milestones = {**f.milestones(), **edge_milestones(f.f6)}
        models[name] = dataclasses.replace(f, f7=f7(trajectories[name], milestones, circuit_threshold))
    return dataclasses.replace(findings, models=models)
