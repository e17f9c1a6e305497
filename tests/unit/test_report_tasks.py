"""Task circuits over training in the panel report: on hand-made run directories whose task
summaries hold numbers set here, the emergence milestone, first entries, overlaps, verdicts,
findings.json, the published numbers beside ours, and refinement's task milestones."""

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest

from emergence.core.config import PanelEntry
from emergence.panel import figures
from emergence.panel.findings import milestone_reached, panel_findings
from emergence.panel.records import PanelFindings
from emergence.panel.refine import plan_model
from emergence.panel.report import main as report_main
from emergence.panel.runs import Checkpoint, load_runs
from emergence.recipe.screen import CLASSES
from emergence.recipe.tasks.ablation import ConditionResult, TaskAblation, screen_sweep
from emergence.recipe.tasks.batches import TaskWords
from emergence.recipe.tasks.metrics import SUMMARY_METRICS, MetricValue, TaskMetrics
from emergence.recipe.tasks.published import DATA as PUBLISHED_FILE
from emergence.recipe.tasks.step import TaskSummary
from emergence.run.results import task_lines
from tests.unit.test_report import write_checkpoint

BOS = CLASSES.index("bos")
TOKENS = (0.0, 1e6, 1e7, 1e8, 1e9)
REVISIONS = [f"r{i}" for i in range(len(TOKENS))]
# IOI per revision: (logit_diff_mean value, its interval), (top1 value, its interval). The levels are
# logit difference > 1 nat and top-1 > 50 %, each on its interval's low end.
IOI = [
    ((0.2, [0.1, 0.3]), (0.10, [0.05, 0.15])),  # r0: neither
    ((1.5, [0.8, 2.2]), (0.70, [0.60, 0.80])),  # r1: logit difference's value above 1, its interval not
    ((1.6, [1.2, 2.0]), (0.55, [0.45, 0.65])),  # r2: top-1's value above 50 %, its interval not
    ((2.0, [1.5, 2.5]), (0.80, [0.70, 0.90])),  # r3: both intervals clear: the milestone
    ((1.2, [0.9, 1.5]), (0.90, [0.85, 0.95])),
]  # r4: falls back (a milestone is the first crossing)


def metrics(task: str, values: dict[str, tuple[float, list[float]]]) -> TaskMetrics:
    """The task's summary metrics: ``values`` where given, 0 [0, 0] elsewhere."""
    return TaskMetrics(
        task=task,
        n_prompts=500,
        n_boot=1000,
        ci_level=0.95,
        seed=0,
        metrics={name: MetricValue(*values.get(name, (0.0, [0.0, 0.0]))) for name in SUMMARY_METRICS[task]},
    )


def task_summary(
    task: str,
    values: dict,
    screens: dict[str, list[str]],
    circuits: dict[str, list[str]],
    ablation: TaskAblation | None = None,
    words: TaskWords | None = None,
) -> TaskSummary:
    return TaskSummary(
        name=task,
        n_prompts=500,
        seq_len=14,
        tokenizer="hand-made",
        prompts_sha1="hand-made",
        fingerprint="hand-made",
        metrics=metrics(task, values),
        screens=screens,
        circuits=circuits,
        ablation=ablation,
        words=words,
    )


def write_task_run(run_dir: Path, sel: np.ndarray, tokens: float, summary: dict) -> None:
    """One run directory of a task run (``summary``: the summary's fields, its task among them)."""
    write_checkpoint(
        run_dir,
        Checkpoint(summary["revision"], tokens, sel),
        {"model": "toy", "tokens": tokens, "n_layers": sel.shape[0], "n_heads": sel.shape[1], **summary},
    )


# Per revision of the IOI panel: the name-mover screen's top 3, the run's own circuits, the BOS heads.
SCREENS = [
    ["L0H0", "L0H1", "L1H1"],
    ["L1H0", "L0H0", "L0H1"],
    ["L0H0", "L0H1", "L1H1"],
    ["L1H0", "L1H1", "L0H0"],
    ["L1H0", "L0H1", "L1H1"],
]
INDUCTION = [[], ["L1H0"], ["L1H0"], ["L1H0", "L1H1"], ["L1H0", "L1H1"]]
PREVIOUS_TOKEN = [[], [], ["L0H0"], ["L0H0"], ["L0H1"]]
SINKS = [[], ["L0H1"], ["L0H1"], ["L0H1", "L0H0"], ["L0H1"]]


