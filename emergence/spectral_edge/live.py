"""The edge of a model while it trains (``track`` and the callback keep no past checkpoint): each call
keeps the count sketch of every scope (``sketch.py``) in ``<runs>/edge_sketch/step<N>.npz``, and the
windows the kept sketches make are ``<runs>/edge_live.json`` (an ``Edge`` of projection ``sketch``).
``python -m emergence.edge`` on the saved checkpoints afterwards gives the exact edge."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch

from emergence.core.atomic import atomic_write_bytes
from emergence.core.config import EdgeConfig, PanelEntry
from emergence.core.errors import UsageError
from emergence.spectral_edge.exact import BandGram
from emergence.spectral_edge.records import Edge
from emergence.spectral_edge.scopes import layout_of
from emergence.spectral_edge.series import check_series, window_starts
from emergence.spectral_edge.sketch import sketch
from emergence.spectral_edge.windows import band_of_vectors, needed_checkpoints, spectra

SKETCH_FOLDER = "edge_sketch"
LIVE_FILE = "edge_live.json"


def sketch_dim(edge: EdgeConfig) -> int:
    """The sketch's dimension: ``edge.dim``, else 10 x the largest W (Xu 2026's d = 10 W)."""
    return edge.dim if edge.dim is not None else 10 * max(edge.windows)


def keep_sketch(model: torch.nn.Module, entry: PanelEntry, runs: Path, edge: EdgeConfig) -> None:
    """The sketch of ``model`` as it is at ``entry``'s step, written to ``runs/edge_sketch/``."""
    layout = layout_of(model)
    dim = sketch_dim(edge)
    values = sketch(dict(model.named_parameters()), layout, dim, edge.seed)
    buf = io.BytesIO()
    np.savez(
        buf,
        values=values,
        scopes=np.array(layout.scopes),
        step=entry.step,
        tokens=-1 if entry.tokens is None else entry.tokens,
        dim=dim,
        seed=edge.seed,
    )
    atomic_write_bytes(runs / SKETCH_FOLDER / f"step{entry.step}.npz", buf.getvalue())


def live_edge(runs: Path, model_key: str, edge: EdgeConfig) -> Edge | None:
    """The windows of the sketches kept in ``runs`` with today's settings, written to ``runs/edge_live.json``;
    None while no W has its W + 1 checkpoints at one spacing."""
    dim, kept = sketch_dim(edge), []
    for path in (runs / SKETCH_FOLDER).glob("step*.npz"):
        with np.load(path) as f:
            if int(f["dim"]) == dim and int(f["seed"]) == edge.seed:
                tokens = int(f["tokens"])
                entry = PanelEntry(f"step{int(f['step'])}", int(f["step"]), None if tokens < 0 else tokens)
                kept.append((entry, list(f["scopes"]), f["values"]))
    kept.sort(key=lambda k: k[0].step)
    kept = [k for k in kept if k[1] == kept[-1][1]]  # a model of other scopes saved into the same folder: not its
    entries = [k[0] for k in kept]
    try:
        check_series(entries)
        windows = [w for w in edge.windows if _has_window(entries, w)]
        if not windows:
            return None
        needed = needed_checkpoints(entries, windows)
    except UsageError:  # a series the sketches cannot make windows of yet
        return None
    vectors = np.stack([kept[i][2] for i in needed])
    band = BandGram(kept[-1][1], band_of_vectors(vectors, max(windows)))
    result = Edge(model_key, "sketch", dim, spectra(entries, needed, band, windows))
    result.save(runs, LIVE_FILE)
    return result


def _has_window(entries: list[PanelEntry], window: int) -> bool:
    try:
        return bool(window_starts(entries, window))
    except UsageError:  # fewer than W + 1 checkpoints at one spacing so far
        return False
