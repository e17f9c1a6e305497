"""A Hugging Face Hub server on localhost for the online tests: olah (a self-hosted Hub
mirror) serving git repositories the tests lay out under real repo ids.

    def test_something(hub_server, tmp_path):
        save_tiny_model("olmo2", tmp_path / "ckpt")
        oids = publish(hub_server.mirrors, "allenai/OLMo-2-0425-1B", {"stage1-step1000-tokens3B": tmp_path / "ckpt"})
        run_cli(..., env=hub_server.env())

The client must read ``HF_ENDPOINT`` before ``huggingface_hub`` is imported (its constants
are read at import), so the checks run in subprocesses started with ``hub_server.env()``.
olah opens the local repositories on every request: a repo published after the server
started is served at once. This module imports nothing from the Hugging Face stack.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import pytest

# Fixed identity and dates: publishing the same files gives the same commit ids on every run.
GIT_ENV = {
    "GIT_AUTHOR_NAME": "emergence tests",
    "GIT_AUTHOR_EMAIL": "tests@emergence.invalid",
    "GIT_AUTHOR_DATE": "2025-01-01T00:00:00Z",
    "GIT_COMMITTER_NAME": "emergence tests",
    "GIT_COMMITTER_EMAIL": "tests@emergence.invalid",
    "GIT_COMMITTER_DATE": "2025-01-01T00:00:00Z",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}  # no user config (hooks, signing)


def _git(repo: Path, *args: str, input: bytes | None = None) -> str:
    done = subprocess.run(
        ["git", *args], cwd=repo, input=input, capture_output=True, check=True, env={**os.environ, **GIT_ENV}
    )
    return done.stdout.decode().strip()


def _lfs_pointer(oid: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {size}\n".encode()


# The patterns of the Hub's default .gitattributes that our fixtures' files match: the Hub stores
# these in LFS (as does every repo created on it), whatever their size.
LFS_SUFFIXES = (".safetensors", ".bin", ".pt")


def publish(mirrors: Path, repo_id: str, branches: dict[str, Path]) -> dict[str, str]:
    """Lay out ``repo_id`` as olah serves it: a git repository at ``<mirrors>/models/<org>/<name>``
    with one commit per branch holding the files of ``branches[branch]`` (a checkpoint
    directory; its subfolders become nested git trees, as ``global_step*/`` in a DeepSpeed
    checkpoint). Files with an ``LFS_SUFFIXES`` suffix are committed as git-LFS pointers,
    their content under ``.git/lfs/objects/``, as the Hub keeps them: the client's cache then
    names each blob by the content's sha256, which is what ``weights_sha256`` reports.
    Publishing to an existing repo adds (or moves) branches. Returns {branch: sha256 of its
    model.safetensors} for the branches that have one.

    Written with git plumbing (hash-object, mktree, commit-tree, update-ref): no checkout,
    no working-tree state between branches, and no git-lfs binary."""
    repo = mirrors / "models" / repo_id
    if not (repo / ".git").exists():
        repo.mkdir(parents=True)
        _git(repo, "init", "--quiet", "--initial-branch=main")
    oids = {}
    for branch, checkpoint in branches.items():
        lfs: dict[str, str] = {}
        tree = _write_tree(repo, checkpoint, lfs)
        commit = _git(repo, "commit-tree", tree, "-m", f"checkpoint {branch}")
        _git(repo, "update-ref", f"refs/heads/{branch}", commit)
        if "model.safetensors" in lfs:
            oids[branch] = lfs["model.safetensors"]
    return oids


def _write_tree(repo: Path, directory: Path, lfs: dict[str, str]) -> str:
    """Write the files under ``directory`` into ``repo``'s object store and return the id of its
    git tree; ``lfs`` gets {path relative to ``directory``: LFS oid} of the files stored in LFS.
    All blobs of a directory are hashed by one ``git hash-object`` (a process per file made the
    Hub twin's ~600 files slow to publish); an LFS file's blob is its pointer, written beside."""
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    with tempfile.TemporaryDirectory() as pointers:
        sources = []  # what each file's blob holds: the file itself, or its LFS pointer
        for f in files:
            if f.suffix in LFS_SUFFIXES:
                oid = hashlib.sha256(f.read_bytes()).hexdigest()
                stored = repo / ".git" / "lfs" / "objects" / oid[:2] / oid[2:4] / oid
                stored.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f, stored)
                lfs[f.relative_to(directory).as_posix()] = oid
                pointer = Path(pointers) / f"{len(sources)}"
                pointer.write_bytes(_lfs_pointer(oid, f.stat().st_size))
                sources.append(pointer)
            else:
                sources.append(f)
        paths = "".join(f"{s}\n" for s in sources).encode()
        blobs = dict(zip(files, _git(repo, "hash-object", "-w", "--no-filters", "--stdin-paths", input=paths).split()))

    def tree(folder: Path) -> str:
        entries = [
            f"040000 tree {tree(p)}\t{p.name}\n" if p.is_dir() else f"100644 blob {blobs[p]}\t{p.name}\n"
            for p in sorted(folder.iterdir())
        ]
        return _git(repo, "mktree", input="".join(entries).encode())

    return tree(directory)


def free_port() -> int:
    """A port of 127.0.0.1 nobody listens on now (the OS picks it for a bound socket)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class HubServer:
    endpoint: str  # http://127.0.0.1:PORT
    mirrors: Path  # where tests ``publish`` their repos
    root: Path  # the server's temporary directory (config, logs, olah's own cache)
    proc: subprocess.Popen | None = None  # the running olah, None while stopped

    def env(self, cache: Path | None = None) -> dict[str, str]:
        """Environment for a subprocess that talks to this server. Downloads go to ``cache``
        (default: a fresh directory each call; pass the same one to reuse what a run fetched).
        HF_HUB_OFFLINE=0 overrides the HF_HUB_OFFLINE=1 that .ci/run sets for the suite; no
        telemetry requests in the server's log, which tests read to count downloads."""
        cache = cache or Path(tempfile.mkdtemp(prefix="hub-cache-", dir=self.root))
        return {
            "HF_ENDPOINT": self.endpoint,
            "HF_HUB_OFFLINE": "0",
            "HF_HUB_CACHE": str(cache),
            "HF_HUB_DISABLE_TELEMETRY": "1",
        }

    def log_tail(self, lines: int = 30) -> str:
        logs = [self.root / "olah.out", self.root / "logs" / "olah.log"]
        return "\n".join(
            f"--- {p}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-lines:]) for p in logs if p.exists()
        )

    def start(self) -> None:
        """Start olah on the endpoint's port (again, after ``stop``: the same port and mirrors,
        as a mirror that comes back after an outage) and wait until it accepts connections."""
        with open(self.root / "olah.out", "ab") as out:  # appended: a restart keeps the earlier access log
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "olah.server",
                    "-c",
                    str(self.root / "olah.toml"),
                    "--log-path",
                    str(self.root / "logs"),
                ],
                cwd=self.root,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        _wait_until_listening(self, timeout=60)

    def stop(self, kill: bool = False) -> None:
        """Stop olah by its pid: terminated (``kill``: SIGKILL, a server that vanishes mid-answer)."""
        if self.proc is None:
            return
        if kill:
            self.proc.kill()
        else:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


