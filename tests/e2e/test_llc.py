"""The LLC over the real toy panel (docs/llc.md): a sweep that adds it to the cached default measures computes
it alone, the report's F7 places its stage boundaries against the induction onset, the final checkpoint's
refined LLC of two heads lands in heads.csv; and the calibration command picks the largest stable step."""

import json
import math

import pytest

from tests.helpers.cli import SMALL_RUN, run_cli

pytest.importorskip("devinterp")

# docs/llc.md's quick settings: 2 chains x (10 burn-in + 30 draws) x 8 sequences, about 5 s a toy checkpoint
QUICK = [
    "measures.llc.chains=2",
    "measures.llc.draws=30",
    "measures.llc.burn_in=10",
    "measures.llc.batch=8",
    "measures.llc.sequences=64",
    "measures.llc.lr=1e-3",
]


def test_the_toy_panels_llc_stages_bracket_the_induction_onset(toy_panel, tmp_path):
    _, env = toy_panel
    sweep = tmp_path / "panel"
    res = run_cli(
        "-m",
        "model=toy_neox",
        "revision=glob(r*)",
        "measures=[default,llc]",
        *QUICK,
        "ablate.enabled=false",
        f"hydra.sweep.dir={sweep}",
        env=env,
        timeout=1200,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    summaries = sorted(
        (json.loads(p.read_text()) for p in sweep.glob("toy_neox/*/summary.json")), key=lambda s: s["tokens"]
    )
    assert len(summaries) == 10
    for s in summaries:  # the panel's default measures came from the cache; the LLC alone was computed
        assert s["measure_sources"] == {
            "sink_importance": "cache",
            "icl": "cache",
            "repeat_loss": "cache",
            "training_copy_loss": "cache",
            "value_drain": "cache",
            "prefix_matching": "cache",
            "weight_circuits": "cache",
            "massive_activations": "cache",
            "llc": "weights",
        }
        assert s["measures"]["llc"]["failed"] is None and "training corpus" in s["measures"]["llc"]["data"]
    llc = [s["measures"]["llc"]["llc"] for s in summaries]
    assert llc[-1] > 3 * llc[0]  # it rises over training (docs/llc.md: from ~1.5 to ~16)

    out = tmp_path / "report"
    res = run_cli(sweep, "--out", out, module="emergence.report", env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    findings = json.loads((out / "findings.json").read_text())
    model = findings["models"]["toy_neox"]
    f7, onset = model["f7"], model["f3"]["induction_onset"]
    assert f7["measure"] == "llc" and [p["value"] for p in f7["series"]] == llc
    touching = [b for b in f7["boundaries"] if b["touches"]["induction_onset"]]
    assert touching, f7["boundaries"]
    low, high = onset["bracket_tokens"]
    assert any(b["bracket_tokens"][0] <= high and b["bracket_tokens"][1] >= low for b in touching)
    assert "stages_vs_tokens.png" in findings["figures"] and (out / "stages_vs_tokens.png").exists()
    assert "F7 stages of the LLC" in (out / "report.md").read_text()

    # the refined LLC of two heads on the final checkpoint: their heads.csv cells, the other heads' empty
    final = tmp_path / "final"
    res = run_cli(
        "model=toy_neox",
        "revision=final",
        "measures=[default,llc]",
        *QUICK,
        "measures.llc.heads=[L1H1,L1H3]",
        "ablate.enabled=false",
        f"hydra.run.dir={final}",
        env=env,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    lines = (final / "heads.csv").read_text().splitlines()
    header = lines[0].split(",")
    cells = {
        f"L{row[header.index('layer')]}H{row[header.index('head')]}": row[header.index("llc_refined")]
        for row in (line.split(",") for line in lines[1:])
    }
    summary = json.loads((final / "summary.json").read_text())["measures"]["llc"]
    for head in ("L1H1", "L1H3"):
        assert float(cells[head]) == pytest.approx(summary["heads"][head]["llc"])
    assert all(math.isnan(float(v)) for h, v in cells.items() if h not in ("L1H1", "L1H3"))


@pytest.mark.slow
def test_calibration_picks_the_largest_stable_step_and_writes_a_preset(tiny_dirs, tmp_path):
    out = tmp_path / "calibration"
    res = run_cli(
        "model=local",
        f"model.name_or_path={tiny_dirs['gpt_neox']}",
        *SMALL_RUN,
        "measures.llc.chains=2",
        "measures.llc.draws=20",
        "measures.llc.burn_in=5",
        "measures.llc.batch=8",
        "measures.llc.sequences=32",
        "--lr",
        "1e-4",
        "1e-3",
        "1",
        "--out",
        str(out),
        module="emergence.llc.calibrate",
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    saved = json.loads((out / "llc_calibration.json").read_text())
    trials = {t["lr"]: t for t in saved["trials"]}
    assert "diverged" in trials[1.0]["failed"] and trials[1e-3]["failed"] is None
    assert saved["chosen"]["lr"] == 1e-3 and "probe batch" in saved["data"]
    preset = (out / "measures" / "llc_calibrated.yaml").read_text()
    assert "lr: 0.001" in preset and "chains: 2" in preset
    # the preset is a measures option a sweep selects by the printed overrides
    from emergence import measures
    from emergence.core.config import compose_config

    cfg = compose_config(["measures=[default,llc_calibrated]", f"hydra.searchpath=[file://{out}]"])
    (chosen,) = [c for c in measures.chosen(cfg.measures) if c.name == "llc"]
    assert chosen.settings.lr == 1e-3 and chosen.settings.chains == 2
