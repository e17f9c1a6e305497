"""The panel's measures on one token axis (docs/probes.md): for each model (and training seed), its
trajectories under every probe it was run with, side by side.

A *transition* of a measure is its largest change between adjacent revisions, and the first
revision past the midpoint of that change (``Transition.half_way``, a milestone with its
bracket). The *events* are the probes' milestones (induction onset, BOS 50 %, Sink_eps 50 %, a
task's emergence ``task_<task>``), the transitions' half-ways and the first revision over the level of
each measure's per-run trajectory that declares one (``RunTrajectory``: a massive activation, over 1000x
the median, Sun et al. 2024); every pair of reached events gets F3's separation, the ratio of their
tokens with its range over both brackets.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np

from emergence import measures
from emergence.panel.records import Milestone, ModelFindings, Separation, SinkProbes, TokenAxis, Transition
from emergence.panel.runs import Checkpoint, Trajectory
from emergence.panel.uncertainty import bracket


def _nan_to_none(x) -> float | None:
    return None if x is None or not np.isfinite(x) else float(x)


def _plugin_value(trajectory: measures.ColumnTrajectory) -> Callable[[Checkpoint], float | None]:
    """A measure's trajectory's value at a checkpoint (``plugin.ColumnTrajectory.value``)."""
    return lambda c: trajectory.value(c.measure_columns.get(trajectory.column))


# measure -> (the probes it is measured on, its value at a checkpoint: None where not measured)
Drawn = dict[str, tuple[tuple[str, ...], Callable[[Checkpoint], float | None]]]


def _run_value(name: str, trajectory: measures.RunTrajectory) -> Callable[[Checkpoint], float | None]:
    """A measure's per-run trajectory's value at a checkpoint (``summary.json`` ``measures[name][field]``)."""
    return lambda c: (c.measure_fields.get(name) or {}).get(trajectory.field)


def drawn() -> Drawn:
    """What the token axis draws: the registry's per-run trajectories, then its columns' trajectories
    (``emergence.measures``), on the probes each is measured on; read when drawn, so a measure
    registered after import is drawn too."""
    return {
        **{t.key: (t.probes, _run_value(name, t)) for name, t in measures.run_trajectories()},
        **{t.key: (t.probes, _plugin_value(t)) for t in measures.trajectories()},
    }


def transition(traj: Trajectory, measure: str) -> Transition | None:
    """``measure``'s transition over ``traj``; None where it is measured at no revision."""
    values = [_nan_to_none(drawn()[measure][1](c)) for c in traj.checkpoints]
    known = {i: v for i, v in enumerate(values) if v is not None}  # revision index -> its value
    measured = list(known)
    if not measured:
        return None
    names, tokens = [c.revision for c in traj.checkpoints], [c.tokens for c in traj.checkpoints]
    largest_jump = jump = half_way = None
    if len(measured) > 1:
        i, j = max(zip(measured, measured[1:]), key=lambda pair: abs(known[pair[1]] - known[pair[0]]))
        jump = known[j] - known[i]
        midpoint, direction = (known[i] + known[j]) / 2, np.sign(jump)
        past = [k for k in measured if direction * (known[k] - midpoint) > 0]
        largest_jump = [names[i], names[j]]
        if jump != 0 and past:
            k = past[0]
            half_way = Milestone(names[k], tokens[k], bracket(traj.tokens, k))
    return Transition(
        measure=measure,
        probe=traj.probe,
        revisions=names,
        tokens=tokens,
        values=values,
        largest_jump=largest_jump,
        jump=jump,
        half_way=half_way,
    )


def level_onset(traj: Trajectory, name: str, trajectory: measures.RunTrajectory) -> Milestone | None:
    """The first revision whose per-run value is over the trajectory's ``level`` (the massive activations':
    the largest activation over 1000x the median)."""
    assert trajectory.level is not None  # only a trajectory with a level has an onset
    value = _run_value(name, trajectory)
    for k, c in enumerate(traj.checkpoints):
        v = value(c)
        if v is not None and v > trajectory.level:
            return Milestone(c.revision, c.tokens, bracket(traj.tokens, k))
    return None


