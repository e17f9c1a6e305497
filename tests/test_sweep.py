"""Sweeps: a failing job loses none of the others' results and the sweep lists it."""

import os
import subprocess
import sys

import pytest

PROBE = ["probe=quick", "probe.n_sequences=8", "probe.seq_len=64", "probe.vocab_low=10", "probe.vocab_high=500",
         "wandb.mode=disabled", "ablate.enabled=false"]


def sweep(tmp_path, tiny_dirs, *launcher):
    paths = f"{tiny_dirs['olmo']},{tiny_dirs['gpt_neox']},/nonexistent"
    return subprocess.run([sys.executable, "-m", "emergence", "-m", *launcher, "model=local",
                           f"model.name_or_path={paths}", *PROBE, f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                          capture_output=True, text=True, timeout=600, env=dict(os.environ))


@pytest.mark.slow
@pytest.mark.parametrize("launcher", [[], ["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10"]],
                         ids=["basic", "submitit_local"])
def test_failing_job_keeps_the_others_and_is_listed(launcher, tmp_path, tiny_dirs):
    res = sweep(tmp_path, tiny_dirs, *launcher)
    assert res.returncode == 1
    summaries = sorted(p.parent.name for p in (tmp_path / "sweep").rglob("summary.json"))
    failed = sorted(p.parent.name for p in (tmp_path / "sweep").rglob("FAILED"))
    assert summaries == ["final_0", "final_1"] and failed == ["final_2"]
    assert "1 job(s) of the sweep failed" in res.stderr and "/nonexistent" in res.stderr.splitlines()[-1]


def test_slurm_launcher_config_composes():
    from hydra import compose, initialize_config_module

    import emergence.config  # noqa: F401  (registers the schema)

    with initialize_config_module(config_module="emergence.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["hydra/launcher=slurm", "hydra.launcher.partition=gpu"],
                      return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert launcher.gpus_per_node == 1 and launcher.partition == "gpu" and launcher.timeout_min == 120
