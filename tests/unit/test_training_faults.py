"""Faults of the machine a training runs on, met by ``emergence.track`` (and so by the callback) in the
middle of a call: a disk that takes no more bytes, a SIGTERM, a W&B run that is finished. The training
goes on (or stops as the signal asks), no half-written run directory stays, and the next call at the same
step runs again. The disk and the signal are real: each in its own process, as a training would meet them."""

import logging
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from transformers import TrainerState

from emergence.integrations import EmergenceCallback
from emergence.run.results import SUMMARY_FILE, RunSummary
from emergence.run.sweep import FAILED_FILE
from tests.unit import test_training_loop
from tests.unit.test_training_loop import FAST, callback_args

# A training's process: a tiny Llama, then the fault set up by FAULT, then a call of track at step 10;
# what it saw is printed, one fact a line.
TRAINING = textwrap.dedent(
    """
    import logging, os, resource, signal, sys
    from pathlib import Path
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from emergence import track
    from emergence.run import results

    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stdout)
    out, fault, overrides = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64))
    run = out / "emergence" / "step10"

    if fault == "disk_full":
        # every write to a file fails (EFBIG), as every write fails on a full disk (ENOSPC)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))
        print("returned", track(model, 10, out=out, overrides=overrides))
        print("left", sorted(p.name for p in run.iterdir()) if run.exists() else None)
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # room again
    else:
        received = []
        if fault == "sigterm_handled":  # the training's own handler: stop after this step, say
            signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
        writing = results.write_run

        def interrupted(*args, **kwargs):  # the signal comes once the class grid is on disk
            assert (run / "classes.png").exists()
            os.kill(os.getpid(), signal.SIGTERM)
            return writing(*args, **kwargs)

        results.write_run = interrupted
        print("returned", track(model, 10, out=out, overrides=overrides))
        print("received", received)
        print("left", sorted(p.name for p in run.iterdir()) if run.exists() else None)
        results.write_run = writing
    print("again", type(track(model, 10, out=out, overrides=overrides)).__name__)
    print("summary", (run / "summary.json").exists())
    """
)


def training(out: Path, fault: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", TRAINING, str(out), fault, *FAST], capture_output=True, text=True, timeout=600
    )


def said(proc: subprocess.CompletedProcess, key: str) -> str:
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith(f"{key} ")]
    return line[len(key) + 1 :]


@pytest.mark.slow
def test_a_full_disk_is_one_warning_nothing_left_and_the_next_call_runs(tmp_path):
    proc = training(tmp_path, "disk_full")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert said(proc, "returned") == "None" and said(proc, "left") == "None"
    (warning,) = [line for line in proc.stdout.splitlines() if line.startswith("emergence:")]
    assert warning.startswith("emergence: step 10 not analysed (OSError: [Errno 27] File too large")
    assert warning.endswith(f"training goes on (no {FAILED_FILE} file either: OSError: [Errno 27] File too large)")
    assert said(proc, "again") == "RunSummary" and said(proc, "summary") == "True"
    assert not (tmp_path / "emergence" / "step10" / FAILED_FILE).exists()


@pytest.mark.slow
def test_sigterm_mid_call_discards_the_step_then_reaches_the_trainings_handler(tmp_path):
    proc = training(tmp_path, "sigterm_handled")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert said(proc, "returned") == "None" and said(proc, "left") == "None"  # classes.png went with it
    assert said(proc, "received") == f"[{int(signal.SIGTERM)}]"  # once, to the training's own handler
    assert "emergence: step 10 not analysed (SIGTERM); the signal goes on to the training" in proc.stdout
    assert said(proc, "again") == "RunSummary" and said(proc, "summary") == "True"


@pytest.mark.slow
def test_sigterm_mid_call_without_a_handler_ends_the_training_and_leaves_no_half_run(tmp_path):
    proc = training(tmp_path, "sigterm_default")
    assert proc.returncode == -signal.SIGTERM  # Python's default: the process ends, as the signal asks
    assert "returned" not in proc.stdout
    assert (tmp_path / "emergence").is_dir() and not (tmp_path / "emergence" / "step10").exists()


model = test_training_loop.model  # the fixture: a tiny Llama as a training holds it


def test_a_finished_wandb_run_is_one_warning_and_the_results_stand(model, tmp_path, monkeypatch, caplog):
    import wandb

    run = wandb.init(mode="offline", dir=str(tmp_path), project="faults")
    run.finish()
    state = TrainerState(global_step=10)
    with caplog.at_level(logging.WARNING):
        EmergenceCallback(overrides=FAST).analyse(callback_args(tmp_path), state, model, None)  # wandb.run: None
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        monkeypatch.setattr(wandb, "run", run)  # a training that still holds its finished run
        state.global_step = 20
        EmergenceCallback(overrides=FAST).analyse(callback_args(tmp_path), state, model, None)
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert line.startswith("emergence: step 20 not logged to W&B (UsageError: Run (") and "is finished" in line
    assert line.endswith(f"its results are in {tmp_path / 'emergence' / 'step20'}")
    for step in (10, 20):
        assert RunSummary.read(tmp_path / "emergence" / f"step{step}").step == step
        assert (tmp_path / "emergence" / f"step{step}" / SUMMARY_FILE).exists()
