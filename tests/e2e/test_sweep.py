"""Sweeps: a failing job loses none of the others' results and the sweep lists it."""

import pytest

from tests.helpers.cli import last_line, run_cli

PROBE = [
    "probe=quick",
    "probe.n_sequences=8",
    "probe.seq_len=64",
    "probe.vocab_low=10",
    "probe.vocab_high=500",
    "wandb.mode=disabled",
    "ablate.enabled=false",
]


def sweep(tmp_path, tiny_dirs, *launcher):
    paths = f"{tiny_dirs['olmo']},{tiny_dirs['gpt_neox']},/nonexistent"
    return run_cli(
        "-m", *launcher, "model=local", f"model.name_or_path={paths}", *PROBE, f"hydra.sweep.dir={tmp_path / 'sweep'}"
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "launcher",
    [[], ["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10"]],
    ids=["basic", "submitit_local"],
)
def test_failing_job_keeps_the_others_and_is_listed(launcher, tmp_path, tiny_dirs):
    res = sweep(tmp_path, tiny_dirs, *launcher)
    assert res.returncode == 1
    summaries = sorted(p.parent.name for p in (tmp_path / "sweep").rglob("summary.json"))
    failed = sorted(p.parent.name for p in (tmp_path / "sweep").rglob("FAILED"))
    assert summaries == ["final_0", "final_1"] and failed == ["final_2"]
    assert "1 job(s) of the sweep failed" in res.stderr and "/nonexistent" in last_line(res.stderr)
