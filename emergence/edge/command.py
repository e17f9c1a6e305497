"""``python -m emergence.edge``: the spectral edge of a checkpoint series (docs/edge.md).

    python -m emergence.edge SWEEP_DIR                          # a panel sweep: its model, first..last revision
    python -m emergence.edge model=toy_neox model.toy.save_every=32
    python -m emergence.edge model=local model.name_or_path=RUN_DIR edge.projection=exact --out OUT

For each rolling window of ``edge.window`` consecutive checkpoint updates at one spacing, and for the
whole model, each decoder block (``L<i>``) and each attention head (``L<i>H<j>``): the singular values of
the stacked updates, sigma_1/sigma_2, sigma_2/sigma_3, the signal rank, the top two directions' shares and
the drift speed. Writes ``edge.json`` and ``edge.png`` into SWEEP_DIR, or ``--out`` (default
``outputs/edge/<model.key>``). Settings: ``edge.window`` (10), ``edge.projection`` (jl | exact),
``edge.dim`` (jl: 10 x window), ``edge.seed``.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from pathlib import Path

import torch

from emergence.core.config import Config, PanelEntry, compose_config
from emergence.core.errors import CommandParser, UsageError, invalid
from emergence.edge.output.figure import plot_edge
from emergence.edge.projection.projection import Exact, RandomProjection
from emergence.edge.scopes.scopes import meta_model, scopes_of
from emergence.edge.stream.stream import stream_windows
from emergence.hub.checkpoints import (
    Source,
    free_memory,
    load_config,
    load_model,
    panel_revision,
    pick_dtype,
    source,
)
from emergence.hub.revisions import between, existing_checkpoints
from emergence.panel.refine import merge_overrides, panel_overrides
from emergence.panel.runs import load_runs
from emergence.recipe.edge import MODEL_SCOPE, Collapse, Edge
from emergence.run import prefetch, steps
from emergence.run.tracking import tracked_run

log = logging.getLogger(__name__)
PROJECTIONS = ("jl", "exact")


def check_edge_config(cfg: Config) -> int | None:
    """The projection's dimension (None: exact); a UsageError for a setting the edge cannot take."""
    edge = cfg.edge
    if edge.window < 3:
        raise invalid("edge.window", edge.window, "a window needs >= 3 updates (sigma_2/sigma_3)")
    if edge.projection not in PROJECTIONS:
        raise invalid("edge.projection", edge.projection, f"use one of {', '.join(PROJECTIONS)}")
    if edge.projection == "exact":
        return None
    dim = edge.dim if edge.dim is not None else 10 * edge.window
    if dim < edge.window:
        raise invalid(
            "edge.dim", dim, f"a projection must keep >= edge.window={edge.window} dimensions (default 10 x window)"
        )
    return dim


def sweep_series(sweep_dir: Path, overrides: list[str], model: str | None) -> tuple[Config, list[PanelEntry]]:
    """A panel sweep's configuration (its runs' overrides, then the command line's) and every existing
    checkpoint from its first panel revision to its last, as ``python -m emergence.refine`` finds them."""
    trajectories = load_runs([sweep_dir])
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


class HubDownloads:
    """A Hub series' checkpoints fetched as a sweep fetches them (``run/prefetch``): one background thread
    downloads the checkpoint read next and ``hub.prefetch`` more ahead while one is read; with
    ``model.cleanup=true`` each revision this command downloaded is removed once it is read. Local
    checkpoints (and ``hub.prefetch=0``) pass through: the loader reads or downloads them itself."""

    def __init__(self, cfg: Config, sources: list[Source]):
        self.cleanup, self.ahead = cfg.model.cleanup, cfg.hub.prefetch
        self.order = [s for s in sources if not s.local_only]
        self.downloader = prefetch.Downloader() if self.order and self.ahead > 0 else None

    @staticmethod
    def key(src: Source) -> prefetch.Key:
        return src.path, src.revision, src.weights_format

    def ready(self, src: Source) -> Source:
        """``src`` once its files are in the cache (asking for the next ones on the way)."""
        if self.downloader is None or src.local_only:
            return src
        at = self.order.index(src)
        for later in self.order[at : at + 1 + self.ahead]:
            self.downloader.ask(self.key(later))
        self.downloader.wait(self.key(src))
        return src

    def done(self, src: Source) -> None:
        """``src`` is read: remove it where ``model.cleanup`` asks (after the downloads asked so far)."""
        if not self.cleanup or src.local_only:
            return
        if self.downloader is None:
            steps.remove_from_cache(src)
        else:
            self.downloader.later(lambda: steps.remove_from_cache(src))

    def finish(self) -> None:
        if self.downloader is not None:
            self.downloader.finish()


