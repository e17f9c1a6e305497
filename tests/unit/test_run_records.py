"""Typed records: one to_json / from_json; summary.json is RunSummary's; an old schema is one line."""

import csv
import json
import math
import shutil
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import pytest

from emergence.core.config import compose_config
from emergence.core.record import Record
from emergence.main import analyse
from emergence.recipe.ablation import AblationResult, ControlDraw, ControlSet, Effect, Metrics
from emergence.recipe.probe import FirstToken
from emergence.recipe.stats import NullSummary
from emergence.run.results import (
    HEAD_COLUMNS,
    HEADS_FILE,
    SCHEMA_VERSION,
    SUMMARY_FILE,
    DuplicateRun,
    HeadRow,
    RunSummary,
    ablation_lines,
    is_done,
    read_run,
    write_run,
)
from tests.helpers.cli import SMALL_RUN, run_cli
from tests.helpers.run_dirs import run_summary

VERSION_2_RUN = Path(__file__).parent / "data" / "v2_run"  # written by the version before schema 3 (its SOURCE.md)


@dataclass
class Inner(Record):
    value: float


@dataclass
class Outer(Record):
    name: str
    one: Inner
    maybe: Inner | None = None
    many: list[Inner] = field(default_factory=list)
    plain: dict | None = None


def test_a_nested_record_survives_json():
    record = Outer("x", Inner(1.5), None, [Inner(2.0), Inner(3.0)], {"a": [1, 2]})
    text = json.dumps(record.to_json())
    assert json.loads(text) == {
        "name": "x",
        "one": {"value": 1.5},
        "maybe": None,
        "many": [{"value": 2.0}, {"value": 3.0}],
        "plain": {"a": [1, 2]},
    }
    back = Outer.from_json(json.loads(text))
    assert back == record and isinstance(back.many[1], Inner)


def test_a_first_token_of_the_old_spelling_reads_as_the_bos_token():
    old = {"kind": "bos", "bos_id": 1, "reason": "probe.first_token=bos (its tokenizer puts '<s>' (id 1) ...)"}
    assert FirstToken.from_json(old) == FirstToken("bos_token", 1, old["reason"])
    assert FirstToken.from_json(FirstToken("random", None, "r").to_json()).kind == "random"


def test_an_ablation_result_survives_json():
    metrics = Metrics(2.0, 0.25, 0.5, 3.0)
    result = AblationResult(
        True,
        "zero",
        3.0,
        "all",
        metrics,
        circuit=Metrics(4.0, 0.0, 0.1, 1.0),
        controls=[ControlSet(["L1H0"], metrics)],
        effect=Effect(2.0, 0.0, None, True),
    )
    assert AblationResult.from_json(json.loads(json.dumps(result.to_json()))) == result
    result.control_draw = ControlDraw(5, 0, 1, {"L1": "L0"}, 25.0, ["L0H3"], "a note")
    result.controls[0].drawn = "fallback"
    assert AblationResult.from_json(json.loads(json.dumps(result.to_json()))) == result


def test_the_ablation_line_is_over_the_sequences_used_and_signs_print_once():
    """The issue's case: the clean loss over all 200 sequences (8.885) is not the one the rise is
    from (8.819 over the 64 the adaptive run used); a fall prints as -0.075, never +-0.075."""
    result = AblationResult(
        True,
        "zero",
        3.0,
        "adaptive",
        Metrics(8.885, 0.1, 0.2, 3.0),
        circuit=Metrics(8.744, 0.1, 0.2, 3.0),
        controls=[ControlSet(["L0H0"], Metrics(8.919, 0.1, 0.2, 3.0))],
        effect=Effect(8.744 - 8.819, 8.919 - 8.819, None, False),
        sequences_used=64,
        clean_loss_used=8.819,
        control_draw=ControlDraw(5, 3, 0, {}, 25.0, [], "3 distinct control sets ..."),
    )
    assert ablation_lines(result) == [
        "ablation (zero, 64 sequences): loss of B 8.819 -> 8.744 (-0.075); controls +0.100: not causal at 3x",
        "control sets: 3 in-layer, 0 by the fallback, 5 asked; never a control (induction >= 25x): none; "
        "3 distinct control sets ...",
    ]