def ioi_panel(root: Path) -> None:
    """The IOI trajectory of ``IOI``, 2 layers x 2 heads, ``SINKS`` at BOS selectivity 40x (>= 30x)."""
    for i, revision in enumerate(REVISIONS):
        sel = np.ones((2, 2, len(CLASSES)))
        for name in SINKS[i]:
            sel[int(name[1]), int(name[3]), BOS] = 40.0
        (ld, ld_ci), (top1, top1_ci) = IOI[i]
        task = task_summary(
            "ioi",
            {"logit_diff_mean": (ld, ld_ci), "top1": (top1, top1_ci)},
            {"name_mover": SCREENS[i], "s_inhibition": []},
            {"induction": INDUCTION[i], "previous_token": PREVIOUS_TOKEN[i]},
        )
        write_task_run(root / revision, sel, TOKENS[i], {"revision": revision, "task": task})


@pytest.fixture()
def ioi(tmp_path):
    ioi_panel(tmp_path / "runs")
    return load_runs([tmp_path / "runs"])


def test_task_runs_form_their_own_trajectory_and_carry_their_summaries(ioi):
    assert list(ioi) == ["toy-ioi"]
    traj = ioi["toy-ioi"]
    assert traj.task == "ioi" and traj.probe == "synthetic"
    assert [c.task.metrics.metrics["top1"].value for c in traj.checkpoints] == [v[1][0] for v in IOI]


def test_the_milestone_is_the_first_revision_whose_intervals_clear_every_level(ioi):
    t = panel_findings(ioi, 30.0, 50.0).models["toy-ioi"].task
    # r1 and r2 have a value above its level but an interval that is not: only r3 clears both
    assert [r.cleared for r in t.revisions] == [False, False, False, True, False]
    assert t.emergence.revision == "r3" and t.emergence.tokens == 1e8
    assert t.emergence.bracket_tokens == [1e7, 1e8]
    assert [(level.metric, level.level) for level in t.levels] == [("logit_diff_mean", 1.0), ("top1", 0.5)]
    assert [r.metrics["logit_diff_mean"].ci for r in t.revisions] == [v[0][1] for v in IOI]
    assert t.ci_level == 0.95


def test_a_level_the_value_reaches_but_the_interval_does_not_is_not_emergence(tmp_path):
    """Greater-than: top1_above 0.6 with its interval down to 0.5 (not above 50 %) is not emergence."""
    for i, (value, ci) in enumerate([(0.2, [0.1, 0.3]), (0.6, [0.5, 0.7]), (0.62, [0.51, 0.73])]):
        task = task_summary(
            "greater_than",
            {"top1_above": (value, ci)},
            {"greater_than": ["L0H0"]},
            {"induction": [], "previous_token": []},
        )
        write_task_run(
            tmp_path / f"r{i}", np.ones((1, 1, len(CLASSES))), TOKENS[i], {"revision": f"r{i}", "task": task}
        )
    t = panel_findings(load_runs([tmp_path]), 30.0, 50.0).models["toy-greater_than"].task
    assert [r.cleared for r in t.revisions] == [False, False, True]
    assert t.emergence.revision == "r2" and t.emergence.bracket_tokens == [TOKENS[1], TOKENS[2]]


def test_each_final_screen_head_first_enters_the_top_k_where_the_screens_say(ioi):
    t = panel_findings(ioi, 30.0, 50.0).models["toy-ioi"].task
    entries = t.first_entry["name_mover"]
    assert [e.head for e in entries] == SCREENS[-1] and [e.rank for e in entries] == [1, 2, 3]
    for e in entries:  # independently: the first revision whose list holds the head
        first = min(i for i, heads in enumerate(SCREENS) if e.head in heads)
        assert e.entered.revision == REVISIONS[first]
        assert e.entered.bracket_tokens == [None if first == 0 else TOKENS[first - 1], TOKENS[first]]
    assert [e.entered.revision for e in entries] == ["r1", "r0", "r0"]  # L1H0 left at r2 and came back
    assert t.first_entry["s_inhibition"] == []


