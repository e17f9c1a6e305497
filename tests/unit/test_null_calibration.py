"""The null floor's rules (``stats.null_rule``): the reference pools every head, ``nondegenerate``
sets aside the heads with a degenerate baseline; and the warnings of thresholds below the floor."""

import logging
import re

import numpy as np
import pytest
import torch

from emergence.core.config import compose_config
from emergence.core.errors import UsageError
from emergence.main import analyse
from emergence.recipe.probe import baseline_positions, make_probe_batch
from emergence.recipe.screen import CLASSES, class_thresholds, classify, selectivity
from emergence.recipe.stats import below_floor, degenerate_baseline, null_calibration
from emergence.run.results import read_run
from emergence.run.validation import validate
from tests.helpers.reference_impl import eager_model, eager_targets
from tests.helpers.tiny_models import save_tiny_model_with_a_sink_head
from tests.unit.test_stats import SMALL, N, T, reference_null_positions


def test_the_default_rule_is_nondegenerate_and_a_bad_rule_is_a_one_line_error():
    assert compose_config([]).stats.null_rule == "nondegenerate"
    validate(compose_config(["stats.null_rule=reference"]))
    with pytest.raises(UsageError, match=r"^stats.null_rule='pooled' is invalid: use one of nondegenerate, reference$"):
        validate(compose_config(["stats.null_rule=pooled"]))


def test_a_baseline_is_degenerate_under_a_thousandth_of_uniform_attention():
    seq_len = 128
    cutoff = 1 / seq_len / 1000
    baseline = np.array([[cutoff * 0.99, cutoff * 1.01, 1e-9, 1 / seq_len]])
    assert degenerate_baseline(baseline, seq_len).tolist() == [[True, False, True, False]]


def hand_made_null(n: int = 40, draws: int = 300, seq_len: int = 64):
    """[1, 2] heads: L0H0 ordinary (baseline 1/T, null draws log-normal around it), L0H1 degenerate
    (baseline 1e-9, draws in the softmax's far tail: mostly ~1e-9, a few a thousand times that)."""
    rng = np.random.default_rng(4)
    baseline = np.array([[1 / seq_len, 1e-9]])
    ordinary = baseline[0, 0] * rng.lognormal(0.0, 0.6, size=draws)
    degenerate = 1e-9 * rng.lognormal(0.0, 1.0, size=draws) * np.where(rng.random(draws) < 0.05, 1e3, 1.0)
    means = np.stack([ordinary, degenerate])[None]  # [1, 2, draws]: mean attention per draw
    return means * n, baseline, n, seq_len


def test_the_nondegenerate_floor_is_the_ordinary_heads_and_the_reference_floor_pools_all():
    null_sums, baseline, n, seq_len = hand_made_null()
    ordinary = null_sums[0, 0] / n / baseline[0, 0]
    degenerate = null_sums[0, 1] / n / 1e-8  # the selectivity's floor on a baseline
    everything = np.concatenate([ordinary, degenerate])
    ours = null_calibration(null_sums, baseline, n, seq_len, "nondegenerate")
    ref = null_calibration(null_sums, baseline, n, seq_len, "reference")

    assert ours.rule == "nondegenerate" and ours.pooled_heads == 1 and ours.set_aside == {"L0H1": 1e-9}
    assert ours.p95 == pytest.approx(np.quantile(ordinary, 0.95), rel=1e-12)
    assert ours.p99 == pytest.approx(np.quantile(ordinary, 0.99), rel=1e-12)
    assert ours.floor == pytest.approx(max(2.0, np.quantile(ordinary, 0.99)), rel=1e-12) and ours.floor > 2
    assert ref.rule == "reference" and ref.pooled_heads == 2 and ref.set_aside == {}
    assert ref.p95 == np.percentile(everything, 95) and ref.p99 == np.percentile(everything, 99)
    assert ref.floor == max(2.0, np.percentile(everything, 99)) and ref.floor > 10 * ours.floor  # captured
    for calibration in (ours, ref):  # per head and the degenerate mark do not depend on the rule
        np.testing.assert_array_equal(
            calibration.per_head_p99, [[np.percentile(ordinary, 99), np.percentile(degenerate, 99)]]
        )
        assert calibration.degenerate.tolist() == [[False, True]]
    summary = ours.as_summary()
    assert summary.set_aside == {"L0H1": 1e-9} and summary.degenerate_below == pytest.approx(1e-3 / seq_len)
    assert "nondegenerate" == summary.rule and "1/T" in summary.definition