def test_summary_json_is_the_run_summary_and_an_old_schema_is_one_line(tiny_dirs, tmp_path):
    run = tmp_path / "run"
    cfg = compose_config(["model=local", f"model.name_or_path={tiny_dirs['olmo']}", *SMALL_RUN, "ablate.heads=[L1H2]"])
    summary = analyse(cfg, run)
    written = json.loads((run / SUMMARY_FILE).read_text())
    assert written == summary.to_json() and written["schema_version"] == SCHEMA_VERSION
    assert RunSummary.read(run) == summary
    assert isinstance(read_run(run)[0].ablation.controls[0], ControlSet)

    # A run written under the first schema (no schema_version): the report names it in one line.
    del written["schema_version"]
    (run / SUMMARY_FILE).write_text(json.dumps(written))
    with pytest.raises(ValueError, match="schema 1"):
        RunSummary.read(run)
    assert not is_done(run, summary.config_digest, lambda: summary.weights_sha256)  # resume=true reruns it
    res = run_cli(tmp_path, "--out", tmp_path / "report", "--wandb-mode", "disabled", module="emergence.report")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith(f"error: {run}: summary.json has schema 1") and "rerun its job" in line
    assert not (tmp_path / "report").exists()


def test_heads_csv_reads_back_exactly_through_head_row(tmp_path):
    """Every column of heads.csv, written and read back: ints as ints, booleans as booleans,
    strings as strings, floats bit for bit (NaN, infinities, -0.0 and the last digit included)."""
    awkward = [1 / 3, 2.0**-1074, 1.7976931348623157e308, -0.0, float("nan"), float("inf"), 0.1 + 0.2, 123456789.123]
    by_type = {
        "int": lambda i, k: i + k,
        "float": lambda i, k: awkward[(i + k) % len(awkward)],
        "bool": lambda i, k: (i + k) % 2 == 0,
        "str": lambda i, k: f"name {i} {k}",
        # the task's and the measures' columns follow the screen's
        "dict[str, float]": lambda i, k: {"a_measure": awkward[(i + k) % len(awkward)], "b_measure": -0.0},
    }
    written = [HeadRow(**{f.name: by_type[f.type](i, k) for k, f in enumerate(fields(HeadRow))}) for i in range(3)]
    write_run(tmp_path, written, run_summary(model="m", revision="r", tokens=1, n_layers=1, n_heads=3))
    columns = [*HEAD_COLUMNS, "a_measure", "b_measure"]
    assert (tmp_path / HEADS_FILE).read_text().splitlines()[0] == ",".join(columns)
    _, rows = read_run(tmp_path)
    assert [list(r) for r in rows] == [columns] * 3
    for row, expected in zip(rows, written):
        for column, value in expected.columns().items():
            assert type(row[column]) is type(value) and repr(row[column]) == repr(value), column


def test_heads_csv_of_an_earlier_layout_reads_its_columns_after_the_screens(tmp_path):
    """Runs before the measures' columns wrote every task's columns, empty (NaN) without a task, and no
    measure's: they read as columns after the screen's, and the measures they had not have none."""
    row = HeadRow(
        **{
            f.name: {"int": 0, "float": 1.5, "bool": False, "str": "bos"}[f.type]
            for f in fields(HeadRow)
            if f.name != "measure_columns"
        },
        measure_columns={"value_norm_ratio": 0.25},
    )
    write_run(tmp_path, [row], run_summary(model="m", revision="r", tokens=1, n_layers=1, n_heads=1))
    lines = (tmp_path / HEADS_FILE).read_text().splitlines()
    assert lines[0].split(",") == [*HEAD_COLUMNS, "value_norm_ratio"]  # the measures' columns follow the screen's
    cut = len(HEAD_COLUMNS)
    old = [
        ",".join([*cells.split(",")[:cut], *extra])
        for cells, extra in zip(lines, (["io_attn", "other_attn"], ["nan"] * 2))
    ]
    (tmp_path / HEADS_FILE).write_text("\n".join(old) + "\n")
    (read,) = read_run(tmp_path)[1]
    assert read["sel_bos"] == 1.5 and math.isnan(read["io_attn"]) and math.isnan(read["other_attn"])
    assert "value_norm_ratio" not in read  # a measure the run had not: no column (the panel draws nothing of it)


