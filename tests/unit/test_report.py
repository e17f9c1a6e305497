"""The panel report reproduces docs/method.md section 7 from the reference study's data, and
gives the same numbers from run directories written in our own format."""

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest

from emergence.core.config import StatsConfig
from emergence.panel.findings import f2_shape, model_findings, panel_findings
from emergence.panel.records import BosShape, Milestone, PanelFindings, SinkShape
from emergence.panel.report import main as report_main
from emergence.panel.report import parse_args as report_args
from emergence.panel.runs import REFERENCE_DATA, Checkpoint, Trajectory, load_reference, load_runs
from emergence.panel.sensitivity import GRID, dense
from emergence.panel.uncertainty import replicates
from emergence.recipe.screen import CLASSES, class_thresholds, classify
from emergence.recipe.stats import screen_intervals
from emergence.run.results import HeadValues, format_tokens, head_rows, write_run
from tests.helpers.run_dirs import run_summary

REFERENCE = REFERENCE_DATA  # the study's per-head results, installed with the package (its SOURCE.md)

BOS_PCT = {
    "pythia": [0, 0, 0, 0, 0, 0, 10.9, 29.7, 46.1, 57.8],
    "olmo": [0, 0, 0.4, 0, 0, 7.4, 70.3, 77.7, 80.9, 80.9],
    "olmoe": [3.5, 15.6, 42.2, 43.4, 50.8, 69.9, 71.5, 73.0, 74.2, 75.8],
}
N_INDUCTION = {
    "pythia": [0, 0, 0, 0, 0, 0, 5, 4, 4, 3],
    "olmo": [0, 0, 1, 3, 2, 3, 3, 3, 2, 3],
    "olmoe": [5, 5, 6, 5, 5, 3, 3, 4, 4, 4],
}


def check_method_numbers(findings: PanelFindings) -> None:
    models = findings.models
    for model in ("pythia", "olmo", "olmoe"):
        revs = models[model].revisions
        assert [round(100 * r.bos_fraction, 1) for r in revs] == BOS_PCT[model]
        assert [r.n_induction for r in revs] == N_INDUCTION[model]
        assert {0, 1} <= set(models[model].f1.zero_bos_layers)  # F1
    olmo, olmoe, pythia = models["olmo"], models["olmoe"], models["pythia"]
    # F2
    assert olmo.f2.largest_jump_pp == pytest.approx(62.9, abs=0.05)
    assert olmo.f2.largest_jump == ["step56000-tokens117B", "step126000-tokens264B"]
    assert olmo.f2.jump_share == pytest.approx(0.78, abs=0.005) and olmo.f2.shape == "abrupt"
    assert pythia.f2.shape == olmoe.f2.shape == "gradual"
    assert round(pythia.f2.largest_jump_pp, 1) in (18.7, 18.8)  # 18.75 published as 18.8
    assert olmoe.f2.largest_jump_pp == pytest.approx(26.6, abs=0.05)
    assert pythia.f2.jump_share == pytest.approx(0.33, abs=0.01)  # 18.8 / 57.8 from rounded values
    assert olmoe.f2.jump_share == pytest.approx(0.35, abs=0.005)
    # F3
    assert olmo.f3.induction_onset.tokens == 23e9 and olmoe.f3.induction_onset.tokens == 20e9
    assert pythia.f3.induction_onset.revision == "step3000"
    assert olmo.f3.bos_50.tokens == 264e9 and olmoe.f3.bos_50.tokens == 419e9
    assert pythia.f3.bos_50.revision == "step143000"
    assert olmo.f3.gap_ratio == pytest.approx(11.5, abs=0.05)
    assert olmoe.f3.gap_ratio == pytest.approx(21, abs=0.1)
    # F4
    assert olmo.f4.recall_67.tokens == 10e9 and olmoe.f4.recall_67.tokens == 41e9
    assert pythia.f4.recall_67.revision == "step3000"
    assert olmo.f4.recall_67.fraction_of_training == pytest.approx(0.003, abs=0.0005)
    assert sorted(pythia.f4.final_circuit) == ["L4H4", "L7H0", "L7H1"]
    assert sorted(olmo.f4.final_circuit) == ["L12H8", "L2H11", "L4H12"]
    assert sorted(olmoe.f4.final_circuit) == ["L12H14", "L5H10", "L7H0", "L9H8"]
    # F5
    l4h4 = pythia.f5.heads["L4H4"]
    assert l4h4.pr_rise.revision == "step256" and l4h4.selectivity_cross.revision == "step3000"
    assert l4h4.lead == pytest.approx(11.7, abs=0.05)
    assert l4h4.pr[0] == pytest.approx(1.96, abs=0.01) and l4h4.pr[4] == pytest.approx(27.35, abs=0.01)
    assert l4h4.selectivity[6] == pytest.approx(171.8, abs=0.1)
    for head in olmoe.f5.heads.values():  # OLMoE starts high at 20B: no measurable rise
        assert head.lead is None and "no measurable rise" in head.reason


