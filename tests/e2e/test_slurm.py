"""Sweeps through a real SLURM cluster (``.ci/slurm.sh start``: one CPU-only node, partition
``debug``), with the repository's ``slurm`` preset: the toy panel's jobs run as array tasks and
equal the local sweep's runs; a job ``scancel`` ends is listed with the scheduler's state and a
relaunch submits that job alone; a request the partition cannot give is refused before anything
runs. They skip where no cluster answers ``sinfo``; they run one at a time on the one node, all on
the worker that trains the session's toy panel, after it (group ``toy_panel``, ``tests/conftest.py``)."""

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from emergence.run import results
from emergence.run.cluster import cluster_nodes
from tests.helpers.cli import last_line, run_cli, start_cli
from tests.helpers.hub_server import HUB_MODEL, HUB_REPO

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("toy_panel")]

NO_ACCOUNTING = Path(__file__).parents[1] / "helpers" / "no_accounting"  # its sacct reads the controller's records
# What the one CPU node lacks of the preset (1 GPU, 8 CPUs, 64 GB): two jobs at a time on its 2 cores.
CPU_NODE = [
    "hydra/launcher=slurm",
    "hydra.launcher.gpus_per_node=0",
    "hydra.launcher.cpus_per_task=1",
    "hydra.launcher.mem_gb=4",
]
# Three of the panel's ten revisions, to keep the tests to a few minutes: before the induction
# heads, at their circuit's peak, and at the end (other classes too). The toy panel fixture's own
# overrides, so that its sweep is the local twin of these runs; reuse=false: measured afresh.
REVISIONS = ["r4", "r6", "r9"]
PANEL = [
    "model=toy_neox",
    f"revision={','.join(REVISIONS)}",
    "model.toy.save_every=32",
    "ablate.enabled=false",
    "reuse=false",
]


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def settled_state(job_id: str, wait_s: float = 60.0) -> str:
    """A job's JobState once SLURM has finished ending it: a job past its limit, or one just done,
    can read COMPLETING (its processes still being reaped) for a moment after its submitter returns."""
    deadline = time.monotonic() + wait_s
    while True:
        (state,) = re.findall(r"JobState=(\S+)", sh("scontrol", "show", "job", "-o", job_id))
        if state not in ("COMPLETING", "RUNNING", "PENDING", "CONFIGURING") or time.monotonic() > deadline:
            return state
        time.sleep(1)


@pytest.fixture(scope="module")
def slurm_env() -> dict:
    """The environment a SLURM sweep runs in: where the cluster keeps no accounting (no slurmdbd),
    the stand-in ``sacct`` first on PATH, as submitit needs job states."""
    try:
        sinfo = subprocess.run(["sinfo", "-h"], capture_output=True, text=True, timeout=30)
    except OSError:
        pytest.skip("no SLURM cluster: sinfo is not installed (as root: .ci/slurm.sh start)")
    if sinfo.returncode != 0 or not sinfo.stdout.strip():
        pytest.skip(f"no SLURM cluster answers sinfo ({sinfo.stderr.strip()}; as root: .ci/slurm.sh start)")
    accounting = subprocess.run(["sacct", "-n", "-X"], capture_output=True).returncode == 0
    return {} if accounting else {"PATH": f"{NO_ACCOUNTING}{os.pathsep}{os.environ['PATH']}"}