def test_a_version_2_run_directory_reads_as_typed_records_and_is_reported(tmp_path):
    """Schema 3 types the parts schema 2 wrote as plain objects, under the same keys; schemas 4 and 5 move
    per-run numbers into ``measures``: a run directory of version 2 reads as the same JSON but for those,
    now the measures' fields, and the report reports it."""
    written = json.loads((VERSION_2_RUN / SUMMARY_FILE).read_text())
    assert written["schema_version"] == 2 and "copy_loss_drop" not in written
    summary, rows = read_run(VERSION_2_RUN)
    # no task before schema 3: the probe's task settings read as their defaults; no first token, GGUF,
    # probe fit or control_draw record before them (the report reads a missing first token as random, the study's);
    # a run before probe.loss_curve measured every position's loss: it reads as all; its massive activations
    # read as the massive_activations measure's fields (``Measure.legacy``)
    layers = written["massive_activations"]
    renamed = {
        **written,
        "task": None,
        "gguf": None,
        "probe_fit": None,
        "measures": {
            "sink_importance": written["sink_metric"],
            "massive_activations": {"layers": layers, "top_ratio": max(r["ratio"] for r in layers)},
        },
        "probe": {
            **written["probe"],
            "task": None,
            "task_prompts": None,
            "task_top_k": 5,
            "task_words": "auto",
            "first_token": "auto",
            "first": None,
            "loss_curve": "all",
            "fit": "auto",
        },
        "ablation": {**written["ablation"], "control_draw": None},
        "measure_sources": {},
    }
    # its text and repeat probes' scores (None: a synthetic run) are the icl and repeat_loss measures' of today
    del renamed["icl_score"], renamed["massive_activations"], renamed["text"], renamed["repeat"], renamed["sink_metric"]
    assert summary.to_json() == renamed
    assert isinstance(summary.null, NullSummary) and summary.null.floor == written["null"]["floor"]
    assert summary.probe.n_sequences == 16
    assert summary.thresholds.circuit == 50.0 and summary.download.prefetched is False
    assert summary.intervals.class_counts == written["intervals"]["class_counts"]
    # its key-0 importance, value drain and prefix-matching columns read as the measures' of those names
    assert len(rows) == 2 * 4
    assert list(rows[0]) == [*HEAD_COLUMNS, "sink_importance", "value_norm_ratio", "prefix_matching"]
    assert is_done(VERSION_2_RUN, written["config_digest"], lambda: written["weights_sha256"])  # resume=true keeps it

    # As a toy's run: its copy loss drop under the old name reaches the report under the new one.
    shutil.copytree(VERSION_2_RUN, tmp_path / "runs" / "main")
    (tmp_path / "runs" / "main" / SUMMARY_FILE).write_text(json.dumps({**written, "icl_score": 1.25}))
    res = run_cli(
        tmp_path / "runs", "--out", tmp_path / "report", "--wandb-mode", "disabled", module="emergence.report"
    )
    assert res.returncode == 0, res.stderr[-2000:]
    findings = json.loads((tmp_path / "report" / "findings.json").read_text())
    (row,) = findings["models"]["local"]["revisions"]
    assert (row["revision"], row["tokens"], row["null"]) == ("main", 1000, written["null"])
    assert row["run_values"] == {"copy_loss_drop": 1.25}
    assert "copy loss drop (nats) |" in (tmp_path / "report" / "report.md").read_text()