def test_screens_overlap_the_runs_circuits_and_the_sinks_of_the_same_revision(ioi):
    t = panel_findings(ioi, 30.0, 50.0).models["toy-ioi"].task
    for i, r in enumerate(t.revisions):
        o = r.overlaps["name_mover"]
        assert o.induction == [h for h in SCREENS[i] if h in INDUCTION[i]]
        assert o.previous_token == [h for h in SCREENS[i] if h in PREVIOUS_TOKEN[i]]
        assert o.sink == [h for h in SCREENS[i] if h in SINKS[i]]
    assert t.revisions[3].overlaps["name_mover"].sink == ["L0H0"]
    assert t.revisions[3].overlaps["name_mover"].induction == ["L1H0", "L1H1"]
    # a higher class threshold leaves no BOS head (40x < 50x), and so no sink in any screen
    t_high = panel_findings(ioi, 50.0, 50.0).models["toy-ioi"].task
    assert all(not r.overlaps["name_mover"].sink for r in t_high.revisions)


def test_task_milestones_are_refinement_milestones(ioi):
    traj = ioi["toy-ioi"]
    reached = milestone_reached(traj, 30.0, 50.0)
    assert reached["task_ioi"].tolist() == [False, False, False, True, False]
    existing = [
        PanelEntry(revision, step, tokens)
        for step, (revision, tokens) in enumerate(
            zip(["r0", "r1", "r2", "r2a", "r2b", "r3", "r4"], [0, 1e6, 1e7, 3e7, 6e7, 1e8, 1e9])
        )
    ]
    plan = plan_model(traj, existing, ["task_ioi", "task_binding"], 1, False, (30.0, 50.0), 0.3)
    refinement = plan.refinements["task_ioi"]
    assert refinement.panel_bracket == ["r2", "r3"] and refinement.inside_bracket == 2
    assert plan.pending == ["r2a"]  # bisection of two checkpoints inside: the first
    assert plan.refinements["task_binding"].reason == "not measured by these runs"


def sweep_ablation(screen_delta: float, seed_deltas: list[float]) -> TaskAblation:
    """A successor ablation whose only content is its screen's sweep over distinct draws, judged as a run
    judges it (``screen_sweep``): the target logit changes by the given deltas, top-1 by a tenth of them."""

    def result(name: str, kind: str, delta: float, seed: int | None = None) -> ConditionResult:
        return ConditionResult(
            name=name,
            kind=kind,
            screen="successor",
            seed=seed,
            heads=["L0H0"],
            metrics=metrics("successor", {}),
            delta={"target_logit_mean": delta, "top1": delta / 10},
        )

    draws = [
        result(f"matched_random_seed:successor:{i}", "matched_random_seed", d, i) for i, d in enumerate(seed_deltas)
    ]
    sweep = screen_sweep(
        "successor", result("screen:successor", "screen", screen_delta), {0: [0]}, draws, n_heads=8, absent=None
    )
    return TaskAblation(task="successor", n_prompts=500, conditions=[], not_run=[], sweeps=[sweep])


def successor_runs(root: Path, ablation: TaskAblation) -> None:
    """Two revisions of a successor trajectory, the last one ablated."""
    for i in range(2):
        task = task_summary(
            "successor",
            {},
            {"successor": ["L0H0"]},
            {"induction": [], "previous_token": []},
            ablation if i == 1 else None,
        )
        write_task_run(root / f"r{i}", np.ones((1, 1, len(CLASSES))), TOKENS[i], {"revision": f"r{i}", "task": task})


@pytest.mark.parametrize("screen_delta, verdict", [(-30.0, "specific"), (-12.0, "not_specific"), (5.0, "not_specific")])
def test_the_final_verdict_is_the_runs_and_the_report_states_it(tmp_path, screen_delta, verdict):
    seeds = [-10.0, -2.0, 0.5, -12.0]
    successor_runs(tmp_path / "runs", sweep_ablation(screen_delta, seeds))
    (v,) = panel_findings(load_runs([tmp_path / "runs"]), 30.0, 50.0).models["toy-successor"].task.verdicts
    assert (v.screen, v.verdict_metric, v.verdict, v.n_distinct) == ("successor", "target_logit_mean", verdict, 4)
    logit = v.sweeps["target_logit_mean"]
    assert logit.mean == pytest.approx(np.mean(seeds)) and logit.min == -12.0
    assert logit.std == pytest.approx(np.std(seeds, ddof=1))
    report_main([str(tmp_path / "runs"), "--out", str(tmp_path / "report"), "--wandb-mode", "disabled"])
    line = next(
        line
        for line in (tmp_path / "report" / "report.md").read_text().splitlines()
        if line.startswith("  - `successor`: ")
    )
    assert line.startswith(
        f"  - `successor`: target_logit_mean {screen_delta:+.3f} vs matched-random "
        f"{np.mean(seeds):+.3f} +- {np.std(seeds, ddof=1):.3f} [-12.000, +0.500]; top1 "
        f"{screen_delta * 10:+.1f} pp vs matched-random {np.mean(seeds) * 10:+.1f} +- "
        f"{np.std(seeds, ddof=1) * 10:.1f} pp [-120.0, +5.0] (ratio "
        f"{screen_delta / np.mean(seeds):.3g}) over 4 distinct draws; "
    )
    assert line.endswith(
        ("below" if verdict == "specific" else "not below") + " every one of 4 distinct draws (lowest -12.000)."
    )


