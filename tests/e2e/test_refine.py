"""Refinement (``python -m emergence.refine``): the search on its own, the plan on hand-made
trajectories, and end to end on toy_neox trained with a checkpoint every 32 steps."""

import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from emergence.core.config import PanelEntry
from emergence.panel.findings import BOS, INDUCTION, model_findings
from emergence.panel.refine import (
    ModelPlan,
    Refinement,
    merge_overrides,
    narrow,
    plan_model,
    spaced,
    with_probabilities,
)
from emergence.panel.runs import Checkpoint, Trajectory
from emergence.panel.uncertainty import replicates


def search(inside: list[str], first_reached: int, per_round: int = 1, scan: bool = False):
    """Run the search to its end against a metric reached from ``inside[first_reached]`` on (the
    panel's high end when first_reached == len(inside)); returns the last Narrowing and the rounds."""
    reached: dict[str, bool] = {}
    rounds = 0
    while True:
        state = narrow(inside, reached, per_round, scan)
        if not state.pending:
            return state, rounds
        rounds += 1
        reached.update({name: inside.index(name) >= first_reached for name in state.pending})


def test_spaced_picks_the_middle_or_even_parts_by_count():
    assert spaced([1, 2, 3, 4, 5], 1) == [3]
    assert spaced([1, 2, 3, 4], 1) == [2]
    assert spaced(list(range(1, 12)), 3) == [3, 6, 9]
    assert spaced([4, 5], 3) == [4, 5]


@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 8, 31, 70])
def test_bisection_finds_the_interval_a_scan_finds_within_log2_n_plus_1_analyses(n):
    inside = [f"step{i}" for i in range(n)]
    for first in range(n + 1):
        state, rounds = search(inside, first)
        # positions: 0 is the panel's low end, i + 1 is inside[i], n + 1 the high end
        assert (state.low, state.high) == (first, first + 1)
        scanned, _ = search(inside, first, scan=True)
        assert (scanned.low, scanned.high) == (state.low, state.high)
        assert len(scanned.evaluated) == n
        assert len(state.evaluated) == len(set(state.evaluated)) == rounds
        assert len(state.evaluated) <= (math.ceil(math.log2(n)) + 1 if n else 0)


@pytest.mark.parametrize("n", [3, 8, 31, 70])
def test_three_per_round_give_the_same_interval_in_fewer_rounds(n):
    inside = [f"step{i}" for i in range(n)]
    fewer = 0
    for first in range(n + 1):
        one, one_rounds = search(inside, first)
        three, three_rounds = search(inside, first, per_round=3)
        assert (three.low, three.high) == (one.low, one.high)
        assert three_rounds <= one_rounds and three.rounds == three_rounds
        fewer += three_rounds < one_rounds
    assert fewer > (n + 1) // 2


def test_a_metric_that_crosses_and_falls_back_misleads_bisection_not_a_scan():
    inside = ["a", "b", "c", "d", "e"]
    values = {"a": False, "b": True, "c": False, "d": True, "e": True}  # b crosses, c falls back
    reached = {}
    while (state := narrow(inside, reached)).pending:
        reached.update({n: values[n] for n in state.pending})
    assert inside[state.high - 1] == "d"  # bisection: c below, d above; b never looked at
    scan = narrow(inside, values, scan=True)
    assert inside[scan.high - 1] == "b" and scan.low == 1


def test_later_overrides_replace_earlier_ones_of_the_same_key():
    merged = merge_overrides(
        ["model=toy_neox", "revision=r3", "ablate.enabled=False"],
        ["ablate.enabled=false"],
        ["+wandb.tags=[a]", "hydra/launcher=slurm"],
        ["wandb.tags=[b]"],
    )
    assert merged == ["model=toy_neox", "revision=r3", "ablate.enabled=false", "hydra/launcher=slurm", "wandb.tags=[b]"]


# --- the plan, on hand-made trajectories -----------------------------------------------------

TOKENS_PER_STEP = 1000


