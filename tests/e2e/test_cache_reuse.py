"""Cached per-head measurements: a threshold re-sweep runs no model; other weights under the same
name (a file replaced in place, a shard, a Hub revision that changed) are measured again."""

import shutil

import numpy as np
import pytest
import torch

from emergence import measures
from emergence.core.config import compose_config
from emergence.hub import checkpoints, weights
from emergence.main import analyse
from emergence.run import cache
from emergence.run.results import read_run
from tests.helpers.hub_twin import Weights, write_weights
from tests.helpers.tiny_models import tiny_model

SMALL = [
    "probe=paper",
    "probe.n_sequences=24",
    "probe.seq_len=64",
    "probe.vocab_low=10",
    "probe.vocab_high=500",
    "model.dtype=float32",
    "wandb.mode=disabled",
    "ablate.enabled=false",
]


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
        for col in (
            "sel_induction",
            "sel_bos",
            "pr",
            "pr_entropy_rank",
            "sel_induction_ci_low",
            "null_p99",
            *(c.name for c in measures.columns([c.measure for c in measures.chosen(compose_config([]).measures)])),
        ):  # the plug-in measures' too: the entry keeps them
            np.testing.assert_equal(ra[col], rb[col])  # NaN where not measured (prefix matching: the repeat probe's)
    assert second.measures == first.measures and first.measures
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


def columns(run_dir, column: str) -> list[float]:
    return [row[column] for row in read_run(run_dir)[1]]


def measured_afresh(monkeypatch) -> list[str]:
    """The checkpoints a run loaded weights of from now on (each call of ``load_model``)."""
    loaded = []
    real = checkpoints.load_model

    def load_model(model, src, *args):
        loaded.append(src.path)
        return real(model, src, *args)

    monkeypatch.setattr(checkpoints, "load_model", load_model)
    return loaded


@pytest.mark.parametrize("layout", ["pickle", "safetensors shards"])
def test_weights_replaced_in_place_are_measured_again(layout, tmp_path, monkeypatch):
    """A folder's ``pytorch_model.bin`` replaced by another model's, or one of its safetensors shards:
    the next run with reuse=true measures them, and its numbers are theirs; unchanged weights are
    still served from the cache."""
    folder, other = tmp_path / "ckpt", tmp_path / "other"
    stored = {"pickle": Weights("bin", torch.float32), "safetensors shards": Weights("safetensors", torch.float32, 3)}
    for seed, directory in enumerate((folder, other)):
        model = tiny_model("llama", seed=seed)
        directory.mkdir()
        model.config.save_pretrained(directory)
        write_weights(model.state_dict(), directory, stored[layout])
    files = sorted(p.name for p in folder.iterdir() if p.suffix in (".bin", ".safetensors"))
    assert files == (
        ["pytorch_model.bin"] if layout == "pickle" else [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    )
    base = ["model=local", f"model.name_or_path={folder}", f"cache_dir={tmp_path / 'cache'}", *SMALL]
    loaded = measured_afresh(monkeypatch)

    first = analyse(compose_config(base), tmp_path / "first")
    analyse(compose_config(base), tmp_path / "again")  # unchanged: served
    assert loaded == [str(folder)] and columns(tmp_path / "again", "sel_induction") == columns(
        tmp_path / "first", "sel_induction"
    )

    shutil.copyfile(other / files[0], folder / files[0])  # the whole file, or its first shard
    replaced = analyse(compose_config(base), tmp_path / "replaced")
    assert loaded == [str(folder)] * 2 and not replaced.reused_measurements
    fresh = analyse(compose_config([*base, "reuse=false"]), tmp_path / "fresh")
    assert columns(tmp_path / "replaced", "sel_induction") == columns(tmp_path / "fresh", "sel_induction")
    assert columns(tmp_path / "replaced", "sel_induction") != columns(tmp_path / "first", "sel_induction")
    assert replaced.weights_sha256 == fresh.weights_sha256 != first.weights_sha256


def test_a_hub_revision_is_named_by_the_digests_the_hub_lists(monkeypatch):
    """A Hub revision not in the cache is named by its weight files' LFS sha256 as the Hub lists them
    (what the run will download): files changed on the Hub are another checkpoint; the same files, in
    another listing order, the same one."""
    src = checkpoints.Source("org/model", "step1000", False, False)
    listing = [
        weights.RemoteFile("config.json", 10, None),
        weights.RemoteFile("model.safetensors", 99, "a" * 64),
        weights.RemoteFile("pytorch_model.bin", 99, "b" * 64),
    ]
    monkeypatch.setattr(weights, "remote_files", lambda repo, revision: listing)
    assert checkpoints.weights_identity(src) == "a" * 64  # the safetensors a run reads, not the pickle
    listing = [listing[2], weights.RemoteFile("model.safetensors", 99, "c" * 64), listing[0]]
    assert checkpoints.weights_identity(src) == "c" * 64

    def unreachable(repo, revision):
        raise OSError("connection refused")

    monkeypatch.setattr(weights, "remote_files", unreachable)
    assert checkpoints.weights_identity(src) is None
    assert cache.entry_of(compose_config(["model=pythia"]), None, "float32") is None  # no name: no entry


@pytest.mark.slow
def test_relaunched_sweep_skips_finished_jobs(tiny_dirs, tmp_path):
    from tests.helpers.cli import run_cli

    args = [
        "-m",
        "model=local",
        f"model.name_or_path={tiny_dirs['gpt_neox']}",
        *SMALL,
        "threshold=paper,strict",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    ]
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr[-2000:]
    assert len(list((tmp_path / "sweep").rglob("summary.json"))) == 2
    again = run_cli(*args)
    assert again.returncode == 0 and again.stderr.count("already done (resume=true)") == 2
    changed = run_cli(*args, "probe.seed=3")
    assert changed.returncode == 0 and "already done" not in changed.stderr  # another config: recomputed