def test_a_run_written_before_verdicts_reads_and_says_it_has_none(tmp_path):
    """A summary of the earlier layout: its sweeps hold top-1 only, with no distinct count or verdict."""
    successor_runs(tmp_path / "runs", sweep_ablation(-30.0, [-10.0, -2.0, 0.5, -12.0]))
    path = tmp_path / "runs" / "r1" / "summary.json"
    data = json.loads(path.read_text())
    ablation = data["task"]["ablation"]
    for key in ("chance_top1", "capability_absent"):
        del ablation[key]
    (sweep,) = ablation["sweeps"]
    ablation["sweeps"] = [
        {
            "screen": sweep["screen"],
            "seeds": sweep["seeds"],
            "sweeps": {"top1": {k: v for k, v in sweep["sweeps"]["top1"].items() if k != "why"}},
        }
    ]
    path.write_text(json.dumps(data))
    (v,) = panel_findings(load_runs([tmp_path / "runs"]), 30.0, 50.0).models["toy-successor"].task.verdicts
    assert v.verdict is None and list(v.sweeps) == ["top1"]
    report_main([str(tmp_path / "runs"), "--out", str(tmp_path / "report"), "--wandb-mode", "disabled"])
    assert (
        "  - `successor`: top1 -300.0 pp vs matched-random -58.8 +- 60.6 pp [-120.0, +5.0] (ratio 5.11) over "
        "4 seeds; no verdict stored (a run of an earlier version: rerun it)."
    ) in (tmp_path / "report" / "report.md").read_text()


def test_findings_json_reads_back_into_the_same_task_records(ioi):
    findings = panel_findings(ioi, 30.0, 50.0)
    written = json.loads(json.dumps(findings.to_json()))
    assert PanelFindings.from_json(written) == findings
    task = written["models"]["toy-ioi"]["task"]
    assert task["emergence"]["revision"] == "r3" and task["revisions"][1]["metrics"]["top1"]["ci"] == [0.6, 0.8]
    first = task["first_entry"]["name_mover"][0]
    assert (first["head"], first["rank"], first["entered"]["revision"]) == ("L1H0", 1, "r1")
    assert findings.models["toy-ioi"].milestones()["task_ioi"].revision == "r3"


# --- the study's numbers beside ours ---------------------------------------------------------------


def condition(name: str, kind: str, screen: str | None, heads: list[str], top1: float) -> ConditionResult:
    """An IOI condition with top-1 ``top1`` (interval +- 0.01), logit difference 10 x top-1."""
    values = {"top1": (top1, [top1 - 0.01, top1 + 0.01]), "logit_diff_mean": (10 * top1, [10 * top1, 10 * top1])}
    return ConditionResult(
        name=name,
        kind=kind,
        screen=screen,
        seed=123 if kind == "matched_random" else None,
        heads=heads,
        metrics=metrics("ioi", values),
        delta={},
    )


OUR_IOI = [
    condition("baseline", "baseline", None, [], 0.91),
    condition("screen:name_mover", "screen", "name_mover", ["L13H1", "L10H6"], 0.95),
    condition("matched_random:name_mover:123", "matched_random", "name_mover", ["L13H2", "L10H1"], 0.9),
    condition("full_layers:name_mover", "full_layers", "name_mover", ["L10H0"], 0.5),
    condition("screen:s_inhibition", "screen", "s_inhibition", ["L12H1"], 0.6),
    condition("screen_union", "screen_union", None, ["L12H1", "L13H1"], 0.3),
    condition("prev_token_circuit", "prev_token_circuit", None, ["L1H3"], 0.1),
    condition("induction_circuit", "induction_circuit", None, ["L4H4"], 0.89),
    condition("circuit_union", "circuit_union", None, ["L1H3", "L4H4"], 0.2),
]


