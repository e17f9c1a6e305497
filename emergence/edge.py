"""``python -m emergence.edge``: the spectral edge of a checkpoint series (docs/edge.md).

    python -m emergence.edge SWEEP_DIR                          # a panel sweep: its model, first..last revision
    python -m emergence.edge model=toy_neox model.toy.save_every=32
    python -m emergence.edge model=local model.name_or_path=RUN_DIR edge.window=[10,20] --out OUT

For each rolling window of W consecutive checkpoint updates at one spacing (each W of ``edge.window``), and
for every scope (the whole model, its embeddings, each decoder block ``L<i>`` and its ``attn``, ``mlp`` and
``norm`` groups, each attention head ``L<i>H<j>``): the singular values of the stacked updates,
sigma_1/sigma_2, sigma_2/sigma_3, the signal rank, k95, the top two directions' shares and the drift speed.
Writes ``edge.json`` and ``edge.png`` into SWEEP_DIR, or ``--out`` (default ``outputs/edge/<model.key>``).
Settings: ``edge.window`` (10, or a list), ``edge.projection`` (exact | sketch), ``edge.dim`` (sketch:
10 x the largest W), ``edge.seed``, ``edge.memory_mib`` (exact: the read buffers' bound, 512).
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from emergence.core.config import Config, PanelEntry, compose_config
from emergence.core.errors import CommandParser, UsageError, invalid
from emergence.hub.checkpoints import load_config, panel_revision, source
from emergence.hub.revisions import between, existing_checkpoints
from emergence.spectral_edge.exact import BandGram
from emergence.spectral_edge.live import sketch_dim
from emergence.spectral_edge.records import MODEL_SCOPE, Edge
from emergence.spectral_edge.scopes import layout_of, meta_model
from emergence.spectral_edge.series import check_series
from emergence.spectral_edge.sketch import sketch
from emergence.spectral_edge.stream import SCRATCH, SeriesFiles, series_gram
from emergence.spectral_edge.windows import band_of_vectors, needed_checkpoints, spectra

log = logging.getLogger(__name__)
PROJECTIONS = ("exact", "sketch")


def check_edge_config(cfg: Config) -> None:
    """A UsageError for a setting the edge cannot take."""
    edge = cfg.edge
    windows = edge.windows
    if not windows or any(not isinstance(w, int) or isinstance(w, bool) or w < 3 for w in windows):
        raise invalid("edge.window", edge.window, "each W needs >= 3 updates (sigma_2/sigma_3): give 10, or [10,20]")
    if len(set(windows)) != len(windows):
        raise invalid("edge.window", edge.window, "a W is named twice; name each once")
    if edge.projection == "jl":
        raise invalid(
            "edge.projection",
            "jl",
            "a dense Gaussian projection is not offered: exact (the default) streams any model size, sketch "
            "(a count sketch) is over 35x faster than Gaussian draws; use one of those",
        )
    if edge.projection not in PROJECTIONS:
        raise invalid("edge.projection", edge.projection, f"use one of {', '.join(PROJECTIONS)}")
    if edge.projection == "sketch" and sketch_dim(edge) < max(windows):
        raise invalid(
            "edge.dim", edge.dim, f"a sketch must keep >= {max(windows)} numbers (the largest W; default 10 x W)"
        )
    if edge.memory_mib < 1:
        raise invalid("edge.memory_mib", edge.memory_mib, "the read buffers need >= 1 MiB (default 512)")


def sweep_series(sweep_dir: Path, overrides: list[str], model: str | None) -> tuple[Config, list[PanelEntry]]:
    """A panel sweep's configuration (its runs' overrides, then the command line's) and every existing
    checkpoint from its first panel revision to its last, as ``python -m emergence.refine`` finds them."""
    # the panel's modules (and the recipe they read) are imported where a sweep is read: a series given by
    # its model starts the seconds they take sooner
    from emergence.panel.refine import merge_overrides, panel_overrides
    from emergence.panel.runs import load_runs

    try:
        trajectories = load_runs([sweep_dir])
    except FileNotFoundError:  # a folder with no run directory at all
        trajectories = {}
    if not trajectories:
        raise UsageError(
            f"{sweep_dir} holds no runs of python -m emergence; give the sweep directory of a panel multirun"
        )
    if model is None and len(trajectories) > 1:
        raise UsageError(
            f"{sweep_dir} holds {len(trajectories)} panels ({', '.join(trajectories)}); pick one with --model NAME"
        )
    name = model or next(iter(trajectories))
    if name not in trajectories:
        raise UsageError(f"--model {name} is invalid: {sweep_dir} holds {', '.join(trajectories)}")
    traj = trajectories[name]
    task, _ = panel_overrides(traj)
    cfg = compose_config(merge_overrides(task, overrides))
    every = existing_checkpoints(cfg)
    panel = [c.revision for c in traj.checkpoints if not c.refined]
    by_name = {e.revision: e for e in every}
    try:
        inside = between(every, panel[0], panel[-1])
    except ValueError as err:
        raise UsageError(f"{sweep_dir}: {err}; the panel's revisions must be among the model's checkpoints") from None
    return cfg, [by_name[panel[0]], *inside, by_name[panel[-1]]]


def model_series(overrides: list[str]) -> tuple[Config, list[PanelEntry]]:
    """The configuration the overrides compose, and every existing checkpoint of its model (a toy trained
    first where it is not yet)."""
    cfg = compose_config(overrides)
    check_edge_config(cfg)  # before a toy trains for it
    if cfg.model.toy is not None:
        from emergence.toy.train import ensure_trained
        from emergence.toy.validation import validate_recipe

        validate_recipe(cfg.model.toy)
        ensure_trained(cfg.model)
    return cfg, existing_checkpoints(cfg)


def sketch_band(cfg: Config, files: SeriesFiles, layout, count: int) -> BandGram:
    """The band of the sketches of checkpoints 0 .. count - 1 (each loaded whole once, then let go)."""
    dim, vectors = sketch_dim(cfg.edge), []
    for i in tqdm(range(count), desc="edge (sketch)", unit="checkpoint"):
        model = files.load(i)
        vectors.append(sketch(dict(model.named_parameters()), layout, dim, cfg.edge.seed))
        del model
        files.done(i)
    return BandGram(list(layout.scopes), band_of_vectors(np.stack(vectors), max(cfg.edge.windows)))


def edge(cfg: Config, entries: list[PanelEntry], out_dir: Path) -> Edge:
    """The edge of ``entries`` (checkpoints of ``cfg``'s model, by step), written to ``out_dir``."""
    check_edge_config(cfg)
    if not entries:
        raise UsageError(f"model {cfg.model.key} has no checkpoints; train or save its run first")
    check_series(entries)
    needed = needed_checkpoints(entries, cfg.edge.windows)
    series = [entries[i] for i in needed]
    first = source(cfg.model, panel_revision(series[0], cfg.model.tokens_per_step))
    skeleton = meta_model(load_config(cfg.model, first).hf_config, cfg.model.trust_remote_code)
    layout = layout_of(skeleton)
    if cfg.edge.projection == "exact":
        band = series_gram(cfg, series, layout, skeleton, out_dir)
    else:
        files = SeriesFiles(cfg, series, layout, skeleton, out_dir / SCRATCH)
        try:
            band = sketch_band(cfg, files, layout, len(series))
        finally:
            files.finish()
    dim = sketch_dim(cfg.edge) if cfg.edge.projection == "sketch" else None
    result = Edge(cfg.model.key, cfg.edge.projection, dim, spectra(entries, needed, band, cfg.edge.windows))
    result.save(out_dir)
    from emergence.spectral_edge.figure import plot_edge  # matplotlib, once the numbers are saved

    figure = plot_edge(result, out_dir)
    log_edge(cfg, result, figure, out_dir)
    return result


def log_edge(cfg: Config, result: Edge, figure: Path, out_dir: Path) -> None:
    """The whole model's windows as one W&B run of the sweep's group (``wandb.group``, else the sweep
    directory's name, as its checkpoints' runs are grouped): the ratios, shares and drift speed against
    the window's last checkpoint's tokens (its step where the series states none), and edge.png."""
    from emergence.run.tracking import tracked_run  # W&B's and the run records' modules: only now

    group = cfg.wandb.group or out_dir.resolve().name
    wandb_cfg = dataclasses.replace(cfg.wandb, group=group)
    first = result.first
    config = {
        "model": cfg.model.key,
        "window": [s.window for s in result.spectra],
        "projection": result.projection,
        "dim": result.dim,
    }
    with tracked_run(wandb_cfg, f"edge-{cfg.model.key}", config, out_dir, job_type="edge") as run:
        if run is None:
            return
        import wandb

        axis = "tokens" if all(w.last_tokens is not None for w in first.scopes[MODEL_SCOPE]) else "step"
        run.define_metric(axis)
        run.define_metric("edge/*", step_metric=axis)
        for w in first.scopes[MODEL_SCOPE]:
            run.log(
                {
                    axis: w.last_tokens if axis == "tokens" else w.last_step,
                    **{
                        f"edge/{k}": v
                        for k, v in (
                            ("r12", w.r12),
                            ("r23", w.r23),
                            ("pc1_share", w.pc1_share),
                            ("pc2_share", w.pc2_share),
                            ("drift_speed", w.drift_speed),
                            ("k_star", w.k_star),
                            ("k95", w.k95),
                        )
                        if v is not None
                    },
                }
            )
        found = first.collapse[MODEL_SCOPE]
        run.summary.update({"edge/peak_window": found.peak, "edge/collapse_window": found.collapse})
        run.log({"edge/figure": wandb.Image(str(figure))})


def main(argv=None) -> None:
    p = CommandParser("python -m emergence.edge", __doc__)
    p.add_argument(
        "target",
        nargs="*",
        help="SWEEP_DIR (a panel multirun's directory) and/or Hydra overrides (model=..., edge.window=...)",
    )
    p.add_argument("--model", help="the panel to read where SWEEP_DIR holds several (as the report names them)")
    p.add_argument("--out", type=Path, help="where edge.json goes without SWEEP_DIR (default outputs/edge/<model.key>)")
    args = p.parse_intermixed_args(argv)
    overrides = [t for t in args.target if "=" in t]
    folders = [Path(t) for t in args.target if "=" not in t]
    if len(folders) > 1:
        p.error(f"one SWEEP_DIR at most, got {len(folders)}: {' '.join(map(str, folders))}")
    if folders and not folders[0].is_dir():
        p.error(f"{folders[0]} is not a directory: give the sweep directory of a panel multirun")
    p.check_output_folder(args.out, "edge.json and edge.png")
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    logging.getLogger("emergence").setLevel(logging.INFO)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one bar, the edge's over checkpoints: not one per checkpoint's load
    try:
        if folders:
            cfg, entries = sweep_series(folders[0].resolve(), overrides, args.model)
            out_dir = args.out or folders[0]
        else:
            cfg, entries = model_series(overrides)
            out_dir = args.out or Path("outputs") / "edge" / cfg.model.key
        result = edge(cfg, entries, out_dir)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    windows = result.first.scopes[MODEL_SCOPE]
    found = result.first.collapse[MODEL_SCOPE]
    said = (
        "no collapse"
        if found.collapse is None
        else f"sigma_2/sigma_3 collapses (< 1.20) in the window ending at step {windows[found.collapse].last_step}"
    )
    print(
        f"edge: W={result.first.window}: {len(windows)} windows x {len(result.first.scopes)} scopes; {said}; "
        f"{out_dir / 'edge.json'}"
    )


if __name__ == "__main__":
    main()
