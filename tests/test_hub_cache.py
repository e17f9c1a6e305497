"""The real ``from_pretrained(repo, revision=...)`` path, offline, on a Hugging Face hub
cache laid out by hand (refs/<branch> -> snapshots/<commit>/) under the real repo ids."""

import hashlib
import json

import pytest
from cli import last_line, run_cli
from tiny_models import save_tiny_model

PANEL_R3 = {"pythia": ("EleutherAI/pythia-1b", "gpt_neox", "step64", 64 * 2_097_152),
            "olmo": ("allenai/OLMo-1B-0724-hf", "olmo", "step11000-tokens23B", 23 * 10**9),
            "olmoe": ("allenai/OLMoE-1B-7B-0924", "olmoe", "step50000-tokens209B", 209 * 10**9)}


def lay_out_cache(cache, repo: str, arch: str, branch: str) -> None:
    """models--ORG--NAME/refs/<branch> holds a commit id; snapshots/<commit>/ the files."""
    root = cache / f"models--{repo.replace('/', '--')}"
    commit = hashlib.sha1(f"{repo}@{branch}".encode()).hexdigest()
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / branch).write_text(commit)
    save_tiny_model(arch, root / "snapshots" / commit, vocab_size=10240)


@pytest.mark.slow
def test_offline_panel_sweep_from_a_hub_cache(tmp_path):
    cache = tmp_path / "hub"
    for repo, arch, branch, _ in PANEL_R3.values():
        lay_out_cache(cache, repo, arch, branch)
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "WANDB_MODE": "disabled"}
    sweep = tmp_path / "sweep"
    res = run_cli("-m", "model=pythia,olmo,olmoe", "revision=r3", "probe=quick", "probe.n_sequences=16",
                  "model.dtype=float32", f"hydra.sweep.dir={sweep}", env=env)
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
    assert "EleutherAI/pythia-1b" in last and "step256" in last and "huggingface-cli download" in last


@pytest.mark.slow
def test_malformed_custom_revision_exits_with_its_name(tmp_path):
    res = run_cli("model=pythia", "revision=custom", "revision.name=step999", "probe=quick",
                  f"hydra.run.dir={tmp_path / 'run'}", env={"WANDB_MODE": "disabled"}, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "step999" in last_line(res.stderr) and not (tmp_path / "run").exists()


def test_download_accounting_and_cleanup_of_one_revision(tmp_path, monkeypatch):
    import huggingface_hub.constants

    from emergence.checkpoints import Source, downloaded_bytes, remove_from_cache

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
