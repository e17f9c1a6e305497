"""A transformers Trainer run's output folder through the commands a user types: one checkpoint, a
``revision=glob(r*)`` sweep over its panel, refinement and the report with tokens on the axis; and the same
runs without token counts, reported against steps."""

import json
import shutil

import pytest

from tests.helpers.cli import run_cli
from tests.helpers.trainer_run import tokens_at

PANEL_STEPS = [10, 20, 30, 40, 50, 60, 70, 80, 90, 120]  # tests/unit/test_own_runs.py derives them


@pytest.mark.slow
def test_one_checkpoint_reads_its_weights_never_the_optimizer_states(trainer_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trainer_run / "checkpoint-50", run / "checkpoint-50")
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin"):
        (run / "checkpoint-50" / name).write_bytes(b"not a pickle")  # reading any of them would fail
    out = tmp_path / "out"
    res = run_cli(
        "model=local",
        f"model.name_or_path={run}",
        "revision=custom",
        "revision.name=checkpoint-50",
        "probe=quick",
        "ablate.enabled=false",
        "wandb.mode=disabled",
        f"hydra.run.dir={out}",
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert (
        "probe fitted to the model (context 64, vocabulary 128): probe.seq_len 256 -> 64, probe.vocab_high "
        "10000 -> 128, probe.vocab_low 100 -> 64; thresholds x0.25"
    ) in res.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["revision"], summary["step"], summary["tokens"]) == ("checkpoint-50", 50, tokens_at(50))
    assert summary["probe"]["seq_len"] == 64 and summary["thresholds"]["circuit"] == 12.5
    assert summary["probe_fit"]["thresholds"] == {"class_default": 7.5, "circuit": 12.5, "prev_token_circuit": 25.0}


@pytest.mark.slow
def test_a_glob_sweep_refinement_and_the_report_over_the_folder(trainer_run, tmp_path):
    sweep = tmp_path / "sweep"
    res = run_cli(
        "-m",
        "model=local",
        f"model.name_or_path={trainer_run}",
        "revision=glob(r*)",
        "probe=quick",
        "ablate.enabled=false",
        "wandb.mode=disabled",
        f"hydra.sweep.dir={sweep}",
        timeout=1200,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    summaries = sorted((json.loads(p.read_text()) for p in sweep.glob("local/*/summary.json")), key=lambda s: s["step"])
    assert [(s["revision"], s["step"], s["tokens"]) for s in summaries] == [
        (f"checkpoint-{s}", s, tokens_at(s)) for s in PANEL_STEPS
    ]
    integrity = json.loads((sweep / "integrity.json").read_text())[str(trainer_run)]["branches"]
    assert sorted(integrity) == sorted(f"checkpoint-{s}" for s in PANEL_STEPS)  # checked before the jobs ran

    refined = run_cli(sweep, "--milestones", "induction_onset", module="emergence.refine", timeout=1200)
    assert refined.returncode == 0, refined.stderr[-3000:]
    answer = json.loads((sweep / "refined.json").read_text())["local"]["induction_onset"]
    if answer["interval"]:  # the run reached it: an interval between adjacent checkpoints of the folder
        low, high = (int(r.removeprefix("checkpoint-")) for r in answer["interval"])
        assert high - low == 10 and answer["tokens"] == [tokens_at(low), tokens_at(high)]
    else:
        assert answer["reason"]

    report = tmp_path / "report"
    res = run_cli(sweep, "--out", report, module="emergence.report", env={"WANDB_MODE": "disabled"})
    assert res.returncode == 0, res.stderr[-3000:]
    findings = json.loads((report / "findings.json").read_text())["models"]["local"]
    assert [r["tokens"] for r in findings["revisions"]] == [tokens_at(s) for s in PANEL_STEPS]
    assert findings["unit"] == "tokens"
    assert "recorded no token counts" not in (report / "report.md").read_text()

    # the same runs as if the Trainer had counted no tokens: the report's axis is the steps, and it says so
    bare = tmp_path / "bare"
    shutil.copytree(sweep, bare, ignore=shutil.ignore_patterns("refine", "refined.json"))
    for path in bare.glob("local/*/summary.json"):
        summary = json.loads(path.read_text())
        path.write_text(json.dumps({**summary, "tokens": None}))
    res = run_cli(bare, "--out", tmp_path / "steps", module="emergence.report", env={"WANDB_MODE": "disabled"})
    assert res.returncode == 0, res.stderr[-3000:]
    findings = json.loads((tmp_path / "steps" / "findings.json").read_text())["models"]["local"]
    assert [r["tokens"] for r in findings["revisions"]] == PANEL_STEPS and findings["unit"] == "steps"
    report = (tmp_path / "steps" / "report.md").read_text()
    assert "every **tokens** of this section counts training **steps**" in report