def study_run(
    root: Path,
    task: str,
    revision: str = "step143000",
    repo: str = "EleutherAI/pythia-1b",
    ablation: TaskAblation | None = None,
    words: TaskWords | None = None,
) -> None:
    screens = {
        "ioi": {"name_mover": ["L13H1", "L10H6", "L9H0", "L10H4", "L11H7"], "s_inhibition": ["L12H1"]},
        "greater_than": {"greater_than": ["L8H5", "L7H0", "L0H0", "L1H1", "L2H2"]},
    }[task]
    summary = task_summary(task, {}, screens, {"induction": ["L4H4"], "previous_token": ["L1H3"]}, ablation, words)
    write_checkpoint(
        root / revision,
        Checkpoint(revision, 3e11, np.ones((16, 8, len(CLASSES)))),
        {
            "model": "pythia",
            "name_or_path": repo,
            "revision": revision,
            "tokens": 299892736000,
            "n_layers": 16,
            "n_heads": 8,
            "task": summary,
        },
    )


def published_rows(model: str, task: str) -> list[tuple]:
    """(experiment, condition, metric, value, valid) of published.json, read as plain JSON, for
    the metrics the task measures."""
    data = json.loads(PUBLISHED_FILE.read_text())
    return [
        (a["experiment"], c["name"], metric, value, c["valid"])
        for a in data["ablations"]
        if a["model"] == model and a["task"] == task
        for c in a["conditions"]
        for metric, value in c["metrics"].items()
        if metric in SUMMARY_METRICS[task]
    ]


def table_rows(text: str) -> dict[tuple, list[str]]:
    """The published-beside-ours table's rows by (experiment, condition, metric)."""
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if re.match(r"\s+\| (capability|name_movers|s_inhibition|task_screen|prev_token_circuit) \|", line)
    ]
    return {tuple(r[:3]): r[3:] for r in rows}


def test_a_pythia_final_run_sets_its_numbers_beside_the_published_ones(tmp_path):
    ablation = TaskAblation(task="ioi", n_prompts=500, conditions=OUR_IOI, sweeps=[], not_run=[])
    study_run(tmp_path / "runs", "ioi", ablation=ablation)
    report_main([str(tmp_path / "runs"), "--out", str(tmp_path / "report"), "--wandb-mode", "disabled"])
    text = (tmp_path / "report" / "report.md").read_text()
    assert "## Task circuits" in text and "Beside the study** (pythia at step143000" in text
    table = table_rows(text)
    expected = published_rows("pythia", "ioi")
    assert len(table) == len(expected) > 20
    ours = {
        ("capability", "baseline"): 0.91,
        ("capability", "prev_token_circuit"): 0.1,
        ("capability", "induction_circuit"): 0.89,
        ("capability", "union"): 0.2,
        ("name_movers", "baseline"): 0.91,
        ("name_movers", "screen"): 0.95,
        ("name_movers", "matched_random"): 0.9,
        ("name_movers", "full_layers"): 0.5,
        ("s_inhibition", "baseline"): 0.91,
        ("s_inhibition", "screen"): 0.6,
        ("s_inhibition", "matched_random"): None,
        ("s_inhibition", "union"): 0.3,
    }
    for experiment, name, metric, value, valid in expected:
        published, mine = table[(experiment, name, metric)][:2]
        assert valid and published == f"{value:.4g}"
        top1 = ours[(experiment, name)]
        if top1 is None:  # our run has no matched-random of the S-inhibition screen
            assert mine == "not run"
            continue
        ours_value = {"top1": top1, "logit_diff_mean": 10 * top1}.get(metric, 0.0)  # the others: 0 (``metrics``)
        assert mine.startswith(f"{ours_value:.4g} [")
    row = table[("capability", "induction_circuit", "top1")]
    assert row[2:] == ["L4H4, L7H0, L7H1", "L4H4"]  # the study's heads beside ours
    assert "Screen `name_mover`: published top-5 L13H1, L10H6, L10H5, L10H4, L11H7" in text
    assert "shared 4/5 (L13H1, L10H6, L10H4, L11H7)" in text
    assert "Sweep `name_mover` top1: published +7.2 pp vs +2.70 +- 4.05 pp; not swept." in text
    assert "Invalid published rows (compare nothing with them): none." in text


