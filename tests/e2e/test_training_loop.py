"""The recipe inside a training, end to end: transformers' ``Trainer`` with ``EmergenceCallback`` (a checkpoint
every 30 of 120 steps, W&B offline, the live edge at W = 3) against the command line on the checkpoints it
saved, against the same training without the callback (``trainer_run``), and in its W&B run; a recipe error
inside a training; and ``python -m emergence.watch`` over a folder that a thread writes."""

import csv
import json
import logging
import shutil
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from emergence.integrations import EmergenceCallback
from emergence.run.results import RunSummary
from emergence.run.sweep import FAILED_FILE
from tests.helpers.cli import run_cli, start_cli
from tests.helpers.trainer_run import STEPS, tokens_at, train_run
from tests.helpers.wandb_offline import history

SAVED = (30, 60, 90, 120)  # the tracked training's checkpoints
LIVE_WINDOW = 3  # edge.window of the callback's live edge: one window, 30 .. 120
OVERRIDES = ["probe=quick"]  # the callback's default probe, said to the command line


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """The ``Trainer`` run of tests/helpers/trainer_run.py saving every 30 steps, with the callback (its live
    edge at W = 3) and ``report_to="wandb"`` (offline): (its output folder, its W&B run's folder)."""
    import wandb

    root = tmp_path_factory.mktemp("tracked")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("WANDB_MODE", "offline")
        env.setenv("WANDB_DIR", str(root))
        callback = EmergenceCallback(overrides=[f"edge.window={LIVE_WINDOW}"])
        out = train_run(root / "out", save_steps=SAVED[0], callbacks=[callback], report_to=["wandb"])
        # the run's own folder: W&B settings made earlier in this worker (another test's run) may place it
        # outside WANDB_DIR
        assert wandb.run is not None, "the Trainer's W&B run is not open"
        run = Path(wandb.run.dir).parent  # <offline-run-...>/files
        wandb.finish()  # the Trainer leaves its run open (history() reads its file once the exit record is in)
    return out, run


def heads(run_dir):
    with open(run_dir / "heads.csv", newline="") as f:
        return list(csv.DictReader(f))


def assert_same_numbers(ours, theirs):
    """heads.csv's rows of two runs: the same heads and classes, every number within 1e-5."""
    assert len(ours) == len(theirs) and ours[0].keys() == theirs[0].keys()
    for a, b in zip(ours, theirs):
        for column, value in a.items():
            try:
                assert float(value) == pytest.approx(float(b[column]), abs=1e-5, nan_ok=True), column
            except ValueError:  # a class name, a boolean
                assert value == b[column], column


