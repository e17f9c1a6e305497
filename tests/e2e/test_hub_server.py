"""The online path against a real Hub server (olah, ``tests/helpers/hub_server.py``): branch listing,
``python -m emergence.revisions``, and a run that downloads, fingerprints and then reuses a
checkpoint, under the OLMo-2 preset's real repo id and branch naming; an unknown branch."""

import hashlib
import json
import os
import re
import subprocess
import sys

import pytest

from tests.helpers.cli import last_line, run_cli
from tests.helpers.hub_server import publish
from tests.helpers.tiny_models import save_tiny_model

OLMO2 = "allenai/OLMo-2-0425-1B"  # conf/model/olmo2.yaml: branches stage1-step{N}-tokens{M}B
QUICK = [
    "probe=quick",
    "probe.n_sequences=16",
    "probe.seq_len=64",
    "model.dtype=float32",
    "ablate.enabled=false",
    "reuse=false",
]  # reuse=false: a second run loads the weights again instead of cached measurements


@pytest.fixture
def placeholder(tmp_path):
    """A checkpoint directory that only has to exist on the server, not load."""
    path = tmp_path / "placeholder"
    path.mkdir()
    (path / "config.json").write_text('{"model_type": "olmo2"}')
    (path / "model.safetensors").write_bytes(b"not weights")
    return path


def list_refs(env: dict, repo: str) -> subprocess.CompletedProcess:
    """``huggingface_hub.list_repo_refs`` in a fresh process, which reads HF_ENDPOINT at import."""
    code = (
        "import sys, huggingface_hub; "
        "print(*sorted(b.name for b in huggingface_hub.list_repo_refs(sys.argv[1]).branches))"
    )
    return subprocess.run(
        [sys.executable, "-c", code, repo], capture_output=True, text=True, timeout=120, env={**os.environ, **env}
    )


def test_publish_lays_out_lfs_objects_and_deterministic_commits(tmp_path, placeholder):
    oids = [publish(tmp_path / m, "EleutherAI/pythia-14m", {"step1000": placeholder}) for m in ("one", "two")]
    oid = hashlib.sha256(b"not weights").hexdigest()
    assert oids == [{"step1000": oid}] * 2
    repos = [tmp_path / m / "models" / "EleutherAI" / "pythia-14m" for m in ("one", "two")]
    commits = {
        subprocess.run(["git", "rev-parse", "step1000"], cwd=r, capture_output=True, text=True, check=True).stdout
        for r in repos
    }
    assert len(commits) == 1  # fixed author and dates: the same files give the same commit
    pointer = subprocess.run(
        ["git", "show", "step1000:model.safetensors"], cwd=repos[0], capture_output=True, text=True, check=True
    ).stdout
    assert pointer == f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize 11\n"
    assert (repos[0] / ".git" / "lfs" / "objects" / oid[:2] / oid[2:4] / oid).read_bytes() == b"not weights"


def test_publish_nests_folders_and_keeps_bin_and_pt_files_in_lfs(tmp_path):
    """A DeepSpeed checkpoint as stanford-crfm's branches hold it: pickles at the top and in a folder."""
    ckpt = tmp_path / "checkpoint-10"
    (ckpt / "global_step10").mkdir(parents=True)
    files = {
        "pytorch_model.bin": b"pickled weights",
        "training_args.bin": b"pickled args",
        "latest": b"global_step10",
        "trainer_state.json": b"{}",
        "global_step10/mp_rank_00_model_states.pt": b"module states",
    }
    for path, content in files.items():
        (ckpt / path).write_bytes(content)
    repo = tmp_path / "mirrors" / "models" / "stanford-crfm" / "alias-gpt2-small-x21"
    assert publish(tmp_path / "mirrors", "stanford-crfm/alias-gpt2-small-x21", {"checkpoint-10": ckpt}) == {}
    listing = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", "checkpoint-10"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.split()
    assert listing == sorted(files)
    for path, content in files.items():
        stored = subprocess.run(
            ["git", "show", f"checkpoint-10:{path}"], cwd=repo, capture_output=True, check=True
        ).stdout
        if path.endswith((".bin", ".pt")):
            oid = hashlib.sha256(content).hexdigest()
            pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {len(content)}\n"
            assert stored == pointer.encode()
            assert (repo / ".git" / "lfs" / "objects" / oid[:2] / oid[2:4] / oid).read_bytes() == content
        else:
            assert stored == content, path


def test_list_repo_refs_sees_exactly_the_published_branches(hub_server, placeholder):
    publish(hub_server.mirrors, "EleutherAI/pythia-14m", {"main": placeholder, "step1000": placeholder})
    res = list_refs(hub_server.env(), "EleutherAI/pythia-14m")
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["main", "step1000"]
    # a repo and a branch published after the server started are served too
    publish(hub_server.mirrors, "EleutherAI/pythia-14m", {"step2000": placeholder})
    publish(hub_server.mirrors, "EleutherAI/pythia-70m", {"step1": placeholder})
    assert list_refs(hub_server.env(), "EleutherAI/pythia-14m").stdout.split() == ["main", "step1000", "step2000"]
    assert list_refs(hub_server.env(), "EleutherAI/pythia-70m").stdout.split() == ["step1"]