def running_task(task: int, timeout: float = 600) -> str:
    """The id (``<job>_<task>``) of array task ``task`` once SLURM runs it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for job_id in sh("squeue", "-h", "-t", "RUNNING", "-o", "%i").split():
            if job_id.endswith(f"_{task}"):
                return job_id
        time.sleep(0.5)
    raise AssertionError(f"array task {task} never ran: {sh('squeue')}")


@pytest.fixture(scope="module")
def cancelled_sweep(slurm_env, toy_panel, tmp_path_factory):
    """The toy sweep through sbatch with its second job (r6) cancelled once running, then relaunched
    into the same directory: (first launch, what it left: FAILED dirs, the cancelled task's id,
    the relaunch, the sweep dir)."""
    _, env = toy_panel
    env = {**env, **slurm_env}
    sweep = tmp_path_factory.mktemp("slurm") / "sweep"
    args = ["-m", *CPU_NODE, *PANEL, f"hydra.sweep.dir={sweep}"]
    first = start_cli(*args, env=env)
    cancelled = running_task(1)
    subprocess.run(["scancel", cancelled], check=True)
    _, stderr = first.communicate(timeout=900)
    failed = {p.parent.name: p.read_text() for p in sweep.rglob("FAILED")}
    relaunch = run_cli(*args, env=env, timeout=900)
    return first.returncode, stderr, failed, cancelled, relaunch, sweep


def test_a_cancelled_job_is_listed_with_the_schedulers_state_and_the_sweep_exits_1(cancelled_sweep):
    returncode, stderr, failed, cancelled, _, _ = cancelled_sweep
    assert returncode == 1, stderr[-3000:]
    assert list(failed) == ["r6_1"]
    assert failed["r6_1"].startswith(f"SLURM ended job {cancelled} (CANCELLED")
    assert "1 job(s) of the sweep failed" in stderr and f"r6_1: SLURM ended job {cancelled} (CANCELLED" in stderr


def test_the_relaunch_submits_exactly_the_cancelled_job_and_completes_the_sweep(cancelled_sweep):
    _, _, _, cancelled, relaunch, sweep = cancelled_sweep
    assert relaunch.returncode == 0, relaunch.stderr[-3000:]
    log = relaunch.stdout  # the launcher's lines (Hydra's log)
    assert "#0 : already done" in log and "#1 : model=toy_neox revision=r6" in log and "#2 : already done" in log
    (submitted,) = re.findall(r"submitted to SLURM: 1 job\(s\), (\S+) ", log)
    first_job = cancelled.split("_")[0]
    folders = {p.name for p in (sweep / ".submitit").iterdir() if re.fullmatch(r"\d+(_\d+)?", p.name)}
    assert folders == {first_job, f"{first_job}_0", f"{first_job}_1", f"{first_job}_2", submitted}  # 3 tasks, 1 job
    assert settled_state(submitted) == "COMPLETED"
    assert not list(sweep.rglob("FAILED"))


def test_the_sweep_through_sbatch_equals_the_local_sweep_run_for_run(cancelled_sweep, toy_panel):
    *_, sweep = cancelled_sweep
    local, _ = toy_panel
    for num, revision in enumerate(REVISIONS):
        (slurm_run,) = (sweep / "toy_neox").glob(f"{revision}_{num}")
        (local_run,) = (local / "toy_neox").glob(f"{revision}_*")
        assert (slurm_run / "heads.csv").read_bytes() == (local_run / "heads.csv").read_bytes(), revision
        slurm_summary, local_summary = results.RunSummary.read(slurm_run), results.RunSummary.read(local_run)
        for verdict in ("class_counts", "member_counts", "induction_circuit", "bos_fraction", "intervals"):
            assert getattr(slurm_summary, verdict) == getattr(local_summary, verdict), (revision, verdict)


@pytest.mark.parametrize(
    "overrides, line",
    [
        (
            [],
            "error: hydra.launcher.gpus_per_node=1: partition 'debug' has no GPUs: set hydra.launcher.gpus_per_node=0",
        ),
        (
            ["hydra.launcher.gpus_per_node=0", "hydra.launcher.partition=gpu"],
            "error: hydra.launcher.partition='gpu' is not a partition of this cluster: choose one of debug",
        ),
        (
            ["hydra.launcher.gpus_per_node=0", "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=100000"],
            "error: hydra.launcher.mem_gb=100000: a node of partition 'debug' has at most",
        ),
        (
            [
                "hydra.launcher.gpus_per_node=0",
                "hydra.launcher.cpus_per_task=1",
                "hydra.launcher.mem_gb=4",
                "hydra.launcher.timeout_min=1",
            ],
            "error: hydra.launcher.signal_delay_s=120: SLURM would warn a job (USR2) within its first 60 s",
        ),
    ],
    ids=["preset-gpu-on-cpu-node", "unknown-partition", "too-much-memory", "warning-at-start"],
)
def test_a_request_the_partition_cannot_give_is_one_line_exit_2_and_nothing_submitted(
    overrides, line, slurm_env, tmp_path
):
    if any(node.gpus for node in cluster_nodes()):
        pytest.skip("the cluster has GPUs: these requests are for .ci/slurm.sh's CPU-only node")
    sweep = tmp_path / "sweep"
    res = run_cli(
        "-m",
        "hydra/launcher=slurm",
        *overrides,
        "model=toy_neox",
        "revision=r0,r1",
        f"hydra.sweep.dir={sweep}",
        env=slurm_env,
    )
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [last_line(res.stderr)]
    assert last_line(res.stderr).startswith(line)
    assert not (sweep / ".submitit").exists() and "Traceback" not in res.stderr


def test_a_sweep_started_outside_the_repository_reaches_the_launcher(slurm_env, toy_panel, tmp_path):
    """Hydra's plugin scan misses hydra_plugins/emergence_slurm under an editable install (its import
    finder is no folder to scan) unless the repository is the current folder; the run registers the
    launcher itself, so a sweep started anywhere submits its job, never "Unknown plugin class"."""
    _, env = toy_panel
    env = {**env, **slurm_env, "PYTHONPATH": ""}  # the repository only where the install puts it
    sweep = tmp_path / "sweep"
    res = run_cli(
        "-m", *CPU_NODE, *PANEL[:1], "revision=r9", *PANEL[2:], f"hydra.sweep.dir={sweep}", cwd=tmp_path, env=env
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "submitted to SLURM: 1 job(s)" in res.stdout and "Unknown plugin" not in res.stderr
    assert (sweep / "toy_neox" / "r9_0" / "heads.csv").is_file()


def test_a_job_past_its_time_limit_is_listed_as_timeout_with_the_limit_to_raise(slurm_env, tmp_path):
    """A job that runs past ``timeout_min`` (2 minutes: its model's weights file is a named pipe no one
    writes, so it waits, idle, for ever) is ended by SLURM, not by submitit's requeue handler, and
    listed with the field to raise. SLURM's warning (USR2) comes ``signal_delay_s`` before the limit,
    at the controller's next check: 30 s puts it past the job's start, while Python still imports,
    which USR2 would end (FAILED)."""
    from tests.helpers.tiny_models import save_tiny_model

    model = tmp_path / "model"
    save_tiny_model("llama", model)
    (model / "model.safetensors").unlink()
    os.mkfifo(model / "model.safetensors")
    sweep = tmp_path / "sweep"
    env = {**slurm_env, "EMERGENCE_CACHE": str(tmp_path / "cache"), "WANDB_MODE": "disabled"}
    res = run_cli(
        "-m",
        *CPU_NODE,
        "hydra.launcher.timeout_min=2",
        "hydra.launcher.signal_delay_s=30",
        "model=local",
        f"model.name_or_path={model}",
        f"hydra.sweep.dir={sweep}",
        env=env,
        timeout=600,
    )
    assert res.returncode == 1, res.stderr[-3000:]
    (job_id,) = re.findall(r"submitted to SLURM: 1 job\(s\), (\S+) ", res.stdout)
    assert settled_state(job_id) == "TIMEOUT"
    line = (
        f"SLURM ended job {job_id} (TIMEOUT) before it finished: it ran past hydra.launcher.timeout_min=2 "
        "minutes: raise it (hydra.launcher.timeout_min=<minutes>) and relaunch"
    )
    (run_dir,) = (path.parent for path in sweep.rglob("FAILED"))
    assert (run_dir / "FAILED").read_text().strip() == line
    assert res.stderr.strip().splitlines()[-2:] == ["1 job(s) of the sweep failed:", f"  {run_dir}: {line}"]
    assert "Traceback" not in res.stderr and not (run_dir / results.SUMMARY_FILE).exists()


REFINE = ["--milestones", "induction_onset", "recall_67", "--parallel", "3"]  # both in r4..r6: 2 rounds, 5 runs


def test_refinement_of_the_slurm_sweep_submits_its_rounds_to_slurm_and_finds_the_local_intervals(
    cancelled_sweep, toy_panel, slurm_env, tmp_path
):
    *_, slurm_sweep = cancelled_sweep
    local_panel, env = toy_panel
    slurm_copy, local_copy = tmp_path / "slurm", tmp_path / "local"
    shutil.copytree(slurm_sweep, slurm_copy)
    for revision in REVISIONS:  # the same three panel runs, measured by the basic launcher
        (run,) = (local_panel / "toy_neox").glob(f"{revision}_*")
        shutil.copytree(run, local_copy / "toy_neox" / run.name)
    # Local first: the SLURM runs (reuse=false, the panel's) then measure afresh, not from its cache.
    local = run_cli(local_copy, *REFINE, module="emergence.refine", env=env, timeout=900)
    assert local.returncode == 0, local.stderr[-3000:]
    through_slurm = run_cli(slurm_copy, *REFINE, module="emergence.refine", env={**env, **slurm_env}, timeout=900)
    assert through_slurm.returncode == 0, through_slurm.stderr[-3000:]
    refined = {
        name: json.loads((d / "refined.json").read_text())["toy_neox"]
        for name, d in (("slurm", slurm_copy), ("local", local_copy))
    }
    for milestone in ("induction_onset", "recall_67"):
        slurm, here = refined["slurm"][milestone], refined["local"][milestone]
        assert slurm["complete"] and slurm["panel_bracket"] == ["step512", "step768"]
        assert (slurm["interval"], slurm["evaluated"]) == (here["interval"], here["evaluated"])
    # Each round one SLURM submission (an array of the round's runs), each run as the local one.
    rounds = re.findall(r"submitted to SLURM: (\d+) job\(s\), (\S+) ", through_slurm.stdout)
    analysed = sorted({r for m in refined["slurm"].values() for r in m["evaluated"]})
    assert len(rounds) == through_slurm.stdout.count("refine round") == 2
    assert sum(int(n) for n, _ in rounds) == len(analysed) == 5
    for _, job_id in rounds:
        assert set(re.findall(r"JobState=(\S+)", sh("scontrol", "show", "job", "-o", job_id.split("_")[0]))) == {
            "COMPLETED"
        }
    for revision in analysed:
        slurm_run, local_run = (d / "refine" / "toy_neox" / revision for d in (slurm_copy, local_copy))
        assert (slurm_run / "heads.csv").read_bytes() == (local_run / "heads.csv").read_bytes(), revision


def test_the_branch_check_runs_once_in_the_submitting_process_before_any_job_is_submitted(
    slurm_env, toy_panel, hub_server, tmp_path
):
    """step-640 serves step-672's weights: the check, written to integrity.json before the array is
    submitted, calls it a duplicate, and its job reads that verdict and analyses nothing."""
    from tests.helpers.hub_server import publish

    _, env = toy_panel
    toy = Path(env["EMERGENCE_CACHE"]) / "toy" / "toy_neox" / "seed0"
    publish(hub_server.mirrors, HUB_REPO, {"step-640": toy / "step672", "step-672": toy / "step672"})
    sweep = tmp_path / "sweep"
    res = run_cli(
        "-m",
        *CPU_NODE,
        *HUB_MODEL,
        "revision=custom",
        "revision.name=step-640,step-672",
        f"hydra.sweep.dir={sweep}",
        env={**env, **hub_server.env(), **slurm_env, "EMERGENCE_CACHE": str(tmp_path / "cache")},
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    store = sweep / "integrity.json"
    assert set(json.loads(store.read_text())[HUB_REPO]["branches"]) == {"step-640", "step-672"}
    log = res.stdout
    assert log.count(f"integrity: {HUB_REPO}@step-640") == 1
    assert log.index(f"integrity: {HUB_REPO}@step-640") < log.index("submitted to SLURM: 2 job(s)")
    # Written once, before submitit wrote anything to submit (the jobs' pickles come first).
    submitted = [p.stat().st_mtime_ns for p in (sweep / ".submitit").rglob("*") if p.is_file()]
    assert submitted and store.stat().st_mtime_ns < min(submitted)
    duplicate, analysed = sweep / "smollm2" / "custom_0", sweep / "smollm2" / "custom_1"  # step-640, step-672
    assert results.DuplicateRun.read(duplicate).duplicate_of == "step-672"
    assert not (duplicate / "heads.csv").exists() and (analysed / "heads.csv").exists()


def test_a_controller_gone_mid_sweep_is_one_line_exit_1_and_the_relaunch_completes(slurm_env, toy_panel, tmp_path):
    """slurmctld stopped while the sweep's jobs run, and the jobs killed with it (as on a node lost with
    it: the toy's jobs would otherwise end within the grace): no job state can be known, so the sweep
    stops waiting after launcher.CONTROLLER_GRACE_S with one line naming what to do; with the
    controller back (``.ci/slurm.sh start``) and the old array cancelled, the relaunch completes it."""
    _, env = toy_panel
    env = {**env, **slurm_env}
    sweep = tmp_path / "sweep"
    args = ["-m", *CPU_NODE, *PANEL[:1], "revision=r4,r6", *PANEL[2:], f"hydra.sweep.dir={sweep}"]
    first = start_cli(*args, env=env)
    try:
        running_task(0)
        pid_file = re.search(r"SlurmctldPidFile\s*=\s*(\S+)", sh("scontrol", "show", "config")).group(1)
        os.kill(int(Path(pid_file).read_text()), 15)
        subprocess.run(["pkill", "-KILL", "-f", "submitit.core._submit"])
        _, stderr = first.communicate(timeout=300)
    finally:
        subprocess.run([str(Path(__file__).parents[2] / ".ci" / "slurm.sh"), "start"], check=True, capture_output=True)
    assert first.returncode == 1 and "Traceback" not in stderr, stderr[-3000:]
    line = last_line(stderr)
    assert re.fullmatch(
        r"error: the SLURM controller stopped answering \(scontrol ping\) while job (\d+)_\d was not "
        r"done: once it is back, cancel what is left \(scancel \1\) and relaunch the same command: it "
        r"submits only the jobs without a complete run",
        line,
    ), line
    subprocess.run(["scancel", re.search(r"scancel (\d+)", line).group(1)])  # its killed jobs may have ended
    relaunch = run_cli(*args, env=env, timeout=900)
    assert relaunch.returncode == 0, relaunch.stderr[-3000:]
    assert all((sweep / "toy_neox" / run / "heads.csv").is_file() for run in ("r4_0", "r6_1"))
