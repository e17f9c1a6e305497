"""Weights & Biases: one tracked run per job, closed whatever happens.

W&B is an output, not the record (``heads.csv`` and ``summary.json`` are). Offline by
default (``$WANDB_MODE`` and the other W&B variables are the config's defaults) so a run
never waits on a network; ``wandb.mode=disabled`` turns it off. A checkpoint analysed while its
model trains goes into the training's own run instead (``log_into_training``).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from emergence import measures  # noqa: E402
from emergence.core.errors import UsageError  # noqa: E402
from emergence.recipe.screen import CLASSES, UNCLASSIFIED  # noqa: E402
from emergence.recipe.tasks import Task  # noqa: E402
from emergence.recipe.tasks.metrics import TOP1_METRIC  # noqa: E402
from emergence.run.results import HeadRow, RunSummary, read_run  # noqa: E402

CLASS_COLOURS = dict(
    zip((*CLASSES, UNCLASSIFIED), ("tab:red", "tab:orange", "tab:blue", "tab:green", "tab:purple", "tab:cyan", "0.85"))
)


def class_figure(head_class: np.ndarray, title: str):
    """A layer x head grid coloured by each head's class."""
    n_layers, n_heads = head_class.shape
    labels = list(CLASS_COLOURS)
    index = np.vectorize(labels.index)(head_class)
    cmap = matplotlib.colors.ListedColormap(list(CLASS_COLOURS.values()))
    fig, ax = plt.subplots(figsize=(max(4.0, 0.35 * n_heads + 3), max(3.0, 0.3 * n_layers + 1.5)))
    ax.imshow(index, cmap=cmap, vmin=-0.5, vmax=len(labels) - 0.5, aspect="auto")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title)
    ax.set_xticks(range(n_heads))
    ax.set_yticks(range(n_layers))
    handles = [matplotlib.patches.Patch(color=c, label=l) for l, c in CLASS_COLOURS.items()]
    ax.legend(handles=handles, bbox_to_anchor=(1.02, 1), loc="upper left", fontsize=8)
    fig.tight_layout()
    return fig


def check_login(wandb_cfg) -> None:
    """``wandb.mode=online`` needs credentials: find out before any work, not after it."""
    if wandb_cfg.mode != "online":
        return
    import wandb

    if not wandb.login(verify=False, prompt=False):
        raise UsageError(
            "wandb.mode='online' is invalid here: no W&B API key is configured; run `wandb login` "
            "or set WANDB_API_KEY, or use wandb.mode=offline (sync later with `wandb sync`)"
        )


def run_id(run_dir: Path) -> str:
    """The same W&B run id for every job run into the same directory, so a re-run resumes it."""
    return hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]


@contextmanager
def tracked_run(
    wandb_cfg, name: str, config: dict, run_dir: Path, job_type: str = "checkpoint", tags: Sequence[str | None] = ()
):  # None and empty tags are left out
    """Yield a W&B run (None when disabled); the run is finished even if the body raises.

    ``tags`` join the configured ``wandb.tags``; ``wandb.dir`` (default ``$WANDB_DIR``)
    places the ``wandb/`` folder, else it goes into ``run_dir``."""
    if wandb_cfg.mode == "disabled":
        yield None
        return
    import wandb

    os.environ.setdefault("WANDB_SILENT", "true")
    if wandb_cfg.dir:
        Path(wandb_cfg.dir).mkdir(parents=True, exist_ok=True)
    run = wandb.init(
        project=wandb_cfg.project,
        entity=wandb_cfg.entity,
        group=wandb_cfg.group,
        tags=list(dict.fromkeys([*wandb_cfg.tags, *(t for t in tags if t)])),
        name=name,
        id=run_id(run_dir),
        resume="allow",
        config=config,
        job_type=job_type,
        mode=wandb_cfg.mode,
        dir=wandb_cfg.dir or str(run_dir),
        settings=wandb.Settings(console="off", init_timeout=60),
    )
    try:
        yield run
    except BaseException:  # marked failed; the caller reports the error (wandb's own exit would print it)
        run.finish(exit_code=1)
        raise
    run.finish()


