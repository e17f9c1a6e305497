"""The real ``from_pretrained(repo, revision=...)`` path, offline, on a Hugging Face hub
cache laid out by hand (refs/<branch> -> snapshots/<commit>/) under the real repo ids."""

import hashlib
import json
import os

import pytest

from tests.helpers.cli import last_line, run_cli
from tests.helpers.tiny_models import save_tiny_model

PANEL_R3 = {
    "pythia": ("EleutherAI/pythia-1b", "gpt_neox", "step64", 64 * 2_097_152),
    "olmo": ("allenai/OLMo-1B-0724-hf", "olmo", "step11000-tokens23B", 23 * 10**9),
    "olmoe": ("allenai/OLMoE-1B-7B-0924", "olmoe", "step50000-tokens209B", 209 * 10**9),
    "amber": ("LLM360/Amber", "llama", "ckpt_008", 8 * 3_500_000_000),
    "crfm_gpt2": ("stanford-crfm/alias-gpt2-small-x21", "gpt2", "checkpoint-300", None),
}


def lay_out_cache(cache, repo: str, arch: str, branch: str, seed: int = 0, blobs: bool = False) -> None:
    """models--ORG--NAME/refs/<branch> holds a commit id; snapshots/<commit>/ the files (with
    ``blobs``, as huggingface_hub keeps them: links to blobs/<sha256 of the content>)."""
    root = cache / f"models--{repo.replace('/', '--')}"
    commit = hashlib.sha1(f"{repo}@{branch}".encode()).hexdigest()
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / branch).write_text(commit)
    snapshot = root / "snapshots" / commit
    save_tiny_model(arch, snapshot, seed=seed, vocab_size=10240)
    if blobs:
        (root / "blobs").mkdir(exist_ok=True)
        for f in snapshot.iterdir():
            blob = root / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
            f.rename(blob)
            f.symlink_to(os.path.relpath(blob, f.parent))


