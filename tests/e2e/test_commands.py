"""The command line as users meet it: bad input, Ctrl-C, W&B's conventions, the job log."""

import os
import shutil
import signal
import time

import pytest

from tests.helpers.cli import last_line, run_cli, start_cli
from tests.helpers.wandb_offline import finished_records

SMALL = ["probe=quick", "probe.n_sequences=16", "probe.seq_len=64", "probe.vocab_low=10", "probe.vocab_high=500"]


def assert_clean_failure(res, out, *words):
    """Exit 2, one line naming the problem, no traceback, nothing left behind."""
    assert res.returncode == 2, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    line = last_line(res.stderr)
    assert line.startswith("error: ") and all(w in line for w in words), line
    assert not out.exists(), sorted(p.name for p in out.rglob("*"))


@pytest.fixture()
def truncated(tiny_dirs, tmp_path):
    """A model directory whose model.safetensors was cut short (an interrupted download)."""
    path = tmp_path / "truncated"
    shutil.copytree(tiny_dirs["olmo"], path)
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    "case", ["cuda_without_cuda", "truncated_safetensors", "head_outside_the_model", "wandb_online_without_login"]
)
def test_bad_input_is_one_line_exit_2_and_leaves_nothing(case, tiny_dirs, truncated, tmp_path):
    out = tmp_path / "run"
    model = ["model=local", f"model.name_or_path={tiny_dirs['olmo']}", *SMALL, f"hydra.run.dir={out}"]
    env = {"WANDB_MODE": "disabled"}
    if case == "cuda_without_cuda":
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
        res, words = run_cli(*model, "device=cuda", env=env), ["device='cuda'", "device=cpu"]
    elif case == "truncated_safetensors":
        res = run_cli(*model, f"model.name_or_path={truncated}", env=env)
        words = [str(truncated), "truncated or corrupt"]
    elif case == "head_outside_the_model":
        res, words = run_cli(*model, "ablate.heads=[L1H0,L99H0]", env=env), ["ablate.heads='L99H0'", "2 layers x 4"]
    else:
        home = tmp_path / "home"  # no ~/.netrc, no W&B settings
        home.mkdir()
        res = run_cli(
            *model,
            "wandb.mode=online",
            env={"HOME": str(home), "WANDB_API_KEY": "", "WANDB_CONFIG_DIR": str(home / "wandb")},
        )
        words = ["wandb.mode='online'", "wandb login"]
    assert_clean_failure(res, out, *words)


@pytest.mark.slow
def test_ctrl_c_is_one_line_and_leaves_no_results(tiny_dirs, tmp_path):
    out = tmp_path / "run"
    proc = start_cli(
        "model=local",
        f"model.name_or_path={tiny_dirs['gpt_neox']}",
        *SMALL,
        "probe.n_sequences=200000",
        "probe.batch_size=4",
        "wandb.mode=offline",
        f"hydra.run.dir={out}",
        env={"WANDB_DIR": ""},
    )
    for line in proc.stderr:  # wait until the probe pass is under way
        if line.startswith("probe: "):
            break
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read()
    assert proc.wait(timeout=120) == 130
    assert "Traceback" not in rest and last_line(rest).startswith("interrupted")
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("after", [0.2, 1.0, 3.0])
def test_ctrl_c_while_importing_is_one_line_too(after, tiny_dirs, tmp_path):
    """Ctrl-C in the first seconds, while torch, transformers and Hydra are still importing (seconds
    on any machine), before ``main`` handles it: exit 130, one line, no traceback, nothing left."""
    out = tmp_path / "run"
    proc = start_cli(
        "model=local",
        f"model.name_or_path={tiny_dirs['gpt_neox']}",
        *SMALL,
        "wandb.mode=disabled",
        f"hydra.run.dir={out}",
    )
    time.sleep(after)
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read()
    assert proc.wait(timeout=120) == 130, rest[-2000:]
    assert "Traceback" not in rest and last_line(rest).startswith("interrupted"), rest[-2000:]
    assert not out.exists()


