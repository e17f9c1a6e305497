"""F6: the parameter-space half of emergence on the activation half's axis.

Two questions the halves were written to answer together:

* **The edge's phases against the milestones.** The spectral edge of the checkpoint series
  (``python -m emergence.edge``, ``edge.json`` beside the runs; docs/edge.md) has a window where
  the whole model's sigma_2/sigma_3 peaks and, after it, the first window where it falls below
  1.20 (its collapse). Each is placed against each milestone (induction onset, 67 % recall of the
  final circuit, BOS 50 %) as a signed distance: the milestone's position minus the window's last
  checkpoint, with its range over the milestone's bracket (it happened after the revision before
  it, by its own) and the window's span.
* **A weight milestone against selectivity** (as F5 asks of PR): per head of the final induction circuit,
  the first revision whose column reaches the level a measure declares (``measures.crossings()``; the
  default measures declare the OV circuit's turn to copying) against the first whose induction
  selectivity reaches the circuit threshold: before, at or after.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from emergence import measures
from emergence.measures import Crossing
from emergence.panel.findings import INDUCTION, final_circuit, first_index, milestone_at
from emergence.panel.records import F6, CrossingOrder, EdgeDistance, EdgePhase, EdgePoint, Milestone, PanelFindings
from emergence.panel.runs import Trajectory
from emergence.recipe.screen import head_name
from emergence.spectral_edge.records import EDGE_FILE, MODEL_SCOPE, Edge, EdgeWindow

EDGE_MILESTONES = ("induction_onset", "recall_67", "bos_50")  # the activation milestones F6 places the edge against


def _position(window: EdgeWindow, unit: str, end: str) -> float | None:
    """A window's first or last checkpoint (``end``) on the panel's axis: its tokens, or its step where the
    panel counts steps."""
    tokens, step = (
        (window.first_tokens, window.first_step) if end == "first" else (window.last_tokens, window.last_step)
    )
    value = step if unit == "steps" else tokens
    return None if value is None else float(value)


def phases(edge: Edge, unit: str) -> list[EdgePhase]:
    """The whole model's r23 peak and collapse at the first W of ``edge.window`` (``Collapse`` indices into
    its windows), where found."""
    windows, found = edge.first.scopes[MODEL_SCOPE], edge.first.collapse[MODEL_SCOPE]
    out = []
    for name, index in (("r23_peak", found.peak), ("r23_collapse", found.collapse)):
        if index is not None:
            w = windows[index]
            out.append(
                EdgePhase(
                    name, w.first_step, w.last_step, _position(w, unit, "first"), _position(w, unit, "last"), w.r23
                )
            )
    return out


def distance(phase: EdgePhase, name: str, milestone: Milestone | None) -> EdgeDistance:
    """``milestone``'s tokens minus the phase's last; its range: (bracket low - phase last, milestone - phase first]."""
    if milestone is None or milestone.tokens is None or phase.last is None or phase.first is None:
        return EdgeDistance(phase.name, name, None, None)
    low = (
        None
        if milestone.bracket_tokens is None or milestone.bracket_tokens[0] is None
        else milestone.bracket_tokens[0] - phase.last
    )
    return EdgeDistance(phase.name, name, milestone.tokens - phase.last, [low, milestone.tokens - phase.first])


def crossing_orders(traj: Trajectory, circuit_threshold: float, crossing: Crossing) -> dict[str, CrossingOrder]:
    """Per head of the final circuit: its first ``crossing`` against its selectivity's; empty where
    no checkpoint measured the crossing's column."""
    column = crossing.column
    if not any(column in c.measure_columns for c in traj.checkpoints):
        return {}
    heads = {}
    for layer, head in final_circuit(traj, circuit_threshold):
        grids = [c.measure_columns.get(column) for c in traj.checkpoints]
        values = np.array([np.nan if g is None else g[layer, head] for g in grids])
        crossed = first_index(values >= crossing.level)  # NaN compares False: not measured, not crossed
        selectivity_cross = first_index(traj.sel[:, layer, head, INDUCTION] >= circuit_threshold)
        order = None
        if crossed is not None and selectivity_cross is not None:
            order = "before" if crossed < selectivity_cross else "at" if crossed == selectivity_cross else "after"
        heads[head_name(layer, head)] = CrossingOrder(
            column,
            crossing.level,
            milestone_at(traj, crossed),
            milestone_at(traj, selectivity_cross),
            order,
            [None if np.isnan(v) else float(v) for v in values],
        )
    return heads


def f6(
    traj: Trajectory, milestones: dict[str, Milestone | None], circuit_threshold: float, edge: tuple[str, Edge] | None
) -> F6:
    """F6 of one trajectory; ``edge``: (its edge.json's path, the edge) where one lies beside the runs."""
    heads: dict[str, list[CrossingOrder]] = {}
    for crossing in measures.crossings():
        for name, order in crossing_orders(traj, circuit_threshold, crossing).items():
            heads.setdefault(name, []).append(order)
    if edge is None:
        return F6(None, None, [], [], [], heads)
    path, found = edge
    placed = phases(found, traj.unit)
    series = [
        EdgePoint(position, w.r12, w.r23, w.drift_speed)
        for w in found.first.scopes[MODEL_SCOPE]
        if (position := _position(w, traj.unit, "last")) is not None
    ]
    return F6(
        path,
        found.first.window,
        placed,
        [distance(p, name, milestones.get(name)) for p in placed for name in EDGE_MILESTONES],
        series,
        heads,
    )


def load_edges(paths) -> dict[str, tuple[str, Edge]]:
    """The edge.json lying in any of ``paths`` (a sweep directory: ``python -m emergence.edge SWEEP_DIR``),
    by the model it is of, with its path."""
    found = {}
    for path in paths:
        if (path / EDGE_FILE).exists():
            edge = Edge.load(path)
            found[edge.model] = (str(path / EDGE_FILE), edge)
    return found


def with_f6(
    findings: PanelFindings,
    trajectories: dict[str, Trajectory],
    circuit_threshold: float,
    edges: dict[str, tuple[str, Edge]],
) -> PanelFindings:
    """Every model's F6: the crossings its measures declare against its selectivity, and, where an edge of
    its model lies beside the runs, the edge's phases against its milestones."""
    models = {}
    for name, f in findings.models.items():
        traj = trajectories[name]
        edge = edges.get(name.removesuffix(f"-{traj.probe}"))
        models[name] = dataclasses.replace(f, f6=f6(traj, f.milestones(), circuit_threshold, edge))
    return dataclasses.replace(findings, models=models)