def separation(earlier: tuple[str, Milestone], later: tuple[str, Milestone]) -> Separation:
    """F3's gap between two reached events (the earlier first); no ratio to an event at 0 tokens."""
    (first_name, first), (then_name, then) = earlier, later
    if first.tokens == 0:
        return Separation(earlier=first_name, later=then_name, gap_ratio=None, gap_ratio_range=None)
    # reached events: tokens, and so a bracket, known (``token_axis``)
    assert first.tokens is not None and then.tokens is not None
    assert first.bracket_tokens is not None and then.bracket_tokens is not None
    low_then, high_then = then.bracket_tokens
    low_first, high_first = first.bracket_tokens
    assert high_then is not None and high_first is not None  # a bracket ends at its own revision's tokens
    return Separation(
        earlier=first_name,
        later=then_name,
        gap_ratio=then.tokens / first.tokens,
        gap_ratio_range=[
            None if low_then is None else low_then / high_first,
            None if not low_first else high_then / low_first,
        ],
    )


def sinks_by_probe(trajectories: dict[str, Trajectory], findings: dict[str, ModelFindings]) -> list[SinkProbes]:
    """The revisions both the synthetic and the text probe measured, with each one's Sink_eps and
    BOS fraction; ``trajectories`` and ``findings`` by probe."""
    if not {"synthetic", "text"} <= set(trajectories):
        return []
    gu = {p: g for p in ("synthetic", "text") if (g := findings[p].sinks_gu) is not None}
    if len(gu) != 2:
        return []
    at = {p: {r.revision: (r, s) for r, s in zip(findings[p].revisions, g.revisions)} for p, g in gu.items()}
    out = []
    for c in trajectories["synthetic"].checkpoints:
        if c.revision not in at["text"]:
            continue
        rows = {p: at[p][c.revision] for p in at}
        sink = {p: rows[p][1].sink_fraction for p in rows}
        out.append(
            SinkProbes(
                c.revision,
                c.tokens,
                sink_fraction={**sink},
                bos_fraction={p: rows[p][0].bos_fraction for p in rows},
                disagree=(sink["synthetic"] >= 0.5) != (sink["text"] >= 0.5),
            )
        )
    return out


def token_axis(trajectories: dict[str, Trajectory], findings: dict[str, ModelFindings]) -> TokenAxis | None:
    """One model's trajectories under each probe (``trajectories`` and ``findings`` by probe.kind);
    None where no run of it measured any of ``drawn()`` nor a task (the reference data, older runs)."""
    transitions = [
        t
        for probe, traj in trajectories.items()
        for measure, (probes, _) in drawn().items()
        if probe in probes and (t := transition(traj, measure)) is not None
    ]
    if not transitions and not any(f.task for f in findings.values()):
        return None
    events: dict[str, Milestone | None] = {}
    for probe, f in findings.items():
        events[f"induction_onset ({probe})"] = f.f3.induction_onset
        events[f"bos_50 ({probe})"] = f.f3.bos_50
        if f.sinks_gu is not None:
            events[f"sink_50 ({probe})"] = f.sinks_gu.f3.sink_50
        for name, run_trajectory in measures.run_trajectories():
            if run_trajectory.level is not None and run_trajectory.event is not None:
                events[f"{run_trajectory.event} ({probe})"] = level_onset(trajectories[probe], name, run_trajectory)
        if f.task is not None:
            events[f"task_{f.task.task} ({probe})"] = f.task.emergence
    for t in transitions:
        events[f"{t.measure} ({t.probe})"] = t.half_way
    reached = sorted(
        ((name, m) for name, m in events.items() if m is not None and m.tokens is not None),
        key=lambda item: item[1].tokens or 0.0,
    )  # each has its tokens (above)
    return TokenAxis(
        probes=list(trajectories),
        transitions=transitions,
        events=events,
        separations=[separation(a, b) for a, b in itertools.combinations(reached, 2)],
        sinks=sinks_by_probe(trajectories, findings),
    )


def token_axes(trajectories: dict[str, Trajectory], models: dict[str, ModelFindings]) -> dict[str, TokenAxis]:
    """Every model's (and seed's) ``token_axis``, by the name of its synthetic-probe trajectory."""
    groups: dict[str, dict[str, str]] = {}
    for name, traj in trajectories.items():
        base = name if traj.probe == "synthetic" else name.removesuffix(f"-{traj.probe}")
        groups.setdefault(base, {})[traj.probe] = name
    axes = {}
    for base, names in groups.items():
        axis = token_axis({p: trajectories[n] for p, n in names.items()}, {p: models[n] for p, n in names.items()})
        if axis is not None:
            axes[base] = axis
    return axes