def test_no_floor_when_every_head_is_degenerate():
    null_sums, baseline, n, seq_len = hand_made_null()
    calibration = null_calibration(null_sums[:, 1:], baseline[:, 1:], n, seq_len, "nondegenerate")
    assert (calibration.p95, calibration.p99, calibration.floor, calibration.pooled_heads) == (None, None, None, 0)
    assert below_floor(classify(np.ones((1, 1, 6)), class_thresholds(1.0), 1.0), class_thresholds(1.0), 1.0, None) == []


def test_a_threshold_below_the_floor_names_the_heads_it_admits_under_the_floor():
    sel = np.ones((2, 2, 6))
    induction, self_ = CLASSES.index("induction"), CLASSES.index("self")
    sel[0, 0, induction] = 3.0  # admitted at 2x, under the floor of 5x
    sel[0, 1, induction] = 10.0  # admitted, but above the floor: not named
    sel[1, 1, self_] = 4.0  # a member at 3x, under the floor
    thresholds = class_thresholds(30.0, {"induction": 2.0, "self": 3.0, "local": 1.5})  # local admits nobody
    scr = classify(sel, thresholds, 2.5)
    assert below_floor(scr, thresholds, 2.5, 5.0) == [
        "induction=2x admits L0H0 (3x)",
        "self=3x admits L1H1 (4x)",
        "circuit=2.5x admits L0H0 (3x)",
    ]
    assert below_floor(scr, thresholds, 2.5, 2.0) == []  # every threshold at or above the floor


@pytest.fixture(scope="module")
def sink_model(tmp_path_factory):
    """The tiny GPT-2 with a hand-made sink head L0H1, and an independent null of it (eager attention,
    the reference's draws): baselines [layers, heads] and null selectivities [layers, heads, draws]."""
    path = tmp_path_factory.mktemp("sink") / "gpt2"
    save_tiny_model_with_a_sink_head(path)
    batch = make_probe_batch(N, T, 10, 500, 42)
    model = eager_model(path)
    with torch.no_grad():
        attentions = model(batch.tokens, output_attentions=True).attentions
    rows_last = np.stack([a[:, :, T - 1, :].double().numpy() for a in attentions], 1)  # [n, layers, heads, T]
    baseline = rows_last[:, :, :, baseline_positions(T, 50)].mean(-1).mean(0)
    positions = reference_null_positions(batch.ab.numpy(), T, 40)
    null = np.stack([rows_last[np.arange(N), :, :, positions[d]].mean(0) for d in range(40)], -1)
    sel = selectivity(eager_targets(model, batch.tokens, batch.ab.numpy(), baseline_positions(T, 50)).mean(0))
    return path, baseline, null / np.maximum(baseline, 1e-8)[..., None], sel


def run(path, out, *overrides):
    cfg = compose_config(["model=local", f"model.name_or_path={path}", *SMALL, *overrides])
    return analyse(cfg, out), read_run(out)[1]


def test_a_sink_head_does_not_make_the_floor_and_is_named(sink_model, tmp_path, caplog):
    path, baseline, null_sel, _ = sink_model
    degenerate = baseline < 1e-3 / T
    assert degenerate.sum() == 1 and degenerate[0, 1] and baseline[0, 1] < 1e-6  # the hand-made head alone
    ordinary = null_sel[~degenerate]  # [7 heads, draws]
    pooled = np.percentile(null_sel, 99)
    # Thresholds between the two floors: the reference rule's (the sink's draws) is above them.
    thresholds = ["threshold.class_default=3", "threshold.circuit=3"]
    assert max(2.0, np.quantile(ordinary, 0.99)) < 3 < max(2.0, pooled)

    with caplog.at_level(logging.INFO, logger="emergence.main"):
        summary, rows = run(path, tmp_path / "nondegenerate", *thresholds)
    null = summary.null
    assert null.rule == "nondegenerate" and null.pooled_heads == 7
    assert list(null.set_aside) == ["L0H1"] and null.set_aside["L0H1"] == pytest.approx(baseline[0, 1], rel=1e-3)
    assert null.p95 == pytest.approx(np.quantile(ordinary, 0.95), rel=1e-4)
    assert null.p99 == pytest.approx(np.quantile(ordinary, 0.99), rel=1e-4)
    assert null.floor == pytest.approx(max(2.0, np.quantile(ordinary, 0.99)), rel=1e-4)
    assert summary.threshold_warnings == []
    logged = [r.getMessage() for r in caplog.records]
    assert not [m for m in logged if m.startswith("warning")]
    assert any(
        m.startswith("null (nondegenerate rule, 40 draws of 7 heads)") and m.endswith("/T): L0H1") for m in logged
    )
    assert [(r["layer"], r["head"]) for r in rows if r["degenerate_baseline"]] == [(0, 1)]

    reference, reference_rows = run(path, tmp_path / "reference", *thresholds, "stats.null_rule=reference")
    null = reference.null
    assert null.rule == "reference" and null.pooled_heads == 8 and null.set_aside == {}
    assert null.p95 == pytest.approx(np.percentile(null_sel, 95), rel=1e-4)
    assert null.p99 == pytest.approx(pooled, rel=1e-4)
    assert null.floor == pytest.approx(max(2.0, pooled), rel=1e-4)
    # Every threshold is below this floor, but no head lies between a threshold and the floor.
    assert admitted_under_the_floor(sink_model[3], 3, 3, null.floor) == {}
    assert reference.threshold_warnings == []
    for ours, theirs in zip(rows, reference_rows):  # the per-head columns do not depend on the rule
        assert ours["null_p99"] == theirs["null_p99"] and ours["degenerate_baseline"] == theirs["degenerate_baseline"]
        assert ours["null_p99"] == pytest.approx(np.percentile(null_sel[ours["layer"], ours["head"]], 99), rel=1e-4)