@pytest.mark.slow
def test_offline_panel_sweep_from_a_hub_cache(tmp_path):
    cache = tmp_path / "hub"
    for repo, arch, branch, _ in PANEL_R3.values():
        lay_out_cache(cache, repo, arch, branch)
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "WANDB_MODE": "disabled"}
    sweep = tmp_path / "sweep"
    res = run_cli(
        "-m",
        f"model={','.join(PANEL_R3)}",
        "revision=r3",
        "probe=quick",
        "probe.n_sequences=16",
        "model.dtype=float32",
        f"hydra.sweep.dir={sweep}",
        env=env,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    summaries = {json.loads(p.read_text())["model"]: json.loads(p.read_text()) for p in sweep.rglob("summary.json")}
    assert set(summaries) == set(PANEL_R3)
    for model, (repo, arch, branch, tokens) in PANEL_R3.items():
        s = summaries[model]
        assert (s["name_or_path"], s["revision"], s["tokens"], s["architecture"]) == (repo, branch, tokens, arch)


@pytest.mark.slow
def test_a_revision_missing_from_the_cache_fails_fast_with_one_line(tmp_path):
    cache = tmp_path / "hub"
    lay_out_cache(cache, "EleutherAI/pythia-1b", "gpt_neox", "step64")
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "WANDB_MODE": "disabled"}
    res = run_cli("model=pythia", "revision=r4", f"hydra.run.dir={tmp_path / 'run'}", env=env, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    last = last_line(res.stderr)
    assert "EleutherAI/pythia-1b" in last and "step256" in last and "hf download" in last


@pytest.mark.slow
def test_malformed_custom_revision_exits_with_its_name(tmp_path):
    res = run_cli(
        "model=pythia",
        "revision=custom",
        "revision.name=step999",
        "probe=quick",
        f"hydra.run.dir={tmp_path / 'run'}",
        env={"WANDB_MODE": "disabled"},
        timeout=120,
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "step999" in last_line(res.stderr) and not (tmp_path / "run").exists()


def test_download_accounting_and_cleanup_of_one_revision(tmp_path, monkeypatch):
    import huggingface_hub.constants

    from emergence.hub.checkpoints import Source, downloaded_bytes, remove_from_cache

    cache = tmp_path / "hub"
    lay_out_cache(cache, "EleutherAI/pythia-1b", "gpt_neox", "step64")
    lay_out_cache(cache, "EleutherAI/pythia-1b", "gpt_neox", "step256")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    fresh = Source("EleutherAI/pythia-1b", "step64", local_only=True, cached_before=False)
    kept = Source("EleutherAI/pythia-1b", "step256", local_only=True, cached_before=True)
    size = downloaded_bytes(fresh)
    assert size > 10_000 and downloaded_bytes(kept) == 0
    assert remove_from_cache(kept) == 0  # never touch what was there before the run
    assert remove_from_cache(fresh) == size
    snapshots = cache / "models--EleutherAI--pythia-1b" / "snapshots"
    assert len(list(snapshots.iterdir())) == 1 and downloaded_bytes(fresh) == 0


# Each new preset end to end, offline, from a cache laid out under its real repo id with a
# branch named in its pattern: the right branch, step and tokens reach summary.json.
PRESETS = [  # model, repo, architecture, revision overrides, branch, step, tokens
    ("amber", "LLM360/Amber", "llama", ["revision=r3"], "ckpt_008", 8, 8 * 3_500_000_000),
    ("crfm_gpt2", "stanford-crfm/alias-gpt2-small-x21", "gpt2", ["revision=r4"], "checkpoint-1000", 1000, None),
    (
        "smollm2",
        "HuggingFaceTB/SmolLM2-135M-intermediate-checkpoints",
        "llama",
        ["revision=custom", "revision.name=step-2000"],
        "step-2000",
        2000,
        2000 * 1_048_576,
    ),
    (
        "olmo2",
        "allenai/OLMo-2-0425-1B",
        "olmo2",
        ["revision=custom", "revision.name=stage1-step1000-tokens3B"],
        "stage1-step1000-tokens3B",
        1000,
        3 * 10**9,
    ),
    (
        "pythia",
        "EleutherAI/pythia-160m-seed3",
        "gpt_neox",
        ["model.name_or_path=EleutherAI/pythia-160m-seed3", "revision=r2"],
        "step16",
        16,
        16 * 2_097_152,
    ),
]
QUICK = [
    "probe=quick",
    "probe.n_sequences=16",
    "probe.seq_len=64",
    "model.dtype=float32",
    "wandb.mode=disabled",
    "ablate.enabled=false",
    "reuse=false",
]


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


@pytest.mark.parametrize("model,repo,arch,overrides,branch,step,tokens", PRESETS)
def test_presets_run_offline_from_a_hub_cache(model, repo, arch, overrides, branch, step, tokens, hub_cache, tmp_path):
    from emergence.core.config import compose_config
    from emergence.main import analyse

    lay_out_cache(hub_cache, repo, arch, branch)
    summary = analyse(compose_config([f"model={model}", *overrides, *QUICK]), tmp_path / "run")
    assert (summary.name_or_path, summary.revision, summary.step, summary.tokens) == (repo, branch, step, tokens)
    assert summary.architecture == arch and summary.model == model


def test_a_seed_repo_needs_a_named_revision(hub_cache, tmp_path):
    from emergence.core.config import compose_config
    from emergence.core.errors import UsageError
    from emergence.hub.checkpoints import resolve_revision

    for overrides, says in (
        (["model=local"], "main branch may hold no weights"),
        (["model=pythia", "revision=custom", "revision.name=main"], "'main' is invalid.*step0"),
    ):
        cfg = compose_config([*overrides, "model.name_or_path=EleutherAI/pythia-410m-seed7", *QUICK])
        with pytest.raises(UsageError, match=says) as err:
            resolve_revision(cfg.model, cfg.revision, cfg.cache_dir)
        assert "\n" not in str(err.value)
    # the same names on a repo that is not a seed repo are fine
    cfg = compose_config(["model=local", "model.name_or_path=EleutherAI/pythia-410m"])
    assert resolve_revision(cfg.model, cfg.revision, cfg.cache_dir).name is None


def test_weights_fingerprint_is_read_from_the_blob_names(hub_cache):
    from emergence.hub.checkpoints import Source, weights_sha256

    repo = "EleutherAI/pythia-2.8b"
    for branch, seed in (("step1000", 1), ("step2000", 2), ("step3000", 1)):  # step3000 serves step1000's weights
        lay_out_cache(hub_cache, repo, "gpt_neox", branch, seed=seed, blobs=True)
    digest = {b: weights_sha256(Source(repo, b, True, True)) for b in ("step1000", "step2000", "step3000")}
    blob = (hub_cache / "models--EleutherAI--pythia-2.8b" / "snapshots").glob("*/model.safetensors")
    assert digest["step1000"] == digest["step3000"] != digest["step2000"]
    assert digest["step1000"] in {hashlib.sha256(p.read_bytes()).hexdigest() for p in blob}
    # the digest is the link's target name: no weights are read (a renamed blob gives the new name)
    link = next(
        p
        for p in (hub_cache / "models--EleutherAI--pythia-2.8b" / "snapshots").glob("*/model.safetensors")
        if p.resolve().name == digest["step2000"]
    )
    fake = link.resolve().with_name("f" * 64)
    link.resolve().rename(fake)
    link.unlink()
    link.symlink_to(fake)
    assert weights_sha256(Source(repo, "step2000", True, True)) == "f" * 64


def test_weights_fingerprint_of_local_shards(tmp_path):
    from emergence.hub.checkpoints import Source, weights_sha256

    one = tmp_path / "one"
    one.mkdir()
    (one / "model.safetensors").write_bytes(b"weights")
    assert weights_sha256(Source(str(one), None, True, True)) == hashlib.sha256(b"weights").hexdigest()
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    for name, content in (("model-00002-of-00002.safetensors", b"b"), ("model-00001-of-00002.safetensors", b"a")):
        (sharded / name).write_bytes(content)
    lines = "".join(
        f"model-0000{i}-of-00002.safetensors {hashlib.sha256(c).hexdigest()}\n" for i, c in ((1, b"a"), (2, b"b"))
    )
    assert weights_sha256(Source(str(sharded), None, True, True)) == hashlib.sha256(lines.encode()).hexdigest()
    assert weights_sha256(Source(str(tmp_path / "sharded"), "step1", True, True)) is not None
    assert weights_sha256(Source("org/not-cached", "main", False, False)) is None