CONFIG = """\
[basic]
host = "127.0.0.1"
port = {port}
repos-path = "{root}/olah-cache"
mirrors-path = ["{root}/mirrors"]
mirror-url = "http://127.0.0.1:{port}"
mirror-lfs-url = "http://127.0.0.1:{port}"

[accessibility]
offline = true
"""


def _wait_until_listening(server: HubServer, timeout: float) -> None:
    port = urlparse(server.endpoint).port
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            pytest.fail(
                f"olah exited with code {server.proc.returncode} before serving {server.endpoint}:\n{server.log_tail()}"
            )
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    pytest.fail(f"olah did not accept connections on {server.endpoint} within {timeout:.0f} s:\n{server.log_tail()}")


@contextmanager
def serving(root: Path) -> Iterator[HubServer]:
    """An olah server on a free port of 127.0.0.1, its config, logs, cache and (empty) mirrors
    under ``root``; stopped on leaving the context. For the ``hub_server`` fixture and the
    session's Hub twin (``hub_twin.py``)."""
    if shutil.which("git") is None:
        pytest.fail("the Hub server tests need git on PATH")
    (root / "mirrors").mkdir()
    port = free_port()
    (root / "olah.toml").write_text(CONFIG.format(port=port, root=root.as_posix()))
    server = HubServer(f"http://127.0.0.1:{port}", root / "mirrors", root)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def hub_server(tmp_path_factory):
    """An olah server on a free port of 127.0.0.1 with empty mirrors, for one test: each test
    sees only the repos it publishes (under the real repo ids, which tests share). A test may
    ``stop()`` and ``start()`` it again on the same port."""
    with serving(tmp_path_factory.mktemp("hub-server")) as server:
        yield server


# The toy's checkpoints as branches step-{N} of a Hub repo, read by the smollm2 preset (branches
# step-{N}, no panel of its own: revision=r0..r9 proposes one from the branches) with the toy's probe
# and thresholds.
HUB_REPO = "HuggingFaceTB/SmolLM2-135M-intermediate-checkpoints"
HUB_MODEL = [
    "model=smollm2",
    "model.architecture=gpt_neox",
    "model.tokens_per_step=4096",
    "threshold=toy",
    "model.probe_fit.seq_len=128",
    "model.probe_fit.vocab_low=0",
    "model.probe_fit.vocab_high=256",
    "model.probe_fit.n_sequences=500",
    "ablate.enabled=false",
]
