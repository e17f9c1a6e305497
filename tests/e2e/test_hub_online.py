"""The online path end to end against a real Hub server (olah, ``tests/helpers/hub_server.py``) under
the OLMo-2 preset's repo id: the proposed and kept panel, ``model.cleanup``, the report's
duplicate-weights flag, unknown repos and revisions; and the faults: the server stopped in
the middle of a sweep (and the sweep relaunched), truncated weights, a download cut short."""

import hashlib
import json
import subprocess
import sys
import time
import uuid

import pytest

from tests.helpers.cli import last_line, run_cli, start_cli
from tests.helpers.hub_server import publish
from tests.helpers.tiny_models import save_tiny_model

OLMO2 = "allenai/OLMo-2-0425-1B"  # conf/model/olmo2.yaml: branches stage1-step{N}-tokens{M}B, no panel
QUICK = ["probe=quick", "probe.n_sequences=16", "probe.seq_len=64", "model.dtype=float32", "ablate.enabled=false"]
STEPS = (100, 300, 1000, 2000, 5000, 10000, 20000, 50000, 100000, 200000, 300000, 400000)
BRANCHES = [f"stage1-step{s}-tokens{max(1, 4 * s // 1000)}B" for s in STEPS]  # 12 branches, 4M tokens a step


def cache_dir(hub_cache, repo=OLMO2):
    return hub_cache / f"models--{repo.replace('/', '--')}"


def snapshot(hub_cache, branch, repo=OLMO2):
    """The cache's snapshot directory of ``repo@branch`` (None if the branch's ref is not there)."""
    ref = cache_dir(hub_cache, repo) / "refs" / branch
    return cache_dir(hub_cache, repo) / "snapshots" / ref.read_text() if ref.exists() else None


def download(env, branch, *files):
    """``hf_hub_download`` of some files of one branch, in a process that reads HF_ENDPOINT at import."""
    code = (
        "import sys, huggingface_hub\nfor f in sys.argv[3:]: huggingface_hub.hf_hub_download(sys.argv[1], f, "
        "revision=sys.argv[2])"
    )
    subprocess.run([sys.executable, "-c", code, OLMO2, branch, *files], env=env, check=True, timeout=120)


@pytest.fixture
def ckpt(tmp_path):
    save_tiny_model("olmo2", tmp_path / "ckpt", seed=3, vocab_size=10240)
    return tmp_path / "ckpt"


@pytest.fixture
def online(hub_server, tmp_path):
    """The environment of runs against the server, sharing one Hugging Face cache and a fresh
    EMERGENCE_CACHE (where a proposed panel is kept)."""
    return {
        **hub_server.env(tmp_path / "hub"),
        "EMERGENCE_CACHE": str(tmp_path / "emergence"),
        "WANDB_MODE": "disabled",
    }


