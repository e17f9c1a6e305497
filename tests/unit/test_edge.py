"""The spectral edge (emergence/spectral_edge, docs/edge.md) on hand-made numbers and a tiny hand-made series,
each checked against a computation written independently here (numpy's SVD of the stacked updates)."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from emergence.core.config import PanelEntry
from emergence.core.errors import UsageError
from emergence.edge import main
from emergence.spectral_edge import tensor_files
from emergence.spectral_edge.exact import stream_gram
from emergence.spectral_edge.scopes import Cell, Layout, layout_of, meta_model
from emergence.spectral_edge.series import check_series, window_starts
from emergence.spectral_edge.sketch import sketch
from emergence.spectral_edge.spectrum import collapse, gram, spectrum
from emergence.spectral_edge.stream import legacy_renamer, stored_parameters
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
    assert s.k_star == 2 and s.r12 is not None and s.r23 is None
    # sigma_3 as rounding leaves it on some CPUs (positive, far below W * eps * lambda_1), sigma_4 exactly 0
    rounded = spectrum(np.diag([188.6, 46.3, 8.1e-15, 0.0, 0.0]))
    assert rounded.k_star == 2 and rounded.r23 is None and rounded.singular_values[2] == 0.0


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


# --- scopes, the streamed exact Gram, the sketch -----------------------------------------------------


def cell_vector(state: dict[str, torch.Tensor], layout, scope: str) -> np.ndarray:
    """A checkpoint's coordinates of ``scope``, float64, cut from whole tensors by the layout's cells."""
    k = layout.scopes.index(scope)
    parts = []
    for name, cells in layout.cells.items():
        matrix = state[name].double().reshape(layout.matrices[name])
        parts += [matrix[c.row0 : c.row1, c.col0 : c.col1].reshape(-1) for c in cells if k in c.scopes]
    return torch.cat(parts).numpy()


@pytest.mark.parametrize("arch", ARCHS)
def test_cells_cover_every_parameter_once_and_scopes_sum_their_groups(arch):
    model = tiny_model(arch)
    layout = layout_of(meta_model(tiny_config(arch)))
    params = dict(model.named_parameters())
    assert list(layout.cells) == list(params)  # tied tensors once, no buffers
    for name, cells in layout.cells.items():  # a partition of the parameter's matrix
        rows, cols = layout.matrices[name]
        assert rows * cols == params[name].numel()
        covered = np.zeros((rows, cols), dtype=int)
        for c in cells:
            covered[c.row0 : c.row1, c.col0 : c.col1] += 1
        assert (covered == 1).all()
    n_layers, n_heads = model.config.num_hidden_layers, model.config.num_attention_heads
    assert layout.numel("model") == sum(p.numel() for p in params.values())
    for i in range(n_layers):
        groups = [g for g in ("attn", "mlp", "norm") if f"L{i}.{g}" in layout.scopes]
        assert layout.numel(f"L{i}") == sum(layout.numel(f"L{i}.{g}") for g in groups)
        block = {n for n in params if f".{i}." in n}
        assert layout.numel(f"L{i}") == sum(params[n].numel() for n in block)
        d_model = model.config.hidden_size
        for j in range(n_heads):  # W_Q, W_K, W_V rows and W_O columns: 4 x d_head x d_model, no biases
            d_head = getattr(model.config, "head_dim", None) or d_model // n_heads
            assert layout.numel(f"L{i}H{j}") == 4 * d_head * d_model
    embed = model.get_input_embeddings().weight
    assert layout.numel("embed") >= embed.numel()
    tied = model.get_output_embeddings().weight is embed
    assert ("unembed" in layout.scopes) == (not tied)


def test_head_scopes_equal_the_familys_own_reshape():
    model = tiny_model("gpt_neox")
    layout = layout_of(meta_model(tiny_config("gpt_neox")))
    state = {k: v.detach() for k, v in model.state_dict().items()}
    n_heads = model.config.num_attention_heads
    for layer in range(2):
        for head in range(n_heads):
            got = np.sort(cell_vector(state, layout, f"L{layer}H{head}"))  # the same coordinates
            want = np.sort(neox_head(state, layer, head, n_heads).double().numpy())
            np.testing.assert_array_equal(got, want)


@pytest.fixture(scope="module")
def arch_series(tmp_path_factory):
    """Per architecture: a short saved series, its layout, its tensors as stored, and its whole state dicts.
    Where the files do not hold the parameters by name (transformers 5 saves OLMoE's fused experts one
    expert at a time), the series as the band's whole reads write it: each checkpoint loaded by
    transformers and its parameters saved under their own names."""

    def make(arch):
        folders = save_series(tmp_path_factory.mktemp(arch), arch, steps=list(range(0, 90, 10)))
        skeleton = meta_model(tiny_config(arch))
        layout = layout_of(skeleton)
        rename = legacy_renamer(skeleton)
        stored = [stored_parameters(f, ["model.safetensors"], layout, rename) for f in folders]
        if any(s is None for s in stored):
            assert arch == "olmoe"  # the one tested family whose files name other tensors
            rename = lambda key: key  # noqa: E731
            for f in folders:
                params = dict(AutoModelForCausalLM.from_pretrained(f).named_parameters())
                save_file({n: params[n].detach().contiguous() for n in layout.cells}, f / "whole.safetensors")
                (f / "model.safetensors").unlink()
                (f / "whole.safetensors").rename(f / "model.safetensors")
            stored = [stored_parameters(f, ["model.safetensors"], layout, rename) for f in folders]
        states = [{rename(k): v for k, v in load_file(f / "model.safetensors").items()} for f in folders]
        return folders, layout, stored, states

    return make


def whole_gram(states, layout, scope) -> np.ndarray:
    vectors = np.stack([cell_vector(s, layout, scope) for s in states])
    deltas = np.diff(vectors, axis=0)
    return deltas @ deltas.T


@pytest.mark.parametrize("arch", ARCHS)
def test_streamed_exact_gram_equals_the_whole_vectors_in_every_scope(arch, arch_series):
    """Every scope's Gram matrix, streamed block by block, against the updates' whole vectors (float64):
    with blocks far larger than any parameter, and with 2 KiB blocks that cut heads' rows, a fused qkv
    and the (tied) embedding mid-row."""
    _, layout, stored, states = arch_series(arch)
    width = 4
    for memory in (2**30, 2 * 4096 * len(stored)):
        band = stream_gram(stored, layout, width, memory)
        for scope in layout.scopes:
            want = whole_gram(states, layout, scope)
            scale = np.abs(want).max()
            for first in range(len(stored) - width):
                got = band.window(layout.scopes.index(scope), first, width)
                np.testing.assert_allclose(
                    got, want[first : first + width, first : first + width], rtol=0, atol=1e-10 * scale
                )


def page_span(start: int, end: int, direct: bool) -> tuple[int, int]:
    """The bytes a read of [start, end) takes from the disk: whole pages where the file is open with
    O_DIRECT."""
    page = tensor_files.PAGE
    return (start // page * page, -(-end // page) * page) if direct else (start, end)


def merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def test_each_file_is_read_once_and_the_band_reads_only_the_last_update(arch_series, monkeypatch):
    _, layout, stored, states = arch_series("gpt_neox")
    reads: list[tuple[str, int, int, bool]] = []
    original = tensor_files.read_into

    def counting(fd, buffer, offset, needed=None):
        got = original(fd, buffer, offset, needed)
        direct = bool(os.O_DIRECT & fcntl.fcntl(fd, fcntl.F_GETFL))
        reads.append((os.readlink(f"/proc/self/fd/{fd}"), offset, offset + got, direct))
        return got

    monkeypatch.setattr(tensor_files, "read_into", counting)
    stream_gram(stored, layout, 4, 2 * 4096 * len(stored))
    by_file: dict[str, list[tuple[int, int]]] = {}
    for path, start, end, _ in reads:
        by_file.setdefault(path, []).append((start, end))
    assert len(by_file) == len(stored)
    direct = {path: d for path, _, _, d in reads}
    for checkpoint in stored:
        path = str(next(iter(checkpoint.values())).path.resolve())
        spans = sorted(by_file[path])
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), "a byte read twice"
        # every parameter's bytes (whole pages of them where direct), nothing else
        size = os.path.getsize(path)
        want = merged([page_span(t.offset, t.offset + t.numel * t.itemsize, direct[path]) for t in checkpoint.values()])
        assert merged(spans) == [(a, min(b, size)) for a, b in want]
    last = stream_gram(stored, layout, 4, 2**30, last_only=True)
    full = stream_gram(stored, layout, 4, 2**30)
    np.testing.assert_array_equal(last.values[:, :-1], 0)
    np.testing.assert_allclose(last.values[:, -1], full.values[:, -1], rtol=1e-12)


def test_a_file_system_that_refuses_direct_reads_is_read_buffered(arch_series, monkeypatch):
    """O_DIRECT opened but its reads refused (EINVAL, as some file systems do): the file is read again
    buffered, and the products are those of buffered reads throughout."""
    _, layout, stored, _ = arch_series("gpt_neox")
    buffered_only = {"on": False}
    real_open = tensor_files.open_for_reading

    def no_direct(path):
        return tensor_files.OpenFile(os.open(path, os.O_RDONLY), direct=False)

    monkeypatch.setattr(tensor_files, "open_for_reading", no_direct)
    want = stream_gram(stored, layout, 4, 2 * 4096 * len(stored))
    monkeypatch.setattr(tensor_files, "open_for_reading", real_open)
    real_preadv = os.preadv

    def refusing(fd, buffers, offset):
        if os.O_DIRECT & fcntl.fcntl(fd, fcntl.F_GETFL):
            buffered_only["on"] = True
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_preadv(fd, buffers, offset)

    monkeypatch.setattr(tensor_files.os, "preadv", refusing)
    got = stream_gram(stored, layout, 4, 2 * 4096 * len(stored))
    np.testing.assert_array_equal(got.values, want.values)
    direct_here = tensor_files.open_for_reading(next(iter(stored[0].values())).path)
    os.close(direct_here.fd)
    assert buffered_only["on"] == direct_here.direct  # refused where this file system took O_DIRECT at all


@pytest.mark.parametrize("arch", ["gpt_neox", "gpt2", "llama"])
def test_the_sketch_is_linear_seeded_and_each_scope_sketches_its_own_coordinates(arch):
    model = tiny_model(arch)
    layout = layout_of(meta_model(tiny_config(arch)))
    params = {n: p.detach() for n, p in model.named_parameters()}
    other = {n: torch.randn_like(p) for n, p in params.items()}
    a, b = sketch(params, layout, 64, seed=3), sketch(other, layout, 64, seed=3)
    diff = sketch({n: params[n] - other[n] for n in params}, layout, 64, seed=3)
    np.testing.assert_allclose(a - b, diff, rtol=1e-5, atol=1e-5)  # params - other rounds in float32
    assert np.array_equal(a, sketch(params, layout, 64, seed=3))
    assert not np.allclose(sketch(params, layout, 64, seed=4)[0], a[0])
    # a head's sketch is the model's sketch of the head's coordinates alone (zeros elsewhere)
    head = layout.scopes.index("L1H1")
    alone = {n: torch.zeros_like(p) for n, p in params.items()}
    for name, cells in layout.cells.items():
        for c in cells:
            if head in c.scopes:
                rows, cols = layout.matrices[name]
                alone[name].reshape(rows, cols)[c.row0 : c.row1, c.col0 : c.col1] = params[name].reshape(rows, cols)[
                    c.row0 : c.row1, c.col0 : c.col1
                ]
    np.testing.assert_allclose(sketch(alone, layout, 64, seed=3)[0], a[head], rtol=1e-9, atol=1e-12)


def test_the_sketch_keeps_inner_products_nearly():
    rng = np.random.default_rng(0)
    x = torch.tensor(rng.normal(size=(2, 200, 100)))
    layout = Layout(["model"], {"p": (20000, 1)}, {"p": [Cell("p", 0, 20000, 0, 1, (0,))]})
    u, v = (sketch({"p": x[i].reshape(-1, 1)}, layout, 4000, seed=0)[0] for i in range(2))
    assert u @ u == pytest.approx(float((x[0] ** 2).sum()), rel=0.1)
    assert u @ v == pytest.approx(float((x[0] * x[1]).sum()), abs=0.1 * float((x[0] ** 2).sum()))


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
    return out, run_edge(series[0], out, f"edge.window=[{W},{W + 2}]")  # exact: the default


@pytest.mark.parametrize("scope", ["model", "L1", "L0H2", "L1.attn", "L0.mlp", "embed", "unembed"])
def test_exact_edge_equals_an_independent_svd_of_the_updates(series, exact_edge, scope):
    _, folders = series
    out, edge = exact_edge
    assert edge["schema"] == 2 and edge["projection"] == "exact" and edge["dim"] is None
    assert [s["window"] for s in edge["spectra"]] == [W, W + 2]
    for spectra in edge["spectra"]:
        w = spectra["window"]
        want = independent_ratios(folders, w, scope, n_heads=4)
        got = spectra["scopes"][scope]
        assert len(got) == len(want) == len(folders) - w
        for i, (window, sv) in enumerate(zip(got, want)):
            assert (window["first_step"], window["last_step"], window["spacing"]) == (10 * i, 10 * (i + w), 10)
            np.testing.assert_allclose(window["singular_values"], sv, rtol=1e-6)
            assert window["r12"] == pytest.approx(sv[0] / sv[1], rel=1e-6)
            assert window["r23"] == pytest.approx(sv[1] / sv[2], rel=1e-6)
            share = np.cumsum(sv**2) / (sv**2).sum()
            assert window["k95"] == int(np.argmax(share >= 0.95)) + 1
    assert (out / "edge.png").stat().st_size > 0


def test_a_series_of_pickles_is_read_as_a_band_to_the_same_edge(series, exact_edge, tmp_path):
    """Pickled checkpoints are loaded whole once each, kept as scratch safetensors while a window needs
    them (W + 1 at most), and give the edge the safetensors series gives; no scratch file stays."""
    import safetensors.torch

    from emergence.spectral_edge import stream

    root, folders = series
    pickles = tmp_path / "pickles"
    for folder in folders:
        shutil.copytree(folder, pickles / folder.name, ignore=shutil.ignore_patterns("*.safetensors"))
        torch.save(
            safetensors.torch.load_file(folder / "model.safetensors"), pickles / folder.name / "pytorch_model.bin"
        )
    on_disk: list[int] = []
    real = stream.SeriesFiles.convert

    def convert(self, i):
        on_disk.append(len(self.converted) + 1)
        return real(self, i)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(stream.SeriesFiles, "convert", convert)
        band = run_edge(pickles, tmp_path / "out", f"edge.window=[{W},{W + 2}]")
    assert len(on_disk) == len(folders) and max(on_disk) <= W + 2 + 1
    assert not (tmp_path / "out" / stream.SCRATCH).exists()
    _, want = exact_edge
    for b, e in zip(band["spectra"], want["spectra"], strict=True):
        for scope in ("model", "L1", "L0H2"):
            for x, y in zip(b["scopes"][scope], e["scopes"][scope], strict=True):
                np.testing.assert_allclose(x["singular_values"], y["singular_values"], rtol=1e-9)


def test_the_sketch_edge_converges_to_exact(series, exact_edge, tmp_path):
    """At d = 100 W each window's ratios are within 10% of the exact ones (the sketch's inner products err
    by about sqrt(2/d)); the default d is 10 x the largest W."""
    root, _ = series
    _, exact = exact_edge
    assert run_edge(root, tmp_path / "d", "edge.projection=sketch")["dim"] == 10 * W
    sketched = run_edge(root, tmp_path / "sketch", "edge.projection=sketch", f"edge.dim={100 * W}")
    assert sketched["projection"] == "sketch" and sketched["dim"] == 100 * W
    for scope in ("model", "L1", "L0H2"):
        pairs = zip(exact["spectra"][0]["scopes"][scope], sketched["spectra"][0]["scopes"][scope], strict=True)
        for e, j in pairs:
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
    assert "use one of those" in one_line_error(capsys, root, tmp_path / "o7", "edge.projection=jl")
    assert "each W needs >= 3" in one_line_error(capsys, root, tmp_path / "o8", "edge.window=[5,2]")
    assert "edge.memory_mib=0 is invalid" in one_line_error(capsys, root, tmp_path / "o9", "edge.memory_mib=0")
    assert one_line_error(capsys, root, tmp_path / "o6", "edge.nope=1").startswith("error: ")


def test_the_edge_is_a_wandb_run_of_the_sweeps_group(series, tmp_path, monkeypatch):
    """W&B offline: one run (job_type edge, group: the output folder's name) whose history holds each
    window of the whole model's edge against its last checkpoint's position."""
    from tests.helpers.wandb_offline import history

    monkeypatch.setenv("WANDB_MODE", "offline")
    root, _ = series
    out = tmp_path / "my_sweep"
    edge = run_edge(root, out, "wandb.mode=offline")
    (run_dir,) = (out / "wandb").glob("offline-run-*")
    logged = [row for row in history(run_dir) if "edge/r23" in row]
    windows = edge["spectra"][0]["scopes"]["model"]
    axis = "tokens" if windows[0]["last_tokens"] is not None else "step"
    assert [row[axis] for row in logged] == [w["last_tokens" if axis == "tokens" else "last_step"] for w in windows]
    assert [row["edge/r23"] for row in logged] == pytest.approx([w["r23"] for w in windows])
    assert [row["edge/drift_speed"] for row in logged] == pytest.approx([w["drift_speed"] for w in windows])
    from tests.helpers.wandb_offline import finished_records

    runs = [r.run for r in finished_records(run_dir) if r.WhichOneof("record_type") == "run"]
    assert {(r.run_group, r.job_type) for r in runs} == {("my_sweep", "edge")}


def test_a_folder_with_no_runs_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        main([str(tmp_path)])
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert (
        line == f"error: {tmp_path} holds no runs of python -m emergence; give the sweep directory of a panel multirun"
    )


def test_a_schema_1_edge_json_still_reads(tmp_path):
    """edge.json as this tool wrote it with one W: read as an Edge of one WindowSpectra, k95 unknown."""
    from emergence.spectral_edge.records import Edge

    window = {
        "first_step": 0,
        "last_step": 50,
        "first_tokens": None,
        "last_tokens": None,
        "spacing": 10,
        "singular_values": [3.0, 2.0, 1.0],
        "r12": 1.5,
        "r23": 2.0,
        "k_star": 2,
        "pc1_share": 0.64,
        "pc2_share": 0.29,
        "drift_speed": 0.5,
    }
    old = {
        "model": "toy_neox",
        "window": 5,
        "projection": "jl",
        "dim": 50,
        "scopes": {"model": [window]},
        "collapse": {"model": {"peak": 0, "collapse": None}},
    }
    (tmp_path / "edge.json").write_text(json.dumps(old))
    edge = Edge.load(tmp_path)
    assert edge.projection == "jl" and edge.dim == 50 and edge.first.window == 5
    (got,) = edge.first.scopes["model"]
    assert got.r23 == 2.0 and got.k95 is None and edge.first.collapse["model"].peak == 0
