"""Typed records: one to_json / from_json; summary.json is RunSummary's; an old schema is one line."""

import json
from dataclasses import dataclass, field

import pytest

from cli import run_cli
from emergence.ablation import AblationResult, ControlSet, Effect, Metrics
from emergence.config import compose_config
from emergence.main import analyse
from emergence.record import Record
from emergence.results import SCHEMA_VERSION, SUMMARY_FILE, RunSummary, is_done, read_run

SMALL = ["probe=paper", "probe.n_sequences=32", "probe.seq_len=64", "probe.vocab_low=10",
         "probe.vocab_high=500", "probe.batch_size=8", "model.dtype=float32", "wandb.mode=disabled"]


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
    assert json.loads(text) == {"name": "x", "one": {"value": 1.5}, "maybe": None,
                                "many": [{"value": 2.0}, {"value": 3.0}], "plain": {"a": [1, 2]}}
    back = Outer.from_json(json.loads(text))
    assert back == record and isinstance(back.many[1], Inner)


def test_an_ablation_result_survives_json():
    metrics = Metrics(2.0, 0.25, 0.5, 3.0)
    result = AblationResult(True, "zero", 3.0, "all", metrics, circuit=Metrics(4.0, 0.0, 0.1, 1.0),
                            controls=[ControlSet(["L1H0"], metrics)], effect=Effect(2.0, 0.0, None, True))
    assert AblationResult.from_json(json.loads(json.dumps(result.to_json()))) == result


def test_summary_json_is_the_run_summary_and_an_old_schema_is_one_line(tiny_dirs, tmp_path):
    run = tmp_path / "run"
    cfg = compose_config(["model=local", f"model.name_or_path={tiny_dirs['olmo']}", *SMALL, "ablate.heads=[L1H2]"])
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
    assert not is_done(run, summary.config_digest)  # resume=true reruns it
    res = run_cli(tmp_path, "--out", tmp_path / "report", "--wandb-mode", "disabled", module="emergence.report")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith(f"error: {run}: summary.json has schema 1") and "rerun its job" in line
    assert not (tmp_path / "report").exists()
