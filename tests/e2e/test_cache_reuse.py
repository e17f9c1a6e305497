"""Cached per-head measurements: a threshold re-sweep runs no model."""

import numpy as np
import pytest

from emergence.core.config import compose_config
from emergence.hub import checkpoints
from emergence.main import analyse
from emergence.run.results import read_run

SMALL = ["probe=paper", "probe.n_sequences=24", "probe.seq_len=64", "probe.vocab_low=10", "probe.vocab_high=500",
         "model.dtype=float32", "wandb.mode=disabled", "ablate.enabled=false"]


def test_threshold_resweep_loads_no_model(tiny_dirs, tmp_path, monkeypatch):
    base = ["model=local", f"model.name_or_path={tiny_dirs['olmo']}", f"cache_dir={tmp_path / 'cache'}", *SMALL]
    first = analyse(compose_config([*base, "threshold=paper"]), tmp_path / "paper")
    assert not first.reused_measurements
    assert list((tmp_path / "cache" / "measurements").glob("*.npz"))

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(checkpoints, "load_model", no_model)
    second = analyse(compose_config([*base, "threshold=lenient", "threshold.circuit=1e-3"]), tmp_path / "lenient")
    assert second.reused_measurements
    _, a = read_run(tmp_path / "paper")
    _, b = read_run(tmp_path / "lenient")
    for ra, rb in zip(a, b):
        for col in ("sel_induction", "sel_bos", "pr", "pr_entropy_rank", "sel_induction_ci_low", "null_p99"):
            assert ra[col] == rb[col]
    assert second.thresholds.circuit == 1e-3 and len(second.induction_circuit) > len(first.induction_circuit)

    with pytest.raises(AssertionError, match="the model was loaded"):  # another probe is another entry
        analyse(compose_config([*base, "probe.seed=1"]), tmp_path / "seed1")
    with pytest.raises(AssertionError, match="the model was loaded"):  # and reuse=false recomputes
        analyse(compose_config([*base, "reuse=false"]), tmp_path / "fresh")


def test_cached_and_fresh_measurements_agree(tiny_dirs, tmp_path):
    base = ["model=local", f"model.name_or_path={tiny_dirs['gpt_neox']}", f"cache_dir={tmp_path / 'cache'}", *SMALL]
    analyse(compose_config(base), tmp_path / "one")
    analyse(compose_config([*base, "reuse=false"]), tmp_path / "two")
    _, one = read_run(tmp_path / "one")
    _, two = read_run(tmp_path / "two")
    np.testing.assert_allclose([r["sel_induction"] for r in one], [r["sel_induction"] for r in two], rtol=1e-6)


@pytest.mark.slow
def test_relaunched_sweep_skips_finished_jobs(tiny_dirs, tmp_path):
    from tests.helpers.cli import run_cli

    args = ["-m", "model=local", f"model.name_or_path={tiny_dirs['gpt_neox']}", *SMALL, "threshold=paper,strict",
            f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr[-2000:]
    assert len(list((tmp_path / "sweep").rglob("summary.json"))) == 2
    again = run_cli(*args)
    assert again.returncode == 0 and again.stderr.count("already done (resume=true)") == 2
    changed = run_cli(*args, "probe.seed=3")
    assert changed.returncode == 0 and "already done" not in changed.stderr  # another config: recomputed
