"""Precision: float64 means over sequences, the dtypes' measured error, heads a rounding could flip."""

import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest

from emergence.core.config import compose_config
from emergence.main import analyse
from emergence.panel.report import write_report
from emergence.panel.runs import Checkpoint, load_runs
from emergence.recipe.pass_record import sequence_mean
from emergence.recipe.screen import CLASSES, DTYPE_RELATIVE_ERROR, class_thresholds, near_threshold, selectivity
from emergence.run.results import PER_SEQUENCE_FILE, dtype_differs, read_run
from tests.helpers.cli import SMALL_RUN
from tests.unit.test_report import write_checkpoint

DOCS = Path(__file__).parents[2] / "docs"


def exact_mean(per_sequence: np.ndarray) -> np.ndarray:
    """[n, ...] -> [...] correctly rounded means (math.fsum), an accumulation independent of numpy's."""
    flat = per_sequence.reshape(per_sequence.shape[0], -1).astype(float)
    return np.array([math.fsum(column) / len(column) for column in flat.T]).reshape(per_sequence.shape[1:])


def test_sequence_mean_accumulates_in_float64():
    rng = np.random.default_rng(0)
    per_sequence = (rng.random((4000, 3, 7)) * 0.01).astype(np.float32)
    exact = exact_mean(per_sequence)
    assert sequence_mean(per_sequence).dtype == np.float64
    np.testing.assert_allclose(sequence_mean(per_sequence), exact, rtol=1e-12)
    # what it replaces: numpy's float32 mean over axis 0 adds one sequence at a time
    assert np.abs(per_sequence.mean(axis=0) / exact - 1).max() > 1e-6


@pytest.mark.parametrize("arch", ["gpt_neox", "olmo", "olmoe", "llama"])
def test_selectivities_equal_a_float64_computation_on_the_stored_attentions(arch, tiny_dirs, tmp_path):
    """heads.csv's selectivities and mean attentions vs the correctly rounded means of the stored
    float32 per-sequence attentions (per_sequence.npz), to 1e-6, over 500 sequences."""
    small = [o for o in SMALL_RUN if not o.startswith("probe.n_sequences")]
    analyse(
        compose_config(
            [
                "model=local",
                f"model.name_or_path={tiny_dirs[arch]}",
                *small,
                "probe.n_sequences=500",
                "stats.n_boot=100",
                "ablate.enabled=false",
            ]
        ),
        tmp_path,
    )
    _, rows = read_run(tmp_path)
    with np.load(tmp_path / PER_SEQUENCE_FILE) as npz:
        targets = npz["targets"]
    assert targets.dtype == np.float32 and targets.shape[0] == 500
    mean = exact_mean(targets)
    sel = selectivity(mean)
    for r in rows:
        l, h = r["layer"], r["head"]
        np.testing.assert_allclose([r[f"sel_{c}"] for c in CLASSES], sel[l, h], rtol=1e-6)
        np.testing.assert_allclose([r[f"attn_{c}"] for c in CLASSES] + [r["attn_baseline"]], mean[l, h], rtol=1e-6)


BF16 = DTYPE_RELATIVE_ERROR["bfloat16"]


def hand_made_sel(values: dict[tuple[int, str], float]) -> np.ndarray:
    """[1, heads, 6] selectivities, 1x except the given (head, class) values."""
    sel = np.ones((1, 1 + max(h for h, _ in values), len(CLASSES)))
    for (head, cls), value in values.items():
        sel[0, head, CLASSES.index(cls)] = value
    return sel


def test_the_measured_errors_are_the_ones_near_threshold_uses():
    worst = json.loads((DOCS.parent / "benchmarks/results/dtype_error_cpu.json").read_text())["dtype"]["worst"]
    for dtype, measured in worst.items():
        assert measured["selectivity"] <= DTYPE_RELATIVE_ERROR[dtype] <= 2 * measured["selectivity"], dtype


def test_a_head_within_the_bfloat16_error_of_30x_is_near_threshold_and_one_far_from_it_is_not():
    sel = hand_made_sel(
        {
            (0, "bos"): 30 * (1 + BF16 / 2),  # its class and BOS membership could flip
            (1, "bos"): 30 * (1 - BF16 / 2),  # ... from below
            (2, "previous_token"): 45.0,  # far from 30x
            (3, "induction"): 50 * (1 + BF16 / 2),  # far from 30x, near the 50x circuit
            (4, "self"): 300.0,
            (4, "local"): 30.3,
        }
    )  # a second class's membership near 30x
    near = near_threshold(sel, class_thresholds(30.0), 50.0, BF16)
    assert near[0].tolist() == [True, True, False, True, True]
    # by hand: |s - t| <= error x s for some class threshold t or the circuit's
    assert near_threshold(sel, class_thresholds(30.0), 50.0, DTYPE_RELATIVE_ERROR["float16"])[0].tolist() == [
        abs(30 * BF16 / 2) <= 6e-3 * 30 * (1 + BF16 / 2),
        abs(30 * BF16 / 2) <= 6e-3 * 30 * (1 - BF16 / 2),
        False,
        False,
        abs(30.3 - 30) <= 6e-3 * 30.3,
    ]