def log_checkpoint(run, summary: RunSummary, rows: list[HeadRow], figure) -> None:
    """Summary metrics (``results.RunSummary``) against tokens, the per-head table and the class grid."""
    if run is None:
        return
    import wandb

    run.define_metric("tokens")
    run.define_metric("*", step_metric="tokens")
    metrics = checkpoint_metrics(summary, [r.columns() for r in rows], figure)
    run.log(metrics)
    run.summary.update({k: v for k, v in metrics.items() if not isinstance(v, (wandb.Table, wandb.Image))})


TRAINING_PREFIX = "emergence/"  # a training's W&B run: our metrics' namespace beside its own
TRAINING_STEP = "train/global_step"  # the axis transformers' ``report_to="wandb"`` plots its metrics against


def log_into_training(run, summary: RunSummary, out_dir: Path, more: dict[str, float] | None = None) -> None:
    """A checkpoint analysed while its model trains (``EmergenceCallback``), into the training's own W&B run:
    ``log_checkpoint``'s metrics (tokens seen among them) and ``more`` (the live edge's) under
    ``emergence/``, against the training's step, the per-head table and the class grid read back from the
    run directory ``out_dir``."""
    run.define_metric(f"{TRAINING_PREFIX}*", step_metric=TRAINING_STEP)
    metrics = {**checkpoint_metrics(summary, read_run(out_dir)[1], out_dir / "classes.png"), **(more or {})}
    run.log({**{TRAINING_PREFIX + k: v for k, v in metrics.items()}, TRAINING_STEP: summary.step})


def scalar_fields(prefix: str, values: dict) -> dict[str, float]:
    """The numbers of ``values`` (a measure's per-run fields) as ``prefix<field>``, a nested record's as
    ``prefix<field>/<key>``; lists and strings are not metrics."""
    out: dict[str, float] = {}
    for k, v in values.items():
        if isinstance(v, dict):
            out.update(scalar_fields(f"{prefix}{k}/", v))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[f"{prefix}{k}"] = v
    return out


def checkpoint_metrics(summary: RunSummary, rows: list[dict], figure) -> dict:
    """What W&B logs of a checkpoint: its summary's numbers, the per-head table (``rows``: heads.csv's
    rows, each column by name) and the class grid (``figure``: a matplotlib figure or an image file)."""
    import wandb

    metrics: dict[str, Any] = {
        "tokens": summary.tokens if summary.tokens is not None else -1,
        "bos_fraction": summary.bos_fraction,
        "n_induction": len(summary.induction_circuit),
        **{f"class_counts/{k}": v for k, v in summary.class_counts.items()},
    }
    ablation = summary.ablation
    if ablation.effect:
        metrics.update({f"ablation/{k}": v for k, v in ablation.effect.to_json().items() if v is not None})
    metrics.update({f"ablation/clean_{k}": v for k, v in ablation.clean.to_json().items()})
    if summary.task is not None:  # probe.task: its capability, and each screen against its matched-random draws
        task = summary.task
        metrics.update({f"task/{task.name}/{k}": m.value for k, m in task.metrics.metrics.items()})
        for sweep in task.ablation.sweeps if task.ablation else []:
            for metric, s in sweep.sweeps.items():
                # the verdict metric: in its own units
                unit = "_pp" if metric == TOP1_METRIC[cast(Task, task.name)] else ""
                metrics[f"task/{task.name}/{sweep.screen}/{metric}_delta{unit}"] = s.screen_delta
                metrics[f"task/{task.name}/{sweep.screen}/{metric}_random_delta{unit}"] = s.mean
    # the measures: their per-run numbers (a record's numbers under its field), and their columns in the head
    # table (each row has them all); lists (curves, chains) stay in summary.json
    for name, values in summary.measures.items():
        metrics.update(scalar_fields(f"{name}/", values))
        declared = measures.REGISTRY.get(name)
        series = None if declared is None else declared.series
        if series is not None and values.get(series.failed):  # why the number is missing, beside it
            metrics[f"{name}/{series.failed}"] = str(values[series.failed])
    columns = list(rows[0])
    metrics["heads"] = wandb.Table(columns=columns, data=[[r[c] for c in columns] for r in rows])
    metrics["classes"] = wandb.Image(str(figure) if isinstance(figure, Path) else figure)
    return metrics