def admitted_under_the_floor(
    sel: np.ndarray, class_threshold: float, circuit_threshold: float, floor: float
) -> dict[str, dict[str, float]]:
    """Per class (and the circuit), the heads whose selectivity is at least the threshold but
    under the floor, with that selectivity."""
    out = {}
    for name in (*CLASSES, "circuit"):
        threshold = circuit_threshold if name == "circuit" else class_threshold
        values = sel[..., CLASSES.index("induction" if name == "circuit" else name)]
        admitted = np.argwhere((values >= threshold) & (values < floor))
        if len(admitted):
            out[name] = {f"L{l}H{h}": values[l, h] for l, h in admitted}
    return out


WARNING = re.compile(r"below the null floor ([\d.]+)x: (\w+)=([\d.]+)x admits (.+)")


def test_the_warnings_name_the_heads_admitted_under_the_floor(sink_model, tmp_path):
    path, _, _, sel = sink_model
    summary, _ = run(path, tmp_path, "threshold.class_default=1.1", "threshold.circuit=1.2")
    floor = summary.null.floor
    named = {"circuit": 1.2, **dict.fromkeys(CLASSES, 1.1)}
    expected = admitted_under_the_floor(sel, 1.1, 1.2, floor)
    assert expected, "the thresholds admit heads under the floor"
    found = {}
    for warning in summary.threshold_warnings:
        match = WARNING.fullmatch(warning)
        assert match and float(match.group(1)) == pytest.approx(floor, abs=0.005)
        assert float(match.group(3)) == named[match.group(2)]
        found[match.group(2)] = {h: float(v) for h, v in re.findall(r"(L\d+H\d+) \(([\d.e+]+)x\)", match.group(4))}
    assert found.keys() == expected.keys()
    for name, heads in expected.items():
        assert found[name].keys() == heads.keys()
        for head, value in heads.items():
            assert found[name][head] == pytest.approx(value, rel=5e-3)


def test_the_panel_report_states_the_null_rule_the_runs_used(tmp_path):
    from emergence.panel.report import write_report
    from emergence.panel.runs import load_runs
    from tests.unit.test_report import toy_trajectory, write_checkpoint

    null_sums, baseline, n, seq_len = hand_made_null()
    made = {
        "r0": null_calibration(null_sums, baseline, n, seq_len, "nondegenerate").as_summary(),
        "r1": null_calibration(null_sums[:, :1], baseline[:, :1], n, seq_len, "nondegenerate").as_summary(),
        "r2": null_calibration(null_sums, baseline, n, seq_len, "reference").as_summary(),
    }
    traj = toy_trajectory()
    for c in traj.checkpoints:
        write_checkpoint(
            tmp_path / "runs" / c.revision,
            c,
            {
                "model": "toy",
                "revision": c.revision,
                "tokens": c.tokens,
                "step": None,
                "n_layers": 2,
                "n_heads": 2,
                "null": made[c.revision],
            },
        )
    findings = write_report(load_runs([tmp_path / "runs"]), tmp_path / "report", 30.0, 50.0, reference=False)
    f = findings.models["toy"].null_floor
    assert {rule: r.revisions for rule, r in f.rules.items()} == {"nondegenerate": ["r0", "r1"], "reference": ["r2"]}
    floors = [made[r].floor for r in ("r0", "r1", "r2")]
    assert f.floor_range == [min(floors), max(floors)] and f.set_aside == {"L0H1": ["r0"]}
    text = (tmp_path / "report" / "report.md").read_text()
    line = next(l for l in text.splitlines() if l.startswith("- **Null floor**"))
    assert "`nondegenerate` at 2 of 3 revisions (floor = max(2," in line and "`reference` at 1 of 3 revisions" in line
    assert f"floors {min(floors):.2f}x to {max(floors):.2f}x" in line and line.endswith(": L0H1 at r0.")
