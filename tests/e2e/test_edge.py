"""``python -m emergence.edge`` on the trained toy panel (conftest's ``toy_panel``: toy_neox with a checkpoint
every 32 steps, 65 in all), read from the panel's sweep directory as a user would, against the edge written
independently (tests/helpers/edge_series.py: safetensors read directly, the scope cut by hand, numpy's SVD
of the stacked updates in float64)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.cli import run_cli
from tests.helpers.edge_series import independent_ratios

W = 10
SCOPES = ("model", "L1", "L1.attn", "L1H2")


def edge_of(sweep: Path, env: dict, out: Path, *overrides: str) -> dict:
    res = run_cli(sweep, *overrides, "--out", out, module="emergence.edge", env=env, timeout=1800)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads((out / "edge.json").read_text())


@pytest.fixture(scope="module")
def toy_edges(toy_panel, tmp_path_factory) -> tuple[dict, dict, list[Path]]:
    """(exact edge: the default, the sketch's at d = 10 W, the checkpoint folders step0 .. step2048)."""
    sweep, env = toy_panel
    out = tmp_path_factory.mktemp("toy_edge")
    exact = edge_of(sweep, env, out / "exact")
    sketched = edge_of(sweep, env, out / "sketch", "edge.projection=sketch")
    root = Path(env["EMERGENCE_CACHE"]) / "toy" / "toy_neox" / "seed0"
    return exact, sketched, [root / f"step{s}" for s in range(0, 2049, 32)]


@pytest.mark.slow
@pytest.mark.parametrize("scope", SCOPES)
def test_toy_edge_equals_an_independent_svd_in_every_window(toy_edges, scope):
    exact, _, folders = toy_edges
    assert exact["projection"] == "exact" and [s["window"] for s in exact["spectra"]] == [W]
    want = independent_ratios(folders, W, scope, n_heads=4)
    got = exact["spectra"][0]["scopes"][scope]
    assert len(got) == len(want) == 65 - W
    for i, (window, sv) in enumerate(zip(got, want)):
        assert (window["first_step"], window["last_step"], window["spacing"]) == (32 * i, 32 * (i + W), 32)
        assert window["last_tokens"] == 32 * (i + W) * 4096
        np.testing.assert_allclose(window["singular_values"], sv, rtol=1e-6)
        assert window["r12"] == pytest.approx(sv[0] / sv[1], rel=1e-6)
        assert window["r23"] == pytest.approx(sv[1] / sv[2], rel=1e-6)
        assert window["k_star"] == int(np.argmax(sv[:-1] / sv[1:])) + 1
        assert window["k95"] == int(np.argmax(np.cumsum(sv**2) / (sv**2).sum() >= 0.95)) + 1


@pytest.mark.slow
def test_toy_sketch_ratios_are_within_ten_percent_of_exact(toy_edges):
    """Xu 2026 states a projection's error as the mean over windows (7.4% at d = 10 W): so is it measured."""
    exact, sketched, _ = toy_edges
    assert sketched["projection"] == "sketch" and sketched["dim"] == 10 * W
    for scope in SCOPES:
        pairs = list(zip(exact["spectra"][0]["scopes"][scope], sketched["spectra"][0]["scopes"][scope], strict=True))
        for ratio in ("r12", "r23"):
            errors = [abs(j[ratio] / e[ratio] - 1) for e, j in pairs]
            assert np.mean(errors) < 0.10, (scope, ratio, np.mean(errors))


@pytest.mark.slow
def test_the_report_over_the_toy_panel_holds_f6_and_its_figure(toy_panel, toy_edges, tmp_path):
    """The edge beside the panel's runs (where ``python -m emergence.edge SWEEP_DIR`` writes it): the report's
    F6 places its phases against the toy's milestones, and every final-circuit head's OV copying."""
    import shutil

    sweep, env = toy_panel
    exact = toy_edges[0]
    copy = tmp_path / "panel"
    shutil.copytree(sweep, copy)
    (copy / "edge.json").write_text(json.dumps(exact))
    out = tmp_path / "report"
    res = run_cli(copy, "--out", out, module="emergence.report", env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    findings = json.loads((out / "findings.json").read_text())
    f6 = findings["models"]["toy_neox"]["f6"]
    assert f6["edge"] == str(copy / "edge.json") and f6["window"] == W
    model = exact["spectra"][0]["scopes"]["model"]
    assert [p["r23"] for p in f6["series"]] == [w["r23"] for w in model]
    peak = exact["spectra"][0]["collapse"]["model"]["peak"]
    assert f6["phases"][0]["name"] == "r23_peak" and f6["phases"][0]["last_step"] == model[peak]["last_step"]
    onset = findings["models"]["toy_neox"]["f3"]["induction_onset"]
    placed = {(d["phase"], d["milestone"]): d["distance"] for d in f6["distances"]}
    window_end = model[peak]["last_tokens"]
    assert placed[("r23_peak", "induction_onset")] == onset["tokens"] - window_end
    assert set(f6["heads"]) == set(findings["models"]["toy_neox"]["f4"]["final_circuit"])
    assert "edge_vs_tokens.png" in findings["figures"] and (out / "edge_vs_tokens.png").exists()
    assert "F6 the spectral edge" in (out / "report.md").read_text()


HUB_SERIES = "edge-test/OLMo-2-series"  # the olmo2 preset's branch names, in a repo of its own
HUB_BRANCHES = [f"stage1-step{s}000-tokens{2 * s}B" for s in range(1, 7)]  # more than a band of W + 1 = 4


@pytest.mark.slow
def test_a_hub_series_is_fetched_ahead_and_removed_once_read(hub_server, tmp_path):
    """A Hub family's series (olah, laid out as the Hub keeps it): with ``hub.prefetch=1`` and
    ``model.cleanup=true`` the edge equals the one read branch by branch without either, and no branch is
    left in the cache; without cleanup, every branch is. Read as a band (downloads), the edge equals the
    one read from the local folders once each."""
    from tests.helpers.hub_server import publish
    from tests.helpers.tiny_models import save_tiny_model

    checkpoints = {}
    for seed, branch in enumerate(HUB_BRANCHES):
        checkpoints[branch] = tmp_path / "ckpt" / branch
        save_tiny_model("olmo2", checkpoints[branch], seed=seed)
    publish(hub_server.mirrors, HUB_SERIES, checkpoints)
    edges, caches = {}, {}
    for name, overrides in (("plain", ["hub.prefetch=0"]), ("fetched", ["hub.prefetch=1", "model.cleanup=true"])):
        caches[name] = tmp_path / name / "hub"
        res = run_cli(
            "model=olmo2",
            f"model.name_or_path={HUB_SERIES}",
            "edge.window=3",
            *overrides,
            "--out",
            tmp_path / name,
            module="emergence.edge",
            env={**hub_server.env(caches[name]), "WANDB_MODE": "disabled"},
            timeout=600,
        )
        assert res.returncode == 0, res.stderr[-3000:]
        edges[name] = json.loads((tmp_path / name / "edge.json").read_text())
    plain = edges["plain"]["spectra"][0]["scopes"]
    assert edges["fetched"]["spectra"][0]["scopes"] == plain and len(plain["model"]) == len(HUB_BRANCHES) - 3
    local = tmp_path / "local_series"  # the same checkpoints as a local run's folders, step<N>-tokens<M>B/
    for branch, folder in checkpoints.items():
        shutil.copytree(folder, local / branch.removeprefix("stage1-"))
    res = run_cli(
        "model=local",
        f"model.name_or_path={local}",
        "edge.window=3",
        "--out",
        tmp_path / "local",
        module="emergence.edge",
        env={"WANDB_MODE": "disabled"},
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    read_once = json.loads((tmp_path / "local" / "edge.json").read_text())["spectra"][0]["scopes"]
    for scope in ("model", "L0", "L1H2"):
        for a, b in zip(read_once[scope], plain[scope], strict=True):
            np.testing.assert_allclose(a["singular_values"], b["singular_values"], rtol=1e-9)

    def snapshots(cache: Path) -> list[str]:
        return sorted(p.name for p in cache.glob("models--*/snapshots/*"))

    assert len(snapshots(caches["plain"])) == len(HUB_BRANCHES) and snapshots(caches["fetched"]) == []
