"""Downloads overlapped with analysis (``emergence/run/prefetch.py``): in a sweep against a Hub
server (olah, ``tests/helpers/hub_server.py``), the next job's revision is in the cache before that
job starts; ``hub.prefetch=0`` turns it off; ``model.cleanup=true`` still removes what the
sweep fetched; a revision too big for the free disk is not prefetched."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from emergence.core.config import compose_config, config_digest
from emergence.core.errors import UsageError
from emergence.run import prefetch
from emergence.run.validation import validate
from tests.e2e.test_hub_server import OLMO2, QUICK
from tests.helpers.cli import run_cli
from tests.helpers.hub_server import publish
from tests.helpers.tiny_models import save_tiny_model

BRANCHES = ["stage1-step1000-tokens3B", "stage1-step2000-tokens5B", "stage1-step3000-tokens7B"]
# A job's analysis long enough (seconds) for the next revision's download to finish during it
ANALYSIS = ["probe.n_sequences=800", "stats.n_boot=2000"]


def sweep(hub_server, tmp_path, name, *overrides) -> tuple[list[dict], list[Path], Path]:
    """A 3-job multirun over ``BRANCHES`` (each its own weights) with a fresh cache: (the
    jobs' summaries, their directories, the cache), in job order."""
    if not (hub_server.mirrors / "models" / OLMO2).exists():
        checkpoints = {}
        for seed, branch in enumerate(BRANCHES):
            checkpoints[branch] = tmp_path / "ckpt" / branch
            save_tiny_model("olmo2", checkpoints[branch], seed=seed, vocab_size=10240)
        publish(hub_server.mirrors, OLMO2, checkpoints)
    cache = tmp_path / name / "hub"
    res = run_cli(
        "-m",
        "model=olmo2",
        "revision=custom",
        f"revision.name={','.join(BRANCHES)}",
        *QUICK,
        *ANALYSIS,
        *overrides,
        f"hydra.sweep.dir={tmp_path / name / 'sweep'}",
        env={**hub_server.env(cache), "WANDB_MODE": "disabled"},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    jobs = sorted((tmp_path / name / "sweep" / "olmo2").iterdir(), key=lambda d: int(d.name.rsplit("_", 1)[1]))
    return [json.loads((d / "summary.json").read_text()) for d in jobs], jobs, cache


def blob_times(cache: Path, summaries: list[dict]) -> list[float]:
    """When each job's weights (named by their sha256, as on the Hub) arrived in the cache."""
    blobs = cache / f"models--{OLMO2.replace('/', '--')}" / "blobs"
    return [(blobs / s["weights_sha256"]).stat().st_mtime for s in summaries]


def job_starts(jobs: list[Path]) -> list[float]:
    """When each job started: Hydra writes its .hydra/config.yaml just before its job-start callbacks."""
    return [(d / ".hydra" / "config.yaml").stat().st_mtime for d in jobs]


@pytest.mark.slow
def test_the_next_revision_is_in_the_cache_before_its_job_starts_and_not_with_prefetch_0(hub_server, tmp_path):
    summaries, jobs, cache = sweep(hub_server, tmp_path, "ahead", "hub.prefetch=1")
    assert [s["revision"] for s in summaries] == BRANCHES
    arrived, started = blob_times(cache, summaries), job_starts(jobs)
    assert arrived[0] > started[0]  # the first job's own: fetched when it started
    assert arrived[1] < started[1] and arrived[2] < started[2], (arrived, started)  # during the job before
    assert [s["download"]["prefetched"] for s in summaries] == [False, True, True]
    assert all(s["download"]["bytes_downloaded"] > 0 for s in summaries)  # each counted as downloaded by the sweep

    summaries, jobs, cache = sweep(hub_server, tmp_path, "off", "hub.prefetch=0")
    arrived, started = blob_times(cache, summaries), job_starts(jobs)
    assert all(a > s for a, s in zip(arrived, started)), (arrived, started)  # each fetched by its own job
    assert [s["download"]["prefetched"] for s in summaries] == [False] * 3
    assert all(s["download"]["bytes_downloaded"] > 0 for s in summaries)


@pytest.mark.slow
def test_cleanup_removes_the_revisions_the_sweep_prefetched(hub_server, tmp_path):
    summaries, _, cache = sweep(hub_server, tmp_path, "cleanup", "hub.prefetch=1", "model.cleanup=true")
    assert [s["download"]["prefetched"] for s in summaries] == [False, True, True]
    assert all(s["download"]["bytes_downloaded"] > 0 for s in summaries)
    repo = cache / f"models--{OLMO2.replace('/', '--')}"
    assert not list(repo.glob("snapshots/*")) and not list(repo.glob("blobs/*"))  # all three removed


def test_a_revision_larger_than_the_free_disk_is_not_prefetched(monkeypatch, tmp_path):
    import huggingface_hub

    files = [
        SimpleNamespace(path="model.safetensors", size=10 * 2**30),
        SimpleNamespace(path="optimizer.pt", size=100 * 2**30),
    ]  # not fetched: not counted
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_tree", lambda self, *a, **k: iter(files))
    downloads = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: downloads.append(a))
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *a, **k: downloads.append(a))
    monkeypatch.setattr(prefetch.shutil, "disk_usage", lambda path: SimpleNamespace(free=9 * 2**30))
    assert not prefetch.fetch(OLMO2, BRANCHES[0], "auto") and downloads == []
    monkeypatch.setattr(prefetch.shutil, "disk_usage", lambda path: SimpleNamespace(free=11 * 2**30))
    assert prefetch.fetch(OLMO2, BRANCHES[0], "auto") and len(downloads) == 2


def test_hub_prefetch_is_validated_and_does_not_change_what_a_run_computes():
    with pytest.raises(UsageError, match=r"^hub.prefetch=-1 is invalid: must be >= 0"):
        validate(compose_config(["hub.prefetch=-1"]))
    assert config_digest(compose_config(["hub.prefetch=0"])) == config_digest(compose_config([]))


@pytest.mark.slow
def test_a_sweep_that_loads_no_weights_prefetches_none(hub_server, tmp_path):
    """With the measurements cached and ablation off (``QUICK``) a job reads no weights: none are fetched."""
    measurements = f"cache_dir={tmp_path / 'measurements'}"
    measured, _, _ = sweep(hub_server, tmp_path, "measure", "hub.prefetch=1", "reuse=true", measurements)
    summaries, _, cache = sweep(hub_server, tmp_path, "reread", "hub.prefetch=1", "reuse=true", measurements)
    assert all(s["reused_measurements"] for s in summaries)
    assert [s["download"]["prefetched"] for s in summaries] == [False] * 3
    # no weights on this machine: their fingerprint is the Hub listing's, the same as that of the files read
    assert [s["weights_sha256"] for s in summaries] == [s["weights_sha256"] for s in measured]
    assert None not in [s["weights_sha256"] for s in summaries]
    assert not list((cache / f"models--{OLMO2.replace('/', '--')}").glob("snapshots/*/*.safetensors"))
