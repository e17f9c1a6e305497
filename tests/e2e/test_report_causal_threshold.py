"""The causal threshold T*: from a threshold sweep, and a real sweep on a tiny checkpoint
whose jobs after the first reuse the cached measurements."""

import json

import pytest

from emergence.panel.causal_threshold import t_star
from emergence.run.results import read_run
from tests.helpers.cli import SMALL_RUN, run_cli


def points(verdicts: dict) -> list[dict]:
    return [{"threshold": t, "causal": v} for t, v in verdicts.items()]


@pytest.mark.parametrize(
    "verdicts,expected",
    [
        ({2: False, 10: False, 30: True, 50: True, 100: True}, {"t_star": 30, "below": 10, "monotone": True}),
        ({2: True, 10: True, 30: True}, {"t_star": 2, "below": None, "monotone": True}),
        ({2: True, 10: False, 30: True, 50: True}, {"t_star": 30, "below": 10, "monotone": False}),
        ({2: True, 10: True, 30: False}, {"t_star": None, "below": None, "monotone": False}),
        (
            {2: None, 10: False, 30: True, 100: None},
            {"t_star": 30, "below": 10, "monotone": True},
        ),  # no verdict: skipped
        ({2: None, 100: None}, {"t_star": None, "below": None, "monotone": True}),
    ],
)
def test_t_star_is_the_start_of_the_top_run_of_causal_verdicts(verdicts, expected):
    assert t_star(points(verdicts)) == expected


@pytest.mark.slow
def test_a_threshold_sweep_reuses_the_measurements_and_reports_t_star(tiny_dirs, tmp_path):
    # A one-entry panel gives the checkpoint a token count, as every panel revision has (the report needs it).
    # Its own cache: another test of the session may have measured the same tiny model with this probe.
    model = [
        "model=local",
        f"model.name_or_path={tiny_dirs['gpt_neox']}",
        "revision=r0",
        "model.panel=[{revision: main, step: 1, tokens: 1000}]",
        f"cache_dir={tmp_path / 'cache'}",
        *SMALL_RUN,
        # every head of this random model is near 1x, so each would be a near-circuit head at the
        # default control_exclude (0.5) and none a control; at 1 the other heads are the controls
        "ablate.control_exclude=1",
    ]
    # Thresholds from the checkpoint's own selectivities (not cached: reuse=false): just above the
    # 3rd, 2nd and 1st induction head of each layer, so the circuits shrink and controls exist.
    probe = run_cli(*model, "ablate.enabled=false", "reuse=false", f"hydra.run.dir={tmp_path / 'probe'}")
    assert probe.returncode == 0, probe.stderr[-2000:]
    _, rows = read_run(tmp_path / "probe")
    ranked = [sorted((r["sel_induction"] for r in rows if r["layer"] == l), reverse=True) for l in (0, 1)]
    thresholds = [max(layer[rank] for layer in ranked) * 1.0001 for rank in (2, 1, 0)]
    sweep = tmp_path / "sweep"
    res = run_cli(
        "-m", *model, "threshold.circuit=" + ",".join(f"{t:.6g}" for t in thresholds), f"hydra.sweep.dir={sweep}"
    )
    assert res.returncode == 0, res.stderr[-2000:]
    summaries = sorted(
        (json.loads(p.read_text()) for p in sweep.rglob("summary.json")), key=lambda s: s["thresholds"]["circuit"]
    )
    assert len(summaries) == 3
    # One probe pass for the whole sweep: only the first job measured (job order = threshold order here).
    assert [s["reused_measurements"] for s in summaries] == [False, True, True]
    assert "capture" in summaries[0]["timings"]

    out = tmp_path / "report"
    rep = run_cli(sweep, "--out", out, "--wandb-mode", "disabled", module="emergence.report")
    assert rep.returncode == 0, rep.stderr[-2000:]
    findings = json.loads((out / "findings.json").read_text())
    (sweep_found,) = findings["causal_threshold"]
    assert [p["threshold"] for p in sweep_found["points"]] == [s["thresholds"]["circuit"] for s in summaries]
    assert [p["circuit"] for p in sweep_found["points"]] == [s["induction_circuit"] for s in summaries]
    verdicts = [s["ablation"]["effect"]["causal"] if s["ablation"]["effect"] else None for s in summaries]
    assert [p["causal"] for p in sweep_found["points"]] == verdicts and set(verdicts) != {None}
    drawn = [s["ablation"]["control_draw"] for s in summaries]  # None: an empty circuit, nothing drawn
    assert [p["n_fallback"] for p in sweep_found["points"]] == [d["fallback"] if d else 0 for d in drawn]
    # T* by its definition, from the summaries: the lowest threshold from which every verdict is causal.
    judged = [(s["thresholds"]["circuit"], v) for s, v in zip(summaries, verdicts) if v is not None]
    expected = next((t for i, (t, _) in enumerate(judged) if all(v for _, v in judged[i:])), None)
    assert sweep_found["t_star"] == expected
    assert "causal_threshold.png" in findings["figures"] and (out / "causal_threshold.png").stat().st_size > 1000
    text = (out / "report.md").read_text()
    assert "## Causal threshold (T*)" in text and "T* = " in text