def test_the_invalid_published_rows_are_named(tmp_path):
    study_run(tmp_path / "runs", "greater_than")
    findings = panel_findings(load_runs([tmp_path / "runs"]), 30.0, 50.0)
    comparison = findings.models["pythia-greater_than"].task.published
    invalid = {(r.condition, r.valid) for r in comparison.rows if r.condition.endswith("_circuit")}
    assert invalid == {("induction_circuit", False), ("prev_token_circuit", False)}
    assert {(e, c) for e, c, _, _, valid in published_rows("pythia", "greater_than") if not valid} == {
        ("task_screen", r.condition) for r in comparison.invalid()
    }
    report_main([str(tmp_path / "runs"), "--out", str(tmp_path / "report"), "--wandb-mode", "disabled"])
    text = (tmp_path / "report" / "report.md").read_text()
    line = next(line for line in text.splitlines() if line.strip().startswith("Invalid published rows"))
    assert "task_screen induction_circuit: " in line and "task_screen prev_token_circuit: " in line
    assert "OLMoE" in line  # the reason, as the package data states it
    assert table_rows(text)[("task_screen", "induction_circuit", "top1_above")][0].endswith("(invalid)")


@pytest.mark.parametrize(
    "revision, repo", [("step3000", "EleutherAI/pythia-1b"), ("step143000", "EleutherAI/pythia-160m")]
)
def test_only_the_study_models_final_revision_is_compared(tmp_path, revision, repo):
    study_run(tmp_path, "ioi", revision=revision, repo=repo)
    assert panel_findings(load_runs([tmp_path]), 30.0, 50.0).models["pythia-ioi"].task.published is None


@pytest.mark.parametrize("mode, compared", [("study", True), ("filtered", False), (None, True)])
def test_only_a_batch_of_the_studys_words_is_compared(tmp_path, mode, compared):
    """A filtered batch holds other prompts than the study measured: nothing to set beside its numbers. A
    summary without ``words`` (a run before probe.task_words) measured the study's."""
    kept = {"names": ["John", "Mary"], "places": ["store"], "objects": ["drink"]}
    words = (
        None
        if mode is None
        else TaskWords(mode, kept, {"names": [] if mode == "study" else ["Donna"], "places": [], "objects": []})
    )
    study_run(tmp_path, "ioi", words=words)
    path = tmp_path / "step143000" / "summary.json"
    written = json.loads(path.read_text())
    assert written["task"]["words"] == (None if words is None else words.to_json())
    if mode is None:
        del written["task"]["words"]
        path.write_text(json.dumps(written))
    published = panel_findings(load_runs([tmp_path]), 30.0, 50.0).models["pythia-ioi"].task.published
    assert (published is not None) == compared
    if compared:
        assert published.study_model == "pythia" and published.rows


def test_the_printed_lines_name_the_words_a_filtered_batch_dropped():
    summary = task_summary("binding", {}, {"binding": ["L0H0"]}, {"induction": [], "previous_token": []})
    words = TaskWords(
        "filtered",
        {"names": ["John", "Mary"], "cities": ["Paris", "Rome"]},
        {"names": ["Donna"], "cities": ["Bangkok", "Sydney"]},
    )
    assert not any(line.startswith("task words") for line in task_lines(summary))  # the study's: nothing to say
    lines = task_lines(dataclasses.replace(summary, words=words))
    assert lines[1] == (
        "task words: filtered to the tokenizer's single tokens, dropped names Donna; cities Bangkok Sydney"
    )


# --- runs without tasks ---------------------------------------------------------------------------


