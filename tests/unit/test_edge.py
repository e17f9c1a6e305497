"""The spectral edge (emergence/edge, docs/edge.md) on hand-made numbers and a tiny hand-made series,
each checked against a computation written independently here (numpy's SVD of the stacked updates)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from emergence.core.config import PanelEntry
from emergence.core.errors import UsageError
from emergence.edge.command import main
from emergence.edge.projection.projection import Exact, RandomProjection
from emergence.edge.scopes.scopes import Piece, meta_model, scopes_of
from emergence.edge.series.windows import check_series, window_starts
from emergence.recipe.edge import collapse, gram, spectrum
from tests.helpers.edge_series import independent_ratios, neox_head, save_series
from tests.helpers.tiny_models import ARCHS, tiny_config, tiny_model

W = 5


def entries(steps: list[int]) -> list[PanelEntry]:
    return [PanelEntry(f"step{s}", s, s * 10) for s in steps]


# --- one window's maths --------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_window_spectrum_is_the_svd_of_the_stacked_updates(seed):
    rng = np.random.default_rng(seed)
    deltas = rng.normal(size=(W, 300)) * rng.uniform(0.1, 3, size=(W, 1)) + rng.normal(size=300)
    s = spectrum(gram(deltas))
    sv = np.linalg.svd(deltas, compute_uv=False)
    np.testing.assert_allclose(s.singular_values, sv, rtol=1e-9)
    assert s.r12 == pytest.approx(sv[0] / sv[1], rel=1e-9)
    assert s.r23 == pytest.approx(sv[1] / sv[2], rel=1e-9)
    assert s.k_star == int(np.argmax(sv[:-1] / sv[1:])) + 1
    assert s.pc1_share == pytest.approx(sv[0] ** 2 / (sv**2).sum(), rel=1e-9)
    assert s.pc2_share == pytest.approx(sv[1] ** 2 / (sv**2).sum(), rel=1e-9)
    assert s.drift_speed == pytest.approx(np.linalg.norm(deltas.sum(axis=0)) / W, rel=1e-9)


def test_a_window_of_rank_two_has_no_sigma2_sigma3_ratio_and_signal_rank_two():
    rng = np.random.default_rng(0)
    deltas = rng.normal(size=(W, 2)) @ rng.normal(size=(2, 50))
    s = spectrum(gram(deltas))
    assert s.k_star == 2 and s.r12 is not None
    assert s.r23 is None or s.r23 > 1e6  # sigma_3 is zero up to rounding


def test_collapse_is_the_first_window_below_1_20_after_the_peak():
    assert collapse([1.1, 1.5, 2.0, 1.3, 1.19, 1.0]) == (2, 4)
    assert collapse([1.1, 1.0, 2.0, 1.5]) == (2, None)  # below 1.20 only before the peak
    assert collapse([None, 1.5, None, 1.1]) == (1, 3)
    assert collapse([None]) == (None, None)


# --- the series: windows at one spacing, and what is refused ---------------------------------------


def test_windows_stay_within_one_spacing():
    pythia_like = [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, *range(1000, 9001, 1000)]
    starts = window_starts(entries(pythia_like), W)
    first = pythia_like.index(1000)
    assert starts == list(range(first, len(pythia_like) - W))
    assert window_starts(entries(list(range(0, 60, 10))), W) == [0]
    # two runs at two spacings, each long enough: no window spans the change at step 50
    steps = [*range(0, 60, 10), *range(70, 190, 20)]
    assert window_starts(entries(steps), W) == [0, 5, 6]


def test_fewer_than_w_plus_one_checkpoints_at_one_spacing_is_refused():
    with pytest.raises(UsageError, match=r"edge.window=5 needs 6 checkpoints at one spacing; the series has at most 5"):
        window_starts(entries([0, 10, 20, 30, 40, 60, 80]), W)


def test_a_step_named_twice_and_a_missing_checkpoint_are_refused():
    twice = [PanelEntry("step10", 10, 1), PanelEntry("checkpoint-10", 10, 1)]
    with pytest.raises(UsageError, match="names step 10 twice"):
        check_series([PanelEntry("step0", 0, 0), *twice])
    with pytest.raises(UsageError, match=r"missing between step20 and step40.*not step 30"):
        check_series(entries([0, 10, 20, 40, 50, 60]))
    check_series(entries([0, 1, 2, 4, 8, 16, 1000, 2000]))  # log spacing, then a regular one: no gap


# --- scopes and projections ----------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_scopes_cover_every_trained_parameter_once_and_each_layer(arch):
    model = tiny_model(arch)
    scopes = scopes_of(meta_model(tiny_config(arch)))
    params = dict(model.named_parameters())
    assert [p.name for p in scopes["model"]] == list(params)  # tied tensors once, no buffers
    n_layers = model.config.num_hidden_layers
    layers = [s for s in scopes if s.startswith("L") and "H" not in s]
    assert layers == [f"L{i}" for i in range(n_layers)]
    heads = [s for s in scopes if "H" in s]
    assert len(heads) == n_layers * model.config.num_attention_heads
    in_layers = {p.name for s in layers for p in scopes[s]}
    assert all(".0." in n or ".1." in n for n in in_layers)
    assert sum(len(scopes[s]) for s in layers) == len(in_layers)  # a parameter in one block only
    for s in heads:  # four weights, no biases
        assert len(scopes[s]) == 4 and all(p.part is not None and p.name.endswith("weight") for p in scopes[s])


def test_head_scopes_equal_the_familys_own_reshape():
    model = tiny_model("gpt_neox")
    exact = Exact(scopes_of(meta_model(tiny_config("gpt_neox"))))
    vectors = exact.vectors(dict(model.named_parameters()))
    state = {k: v.detach() for k, v in model.state_dict().items()}
    n_heads = model.config.num_attention_heads
    for layer in range(2):
        for head in range(n_heads):
            got = np.sort(vectors[f"L{layer}H{head}"])  # the same coordinates, in the slices' order
            want = np.sort(neox_head(state, layer, head, n_heads).double().numpy())
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("arch", ["gpt_neox", "gpt2", "llama"])
def test_jl_projection_is_linear_seeded_and_each_scope_projects_its_own_coordinates(arch):
    model = tiny_model(arch)
    scopes = scopes_of(meta_model(tiny_config(arch)))
    jl = RandomProjection(scopes, 64, seed=3)
    params = {n: p.detach() for n, p in model.named_parameters()}
    other = {n: torch.randn_like(p) for n, p in params.items()}
    a, b = jl.vectors(params), jl.vectors(other)
    diff = jl.vectors({n: params[n] - other[n] for n in params})
    for scope in scopes:
        np.testing.assert_allclose(a[scope] - b[scope], diff[scope], rtol=1e-4, atol=1e-4)
    again = RandomProjection(scopes, 64, seed=3).vectors(params)
    assert all(np.array_equal(a[s], again[s]) for s in scopes)
    assert not np.allclose(RandomProjection(scopes, 64, seed=4).vectors(params)["model"], a["model"])
    # a head's projection is the model's projection of the head's coordinates alone (zeros elsewhere)
    head = scopes["L1H1"]
    alone = {n: torch.zeros_like(p) for n, p in params.items()}
    for piece in head:
        assert piece.part is not None
        piece.part.of(alone[piece.name]).copy_(piece.part.of(params[piece.name]))
    np.testing.assert_allclose(jl.vectors(alone)["model"], a["L1H1"], rtol=1e-4, atol=1e-5)


def test_jl_keeps_inner_products_nearly():
    rng = np.random.default_rng(0)
    x = torch.tensor(rng.normal(size=(3, 20, 100)), dtype=torch.float32)
    names = [f"p{i}" for i in range(3)]

    jl = RandomProjection({"model": [Piece(n) for n in names]}, 2000, seed=0)
    for i in range(3):
        v = jl.vectors({n: x[i] if n == "p0" else torch.zeros(20, 100) for n in names})["model"]
        assert np.linalg.norm(v) == pytest.approx(float(torch.linalg.norm(x[i])), rel=0.1)


# --- the command on a tiny saved series ------------------------------------------------------------


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    root = tmp_path_factory.mktemp("edge") / "series"
    return root, save_series(root)


def run_edge(root, out, *overrides):
    main(["model=local", f"model.name_or_path={root}", f"edge.window={W}", *overrides, "--out", str(out)])
    return json.loads((out / "edge.json").read_text())


@pytest.fixture(scope="module")
def exact_edge(series, tmp_path_factory):
    out = tmp_path_factory.mktemp("exact")
    return out, run_edge(series[0], out, "edge.projection=exact")


@pytest.mark.parametrize("scope", ["model", "L1", "L0H2"])
def test_exact_edge_equals_an_independent_svd_of_the_updates(series, exact_edge, scope):
    _, folders = series
    out, edge = exact_edge
    assert edge["window"] == W and edge["projection"] == "exact" and edge["dim"] is None
    want = independent_ratios(folders, W, scope, n_heads=4)
    got = edge["scopes"][scope]
    assert len(got) == len(want) == len(folders) - W
    for i, (window, sv) in enumerate(zip(got, want)):
        assert (window["first_step"], window["last_step"], window["spacing"]) == (10 * i, 10 * (i + W), 10)
        np.testing.assert_allclose(window["singular_values"], sv, rtol=1e-6)
        assert window["r12"] == pytest.approx(sv[0] / sv[1], rel=1e-6)
        assert window["r23"] == pytest.approx(sv[1] / sv[2], rel=1e-6)
    assert (out / "edge.png").stat().st_size > 0


@pytest.mark.slow  # d = 500: 500 Gaussian numbers per parameter and checkpoint
def test_jl_edge_converges_to_exact(series, exact_edge, tmp_path):
    """At d = 100 W each window's ratios are within 10% of the exact ones (a ratio of two projected norms
    errs by about sqrt(2/d)); at the default d = 10 W the projection is as documented (the toy's error is
    tests/e2e/test_edge.py's)."""
    root, _ = series
    _, exact = exact_edge
    assert run_edge(root, tmp_path / "jl")["dim"] == 10 * W
    jl = run_edge(root, tmp_path / "jl", f"edge.dim={100 * W}")
    assert jl["projection"] == "jl" and jl["dim"] == 100 * W
    for scope in ("model", "L1", "L0H2"):
        for e, j in zip(exact["scopes"][scope], jl["scopes"][scope], strict=True):
            assert j["r12"] == pytest.approx(e["r12"], rel=0.1)
            assert j["r23"] == pytest.approx(e["r23"], rel=0.1)


def one_line_error(capsys, root, out, *overrides) -> str:
    with pytest.raises(SystemExit) as stop:
        main(["model=local", f"model.name_or_path={root}", f"edge.window={W}", *overrides, "--out", str(out)])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert not (out / "edge.json").exists()
    return err[-1]


def test_broken_series_end_in_one_line(series, tmp_path, capsys):
    root, folders = series
    broken = tmp_path / "missing"
    shutil.copytree(root, broken)
    shutil.rmtree(broken / "step70")
    line = one_line_error(capsys, broken, tmp_path / "o1")
    assert line.startswith("error: checkpoint(s) missing between step60 and step80") and "; restore" in line
    duplicated = tmp_path / "duplicated"
    shutil.copytree(root, duplicated)
    shutil.rmtree(duplicated / "step70")
    shutil.copytree(duplicated / "step60", duplicated / "step70")
    line = one_line_error(capsys, duplicated, tmp_path / "o2")
    assert line == (
        "error: step60 and step70 hold identical weights: one is a copy of the other, not a checkpoint of "
        "its own step; remove the duplicate"
    )
    named_twice = tmp_path / "twice"
    shutil.copytree(root, named_twice)
    shutil.copytree(root / "step70", named_twice / "checkpoint-70")
    assert "names step 70 twice" in one_line_error(capsys, named_twice, tmp_path / "o3")
    line = one_line_error(capsys, root, tmp_path / "o4", "edge.window=20")
    assert line.startswith("error: edge.window=20 needs 21 checkpoints at one spacing; the series has at most 16")
    assert "edge.projection='svd' is invalid" in one_line_error(capsys, root, tmp_path / "o5", "edge.projection=svd")
    assert one_line_error(capsys, root, tmp_path / "o6", "edge.nope=1").startswith("error: ")


def test_the_edge_is_a_wandb_run_of_the_sweeps_group(series, tmp_path, monkeypatch):
    """W&B offline: one run (job_type edge, group: the output folder's name) whose history holds each
    window of the whole model's edge against its last checkpoint's position."""
    from tests.helpers.wandb_offline import history

    monkeypatch.setenv("WANDB_MODE", "offline")
    root, _ = series
    out = tmp_path / "my_sweep"
    edge = run_edge(root, out, "edge.projection=exact", "wandb.mode=offline")
    (run_dir,) = (out / "wandb").glob("offline-run-*")
    logged = [row for row in history(run_dir) if "edge/r23" in row]
    windows = edge["scopes"]["model"]
    axis = "tokens" if windows[0]["last_tokens"] is not None else "step"
    assert [row[axis] for row in logged] == [w["last_tokens" if axis == "tokens" else "last_step"] for w in windows]
    assert [row["edge/r23"] for row in logged] == pytest.approx([w["r23"] for w in windows])
    assert [row["edge/drift_speed"] for row in logged] == pytest.approx([w["drift_speed"] for w in windows])
    from wandb.proto import wandb_internal_pb2

    from tests.helpers.wandb_offline import records

    runs = []
    for raw in records(next(run_dir.glob("run-*.wandb"))):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "run":
            runs.append(record.run)
    assert {(r.run_group, r.job_type) for r in runs} == {("my_sweep", "edge")}