def test_a_version_4_summary_reads_its_per_run_numbers_as_the_measures_of_today(tmp_path):
    """Schema 5 moved summary.json's ``text``, ``repeat``, ``sink_metric`` and ``copy_loss_drop`` into
    ``measures`` (``Measure.legacy``)."""
    text = {
        "loss_by_position": [None, 2.5, 2.0],
        "icl_positions": [1, 2],
        "icl_score": -0.5,
        "icl_score_ci": [-0.6, -0.4],
        "source": "book.txt",
        "tokenizer": "bytes",
    }
    repeat = {"span": 4, "first_copy_loss": 3.0, "later_copy_loss": 1.0, "loss_drop": 2.0, "loss_drop_ci": [1.5, 2.5]}
    written = run_summary(model="m", revision="r", tokens=1, n_layers=1, n_heads=1).to_json()
    sinks = {"epsilon": 0.3, "fraction": 0.25, "fraction_ci": [0.2, 0.3], "per_layer": [0.5, 0.0], "definition": "d"}
    for old in ({"text": text, "repeat": None}, {"text": None, "repeat": repeat}):
        numbers = {**old, "sink_metric": sinks, "copy_loss_drop": 1.5}
        (tmp_path / SUMMARY_FILE).write_text(json.dumps({**written, "schema_version": 4, "measures": {}, **numbers}))
        read = RunSummary.read(tmp_path)
        assert read.measures == {
            "sink_importance": sinks,
            **{name: v for name, v in (("icl", old["text"]), ("repeat_loss", old["repeat"])) if v},
            "training_copy_loss": {"copy_loss_drop": 1.5},
        }


def test_a_duplicates_summary_carries_the_schema_and_reads_under_the_same_rule(tmp_path):
    duplicate = DuplicateRun(SCHEMA_VERSION, "m", "org/m", None, "step2", 2, 2000, "step3", "ab" * 32, "digest")
    duplicate.save(tmp_path)
    assert DuplicateRun.read(tmp_path) == duplicate and is_done(tmp_path, "digest", lambda: "ab" * 32)
    for schema in (2, 1):  # version 2 wrote the same keys; version 1's is another schema: rerun
        (tmp_path / SUMMARY_FILE).write_text(json.dumps({**duplicate.to_json(), "schema_version": schema}))
        assert is_done(tmp_path, "digest", lambda: "ab" * 32) == (schema == 2)


def test_a_finished_run_on_weights_changed_since_is_not_done(tmp_path):
    """resume=true keeps a run only on the weights it measured; where they cannot be named now (a Hub
    revision gone from the cache, offline) the run stands; the weights are asked only after the config."""
    DuplicateRun(SCHEMA_VERSION, "m", "org/m", None, "step2", 2, 2000, "step3", "ab" * 32, "digest").save(tmp_path)
    assert is_done(tmp_path, "digest", lambda: "ab" * 32)
    assert not is_done(tmp_path, "digest", lambda: "cd" * 32)
    assert is_done(tmp_path, "digest", lambda: None)
    asked = []
    assert not is_done(tmp_path, "other digest", lambda: asked.append(1))
    assert not asked


class Run:
    """What ``tracking.log_checkpoint`` calls on a W&B run, keeping what it logs."""

    def __init__(self):
        self.logged, self.summary = {}, {}

    def define_metric(self, *args, **kwargs):
        pass

    def log(self, metrics):
        self.logged.update(metrics)


def test_the_toys_copy_loss_drop_reaches_w_and_b_under_its_name():
    import matplotlib.pyplot as plt

    from emergence.run.tracking import log_checkpoint

    with open(VERSION_2_RUN / HEADS_FILE, newline="") as f:
        rows = [HeadRow.from_columns(r) for r in csv.DictReader(f)]
    read = RunSummary.read(VERSION_2_RUN)
    toy = replace(read, measures={**read.measures, "training_copy_loss": {"copy_loss_drop": 1.25}})
    run, figure = Run(), plt.figure()
    log_checkpoint(run, toy, rows, figure)
    plt.close(figure)
    assert run.summary["training_copy_loss/copy_loss_drop"] == 1.25 and "icl_score" not in run.summary
    heads = run.logged["heads"]  # the measures' columns after the screen's
    assert heads.columns == [*HEAD_COLUMNS, "sink_importance", "value_norm_ratio", "prefix_matching"]
    assert len(heads.data) == len(rows)