def test_reference_data_reproduces_method_section_7():
    check_method_numbers(panel_findings(load_reference(REFERENCE)))


def test_the_reference_data_ships_with_the_package_and_a_path_still_chooses_other_data(tmp_path):
    assert len(list((REFERENCE / "per_revision").glob("*_mechinterp_*.json"))) == 30
    assert len(list((REFERENCE / "pr").glob("*_trajectory.json"))) == 3 and (REFERENCE / "SOURCE.md").exists()
    assert report_args(["--reference", "--out", str(tmp_path)]).reference == REFERENCE
    assert report_args(["--reference", str(tmp_path), "--out", str(tmp_path)]).reference == tmp_path


def write_checkpoint(run_dir: Path, c: Checkpoint, summary: dict) -> None:
    """Write one checkpoint's selectivities as `python -m emergence` would (baseline attention 1e-3,
    four identical probe sequences, so the intervals are points)."""
    scr = classify(c.sel, class_thresholds(30.0), 50.0)
    attention = np.concatenate([c.sel * 1e-3, np.full(c.sel.shape[:2] + (1,), 1e-3)], -1)
    targets = np.repeat(attention[None], 4, axis=0)
    intervals = screen_intervals(targets, class_thresholds(30.0), 50.0, StatsConfig(n_boot=100))
    spectral = c.spectral if c.spectral is not None else np.full(c.sel.shape[:2], np.nan)
    measures = HeadValues(attention, np.full(c.sel.shape[:2], np.nan), spectral, measure_columns=c.measure_columns)
    rows = head_rows(
        scr,
        measures,
        intervals,
        np.zeros(c.sel.shape[:2]),
        np.zeros(c.sel.shape[:2], dtype=bool),
        np.zeros(c.sel.shape[:2], dtype=bool),
    )
    write_run(run_dir, rows, run_summary(**summary), {"targets": targets})


def as_run_dirs(trajectories: dict, root: Path) -> None:
    for model, traj in trajectories.items():
        for c in traj.checkpoints:
            write_checkpoint(
                root / model / c.revision,
                c,
                {
                    "model": model,
                    "revision": c.revision,
                    "tokens": c.tokens,
                    "step": None,
                    "n_layers": c.sel.shape[0],
                    "n_heads": c.sel.shape[1],
                },
            )


def test_run_directories_give_the_same_findings(tmp_path):
    reference = load_reference(REFERENCE)
    as_run_dirs(reference, tmp_path / "multirun")
    from_runs = load_runs([tmp_path / "multirun"], spectral_estimator="pr_entropy_rank")
    check_method_numbers(panel_findings(from_runs))
    for model in reference:
        np.testing.assert_allclose(from_runs[model].sel, reference[model].sel, rtol=1e-12)


def toy_trajectory() -> Trajectory:
    """2 layers x 2 heads, 3 revisions, with known answers."""
    ind, first = CLASSES.index("induction"), CLASSES.index("bos")
    sels = np.zeros((3, 2, 2, 6))
    sels[1, 1, 0, ind] = 40  # L1H0: member (>= 30) at r1, circuit (>= 50) at r2
    sels[2, 1, 0, ind] = 60
    sels[2, 1, 1, ind] = 80  # L1H1: only at r2
    sels[2, 1, 1, first] = 35  # BOS member at r2 only (1 of 4 heads)
    prs = np.ones((3, 2, 2))
    prs[1, 1, 0] = 3.0  # PR rise of L1H0 at r1
    cps = [Checkpoint(f"r{i}", t, sels[i], prs[i]) for i, t in enumerate((1e6, 1e7, 1e8))]
    return Trajectory("toy", cps, "pr")


def test_findings_on_a_hand_made_trajectory():
    f = model_findings(toy_trajectory())
    assert [r.bos_fraction for r in f.revisions] == [0, 0, 0.25]
    assert [r.n_induction for r in f.revisions] == [0, 0, 2]
    assert [r.induction_recall for r in f.revisions] == [0, 0.5, 1]
    assert f.f1.zero_bos_layers == [0]
    assert f.f3.induction_onset is None  # never 3 heads
    assert f.f4.recall_33.revision == "r1" and f.f4.recall_67.revision == "r2"
    assert f.f4.recall_67.fraction_of_training == 1.0
    h = f.f5.heads["L1H0"]
    assert h.pr_rise.revision == "r1" and h.selectivity_cross.revision == "r2"
    assert h.lead == pytest.approx(10.0)
    assert f.f5.heads["L1H1"].lead is None


def test_shape_from_the_largest_jump():
    f = f2_shape(np.array([0.0, 0.1, 0.7, 0.8]), ["a", "b", "c", "d"])
    assert f.largest_jump == ["b", "c"] and f.shape == "abrupt" and f.monotonic
    assert f.jump_share == pytest.approx(0.6 / 0.8)
    g = f2_shape(np.array([0.0, 0.2, 0.15, 0.4, 0.6]), list("abcde"))
    assert g.shape == "gradual" and not g.monotonic and g.largest_drop_pp == pytest.approx(-5)


