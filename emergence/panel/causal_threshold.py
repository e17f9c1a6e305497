"""The causal threshold T* (docs/method.md section 9, the study's "ablation floor"): the circuit
screened at several thresholds, each ablated against its controls; T* is the lowest threshold
from which on the screened circuit carries the effect.

A sweep is a set of runs of one checkpoint that differ only in ``threshold.circuit``
(``python -m emergence -m threshold.circuit=2,10,30,50,100``; the jobs after the first reuse
the cached measurements, so only the ablations run again).

T*, precisely: over the swept thresholds whose ablation has a verdict (``effect.causal`` is
true or false; an empty circuit, or one without controls, has none), T* is the smallest
threshold t such that the verdict is "causal" at t and at every swept threshold above t. It
lies in (the next lower swept threshold with a verdict, T*]: the sweep's spacing bounds it.
None when the highest threshold with a verdict is not causal. When the verdicts are not
monotone (causal, then not, then causal again), T* is still defined by the top run of
causal verdicts, and ``monotone`` is false.
"""

from __future__ import annotations

from emergence.panel.runs import find_runs
from emergence.run.results import RunSummary

SWEEP_KEYS = ("model", "name_or_path", "revision")  # with the probe, class thresholds and ablation settings


def _sweep_key(summary: RunSummary) -> tuple:
    ab = summary.ablation
    return (
        *(getattr(summary, k) for k in SWEEP_KEYS),
        summary.probe.fingerprint,
        tuple(sorted(summary.thresholds.classes.items())),
        ab.mode,
        ab.causal_factor,
        ab.sequences,
    )


def point(summary: RunSummary) -> dict:
    """One threshold of a sweep: the circuit it screened and what ablating it did."""
    ab, effect = summary.ablation, summary.ablation.effect
    return {
        "threshold": summary.thresholds.circuit,
        "circuit": summary.induction_circuit,
        "circuit_loss_increase": effect and effect.circuit_loss_increase,
        "controls_loss_increase_mean": effect and effect.controls_loss_increase_mean,
        "causal": effect and effect.causal,
        "n_controls": len(ab.controls),
        # of them drawn by the fallback (``ablation.draw_controls``); runs before it drew none
        "n_fallback": ab.control_draw.fallback if ab.control_draw else 0,
        "sequences_used": ab.sequences_used,
        "note": ab.note,
    }


def t_star(points: list[dict]) -> dict:
    """T* of one sweep (see the module docstring) from its points' thresholds and verdicts."""
    judged = sorted((p["threshold"], p["causal"]) for p in points if p["causal"] is not None)
    if not judged or not judged[-1][1]:
        return {"t_star": None, "below": None, "monotone": _monotone(judged)}
    i = len(judged) - 1
    while i > 0 and judged[i - 1][1]:
        i -= 1
    return {"t_star": judged[i][0], "below": judged[i - 1][0] if i > 0 else None, "monotone": _monotone(judged)}


def _monotone(judged: list[tuple[float, bool]]) -> bool:
    """Not causal below some threshold and causal from there on (either part may be empty)."""
    verdicts = [causal for _, causal in judged]
    return verdicts == sorted(verdicts)


def load_sweeps(paths) -> list[dict]:
    """The causal-threshold sweeps among the run directories under ``paths``: groups of runs of
    one checkpoint with ablation on and at least two circuit thresholds (a fixed ``ablate.heads``
    does not depend on the threshold, so such runs are no sweep)."""
    groups: dict[tuple, dict[float, RunSummary]] = {}
    for run_dir in find_runs(paths):
        summary = RunSummary.read(run_dir)
        if not summary.ablation.enabled or summary.ablation.heads is not None:
            continue
        groups.setdefault(_sweep_key(summary), {})[summary.thresholds.circuit] = summary
    sweeps = []
    for runs in groups.values():
        if len(runs) < 2:
            continue
        first = next(iter(runs.values()))
        points = [point(runs[t]) for t in sorted(runs)]
        sweeps.append(
            {
                "model": first.model,
                "revision": first.revision,
                "tokens": first.tokens,
                "causal_factor": first.ablation.causal_factor,
                "points": points,
                **t_star(points),
            }
        )
    return sorted(sweeps, key=lambda s: (s["model"], s["tokens"] or 0, s["revision"] or ""))