def checkpoint(step: int, n_induction: int, bos_heads: int, refined: bool = False) -> Checkpoint:
    """4 layers x 4 heads: ``n_induction`` heads at 100x induction, ``bos_heads`` at 100x first-token."""
    sel = np.ones((4, 4, 6))
    sel.reshape(16, 6)[:n_induction, INDUCTION] = 100.0
    sel.reshape(16, 6)[16 - bos_heads :, BOS] = 100.0
    return Checkpoint(f"step{step}", float(step * TOKENS_PER_STEP), sel, refined=refined)


def onset_at(step: int) -> int:  # induction heads: 0 before step 30 (3 at the onset), 4 from step 40
    return 0 if step < 30 else 3 if step < 40 else 4


def bos_at(step: int) -> int:  # BOS heads (of 16) grow by one every 2 steps from step 20
    return min(16, max(0, (step - 20) // 2))


def trajectory(panel_steps, refined_steps=()) -> Trajectory:
    steps = sorted([(s, False) for s in panel_steps] + [(s, True) for s in refined_steps])
    return Trajectory("m", [checkpoint(s, onset_at(s), bos_at(s), r) for s, r in steps], None)


EXISTING = [PanelEntry(f"step{s}", s, s * TOKENS_PER_STEP) for s in range(0, 101)]
PANEL = (0, 10, 50, 100)


def test_one_analysed_checkpoint_serves_every_milestone_whose_bracket_holds_it():
    plan = plan_model(
        trajectory(PANEL), EXISTING, ["induction_onset", "bos_10", "recall_67"], 1, False, (30.0, 50.0), 0.3
    )
    onset, bos = plan.refinements["induction_onset"], plan.refinements["bos_10"]
    assert onset.panel_bracket == bos.panel_bracket == ["step10", "step50"]
    assert onset.inside_bracket == 39 and not onset.complete
    assert plan.pending == ["step30"]  # the middle of 11..49, asked for once for all three
    done = []
    while plan.pending:
        done += [int(r.removeprefix("step")) for r in plan.pending]
        plan = plan_model(
            trajectory(PANEL, done), EXISTING, ["induction_onset", "bos_10", "recall_67"], 1, False, (30.0, 50.0), 0.3
        )
    onset, bos = plan.refinements["induction_onset"], plan.refinements["bos_10"]
    assert onset.interval == ["step29", "step30"] and onset.tokens == [29_000.0, 30_000.0]
    assert bos.interval == ["step23", "step24"]  # 2 of 16 BOS heads (12.5%) from step 24
    recall = plan.refinements["recall_67"]  # final circuit: 4 heads; 3 of them (75%) from step 30
    assert recall.interval == ["step29", "step30"]
    for r in (onset, bos, recall):
        assert r.complete and r.monotone and r.evaluations <= math.ceil(math.log2(39)) + 1
    assert set(onset.evaluated) | set(bos.evaluated) == {f"step{s}" for s in done}  # each analysed one was used
    assert len(done) == len(set(done))


def test_milestones_without_a_bracket_say_why():
    plan = plan_model(trajectory((0, 10, 30)), EXISTING, ["bos_50", "sink_10"], 1, False, (30.0, 50.0), 0.3)
    assert plan.refinements["bos_50"].reason == "not reached by the panel's last revision"  # 5 of 16 heads at step30
    assert plan.refinements["sink_10"].reason == "not measured by these runs"
    early = plan_model(trajectory((30, 50, 100)), EXISTING, ["induction_onset"], 1, False, (30.0, 50.0), 0.3)
    assert "first revision" in early.refinements["induction_onset"].reason and not early.pending


def test_the_report_takes_brackets_and_the_gap_from_the_refined_points():
    panel = model_findings(trajectory(PANEL), 30.0, 50.0)
    assert panel.f3.induction_onset.bracket_tokens == [10_000.0, 50_000.0]
    assert panel.f3.gap_ratio_range == pytest.approx([10 / 50, 50 / 10])  # both in (step10, step50]
    refined = model_findings(trajectory(PANEL, [29, 30, 35, 36]), 30.0, 50.0)
    onset, bos_50 = refined.f3.induction_onset, refined.f3.bos_50
    assert onset.bracket_tokens == [29_000.0, 30_000.0]
    assert bos_50.revision == "step36" and bos_50.bracket_tokens == [35_000.0, 36_000.0]  # 8 of 16 heads
    assert refined.f3.gap_ratio_range == pytest.approx([35 / 30, 36 / 29])
    assert [r.refined for r in refined.revisions] == [False, False, True, True, True, True, False, False]


def test_a_finished_refinement_takes_its_probability_from_the_reports_bootstrap():
    from tests.unit.test_report import noisy_trajectory

    traj = noisy_trajectory([1, 20, 32, 80], noise=1.0)  # BOS-30% first at step2, but not in every replicate
    refined = Refinement(
        "bos_30", ["step1", "step3"], [1e7, 1e9], ["step1", "step2"], [1e7, 1e8], 1, ["step2"], 1, 1, "bisection", True
    )
    plan = ModelPlan({"bos_30": refined, "bos_70": Refinement.without_bracket("bos_70", "bisection", "never")}, [])
    answers = with_probabilities(traj, plan, (30.0, 50.0), 0.3).refinements
    report = model_findings(traj, 30.0, 50.0, replicates(traj, 30.0, 50.0)).f3.bos_30.probability
    assert answers["bos_30"].probability == report["step2"] and 0 < report["step2"] < 1
    assert answers["bos_70"].probability is None  # no interval: nothing to weigh


# --- end to end on toy_neox ---------------------------------------------------------------------

MILESTONES = ["--milestones", "induction_onset", "recall_67"]


def refine_copy(toy_panel, tmp_path, name, *args):
    from tests.helpers.cli import run_cli

    sweep, env = toy_panel
    copy = tmp_path / name
    shutil.copytree(sweep, copy)
    res = run_cli(copy, *MILESTONES, *args, module="emergence.refine", env=env, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return copy, json.loads((copy / "refined.json").read_text())["toy_neox"]


@pytest.fixture(scope="module")
def toy_bisected(toy_panel, tmp_path_factory):
    """A copy of the toy panel's sweep refined by bisection to both milestones, once for the tests that
    read it (none writes to it): (its folder, its ``refined.json`` entry of toy_neox)."""
    return refine_copy(toy_panel, tmp_path_factory.mktemp("refined"), "bisection")


@pytest.mark.slow
def test_refinement_of_the_toy_matches_a_scan_of_every_saved_checkpoint(toy_panel, toy_bisected, tmp_path):
    from tests.helpers.cli import run_cli

    bisected_dir, bisected = toy_bisected
    _, scanned = refine_copy(toy_panel, tmp_path, "scan", "--scan")
    # Three per round, each round's jobs through another launcher (as hydra/launcher=slurm would).
    parallel_dir, parallel = refine_copy(
        toy_panel,
        tmp_path,
        "parallel",
        "--parallel",
        "3",
        "hydra/launcher=submitit_local",
        "hydra.launcher.timeout_min=10",
    )
    step = lambda name: int(name.removeprefix("step"))  # noqa: E731
    for milestone in ("induction_onset", "recall_67"):
        b, s, p = bisected[milestone], scanned[milestone], parallel[milestone]
        assert b["complete"] and b["inside_bracket"] > 0
        lo, hi = b["panel_bracket"]
        assert b["inside_bracket"] == (step(hi) - step(lo)) // 32 - 1  # the saved checkpoints strictly inside
        assert step(b["interval"][1]) - step(b["interval"][0]) == 32  # adjacent saved checkpoints
        assert b["evaluations"] <= math.ceil(math.log2(b["inside_bracket"])) + 1
        assert s["interval"] == b["interval"] == p["interval"]
        assert s["evaluations"] == s["inside_bracket"] and s["first_crossing_guaranteed"] is True
        assert p["rounds"] < b["rounds"]
        assert 0 < b["probability"] <= 1
    assert list((parallel_dir / "refine" / "toy_neox" / ".submitit").iterdir())  # the launcher ran them
    # Each analysed checkpoint is one normal run in the sweep, of the run's own configuration, ablation off.
    runs = sorted((bisected_dir / "refine" / "toy_neox").glob("*/summary.json"))
    analysed = {r for m in bisected.values() for r in m["evaluated"]}
    assert {p.parent.name for p in runs} == analysed
    for path in runs:
        summary = json.loads(path.read_text())
        assert summary["ablation"]["enabled"] is False and summary["ablation"]["circuit"] is None
    overrides = (runs[0].parent / ".hydra" / "overrides.yaml").read_text()
    assert "model.toy.save_every=32" in overrides and "revision=custom" in overrides
    # The report reads them like any other run, and takes its F3 bracket from the refined points.
    out = tmp_path / "report"
    res = run_cli(bisected_dir, "--out", out, module="emergence.report", env=toy_panel[1], timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    findings = json.loads((out / "findings.json").read_text())["models"]["toy_neox"]
    assert findings["refined"] == bisected
    assert findings["f3"]["induction_onset"]["revision"] == bisected["induction_onset"]["interval"][1]
    assert findings["f3"]["induction_onset"]["bracket_tokens"] == bisected["induction_onset"]["tokens"]
    report = (out / "report.md").read_text()
    lo, hi = bisected["induction_onset"]["interval"]
    assert f"| induction_onset | {' -> '.join(bisected['induction_onset']['panel_bracket'])} | {lo} -> {hi} |" in report


@pytest.mark.slow
def test_a_killed_refinement_resumes_without_analysing_anything_twice(toy_panel, tmp_path):
    sweep, env = toy_panel
    copy = tmp_path / "killed"
    shutil.copytree(sweep, copy)
    command = [sys.executable, "-m", "emergence.refine", str(copy), *MILESTONES, "--scan"]
    proc = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **env}, start_new_session=True
    )
    deadline = time.time() + 600
    while not list(copy.glob("refine/toy_neox/*/summary.json")) and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the refinement and its multirun, mid-round
    proc.wait()
    done = {p.parent.name: p.stat().st_mtime_ns for p in copy.glob("refine/toy_neox/*/summary.json")}
    assert done, "killed before any job finished: nothing to resume"
    before = json.loads((copy / "refined.json").read_text())["toy_neox"]  # written before the round started
    assert not all(m["complete"] for m in before.values())

    res = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **env}, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    launched = {
        name
        for line in res.stdout.splitlines()
        if line.startswith("refine round")
        for name in line.split("analysing ")[1].split(" for ")[0].split(", ")
    }
    refined = json.loads((copy / "refined.json").read_text())["toy_neox"]
    inside = {r for m in refined.values() for r in m["evaluated"]}
    assert launched and not launched & set(done) and launched | set(done) == inside
    assert {
        p.parent.name: p.stat().st_mtime_ns
        for p in copy.glob("refine/toy_neox/*/summary.json")
        if p.parent.name in done
    } == done  # the finished ones were not run again
    assert all(m["complete"] and m["evaluations"] == m["inside_bracket"] for m in refined.values())


def test_overrides_may_follow_the_options(monkeypatch, tmp_path):
    import emergence.panel.refine as refine

    seen = {}
    monkeypatch.setattr(
        refine,
        "refine",
        lambda sweep, milestones, per_round, scan, overrides, eps: (
            seen.update(milestones=milestones, per_round=per_round, overrides=sorted(overrides)) or {}
        ),
    )
    refine.main([str(tmp_path), "--milestones", "bos_50", "hydra/launcher=slurm", "--parallel", "3", "probe=quick"])
    assert seen == {"milestones": ["bos_50"], "per_round": 3, "overrides": ["hydra/launcher=slurm", "probe=quick"]}
    with pytest.raises(SystemExit) as exit_:
        refine.main([str(tmp_path), "--milestones", "bos_55"])
    assert exit_.value.code == 2


@pytest.mark.slow
def test_the_same_refinement_against_a_hub_repo_served_over_http(toy_panel, toy_bisected, hub_server, tmp_path):
    """The toy's 65 checkpoints as branches of a Hub repo, the one where the induction onset is first
    seen serving the next checkpoint's weights instead (as pythia#205's branches serve later weights):
    the panel is proposed from the branches, refine lists them with list_repo_refs, every analysis
    downloads its revision, recall_67 is located where the toy's own refinement put it, and the
    onset's search checks the branches it considers, never analyses the duplicate, and ends its
    interval on the next distinct checkpoint."""
    from tests.helpers.cli import run_cli
    from tests.helpers.hub_server import HUB_MODEL, HUB_REPO, publish

    sweep, env = toy_panel
    toy = Path(env["EMERGENCE_CACHE"]) / "toy" / "toy_neox" / "seed0"
    saved = [c["revision"] for c in json.loads((toy / "manifest.json").read_text())["checkpoints"]]
    _, toy_refined = toy_bisected
    before, onset = toy_refined["induction_onset"]["interval"]
    after = saved[saved.index(onset) + 1]  # the next saved checkpoint: the onset is not the panel's end
    assert onset not in toy_refined["induction_onset"]["panel_bracket"]
    branch = lambda revision: f"step-{revision.removeprefix('step')}"  # noqa: E731
    publish(hub_server.mirrors, HUB_REPO, {branch(r): toy / (after if r == onset else r) for r in saved})
    hub_env = {**env, **hub_server.env(), "EMERGENCE_CACHE": str(tmp_path / "cache")}
    hub_sweep = tmp_path / "hub"
    res = run_cli("-m", *HUB_MODEL, "revision=glob(r*)", f"hydra.sweep.dir={hub_sweep}", env=hub_env, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    res = run_cli(hub_sweep, *MILESTONES, module="emergence.refine", env=hub_env, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    refined = json.loads((hub_sweep / "refined.json").read_text())["smollm2"]
    step = lambda name: int(name.removeprefix("step").removeprefix("-"))  # noqa: E731
    for milestone in ("induction_onset", "recall_67"):
        lo, hi = map(step, refined[milestone]["panel_bracket"])
        # the proposed panel is sparser than the toy's; a duplicate inside is no checkpoint of its own
        duplicates_inside = int(lo < step(onset) < hi)
        assert refined[milestone]["inside_bracket"] == (hi - lo) // 32 - 1 - duplicates_inside > 3
    recall = refined["recall_67"]
    assert recall["evaluations"] <= math.ceil(math.log2(recall["inside_bracket"])) + 1
    assert recall["interval"] == [branch(r) for r in toy_refined["recall_67"]["interval"]]
    assert recall["tokens"] == [4096.0 * step(x) for x in recall["interval"]]
    assert f"stepping over {branch(onset)} (duplicate of {branch(after)})" in res.stdout
    assert refined["induction_onset"]["interval"] == [branch(before), branch(after)]
    assert branch(onset) not in refined["induction_onset"]["evaluated"]
    assert not (hub_sweep / "refine" / "smollm2" / branch(onset)).exists()
    for path in hub_sweep.glob("refine/smollm2/*/summary.json"):
        summary = json.loads(path.read_text())
        assert summary["name_or_path"] == HUB_REPO and summary["download"]["bytes_downloaded"] > 0
        assert (
            summary["weights_sha256"]
            == hashlib.sha256((toy / f"step{summary['step']}" / "model.safetensors").read_bytes()).hexdigest()
        )


def test_a_local_checkpoint_has_no_checkpoints_to_refine_between(tmp_path):
    from emergence.core.config import compose_config
    from emergence.core.errors import UsageError
    from emergence.hub.revisions import existing_checkpoints

    (tmp_path / "config.json").write_text("{}")  # one checkpoint, not a folder of a run's checkpoints
    with pytest.raises(UsageError, match="is a local directory: one checkpoint"):
        existing_checkpoints(compose_config(["model=local", f"model.name_or_path={tmp_path}"]))