@pytest.mark.slow
def test_every_number_the_callback_wrote_is_the_command_lines_on_the_saved_checkpoint(tracked, tmp_path):
    out, _ = tracked
    sweep = tmp_path / "sweep"
    res = run_cli(
        "-m",
        "model=local",
        f"model.name_or_path={out}",
        "revision=custom",
        f"revision.name={','.join(f'checkpoint-{s}' for s in SAVED)}",
        *OVERRIDES,
        "wandb.mode=disabled",
        f"hydra.sweep.dir={sweep}",
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    command = {RunSummary.read(p.parent).step: p.parent for p in sweep.glob("local/*/summary.json")}
    assert sorted(command) == list(SAVED)
    for step in SAVED:
        ours, theirs = out / "emergence" / f"step{step}", command[step]
        assert_same_numbers(heads(ours), heads(theirs))
        with np.load(ours / "per_sequence.npz") as a, np.load(theirs / "per_sequence.npz") as b:
            assert a.files == b.files
            for name in a.files:
                np.testing.assert_allclose(a[name], b[name], atol=1e-5, err_msg=name)
        mine, cli = RunSummary.read(ours), RunSummary.read(theirs)
        assert (mine.step, mine.tokens) == (cli.step, cli.tokens) == (step, tokens_at(step))
        assert mine.class_counts == cli.class_counts and mine.induction_circuit == cli.induction_circuit
        assert mine.bos_fraction == pytest.approx(cli.bos_fraction, abs=1e-6)
        assert mine.ablation.to_json() == cli.ablation.to_json()
        assert mine.probe_fit == cli.probe_fit and mine.thresholds == cli.thresholds


@pytest.mark.slow
def test_the_training_is_the_one_without_the_callback_loss_for_loss_weight_for_weight(tracked, trainer_run):
    """``trainer_run`` is the same training without the callback (nor W&B), saving every 10 steps."""
    out, _ = tracked

    def losses(folder):
        state = json.loads((folder / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())
        return [entry["loss"] for entry in state["log_history"] if "loss" in entry]

    assert len(losses(out)) == STEPS and losses(out) == losses(trainer_run)  # every step's, unrounded
    for step in SAVED:
        name = f"checkpoint-{step}/model.safetensors"
        assert (out / name).read_bytes() == (trainer_run / name).read_bytes(), name


@pytest.mark.slow
def test_the_trainers_wandb_run_holds_the_loss_and_the_emergence_metrics(tracked):
    out, run = tracked
    logged = history(run)
    assert len([r for r in logged if "train/loss" in r]) == STEPS
    ours = [r for r in logged if any(k.startswith("emergence/") for k in r)]
    assert [r["train/global_step"] for r in ours] == list(SAVED)
    for step, row in zip(SAVED, ours):
        summary = RunSummary.read(out / "emergence" / f"step{step}")
        assert row["emergence/tokens"] == tokens_at(step)
        assert row["emergence/bos_fraction"] == summary.bos_fraction
        assert row["emergence/n_induction"] == len(summary.induction_circuit)
        assert row["emergence/heads/_type"] == "table-file" and row["emergence/heads/nrows"] == 8  # 2 layers x 4 heads
        assert row["emergence/classes/_type"] == "image-file"
        assert not any(k in row for k in ("bos_fraction", "tokens"))  # nothing outside its namespace


@pytest.mark.slow
def test_the_callback_writes_the_live_edge_into_the_trainers_wandb_run(tracked):
    """Each call keeps the model's sketch; once W + 1 of them are at one spacing, the window ending at the
    step is in edge_live.json and in the training's W&B run, its ratios those of the kept sketches' updates."""
    out, run = tracked
    runs = out / "emergence"
    assert sorted(p.name for p in (runs / "edge_sketch").glob("*.npz")) == sorted(f"step{s}.npz" for s in SAVED)
    live = json.loads((runs / "edge_live.json").read_text())
    (window,) = live["spectra"][0]["scopes"]["model"]
    assert live["projection"] == "sketch" and (window["first_step"], window["last_step"]) == (SAVED[0], SAVED[-1])
    vectors = [np.load(runs / "edge_sketch" / f"step{s}.npz")["values"][0] for s in SAVED]
    sv = np.linalg.svd(np.diff(np.stack(vectors), axis=0), compute_uv=False)
    assert window["r23"] == pytest.approx(sv[1] / sv[2], rel=1e-9)
    rows = [r for r in history(run) if "emergence/edge/r23" in r]
    assert [r["train/global_step"] for r in rows] == [SAVED[-1]]
    assert rows[0]["emergence/edge/r23"] == pytest.approx(window["r23"]) and rows[0]["emergence/tokens"] == tokens_at(
        120
    )


@pytest.mark.slow
def test_the_report_reads_the_callbacks_runs_as_a_panel_with_tokens_on_the_axis(tracked, tmp_path):
    out, _ = tracked
    res = run_cli(
        out / "emergence", "--out", tmp_path / "report", module="emergence.report", env={"WANDB_MODE": "disabled"}
    )
    assert res.returncode == 0, res.stderr[-3000:]
    findings = json.loads((tmp_path / "report" / "findings.json").read_text())["models"]["local"]
    assert [r["tokens"] for r in findings["revisions"]] == [tokens_at(s) for s in SAVED]
    assert findings["unit"] == "tokens"


@pytest.mark.slow
def test_a_recipe_error_inside_training_is_one_warning_line_and_the_training_goes_on(tmp_path, monkeypatch, caplog):
    def broken(cfg, loaded, out_dir):
        raise RuntimeError("the capture broke")

    monkeypatch.setattr("emergence.run.steps.measure", broken)
    with caplog.at_level(logging.WARNING, logger="emergence"):
        out = train_run(tmp_path / "out", steps=20, save_steps=20, callbacks=[EmergenceCallback(every_steps=10)])
    said = [r.getMessage() for r in caplog.records if r.name.startswith("emergence")]
    assert said == [
        f"emergence: step {s} not analysed (RuntimeError: the capture broke); training goes on "
        f"({out / 'emergence' / f'step{s}' / FAILED_FILE})"
        for s in (10, 20)
    ]
    assert json.loads((out / "checkpoint-20" / "trainer_state.json").read_text())["global_step"] == 20
    for step in (10, 20):
        assert (out / "emergence" / f"step{step}" / FAILED_FILE).read_text().startswith("RuntimeError: the capture")


CHECKPOINT_FILES = ("config.json", "model.safetensors", "trainer_state.json")  # what watch reads of one


def write_slowly(source, folder, pieces: int = 8, pause: float = 0.3):
    """A checkpoint as a Trainer saves it, slowed down: the config, the weights in pieces, then its state."""
    folder.mkdir()
    shutil.copy(source / "config.json", folder)
    weights = (source / "model.safetensors").read_bytes()
    with open(folder / "model.safetensors", "wb") as f:
        for piece in np.array_split(np.frombuffer(weights, np.uint8), pieces):
            f.write(piece.tobytes())
            f.flush()
            time.sleep(pause)
    shutil.copy(source / "trainer_state.json", folder)


def crashed(source, folder):
    """A save that died: its config and trainer state whole, a third of its weights."""
    folder.mkdir()
    shutil.copy(source / "config.json", folder)
    weights = (source / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(weights[: len(weights) // 3])
    state = json.loads((source / "trainer_state.json").read_text())
    (folder / "trainer_state.json").write_text(json.dumps({**state, "global_step": 160}))


@pytest.mark.slow
def test_watch_analyses_each_whole_checkpoint_once_never_a_half_written_one(trainer_run, tracked, tmp_path):
    """A folder a thread writes: checkpoint-40 and -80 are there, -80 is deleted while -40 is analysed (as
    save_total_limit would), -120 is written slowly, -160 stays cut short; Ctrl-C during -120's analysis,
    then ``--once``."""
    run = tmp_path / "run"
    for step in (40, 80):
        (run / f"checkpoint-{step}").mkdir(parents=True)
        for name in CHECKPOINT_FILES:
            shutil.copy(trainer_run / f"checkpoint-{step}" / name, run / f"checkpoint-{step}")
    watcher = start_cli(run, *OVERRIDES, "--poll", "0.3", module="emergence.watch")
    timer = threading.Timer(300, watcher.kill)  # a watch that hangs fails the test, not the session
    timer.start()
    lines, writer = [], None
    for line in watcher.stderr:
        lines.append(line)
        if "checkpoint-40: analysing" in line:
            shutil.rmtree(run / "checkpoint-80")
            crashed(trainer_run / "checkpoint-120", run / "checkpoint-160")
        elif f"results: {run / 'emergence' / 'step40'}" in line:
            writer = threading.Thread(
                target=write_slowly, args=(trainer_run / "checkpoint-120", run / "checkpoint-120")
            )
            writer.start()
        elif "checkpoint-120: analysing" in line:
            watcher.send_signal(signal.SIGINT)
    assert watcher.wait() == 130
    timer.cancel()
    writer.join()
    said = "".join(lines)
    assert "missed checkpoint-80: deleted before it was analysed" in said
    assert "checkpoint-120: not whole yet (" in said and said.index("checkpoint-120: not whole yet") < said.index(
        "checkpoint-120: analysing"
    )
    assert "checkpoint-160: not whole yet (model.safetensors is shorter than its header declares)" in said
    assert "interrupted: the checkpoint being analysed left no run directory" in said
    assert sorted(p.name for p in (run / "emergence").iterdir()) == ["step40"]  # -120's half-written run is gone
    step40 = run / "emergence" / "step40" / "summary.json"
    written = step40.stat().st_mtime_ns

    again = run_cli(run, "--once", *OVERRIDES, module="emergence.watch")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "checkpoint-40: already analysed" in again.stderr and step40.stat().st_mtime_ns == written
    assert again.stderr.count(": analysing") == 1 and "checkpoint-120: analysing" in again.stderr
    assert "not analysed: checkpoint-160 is not whole (model.safetensors is shorter than its header declares)" in (
        again.stderr
    )
    assert sorted(p.name for p in (run / "emergence").iterdir()) == ["step120", "step40"]
    out, _ = tracked  # the same weights (the training is the callback's, to the bit): the same numbers
    for step in (120,):  # the step both analysed (the callback's saves are 30 apart)
        assert_same_numbers(heads(run / "emergence" / f"step{step}"), heads(out / "emergence" / f"step{step}"))
    summary = RunSummary.read(run / "emergence" / "step120")
    assert (summary.revision, summary.step, summary.tokens) == ("checkpoint-120", 120, tokens_at(120))