def test_cli_writes_all_outputs(tmp_path):
    out = tmp_path / "report"
    report_main(["--reference", "--out", str(out), "--wandb-mode", "disabled"])  # no DIR: the packaged data
    findings = json.loads((out / "findings.json").read_text())
    assert set(findings["models"]) == {"pythia", "olmo", "olmoe"}
    text = (out / "report.md").read_text()
    assert "+62.9 pp" in text and "Published" in text
    olmo_section = text.split("## olmo\n")[1]
    assert "- **Dtype**: the study's numbers, computed in float16" in olmo_section  # model.reference_dtype
    assert findings["models"]["pythia"]["dtype"]["reference_dtype"] == "float32"
    assert not re.search(r"\d[eE][+-]\d", text), "token counts without exponent notation"
    assert "tokens264B (264B; in (117B, 264B])" in text and "step3000 (6.29B; in (1.07B, 6.29B])" in text
    assert "| step256 | 537M |" in text and "only the brackets apply" in text
    olmo = findings["models"]["olmo"]["f3"]
    assert olmo["bos_50"]["bracket_tokens"] == [117e9, 264e9]
    assert olmo["gap_ratio_range"] == pytest.approx([5.09, 26.4], abs=0.005)
    assert not findings["models"]["olmo"]["intervals"] and olmo["bos_50"]["probability"] is None
    for name in findings["figures"]:
        assert (out / name).stat().st_size > 1000
    assert {
        "bos_fraction_vs_tokens.png",
        "recall_vs_tokens.png",
        "sensitivity.png",
        "bos_per_layer_olmo.png",
        "induction_heads_pythia.png",
    } <= set(findings["figures"])
    held = {(c["model"], c["key"]): c for c in findings["sensitivity"]}
    # At docs/method.md's thresholds (30x, 50x) the published conclusions hold ...
    assert all(held[(m, "layers_0_1_bos_free")]["holds_at_report_thresholds"] for m in ("pythia", "olmo", "olmoe"))
    assert held[("olmo", "abrupt")]["holds_at_report_thresholds"]
    assert not held[("pythia", "abrupt")]["holds_at_report_thresholds"]
    assert held[("olmo", "gap_at_least_10x")]["holds_at_report_thresholds"]
    # ... and the dense grid says where they stop: OLMo gets layer-0/1 BOS heads below ~29x.
    assert held[("olmo", "layers_0_1_bos_free")]["flips"] == "class 25x -> 29x"
    assert held[("pythia", "layers_0_1_bos_free")]["holds_everywhere"]
    with open(out / "sensitivity.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    for model in ("pythia", "olmo", "olmoe"):
        mine = [r for r in rows if r["model"] == model]
        assert len(mine) == len({(r["class_threshold"], r["circuit_threshold"]) for r in mine}) >= 1000
        assert {float(r["class_threshold"]) for r in mine} >= {2.0, 200.0}


def check_grid_against_findings(traj: Trajectory, classes, circuits) -> None:
    """Every cell of the vectorised grid against ``model_findings`` at that one setting."""
    g = dense(traj, classes, circuits)
    gap, lower = g.gap_ratio(), g.gap_lower_bound()
    tokens = lambda m: np.nan if m is None else m.tokens  # noqa: E731
    for i, ct in enumerate(classes):
        for j, cc in enumerate(circuits):
            f = model_findings(traj, ct, cc)
            assert list(np.flatnonzero(g.zero_bos_layers[i])) == f.f1.zero_bos_layers
            assert g.final_bos_fraction[i] == pytest.approx(f.f2.final_fraction)
            if f.f2.jump_share is None:
                assert g.jump_index[i] == -1
            else:
                assert g.revisions[g.jump_index[i]] == f.f2.largest_jump[0]
                assert g.jump_share[i] == pytest.approx(f.f2.jump_share)
            np.testing.assert_equal(g._tokens_at(g.onset)[j], tokens(f.f3.induction_onset))
            np.testing.assert_equal(g._tokens_at(g.bos_50)[i], tokens(f.f3.bos_50))
            np.testing.assert_allclose(gap[i, j], np.nan if f.f3.gap_ratio is None else f.f3.gap_ratio)
            np.testing.assert_equal(g._tokens_at(g.recall_67)[i, j], tokens(f.f4.recall_67))
            assert g.circuit_size[j] == len(f.f4.final_circuit)
            if f.f3.induction_onset and not f.f3.bos_50:
                assert lower[i, j] == traj.checkpoints[-1].tokens / f.f3.induction_onset.tokens


def test_dense_grid_agrees_with_the_findings_on_a_hand_made_trajectory():
    check_grid_against_findings(toy_trajectory(), [1.0, 30.0, 35.0, 36.0, 50.0], [30.0, 50.0, 60.0, 70.0, 90.0])


def test_dense_grid_agrees_with_the_findings_on_the_reference_data():
    reference = load_reference(REFERENCE)
    for traj in reference.values():  # a sample of the 32 x 32 grid, and docs/method.md's thresholds
        check_grid_against_findings(traj, [*GRID[::5], 30.0], [*GRID[2::6], 50.0])


def test_a_dense_grid_over_the_30_run_panel_takes_well_under_a_second():
    import time

    reference = load_reference(REFERENCE)
    start = time.process_time()
    grids = [dense(t) for t in reference.values()]
    assert time.process_time() - start < 1.0
    assert all(g.conclusions()["abrupt"].shape == (32, 32) for g in grids)


def test_missing_input_is_a_one_line_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        report_main([str(tmp_path), "--out", str(tmp_path / "o"), "--wandb-mode", "disabled"])
    assert exit_info.value.code == 2
    assert "no run directories" in capsys.readouterr().err


def test_a_broken_summary_is_a_one_line_error_naming_the_file(tmp_path, capsys):
    run = tmp_path / "runs" / "job_0"
    run.mkdir(parents=True)
    (run / "summary.json").write_text('{"model": "pythia",\n')  # cut short
    (run / "heads.csv").write_text("layer,head\n")
    with pytest.raises(SystemExit) as exit_info:
        report_main([str(tmp_path / "runs"), "--out", str(tmp_path / "o"), "--wandb-mode", "disabled"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1
    assert str(run / "summary.json") in err[0] and "not valid JSON" in err[0]
    assert not (tmp_path / "o" / "findings.json").exists()


@pytest.mark.parametrize(
    "tokens,text",
    [
        (None, "-"),
        (0, "0"),
        (999, "999"),
        (262_144, "262K"),
        (2_097_152, "2.1M"),
        (134_217_728, "134M"),
        (999_999_999, "1B"),
        (1_073_741_824, "1.07B"),
        (6.29e9, "6.29B"),
        (1.35e12, "1.35T"),
        (3.048e15, "3,048T"),
    ],
)
def test_token_counts_read_the_same_way_everywhere(tokens, text):
    assert format_tokens(tokens) == text


def noisy_trajectory(bos_selectivity: list[float], noise: float, n: int = 60, seed: int = 0) -> Trajectory:
    """8 heads (2 x 4) whose first-token selectivity at each revision is ``bos_selectivity[r]`` for
    heads 0-3 of layer 1 (others 1x), per-sequence attention with relative noise ``noise``."""
    rng = np.random.default_rng(seed)
    checkpoints = []
    for r, level in enumerate(bos_selectivity):
        targets = np.full((n, 2, 4, 7), 0.01)
        # mean 1
        targets[:, 1, :, CLASSES.index("bos")] = 0.01 * level * rng.lognormal(-(noise**2) / 2, noise, size=(n, 4))
        mean = targets.mean(0)
        sel = mean[..., :6] / mean[..., 6:]
        checkpoints.append(Checkpoint(f"step{r}", float(10 ** (r + 6)), sel, None, targets=targets))
    return Trajectory("noisy", checkpoints, None)


def test_milestone_probabilities_come_from_one_paired_resample(tmp_path):
    from emergence.recipe.stats import resample_weights

    N_BOOT, SEED = StatsConfig.n_boot, StatsConfig.seed  # the report's bootstrap: the runs' defaults
    traj = noisy_trajectory([1, 20, 32, 80], noise=1.0)
    f = model_findings(traj, 30.0, 50.0, replicates(traj, 30.0, 50.0))
    bos_30 = f.f3.bos_30
    assert sum(bos_30.probability.values()) == pytest.approx(1.0)
    # Independently: resample the sequences themselves (the same draws) and redo the screen.
    counts = np.rint(resample_weights(60, N_BOOT, SEED) * 60).astype(int)
    first = []
    for c in counts:
        index = np.repeat(np.arange(60), c)
        fractions = []
        for cp in traj.checkpoints:
            m = cp.targets[index].mean(0)
            fractions.append((m[..., CLASSES.index("bos")] / m[..., 6] >= 30).mean())
        hit = [i for i, x in enumerate(fractions) if x >= 0.3 - 1e-12]
        first.append(traj.checkpoints[hit[0]].revision if hit else "never")
    expected = {name: first.count(name) / N_BOOT for name in set(first)}
    assert bos_30.probability == pytest.approx(expected)
    assert 0 < bos_30.probability["step2"] < 1  # a borderline revision: the bootstrap is unsure
    low, high = f.revisions[2].bos_fraction_ci
    assert low < f.revisions[2].bos_fraction <= high


def test_a_rise_is_abrupt_only_if_its_share_holds_at_the_lower_bound():
    clear = noisy_trajectory([1, 1, 300, 320], noise=0.2)
    f2 = model_findings(clear, 30.0, 50.0, replicates(clear, 30.0, 50.0)).f2
    assert f2.shape == "abrupt" and f2.jump_share_ci[0] >= 0.5 and f2.shape_note is None
    shaky = noisy_trajectory([1, 1, 31, 40], noise=1.5)
    point = model_findings(shaky, 30.0, 50.0).f2
    f2 = model_findings(shaky, 30.0, 50.0, replicates(shaky, 30.0, 50.0)).f2
    assert point.shape == "abrupt" and f2.jump_share_ci[0] < 0.5
    assert f2.shape == "gradual" and "not called abrupt" in f2.shape_note


def test_findings_json_reads_back_into_the_same_records():
    """One serialisation path: ``to_json`` writes findings.json (optional fields as null, the old key
    names), ``from_json`` reads it back into equal records."""
    noisy = noisy_trajectory([1, 20, 32, 80], noise=1.0)
    rng = np.random.default_rng(2)
    for c in noisy.checkpoints:  # Gu et al.'s key-0 importance: the sink findings and their F2 record
        c.sequences = {"sink_importance": rng.random((60, 2, 4)).astype(np.float32)}
    findings = panel_findings({"noisy": noisy, "toy": toy_trajectory()}, 30.0, 50.0)
    written = json.loads(json.dumps(findings.to_json()))
    back = PanelFindings.from_json(written)
    assert back == findings
    assert isinstance(back.models["noisy"].f3.bos_30, Milestone) and back.models["noisy"].f3.bos_30.probability
    assert isinstance(back.models["noisy"].sinks_gu.f2, SinkShape) and isinstance(back.models["noisy"].f2, BosShape)
    assert written["thresholds"]["class"] == 30.0
    toy = written["models"]["toy"]
    assert toy["f2"]["final_bos_fraction"] == 0.25 and toy["sinks_gu"] is None
    assert "final_sink_fraction" in written["models"]["noisy"]["sinks_gu"]["f2"]
    assert toy["f3"]["bos_10"]["probability"] is None
    assert toy["revisions"][0]["run_values"]["copy_loss_drop"] is None  # not left out


def test_brackets_and_the_gap_range():
    from emergence.panel.uncertainty import bracket, ratio_range

    tokens = np.array([0, 10, 23, 52, 117, 264.0])
    assert bracket(tokens, 0) == [None, 0.0] and bracket(tokens, 5) == [117.0, 264.0]
    assert ratio_range(5, 2, tokens, tokens) == pytest.approx([117 / 23, 264 / 10])
    assert ratio_range(5, 1, tokens, tokens) == [117 / 10, None]  # the onset may lie at 0 tokens: open
    assert ratio_range(None, 2, tokens, tokens) is None


def test_revisions_with_identical_weights_are_flagged(tmp_path):
    """r0 and r2 serve the same weights (as pythia-2.8b's branches did): findings and report say so."""
    traj = toy_trajectory()
    for c, digest in zip(traj.checkpoints, ("a" * 64, "b" * 64, "a" * 64)):
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
                "weights_sha256": digest,
            },
        )
    out = tmp_path / "report"
    report_main([str(tmp_path / "runs"), "--out", str(out), "--wandb-mode", "disabled"])
    findings = json.loads((out / "findings.json").read_text())["models"]["toy"]
    assert findings["identical_weights"] == [["r0", "r2"]]
    assert [r["weights_sha256"][0] for r in findings["revisions"]] == ["a", "b", "a"]
    line = next(l for l in (out / "report.md").read_text().splitlines() if "Identical weights" in l)
    assert "r0 = r2" in line and "r1" not in line


def test_distinct_or_unknown_weights_are_not_flagged():
    from emergence.panel.findings import identical_weights

    traj = toy_trajectory()
    assert identical_weights(traj) == []  # no fingerprints (older runs)
    for c, digest in zip(traj.checkpoints, "abc"):
        c.weights_sha256 = digest
    assert identical_weights(traj) == []


def test_sinks_two_ways_from_run_directories(tmp_path):
    """Gu et al.'s Sink_0 from the runs' per-sequence importances: its per-revision share, milestones,
    per-layer shares and bootstrap against a count by hand; the report names where the BOS fraction
    (one query, a ratio) and Sink_0 (all queries, an absolute level) disagree."""
    rng = np.random.default_rng(1)
    n = 40
    # BOS fraction (heads 0-3 of layer 1 at 80x) reaches 50% at step2; Sink_0 only at step3: layer 1's
    # heads get 0.2 of every query at step2 (below 0.3) and 0.6 at step3.
    traj = noisy_trajectory([1, 1, 80, 80], noise=0.1, n=n)
    levels = [0.0, 0.05, 0.2, 0.6]
    root = tmp_path / "runs"
    for r, c in enumerate(traj.checkpoints):
        importance = np.full((n, 2, 4), 0.01)
        importance[:, 1] = np.clip(levels[r] + rng.normal(0, 0.02, size=(n, 4)), 0, 1)
        importance[:5, 0, 0] = 0.9 if r == 3 else 0.01  # a few sequences with a layer-0 sink at the end
        importance = importance.astype(np.float32)  # as the measure and the files hold it
        c.sequences = {"sink_importance": importance}
        run_dir = root / c.revision
        scr = classify(c.sel, class_thresholds(30.0), 50.0)
        intervals = screen_intervals(c.targets, class_thresholds(30.0), 50.0, StatsConfig(n_boot=50))
        zeros, degenerate = np.zeros(c.sel.shape[:2]), np.zeros(c.sel.shape[:2], dtype=bool)
        write_run(
            run_dir,
            head_rows(
                scr,
                HeadValues(c.targets.mean(0), zeros, zeros, {"sink_importance": importance.mean(0)}),
                intervals,
                zeros,
                degenerate,
                degenerate,
            ),
            run_summary(model="two", revision=c.revision, tokens=c.tokens, n_layers=2, n_heads=4),
            {"targets": c.targets, "sink_importance": importance},
        )
    loaded = load_runs([root])["two"]
    assert np.array_equal(loaded.checkpoints[3].sink_values(), traj.checkpoints[3].sink_values())
    f = panel_findings({"two": loaded}, 30.0, 50.0).models["two"]
    g = f.sinks_gu
    by_hand = [(c.sequences["sink_importance"] > 0.3).mean() for c in traj.checkpoints]
    assert [r.sink_fraction for r in g.revisions] == pytest.approx(by_hand)
    assert g.revisions[3].sink_per_layer == pytest.approx([5 / (n * 4), 1.0])
    assert g.f1.zero_sink_layers == [] and f.f1.zero_bos_layers == [0]
    assert f.f3.bos_50.revision == "step2" and g.f3.sink_50.revision == "step3"
    assert g.f3.sink_50.probability == {"step3": 1.0}
    low, high = g.revisions[3].sink_fraction_ci
    assert low <= by_hand[3] <= high and low < high  # the 5 layer-0 sequences vary between replicates
    assert any(
        "F3: 50% is first reached at step2 by the BOS fraction but at step3 by Sink_0" in d for d in g.disagreements
    )
    assert any(d.startswith("F1:") for d in g.disagreements)

    out = tmp_path / "report"
    report_main([str(root), "--out", str(out), "--sink-epsilon", "0.1"])  # step2's 0.2 now counts
    findings = json.loads((out / "findings.json").read_text())
    g = findings["models"]["two"]["sinks_gu"]
    assert g["epsilon"] == 0.1 and g["f3"]["sink_50"]["revision"] == "step2"
    text = (out / "report.md").read_text()
    assert "Sinks two ways" in text and "Sink_0 > 0.1" not in text and "key-0 importance > 0.1" in text
    assert PanelFindings.from_json(findings).to_json() == findings


def test_a_transition_reads_the_per_run_fields_the_measures_recorded():
    from emergence.panel.token_axis import transition

    sel = np.ones((1, 1, 6))
    traj = Trajectory(
        "m",
        [
            Checkpoint("r0", 1e6, sel, measure_fields={"icl": {"icl_score": -0.1}}),
            Checkpoint("r1", 1e7, sel, measure_fields={"icl": {"icl_score": -0.5}}),
            Checkpoint("r2", 1e8, sel),
        ],
        None,
        probe="text",
    )
    found = transition(traj, "icl_score")
    assert found.values == [-0.1, -0.5, None] and found.half_way.revision == "r1"
    assert transition(traj, "loss_drop") is None  # no revision has repeat scores


def test_the_report_draws_the_plug_in_measures_trajectories(tmp_path):
    """A registered measure's columns in heads.csv become its trajectories on the token axis: the
    reduction over heads it declares, at every checkpoint, on the probes it declares (these runs are
    the synthetic probe's: the repeat probe's prefix matching is not drawn)."""
    from emergence import measures

    rng = np.random.default_rng(0)
    root, grids = tmp_path / "multirun", {}
    for k, (revision, tokens) in enumerate((("r0", 1e6), ("r1", 1e7), ("r2", 1e8))):
        grids[revision] = {c.name: rng.uniform(-1, 1, (2, 3)) + k for c in measures.columns()}
        checkpoint = Checkpoint(revision, tokens, np.ones((2, 3, 6)), measure_columns=grids[revision])
        write_checkpoint(
            root / revision,
            checkpoint,
            {"model": "m", "revision": revision, "tokens": tokens, "step": None, "n_layers": 2, "n_heads": 3},
        )
    out = tmp_path / "report"
    report_main([str(root), "--out", str(out)])
    findings = json.loads((out / "findings.json").read_text())
    drawn = {t["measure"]: t["values"] for t in findings["token_axis"]["m"]["transitions"]}
    reduce = {"max": np.max, "min": np.min, "mean": np.mean}
    for t in measures.trajectories():
        if "synthetic" not in t.probes:
            assert t.key not in drawn
            continue
        assert drawn[t.key] == pytest.approx([reduce[t.reduce](grids[r][t.column]) for r in ("r0", "r1", "r2")])
    assert "prefix_matching_max" not in drawn and "value_norm_ratio_min" in drawn
    assert "token_axis.png" in findings["figures"]


def test_f6_places_the_edge_and_the_ov_copying_against_the_milestones(tmp_path):
    """A hand-made sweep: the induction circuit (L0H0-L0H2) crosses at r2, BOS 50 % at r3, and the heads'
    ov_copying crosses 0.5 at r1, r2, r3 (before, at, after their selectivity); an edge.json beside the runs
    whose sigma_2/sigma_3 peaks in its third window and collapses in its fourth. F6 places each phase
    against each milestone: milestone tokens - the window's last, over (bracket low - last, tokens - first]."""
    from emergence import measures
    from emergence.spectral_edge.records import MODEL_SCOPE, Edge, EdgeWindow, WindowSpectra

    tokens = [1e6, 2e6, 4e6, 8e6, 16e6]
    root = tmp_path / "multirun"
    for k, t in enumerate(tokens):
        sel = np.ones((2, 3, 6))
        if k >= 2:
            sel[0, :, 0] = 100.0  # induction: three heads over the circuit threshold from r2
        if k >= 3:
            sel[1, :, 4] = 100.0  # bos: 3 of 6 heads from r3
            sel[0, 0, 4] = 100.0  # and a fourth: 67 %
        copying = np.zeros((2, 3))
        copying[0] = [0.9 if k >= 1 else 0.1, 0.9 if k >= 2 else 0.1, 0.9 if k >= 3 else 0.1]
        grids = {c.name: copying if c.name == "ov_copying" else np.ones((2, 3)) for c in measures.columns()}
        write_checkpoint(
            root / f"r{k}",
            Checkpoint(f"r{k}", t, sel, measure_columns=grids),
            {"model": "m", "revision": f"r{k}", "tokens": t, "step": None, "n_layers": 2, "n_heads": 3},
        )
    last = [3e6, 5e6, 6e6, 9e6, 12e6]
    r23 = [1.5, 2.0, 3.0, 1.1, 1.0]
    windows = [
        EdgeWindow(10 * i, 10 * i + 20, int(b - 2e6), int(b), 2, [3.0, 2.0, 1.0], 1.5, r, 1, 2, 0.5, 0.3, 0.1)
        for i, (b, r) in enumerate(zip(last, r23))
    ]
    Edge("m", "exact", None, [WindowSpectra.of(10, {MODEL_SCOPE: windows})]).save(root)

    out = tmp_path / "report"
    report_main([str(root), "--out", str(out)])
    f6 = json.loads((out / "findings.json").read_text())["models"]["m"]["f6"]
    assert [(p["name"], p["first"], p["last"]) for p in f6["phases"]] == [
        ("r23_peak", 4e6, 6e6),
        ("r23_collapse", 7e6, 9e6),
    ]
    milestone = {"induction_onset": (4e6, 2e6), "recall_67": (4e6, 2e6), "bos_50": (8e6, 4e6)}  # (tokens, low)
    phase = {"r23_peak": (4e6, 6e6), "r23_collapse": (7e6, 9e6)}  # (first, last)
    expected = [
        (p, m, milestone[m][0] - phase[p][1], [milestone[m][1] - phase[p][1], milestone[m][0] - phase[p][0]])
        for p in phase
        for m in milestone
    ]
    assert [(d["phase"], d["milestone"], d["distance"], d["range"]) for d in f6["distances"]] == expected
    # the crossing the weight circuits declare (ov_copying >= 0.5) against each head's selectivity crossing
    assert {h: [(o["column"], o["level"], o["order"]) for o in orders] for h, orders in f6["heads"].items()} == {
        "L0H0": [("ov_copying", 0.5, "before")],
        "L0H1": [("ov_copying", 0.5, "at")],
        "L0H2": [("ov_copying", 0.5, "after")],
    }
    assert f6["heads"]["L0H0"][0]["crossing"]["revision"] == "r1" and f6["heads"]["L0H0"][0]["values"][:2] == [0.1, 0.9]
    assert [p["r23"] for p in f6["series"]] == r23 and f6["window"] == 10
    assert "edge_vs_tokens.png" in json.loads((out / "findings.json").read_text())["figures"]
    text = (out / "report.md").read_text()
    assert "F6 the spectral edge" in text and "collapses below 1.20" in text
    assert "- **F6 ov_copying against selectivity**: L0H0: ov_copying >= 0.5 at r1" in text and ": before;" in text


def test_f7_cuts_the_llc_into_stages_and_places_them_against_the_milestones(tmp_path):
    """A hand-made sweep whose LLC (``measures.llc`` in each summary) is flat, rises over r3..r5 and
    plateaus, with r2's estimate failed; the induction circuit (L0H0-L0H2) crosses at r4. F7: boundaries
    at r3 (flat -> rising) and r5 (rising -> flat), each bracketed by its measured neighbours and placed
    against the onset; r2 left out; L0H0's refined LLC rises at r4, with its selectivity."""
    tokens = [1e6 * (k + 1) for k in range(8)]
    llc = [1.0, 1.05, None, 1.0, 8.0, 10.0, 10.1, 10.0]
    root = tmp_path / "multirun"
    for k, t in enumerate(tokens):
        sel = np.ones((2, 3, 6))
        if k >= 4:
            sel[0, :, 0] = 100.0  # induction: three heads over the circuit threshold from r4
        refined = np.full((2, 3), np.nan)
        refined[0, 0] = 0.5 if k < 4 else 3.0
        failed = "chain 0 diverged at step 7 (loss NaN or inf): lower lr" if llc[k] is None else None
        fields = {
            "llc": llc[k],
            "std": None if failed else 0.1,
            "failed": failed,
            "heads": {"L0H0": {"llc": float(refined[0, 0]), "std": 0.05}},
        }
        write_checkpoint(
            root / f"r{k}",
            Checkpoint(f"r{k}", t, sel, measure_columns={"llc_refined": refined}),
            {
                "model": "m",
                "revision": f"r{k}",
                "tokens": t,
                "step": None,
                "n_layers": 2,
                "n_heads": 3,
                "measures": {"llc": fields},
            },
        )
    out = tmp_path / "report"
    report_main([str(root), "--out", str(out)])
    findings = json.loads((out / "findings.json").read_text())
    f7 = findings["models"]["m"]["f7"]
    onset = findings["models"]["m"]["f3"]["induction_onset"]
    assert onset["revision"] == "r4" and f7["measure"] == "llc"
    assert [p["value"] for p in f7["series"]] == llc and f7["series"][2]["failed"].startswith("chain 0 diverged")
    got = [(b["revision"], b["before"], b["after"], b["bracket_tokens"]) for b in f7["boundaries"]]
    assert got == [("r3", "flat", "rising", [2e6, 5e6]), ("r5", "rising", "flat", [5e6, 7e6])]
    for b in f7["boundaries"]:
        assert b["distances"]["induction_onset"] == onset["tokens"] - b["tokens"]
        assert b["touches"]["induction_onset"]  # the onset's (4e6, 5e6] touches both brackets
    assert f7["heads"]["L0H0"]["order"] == "at" and f7["heads"]["L0H0"]["rise"]["revision"] == "r4"
    text = (out / "report.md").read_text()
    assert "F7 stages of the LLC" in text and "left out as failed: r2 (chain 0 diverged" in text
    assert "flat -> rising at r3" in text and "the rise at" in text
    assert "stages_vs_tokens.png" in findings["figures"]


def test_the_llc_rise_is_a_refinement_milestone():
    """``llc_rise``: the panel's LLC half-way from its lowest to its highest value (11 here): reached at r3
    (14 >= 11), so refine brackets it in (r2, r3] and asks for the middle checkpoint inside; a refined run
    below the level moves the bracket's low end, a failed one has not reached it."""
    from emergence.core.config import PanelEntry
    from emergence.panel.refine import MILESTONES, plan_model

    assert "llc_rise" in MILESTONES

    def checkpoint(revision, tokens, llc, refined=False, failed=None):
        fields = {"llc": None if failed else llc, "std": 0.1, "failed": failed}
        return Checkpoint(revision, tokens, np.ones((2, 3, 6)), refined=refined, measure_fields={"llc": fields})

    panel = [checkpoint(f"r{k}", 10.0**k, v) for k, v in enumerate([2.0, 2.1, 2.0, 14.0, 20.0])]
    existing = [
        PanelEntry(revision, step, tokens)
        for step, (revision, tokens) in enumerate(
            zip(["r0", "r1", "r2", "r2a", "r2b", "r2c", "r3", "r4"], [1, 10, 100, 300, 500, 700, 1000, 1e4])
        )
    ]
    plan = plan_model(Trajectory("m", panel, None), existing, ["llc_rise"], 1, False, (30.0, 50.0), 0.3)
    r = plan.refinements["llc_rise"]
    assert r.panel_bracket == ["r2", "r3"] and r.inside_bracket == 3 and plan.pending == ["r2b"]
    refined = [*panel[:3], checkpoint("r2b", 500, 9.0, refined=True), *panel[3:]]  # below 11: not reached
    plan = plan_model(Trajectory("m", refined, None), existing, ["llc_rise"], 1, False, (30.0, 50.0), 0.3)
    assert plan.pending == ["r2c"]
    failed = [*refined[:4], checkpoint("r2c", 700, None, refined=True, failed="negative estimate"), *refined[4:]]
    plan = plan_model(Trajectory("m", failed, None), existing, ["llc_rise"], 1, False, (30.0, 50.0), 0.3)
    assert plan.refinements["llc_rise"].interval == ["r2c", "r3"]