def edge(cfg: Config, entries: list[PanelEntry], out_dir: Path) -> Edge:
    """The edge of ``entries`` (checkpoints of ``cfg``'s model, by step), written to ``out_dir``."""
    dim = check_edge_config(cfg)
    device, dtype = torch.device("cpu"), pick_dtype(cfg.model.dtype)

    def checkpoint_source(entry: PanelEntry):
        return source(cfg, panel_revision(entry, cfg.model.tokens_per_step))

    if not entries:
        raise UsageError(f"model {cfg.model.key} has no checkpoints; train or save its run first")
    first = checkpoint_source(entries[0])
    skeleton = meta_model(load_config(cfg, first).hf_config, cfg.model.trust_remote_code)
    scopes = scopes_of(skeleton)
    projection: Exact | RandomProjection
    if dim is None:
        projection = Exact(scopes)
        need = projection.bytes_needed({n: p.shape for n, p in skeleton.named_parameters()}, cfg.edge.window)
        free = free_memory(device)
        log.info(
            f"edge: exact mode keeps {cfg.edge.window + 2} float64 copies of {len(scopes)} scopes: "
            f"{need / 2**30:.2f} GiB" + (f" of {free / 2**30:.1f} GiB available" if free else "")
        )
        if free is not None and need > free:
            raise invalid(
                "edge.projection",
                "exact",
                f"it needs {need / 2**30:.1f} GiB but {free / 2**30:.1f} GiB is available; use edge.projection=jl",
            )
    else:
        projection = RandomProjection(scopes, dim, cfg.edge.seed)

    sources = {entry.step: checkpoint_source(entry) for entry in entries}  # before anything is fetched
    downloads = HubDownloads(cfg, [sources[e.step] for e in entries])

    def read(entry: PanelEntry):
        src = downloads.ready(sources[entry.step])
        model = load_model(cfg, src, load_config(cfg, src), device, dtype, "eager")  # only its parameters are read
        vectors = projection.vectors(dict(model.named_parameters()))
        downloads.done(src)
        return vectors

    windows = stream_windows(entries, read, cfg.edge.window)
    downloads.finish()
    result = Edge(
        cfg.model.key,
        cfg.edge.window,
        cfg.edge.projection,
        dim,
        windows,
        {scope: Collapse.of(w) for scope, w in windows.items()},
    )
    result.save(out_dir)
    figure = plot_edge(result, out_dir)
    log_edge(cfg, result, figure, out_dir)
    return result


def log_edge(cfg: Config, result: Edge, figure: Path, out_dir: Path) -> None:
    """The whole model's windows as one W&B run of the sweep's group (``wandb.group``, else the sweep
    directory's name, as its checkpoints' runs are grouped): the ratios, shares and drift speed against
    the window's last checkpoint's tokens (its step where the series states none), and edge.png."""
    group = cfg.wandb.group or out_dir.resolve().name
    wandb_cfg = dataclasses.replace(cfg.wandb, group=group)
    config = {"model": cfg.model.key, "window": result.window, "projection": result.projection, "dim": result.dim}
    with tracked_run(wandb_cfg, f"edge-{cfg.model.key}", config, out_dir, job_type="edge") as run:
        if run is None:
            return
        import wandb

        axis = "tokens" if all(w.last_tokens is not None for w in result.scopes[MODEL_SCOPE]) else "step"
        run.define_metric(axis)
        run.define_metric("edge/*", step_metric=axis)
        for w in result.scopes[MODEL_SCOPE]:
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
                        )
                        if v is not None
                    },
                }
            )
        found = result.collapse[MODEL_SCOPE]
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
    windows = result.scopes[MODEL_SCOPE]
    found = result.collapse[MODEL_SCOPE]
    said = (
        "no collapse"
        if found.collapse is None
        else f"sigma_2/sigma_3 collapses (< 1.20) in the window ending at step {windows[found.collapse].last_step}"
    )
    print(f"edge: {len(windows)} windows x {len(result.scopes)} scopes; {said}; {out_dir / 'edge.json'}")