@pytest.mark.slow
def test_revisions_lists_the_branches_with_step_and_tokens_and_those_between(hub_server, placeholder):
    publish(
        hub_server.mirrors,
        OLMO2,
        {
            b: placeholder
            for b in ("main", "stage1-step1000-tokens3B", "stage1-step20000-tokens42B", "stage1-step300-tokens1B")
        },
    )
    res = run_cli("olmo2", module="emergence.revisions", env=hub_server.env(), timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.splitlines() == [  # ordered by step; main does not match the pattern
        f"# 3 checkpoint branches of {OLMO2}",
        "  - {revision: stage1-step300-tokens1B, step: 300, tokens: 1000000000}",
        "  - {revision: stage1-step1000-tokens3B, step: 1000, tokens: 3000000000}",
        "  - {revision: stage1-step20000-tokens42B, step: 20000, tokens: 42000000000}",
    ]
    res = run_cli(
        "olmo2",
        "--between",
        "stage1-step20000-tokens42B",
        "stage1-step300-tokens1B",
        module="emergence.revisions",
        env=hub_server.env(),
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.splitlines()[-1] == (
        "python -m emergence -m model=olmo2 revision=custom revision.name=stage1-step1000-tokens3B"
    )


@pytest.mark.slow
def test_a_run_downloads_fingerprints_and_then_reuses_a_hub_checkpoint(hub_server, tmp_path):
    branch = "stage1-step1000-tokens3B"
    save_tiny_model("olmo2", tmp_path / "ckpt", seed=3, vocab_size=10240)
    oid = publish(hub_server.mirrors, OLMO2, {"main": tmp_path / "ckpt", branch: tmp_path / "ckpt"})[branch]
    env = {**hub_server.env(tmp_path / "hub"), "WANDB_MODE": "disabled"}
    args = ["model=olmo2", "revision=custom", f"revision.name={branch}", *QUICK]

    def weight_requests() -> int:  # the server's access log: GETs of this branch's weights
        log = (hub_server.root / "olah.out").read_text()
        return len(re.findall(rf'"GET /{OLMO2}/resolve/[0-9a-f]+/model\.safetensors HTTP', log))

    first = run_cli(*args, f"hydra.run.dir={tmp_path / 'first'}", env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    summary = json.loads((tmp_path / "first" / "summary.json").read_text())
    assert (summary["name_or_path"], summary["revision"], summary["step"], summary["tokens"]) == (
        OLMO2,
        branch,
        1000,
        3 * 10**9,
    )
    assert summary["weights_sha256"] == oid  # the LFS object id, as the Hub names the blob
    size = (tmp_path / "ckpt" / "model.safetensors").stat().st_size
    assert summary["download"]["bytes_downloaded"] > size
    assert weight_requests() == 1

    again = run_cli(*args, f"hydra.run.dir={tmp_path / 'again'}", env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    summary = json.loads((tmp_path / "again" / "summary.json").read_text())
    assert summary["download"]["bytes_downloaded"] == 0 and summary["weights_sha256"] == oid
    assert weight_requests() == 1  # read from the cache, not fetched again


@pytest.mark.slow
def test_an_unknown_branch_ends_in_one_line(hub_server, placeholder, tmp_path):
    publish(hub_server.mirrors, OLMO2, {"stage1-step1000-tokens3B": placeholder})
    missing = "stage1-step2000-tokens5B"
    res = run_cli(
        "model=olmo2",
        "revision=custom",
        f"revision.name={missing}",
        *QUICK,
        f"hydra.run.dir={tmp_path / 'run'}",
        env={**hub_server.env(), "WANDB_MODE": "disabled"},
        timeout=120,
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
    # olah answers an unknown revision with 401 where the Hub answers 404 RevisionNotFound, so
    # transformers words it as an unknown repo; the line still names the repo and the branch
    last = last_line(res.stderr)
    assert OLMO2 in last and missing in last, last
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "endpoint,address",
    [
        ("http://mirror.invalid", ("mirror.invalid", 80)),
        ("https://mirror.invalid", ("mirror.invalid", 443)),
        ("http://127.0.0.1:8090", ("127.0.0.1", 8090)),
    ],
)
def test_hub_reachable_connects_to_the_endpoints_own_port(endpoint, address, monkeypatch):
    import huggingface_hub.constants

    from emergence.hub import endpoint as hub

    tried = []

    def refuse(addr, timeout):
        tried.append(addr)
        raise ConnectionRefusedError(addr)

    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(hub.socket, "create_connection", refuse)
    assert not hub.hub_reachable()
    assert tried == [address]