def test_a_task_sweep_reaches_w_and_b_in_its_units():
    """The verdict metric's changes in its own units, top-1's in percentage points, for the user's heads too."""
    import matplotlib.pyplot as plt

    from emergence.recipe.tasks.ablation import ConditionResult, TaskAblation, screen_sweep
    from emergence.recipe.tasks.metrics import SUMMARY_METRICS, MetricValue, TaskMetrics
    from emergence.recipe.tasks.step import TaskSummary
    from emergence.run.tracking import log_checkpoint

    metrics = TaskMetrics(
        task="ioi",
        n_prompts=5,
        n_boot=1,
        ci_level=0.9,
        seed=0,
        metrics={m: MetricValue(0.5, [0.4, 0.6]) for m in SUMMARY_METRICS["ioi"]},
    )

    def result(kind, ld, top1, seed=None):
        return ConditionResult(
            name=f"{kind}:{seed}",
            kind=kind,
            screen=None if kind == "user" else "user",
            seed=seed,
            heads=["L0H0"],
            metrics=metrics,
            delta={"logit_diff_mean": ld, "top1": top1},
        )

    draws = [result("matched_random_seed", -0.1 * s, 0.01 * s, s) for s in range(3)]
    sweep = screen_sweep("ioi", result("user", -2.0, -0.3), {0: [0]}, draws, n_heads=4, absent=None)
    task = TaskSummary(
        name="ioi",
        n_prompts=5,
        seq_len=14,
        tokenizer="t",
        prompts_sha1="s",
        fingerprint="f",
        metrics=metrics,
        screens={},
        circuits={"previous_token": [], "induction": []},
        ablation=TaskAblation(task="ioi", n_prompts=5, conditions=[], sweeps=[sweep], not_run=[]),
    )

    with open(VERSION_2_RUN / HEADS_FILE, newline="") as f:
        rows = [HeadRow.from_columns(r) for r in csv.DictReader(f)]
    run, figure = Run(), plt.figure()
    log_checkpoint(run, replace(RunSummary.read(VERSION_2_RUN), task=task), rows, figure)
    plt.close(figure)
    assert run.summary["task/ioi/user/logit_diff_mean_delta"] == -2.0
    assert run.summary["task/ioi/user/logit_diff_mean_random_delta"] == pytest.approx(-0.1)
    assert run.summary["task/ioi/user/top1_delta_pp"] == pytest.approx(-30.0)
    assert run.summary["task/ioi/user/top1_random_delta_pp"] == pytest.approx(1.0)


def test_the_plug_in_measures_reach_w_and_b():
    """A registered measure's per-run fields as <name>/<field>, its columns in the head table."""
    import matplotlib.pyplot as plt

    from emergence.run.tracking import log_checkpoint

    with open(VERSION_2_RUN / HEADS_FILE, newline="") as f:
        rows = [
            replace(HeadRow.from_columns(r), measure_columns={"ov_copying": 0.25 * i, "qk_sigma1": 2.0})
            for i, r in enumerate(csv.DictReader(f))
        ]
    summary = replace(RunSummary.read(VERSION_2_RUN), measures={"weight_circuits": {"copying_heads": 3.0}})
    run, figure = Run(), plt.figure()
    log_checkpoint(run, summary, rows, figure)
    plt.close(figure)
    assert run.logged["weight_circuits/copying_heads"] == 3.0
    table = run.logged["heads"]
    assert table.columns == [*HEAD_COLUMNS, "ov_copying", "qk_sigma1"]
    assert [row[-2] for row in table.data] == [0.25 * i for i in range(len(rows))]