def test_a_panel_with_tasks_reports_them_and_one_without_reports_none(tmp_path):
    ioi_panel(tmp_path / "tasks")
    for i, revision in enumerate(REVISIONS):  # the same model without a task
        write_task_run(tmp_path / "plain" / revision, np.ones((2, 2, len(CLASSES))), TOKENS[i], {"revision": revision})
    plain = load_runs([tmp_path / "plain"])
    assert list(plain) == ["toy"] and plain["toy"].task is None
    both = load_runs([tmp_path / "plain", tmp_path / "tasks"])
    assert list(both) == ["toy", "toy-ioi"]

    report_main([str(tmp_path / "plain"), "--out", str(tmp_path / "plain_report"), "--wandb-mode", "disabled"])
    report_main(
        [
            str(tmp_path / "plain"),
            str(tmp_path / "tasks"),
            "--out",
            str(tmp_path / "both_report"),
            "--wandb-mode",
            "disabled",
        ]
    )
    plain_text = (tmp_path / "plain_report" / "report.md").read_text()
    plain_findings = json.loads((tmp_path / "plain_report" / "findings.json").read_text())
    assert "Task circuits" not in plain_text and "task_" not in plain_text
    assert plain_findings["models"]["toy"]["task"] is None and plain_findings["token_axis"] == {}
    assert "task_capability.png" not in plain_findings["figures"]

    both_text = (tmp_path / "both_report" / "report.md").read_text()
    both_findings = json.loads((tmp_path / "both_report" / "findings.json").read_text())
    # the plain model's own section is the same with the task trajectory beside it
    assert plain_text.split("## toy\n")[1].split("## ")[0] == both_text.split("## toy\n")[1].split("## ")[0]
    assert {"task_capability.png", "token_axis.png"} <= set(both_findings["figures"])
    assert "### toy-ioi: ioi" in both_text
    # on the token axis, beside induction and sinks, with its separation from them
    assert "task_ioi (synthetic) r3 (100M; in (10M, 100M])" in both_text
    assert "| bos_50 (synthetic) | task_ioi (synthetic) | 1.0x |" in both_text
    assert both_findings["token_axis"]["toy-ioi"]["events"]["task_ioi (synthetic)"]["revision"] == "r3"


def test_the_task_figures_start_at_zero_tokens_and_say_what_they_show(ioi, tmp_path, monkeypatch):
    made = {}
    save = figures._save
    monkeypatch.setattr(figures, "_save", lambda fig, path: made.setdefault(path.name, fig) and save(fig, path))
    findings = panel_findings(ioi, 30.0, 50.0)
    figures.task_capability(findings, tmp_path)
    figures.token_axis(findings, tmp_path)
    assert set(made) == {"task_capability.png", "token_axis.png"}
    capability = [ax for ax in made["task_capability.png"].axes if ax.axison]
    assert [ax.get_ylabel() for ax in capability] == list(SUMMARY_METRICS["ioi"])
    (task_panel,) = made["token_axis.png"].axes  # no measure of token_axis.drawn(): the task's panel alone
    for ax in [*capability, task_panel]:
        assert ax.get_xlim()[0] == 0 and ax.get_xlabel() == "training tokens"
        assert ax.get_ylabel()
    # the emergence (r3) drawn on every panel, and on the top-1 panel the level
    assert all(any(line.get_xdata()[0] == 1e8 for line in ax.lines) for ax in [*capability, task_panel])
    assert any(list(line.get_ydata()) == [0.5, 0.5] for line in capability[0].lines)


def test_our_sweep_beside_the_published_one_says_over_how_many_distinct_draws(tmp_path):
    def result(name: str, kind: str, top1: float, seed: int | None = None) -> ConditionResult:
        return ConditionResult(
            name=name,
            kind=kind,
            screen="name_mover",
            seed=seed,
            heads=["L13H1"],
            metrics=metrics("ioi", {}),
            delta={"top1": top1, "logit_diff_mean": 10 * top1},
        )

    draws = [
        result(f"matched_random_seed:name_mover:{s}", "matched_random_seed", d, s) for s, d in enumerate([-0.01, 0.03])
    ]
    sweep = screen_sweep("ioi", result("screen:name_mover", "screen", -0.2), {13: [1]}, draws, n_heads=8, absent=None)
    study_run(
        tmp_path / "runs",
        "ioi",
        ablation=TaskAblation(task="ioi", n_prompts=500, conditions=OUR_IOI, sweeps=[sweep], not_run=[]),
    )
    report_main([str(tmp_path / "runs"), "--out", str(tmp_path / "report"), "--wandb-mode", "disabled"])
    assert (
        "Sweep `name_mover` top1: published +7.2 pp vs +2.70 +- 4.05 pp; ours -20.0 pp vs +1.00 +- - pp over 2 "
        "distinct draws."
    ) in (tmp_path / "report" / "report.md").read_text()