def test_a_run_marks_its_near_threshold_heads_and_states_its_dtype_against_the_reference(tiny_dirs, tmp_path, caplog):
    """A float32 run with the class threshold set just under one head's best selectivity (within
    float32's error) and model.reference_dtype=float16: that head alone is marked, summary.json counts
    it and records both dtypes, and the report lines say they differ."""
    model = [
        "model=local",
        f"model.name_or_path={tiny_dirs['gpt_neox']}",
        *SMALL_RUN,
        "stats.n_boot=100",
        "ablate.enabled=false",
    ]
    analyse(compose_config(model), tmp_path / "plain")
    _, rows = read_run(tmp_path / "plain")
    best = [max(r[f"sel_{c}"] for c in CLASSES) for r in rows]
    target = int(np.argmax(best))
    threshold = best[target] * (1 - DTYPE_RELATIVE_ERROR["float32"] / 2)
    assert all(abs(b - threshold) > 1e-3 * b for i, b in enumerate(best) if i != target)  # the others are far
    with caplog.at_level(logging.INFO):
        summary = analyse(
            compose_config(
                [
                    *model,
                    f"threshold.class_default={threshold}",
                    "threshold.circuit=1e6",
                    "model.reference_dtype=float16",
                ]
            ),
            tmp_path / "near",
        )
    _, rows = read_run(tmp_path / "near")
    assert [r["near_threshold"] for r in rows] == [i == target for i in range(len(rows))]
    name = f"L{rows[target]['layer']}H{rows[target]['head']}"
    assert summary.near_threshold.to_json() == {
        "relative_error": DTYPE_RELATIVE_ERROR["float32"],
        "count": 1,
        "heads": [name],
    }
    assert (summary.dtype, summary.reference_dtype) == ("float32", "float16")
    assert "dtype float32, the reference study's float16" in caplog.text and "near a threshold" in caplog.text
    plain = read_run(tmp_path / "plain")[0]
    assert plain.reference_dtype is None and not dtype_differs(plain.dtype, plain.reference_dtype)


def test_the_panel_report_states_the_dtypes_and_lists_near_threshold_heads(tmp_path):
    """Run directories in bfloat16 of a model the study ran in float16: report.md says so and lists,
    per revision, the heads within bfloat16's error of a threshold."""
    sel = [
        hand_made_sel({(0, "bos"): 31.0, (1, "induction"): 80.0}),  # L0H0 near 30x (3%: no)
        hand_made_sel({(0, "bos"): 30.3, (1, "induction"): 50.5}),
    ]  # both near
    for i, s in enumerate(sel):
        write_checkpoint(
            tmp_path / "runs" / f"r{i}",
            Checkpoint(f"r{i}", 1e6 * 10**i, s),
            {
                "model": "m",
                "revision": f"r{i}",
                "tokens": 1e6 * 10**i,
                "step": None,
                "n_layers": 1,
                "n_heads": 2,
                "dtype": "bfloat16",
                "reference_dtype": "float16",
            },
        )
    write_report(load_runs([tmp_path / "runs"]), tmp_path / "report", 30.0, 50.0, reference=False)
    text = (tmp_path / "report" / "report.md").read_text()
    assert "| r0 | 1M | 50.0 | 1 | 100.0% | 100.0% | none |" in text
    assert "| r1 | 10M | 50.0 | 1 | 100.0% | 100.0% | L0H0, L0H1 |" in text
    assert "these runs used bfloat16, the study float16" in text and "bfloat16 moves a selectivity by up to 2%" in text


def test_a_milestone_next_to_near_threshold_heads_says_it_depends_on_them(tmp_path):
    from emergence.panel.findings import model_findings
    from emergence.panel.runs import Trajectory

    def revision(name, tokens, bos):  # two heads: L0H0's first-token selectivity varies
        return Checkpoint(name, tokens, hand_made_sel({(0, "bos"): bos, (1, "self"): 2.0}), dtype="bfloat16")

    # BOS-50% (L0H0 a BOS head) is first reached at r1, 30.3x: within bfloat16's 2% of 30x.
    near = model_findings(
        Trajectory("m", [revision("r0", 1e6, 5.0), revision("r1", 1e7, 30.3), revision("r2", 1e8, 90.0)], None),
        30.0,
        50.0,
    )
    assert near.f3.bos_50.revision == "r1"
    assert near.f3.bos_50.near_threshold_heads == ["L0H0"]
    far = model_findings(Trajectory("m", [revision("r0", 1e6, 5.0), revision("r1", 1e7, 60.0)], None), 30.0, 50.0)
    assert far.f3.bos_50.revision == "r1" and far.f3.bos_50.near_threshold_heads is None
    from emergence.panel.markdown import milestone_text

    assert "depends on heads near a threshold: L0H0" in milestone_text(near.f3.bos_50)