@pytest.mark.slow
def test_olmo2_proposes_a_panel_from_its_branches_keeps_it_and_uses_it_with_the_server_gone(
    hub_server, online, ckpt, tmp_path
):
    publish(hub_server.mirrors, OLMO2, {"main": ckpt, **{b: ckpt for b in BRANCHES}})
    res = run_cli("olmo2", "--propose", "3", module="emergence.revisions", env=online, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.splitlines() == [  # log-spaced over 1B .. 1600B tokens
        "panel:",
        "  - {revision: stage1-step100-tokens1B, step: 100, tokens: 1000000000}",
        "  - {revision: stage1-step10000-tokens40B, step: 10000, tokens: 40000000000}",
        "  - {revision: stage1-step400000-tokens1600B, step: 400000, tokens: 1600000000000}",
    ]

    first = run_cli("model=olmo2", "revision=r0", *QUICK, f"hydra.run.dir={tmp_path / 'first'}", env=online)
    assert first.returncode == 0, first.stderr[-3000:]
    assert f"proposed panel of {OLMO2} (13 branches" in first.stdout
    kept = json.loads((tmp_path / "emergence" / "panels" / f"{OLMO2.replace('/', '--')}.json").read_text())
    # up to 10: among 12 branches, two log-spaced targets can have the same nearest branch
    assert len(kept) == 9 and kept[0] == {"revision": BRANCHES[0], "step": 100, "tokens": 10**9}
    assert kept[-1]["revision"] == BRANCHES[-1] and {e["revision"] for e in kept} <= set(BRANCHES)
    summary = json.loads((tmp_path / "first" / "summary.json").read_text())
    assert (summary["revision"], summary["step"], summary["tokens"]) == (BRANCHES[0], 100, 10**9)

    hub_server.stop()  # r0 is cached, and so is the panel: nothing needs the server
    again = run_cli(
        "model=olmo2", "revision=r0", *QUICK, "reuse=false", f"hydra.run.dir={tmp_path / 'again'}", env=online
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "proposed panel" not in again.stdout
    summary = json.loads((tmp_path / "again" / "summary.json").read_text())
    assert (summary["revision"], summary["download"]["bytes_downloaded"]) == (BRANCHES[0], 0)
    # a revision of the kept panel that is not cached says so, naming the endpoint
    missing = run_cli(
        "model=olmo2", "revision=r8", *QUICK, f"hydra.run.dir={tmp_path / 'missing'}", env=online, timeout=120
    )
    assert missing.returncode == 2 and "Traceback" not in missing.stderr, missing.stderr[-3000:]
    assert f"{OLMO2}@{kept[8]['revision']}" in last_line(missing.stderr)
    assert f"the Hub endpoint {hub_server.endpoint} is not reachable" in last_line(missing.stderr)


@pytest.mark.slow
def test_cleanup_removes_what_the_sweep_downloaded_and_the_report_lists_a_duplicate_branch(
    hub_server, online, ckpt, tmp_path
):
    save_tiny_model("olmo2", tmp_path / "other", seed=4, vocab_size=10240)
    cached, same, other = BRANCHES[2], BRANCHES[5], BRANCHES[8]  # `cached` serves the file `same` serves
    oids = publish(hub_server.mirrors, OLMO2, {cached: ckpt, same: ckpt, other: tmp_path / "other"})
    download(online, cached, "config.json", "model.safetensors")  # in the cache before the sweep
    kept_files = sorted(p.name for p in snapshot(tmp_path / "hub", cached).iterdir())
    sweep = tmp_path / "sweep"
    res = run_cli(
        "-m",
        "model=olmo2",
        "revision=custom",
        f"revision.name={cached},{same},{other}",
        "model.cleanup=true",
        *QUICK,
        f"hydra.sweep.dir={sweep}",
        env=online,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    summaries = {s["revision"]: s for s in (json.loads(p.read_text()) for p in sweep.rglob("summary.json"))}
    assert {b: s["weights_sha256"] for b, s in summaries.items()} == oids
    # identical weights are analysed once, at the later branch; the earlier one's job names it
    assert summaries[cached]["duplicate_of"] == same and "download" not in summaries[cached]
    assert summaries[other]["download"]["bytes_downloaded"] > 0
    blobs = {p.name for p in (cache_dir(tmp_path / "hub") / "blobs").iterdir()}
    assert sorted(p.name for p in snapshot(tmp_path / "hub", cached).iterdir()) == kept_files  # cached before: kept
    assert oids[cached] in blobs and oids[other] not in blobs  # `same`'s blob is `cached`'s: it stays
    assert not (cache_dir(tmp_path / "hub") / "refs" / same).exists()
    assert not (cache_dir(tmp_path / "hub") / "refs" / other).exists()

    res = run_cli(
        sweep,
        "--out",
        tmp_path / "report",
        "--wandb-mode",
        "disabled",
        module="emergence.report",
        env=online,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    findings = json.loads((tmp_path / "report" / "findings.json").read_text())
    assert findings["defective_checkpoints"] == {OLMO2: {cached: f"duplicate of {same}"}}
    assert [r["revision"] for r in findings["models"]["olmo2"]["revisions"]] == [same, other]
    assert f"- {OLMO2}@{cached}: duplicate of {same}" in (tmp_path / "report" / "report.md").read_text()


@pytest.mark.slow
def test_a_repo_or_a_revision_the_server_lacks_ends_in_one_line_naming_it(hub_server, online, ckpt, tmp_path):
    publish(hub_server.mirrors, OLMO2, {BRANCHES[0]: ckpt})
    cases = {  # args -> what the one line names
        (
            "model.name_or_path=allenai/nope",
            "revision=custom",
            f"revision.name={BRANCHES[0]}",
        ): f"repo allenai/nope does not exist on {hub_server.endpoint}",
        (
            "model.name_or_path=allenai/nope",
            "revision=r0",
        ): f"repo allenai/nope does not exist on {hub_server.endpoint}",
        ("revision=custom", f"revision.name={BRANCHES[1]}"): f"{OLMO2} on {hub_server.endpoint} has no revision "
        f"'{BRANCHES[1]}' (1 branches)",
    }
    for args, named in cases.items():
        run = tmp_path / "run"
        res = run_cli("model=olmo2", *args, *QUICK, f"hydra.run.dir={run}", env=online, timeout=120)
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
        assert named in last_line(res.stderr), last_line(res.stderr)
        assert not run.exists()
    res = run_cli("olmo2", "--repo", "allenai/nope", module="emergence.revisions", env=online, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert res.stderr.strip() == (
        "error: the revisions of allenai/nope cannot be listed: repo allenai/nope does not "
        f"exist on {hub_server.endpoint} (or is private); check the repo id "
        "(model.name_or_path)"
    )


def wait_for(path, proc, timeout=300):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"the sweep ended before {path} appeared: {proc.stderr.read()[-3000:]}"
        assert time.monotonic() < deadline, f"no {path} within {timeout} s"
        time.sleep(0.05)


@pytest.mark.slow
def test_a_sweep_survives_the_server_stopping_and_a_relaunch_completes_only_the_missing_jobs(
    hub_server, online, ckpt, tmp_path
):
    branches = BRANCHES[:3]
    for seed in (4, 5):  # three distinct checkpoints: identical ones would be analysed once (integrity)
        save_tiny_model("olmo2", tmp_path / f"ckpt{seed}", seed=seed, vocab_size=10240)
    publish(hub_server.mirrors, OLMO2, dict(zip(branches, [ckpt, tmp_path / "ckpt4", tmp_path / "ckpt5"])))
    sweep = tmp_path / "sweep"
    args = [
        "-m",
        "model=olmo2",
        "revision=custom",
        f"revision.name={','.join(branches)}",
        *QUICK,
        f"hydra.sweep.dir={sweep}",
    ]
    jobs = [sweep / "olmo2" / f"custom_{i}" for i in range(3)]
    proc = start_cli(*args, env=online)
    wait_for(jobs[0] / "summary.json", proc)
    hub_server.stop(kill=True)  # gone at once, as a mirror that crashes
    stopped = time.monotonic()
    _, stderr = proc.communicate(timeout=300)
    assert time.monotonic() - stopped < 30  # the rest fails at once: no minutes of retries
    assert proc.returncode == 1, stderr[-3000:]
    assert "Traceback" not in stderr
    finished = (jobs[0] / "summary.json").read_bytes()
    # job 1 may have fetched its revision before the server went; job 2 started after it
    failed = [j for j in jobs if (j / "FAILED").exists()]
    assert jobs[2] in failed and all(not (j / "summary.json").exists() for j in failed)
    assert all(not (j / "heads.csv").exists() for j in failed)  # no partial results
    for job in failed:
        line = (job / "FAILED").read_text()
        assert hub_server.endpoint in line and "\n" not in line.strip(), line
    assert f"{len(failed)} job(s) of the sweep failed:" in stderr
    assert all(str(j) in stderr for j in failed)

    hub_server.start()  # the same port and mirrors
    res = run_cli(*args, env=online)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (jobs[0] / "summary.json").read_bytes() == finished  # kept, not run again
    assert f"already done (resume=true): {jobs[0]}" in res.stderr
    assert all((j / "summary.json").exists() and not (j / "FAILED").exists() for j in jobs)
    assert [json.loads((j / "summary.json").read_text())["revision"] for j in jobs] == branches


@pytest.mark.slow
def test_a_branch_with_truncated_safetensors_ends_in_one_line(hub_server, online, ckpt, tmp_path):
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    publish(hub_server.mirrors, OLMO2, {BRANCHES[0]: ckpt})
    res = run_cli(
        "model=olmo2",
        "revision=custom",
        f"revision.name={BRANCHES[0]}",
        *QUICK,
        f"hydra.run.dir={tmp_path / 'run'}",
        env=online,
        timeout=120,
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
    last = last_line(res.stderr)
    assert f"{OLMO2}@{BRANCHES[0]}" in last and "safetensors weights are truncated or corrupt" in last, last
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_download_cut_short_is_fetched_again_not_analysed(hub_server, online, ckpt, tmp_path):
    branch = BRANCHES[0]
    oid = publish(hub_server.mirrors, OLMO2, {branch: ckpt})[branch]
    # What a run killed while fetching the weights leaves: config.json in the snapshot (fetched
    # first), and the weights' first half in huggingface_hub's per-process temporary file.
    download(online, branch, "config.json")
    half = (ckpt / "model.safetensors").read_bytes()[: (ckpt / "model.safetensors").stat().st_size // 2]
    (cache_dir(tmp_path / "hub") / "blobs" / f"{oid}.{uuid.uuid4().hex[:8]}.incomplete").write_bytes(half)
    args = ["model=olmo2", "revision=custom", f"revision.name={branch}", *QUICK]

    hub_server.stop()  # not mistaken for a cached checkpoint: it needs the server, and says so
    res = run_cli(*args, f"hydra.run.dir={tmp_path / 'offline'}", env=online, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert (
        f"{OLMO2}@{branch}' cannot be loaded: it is not in the local Hugging Face cache and the Hub endpoint "
        f"{hub_server.endpoint} is not reachable"
    ) in last_line(res.stderr)

    hub_server.start()
    res = run_cli(*args, f"hydra.run.dir={tmp_path / 'run'}", env=online)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["weights_sha256"] == oid and summary["download"]["bytes_downloaded"] > len(half)
    analysed = snapshot(tmp_path / "hub", branch) / "model.safetensors"
    assert hashlib.sha256(analysed.read_bytes()).hexdigest() == oid  # the whole file, fetched again