def test_a_ctrl_c_that_python_swallows_in_a_finalizer_still_counts():
    """The KeyboardInterrupt of a Ctrl-C that lands in a finalizer is only printed; the run's
    handler records the Ctrl-C itself, which ``main`` then treats as an interrupt."""
    from emergence.run import interrupt

    class Finalized:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler runs here, inside the finalizer

    previous = signal.signal(signal.SIGINT, interrupt.on_sigint)
    try:
        Finalized()  # collected at once: its KeyboardInterrupt goes no further than "Exception ignored"
        assert interrupt.received.is_set()
    finally:
        signal.signal(signal.SIGINT, previous)
        interrupt.received.clear()


@pytest.mark.slow
def test_wandb_environment_group_tags_and_resume(tiny_dirs, tmp_path):
    model = ["model=local", f"model.name_or_path={tiny_dirs['gpt_neox']}", *SMALL, "ablate.enabled=false"]
    # WANDB_MODE=disabled: no wandb/ folder anywhere; the job log still holds the report lines.
    off = tmp_path / "off"
    res = run_cli(*model, f"hydra.run.dir={off}", env={"WANDB_MODE": "disabled"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert not list(off.rglob("wandb"))
    log = (off / "main.log").read_text()
    assert "BOS fraction:" in log and f"results: {off}" in log

    # A sweep in offline mode: one group (the sweep's name), model and revision as tags, and a
    # re-run into the same directory continues the same W&B run.
    sweep = tmp_path / "sweep-7f3a"
    args = ["-m", *model, "threshold=paper,strict", f"hydra.sweep.dir={sweep}", "resume=false"]
    for _ in range(2):
        res = run_cli(*args, env={"WANDB_MODE": "offline", "WANDB_DIR": ""})
        assert res.returncode == 0, res.stderr[-2000:]
    for job in ("local/final_0", "local/final_1"):
        runs = sorted((sweep / job / "wandb").glob("offline-run-*"))
        assert len(runs) == 2, runs  # two launches ...
        assert len({r.name.rsplit("-", 1)[1] for r in runs}) == 1  # ... of one run id
    ids = {
        next((sweep / j / "wandb").glob("offline-run-*")).name.rsplit("-", 1)[1]
        for j in ("local/final_0", "local/final_1")
    }
    assert len(ids) == 2  # each job its own run
    for run in sweep.rglob("offline-run-*"):  # W&B's run record holds the group it was given
        (record,) = [r.run for r in finished_records(run) if r.WhichOneof("record_type") == "run"]
        assert record.run_group == "sweep-7f3a"


def test_tracked_run_passes_group_tags_id_and_dir(monkeypatch, tmp_path):
    """What reaches wandb.init: the sweep's group, model and revision tags, a stable id, $WANDB_DIR."""
    import wandb

    from emergence.core.config import compose_config
    from emergence.run import tracking

    seen = {}

    class Run:
        def finish(self, exit_code=0):
            seen["exit_code"] = exit_code

    def fake_init(**kwargs):
        seen.update(kwargs)
        return Run()

    monkeypatch.setattr(wandb, "init", fake_init)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "w"))
    cfg = compose_config(["wandb.mode=offline", "wandb.group=sweep-1", "wandb.tags=[mine]"]).wandb
    with tracking.tracked_run(cfg, "toy_neox@step64", {}, tmp_path / "job", tags=["toy_neox", "step64", None]):
        pass
    assert seen["exit_code"] == 0 and seen["group"] == "sweep-1" and seen["tags"] == ["mine", "toy_neox", "step64"]
    assert seen["dir"] == str(tmp_path / "w") and (tmp_path / "w").is_dir()
    assert seen["resume"] == "allow" and seen["id"] == tracking.run_id(tmp_path / "job")
    assert tracking.run_id(tmp_path / "job") != tracking.run_id(tmp_path / "other")


@pytest.mark.slow
def test_help_names_the_tool_its_groups_options_and_sibling_commands():
    res = run_cli("--help")
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stdout.splitlines()
    assert lines[0].startswith("emergence: when do attention circuits form")
    for group, option in [("model", "toy_neox"), ("revision", "r9"), ("probe", "paper"), ("threshold", "strict")]:
        assert any(line.startswith(f"{group}: ") and option in line for line in lines), group
    assert "ablate:" in lines and "  n_controls: 5" in lines  # every option, with its default
    for sibling in ("refine", "report", "revisions", "toy", "edge", "llc.calibrate"):
        assert any(line.startswith(f"python -m emergence.{sibling} ") for line in lines), sibling
    assert "powered by Hydra" not in res.stdout
