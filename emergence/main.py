"""``python -m emergence``: probe -> screen -> participation ratio -> ablate on one checkpoint.

``analyse`` is the recipe in order, one call a step (``emergence/run/steps.py``); each step's maths
lives in ``emergence/recipe/``. It serves the command line, ``python -m emergence.watch`` and, on a model
in memory, ``emergence.track`` (its step 0 differs: ``steps.load_live``). ``main`` is
the command line around it: one line and exit 2 for bad input, a sweep that survives a
failing job, Ctrl-C without a traceback.
"""

from __future__ import annotations

import logging
import shutil
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import cast

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.plugins import Plugins
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from emergence.core.config import Config
from emergence.core.errors import UsageError
from emergence.hub import integrity
from emergence.recipe import ablation, screen, spectral, stats
from emergence.recipe.pass_record import PassRecord
from emergence.recipe.tasks.step import measure_task
from emergence.run import interrupt, prefetch, results, steps, sweep, tracking
from emergence.run.validation import validate
from hydra_plugins.emergence_slurm.launcher import SlurmLauncher

log = logging.getLogger(__name__)


class Laps:
    """Seconds per step of the recipe, in order (``summary.json`` ``timings``)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def __call__(self, step: str) -> None:
        now = time.perf_counter()
        self.seconds[step] = round(now - self._last, 3)
        self._last = now


def analyse(
    cfg: Config, out_dir: Path, integrity_store: Path | None = None, load: Callable[[Config], steps.Loaded] = steps.load
) -> results.RunSummary | results.DuplicateRun:
    """Run the recipe on the checkpoint ``cfg`` names; write and return its summary. In a sweep,
    ``integrity_store`` holds the sweep's check of its branches (``sweep.CheckBranches``): a branch
    that duplicates a later one is not analysed again. ``load`` is step 0: the checkpoint ``cfg`` names
    (``steps.load``), or a model in memory (``emergence.track``: ``steps.load_live``)."""
    lap = Laps()
    tracking.check_login(cfg.wandb)
    validate(cfg)  # everything that can be checked without the weights, before they load
    duplicate = steps.check_branch(cfg, integrity_store)
    if duplicate is not None:
        duplicate.save(out_dir)
        log.info(f"{duplicate.revision} serves the weights of {duplicate.duplicate_of}: analysed there, not again")
        return duplicate
    loaded = load(cfg)
    cfg = loaded.cfg  # the probe fitted to the model where it is smaller (``validation.fit_probe``)
    lap("load")
    with tracking.tracked_run(
        cfg.wandb, loaded.name, steps.run_config(cfg, loaded), out_dir, tags=[cfg.model.key, loaded.revision.name]
    ) as run:
        lap("tracker")  # starting W&B is bookkeeping, not the recipe's first step
        step1 = steps.measure(cfg, loaded, out_dir)  # the probe pass, and the measures the cache lacks
        cap = step1.capture  # None: the cache served the pass's measurements
        lap("capture")
        if loaded.cached is not None:
            measured = loaded.cached
        else:
            assert cap is not None  # no cache: the pass ran on the model
            estimates = spectral.estimates(cap.gram, cap.total, cap.spectral_n)  # step 3
            assert loaded.subject is not None  # the pass ran on it
            measured = PassRecord.of(cap, estimates, loaded.subject.arch, loaded.batch.fingerprint())
        lap("spectral")
        screened = screen.screen_heads(cfg.threshold, measured.mean_attention, loaded.dtype)
        lap("screen_spectral")
        uncertainty = stats.quantify_uncertainty(
            measured, screened, cfg.threshold.circuit, cfg.stats, cfg.probe.seq_len
        )
        lap("intervals")
        circuit = ablation.ScreenedCircuit(
            screened.classes.circuit_heads(),
            screened.classes.sel[..., screen.CLASSES.index("induction")],
            cfg.threshold.circuit,
        )
        ablated = ablation.ablate(
            cfg.ablate,
            cfg.stats,
            loaded.subject,
            circuit,
            ablation.CleanRun(measured.clean_metrics, measured.clean_loss),
            None if cap is None else cap.position_mean,
        )
        lap("ablate")
        task = None
        if loaded.task_batch is not None:
            assert loaded.subject is not None and loaded.task_tokenizer is not None  # a task loads both
            task = measure_task(loaded.subject, loaded.task_batch, loaded.task_tokenizer, screened.classes.sel, cfg)
            lap("task")
        found = steps.Findings(screened, uncertainty, ablated, task, step1)
        summary = steps.summarise(cfg, loaded, measured, found, lap.seconds)
        lap("summary")
        steps.write_outputs(out_dir, run, summary, loaded, measured, found)
    for line in results.report_lines(summary, screened.classes, out_dir):
        log.info(line)
    source = loaded.source
    if cfg.model.cleanup and source is not None:  # the results are written: the weights can go
        prefetch.after_downloads(lambda: steps.remove_from_cache(source))
    return summary


def discard_run_dir(out_dir: Path, job_name: str | None = None) -> None:
    """Remove what Hydra and W&B wrote for a run that never finished (its .hydra/, job log and
    wandb/), and the directory itself if that leaves it empty; nothing else is touched. ``job_name``:
    the Hydra job whose log goes too (None: a run Hydra did not start, ``track``'s or ``watch``'s)."""
    if not out_dir.is_dir():  # never made, or not a directory at all (a file in its place): nothing of ours
        return
    results.discard_partial(out_dir)
    for folder in (".hydra", "wandb"):
        shutil.rmtree(out_dir / folder, ignore_errors=True)
    if job_name is not None:
        logging.shutdown()  # closes the job log, so that it can go
        (out_dir / f"{job_name}.log").unlink(missing_ok=True)
    try:
        out_dir.rmdir()
    except OSError:  # not empty (or not ours): keep it
        pass


# Hydra finds launchers by scanning the hydra_plugins package, which misses ours under an editable
# install (its import finder is not a folder to scan): hydra/launcher=slurm needs it registered.
Plugins.instance().register(SlurmLauncher)


@hydra.main(version_base="1.3", config_path="pkg://emergence.conf", config_name="config")
def main(dict_cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    out_dir = Path(hydra_cfg.runtime.output_dir)
    in_sweep = hydra_cfg.mode == RunMode.MULTIRUN
    interrupt.install()
    try:
        cfg = cast(Config, OmegaConf.to_object(dict_cfg))
        if in_sweep and cfg.wandb.group is None:  # one W&B group per sweep
            cfg.wandb.group = Path(hydra_cfg.sweep.dir).name
        if sweep.already_done(cfg, out_dir):
            log.info(f"already done (resume=true): {out_dir}")
            return
        if in_sweep:  # a relaunched sweep runs its failed jobs again: their old FAILED must not list them
            sweep.clear_failure(out_dir)
        analyse(cfg, out_dir, Path(hydra_cfg.sweep.dir) / integrity.INTEGRITY_FILE if in_sweep else None)
        if interrupt.received.is_set():  # its KeyboardInterrupt was swallowed on the way
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        log.error(f"interrupted: no results written{'' if in_sweep else ' (run directory removed)'}")
        if in_sweep:
            results.discard_partial(out_dir)
        else:
            discard_run_dir(out_dir, hydra_cfg.job.name)
        sys.exit(130)
    except (UsageError, FloatingPointError) as err:  # bad input / NaN: one line, no traceback
        log.error(f"error: {err}")
        if in_sweep:  # the other jobs go on; the sweep lists this one at the end
            sweep.record_failure(out_dir, f"error: {err}")
            return
        if isinstance(err, UsageError):  # found before any result was written: leave nothing behind
            discard_run_dir(out_dir, hydra_cfg.job.name)
        sys.exit(2 if isinstance(err, UsageError) else 1)
    except Exception as err:
        if not in_sweep:
            raise
        sweep.record_failure(out_dir, f"{type(err).__name__}: {err}")
        traceback.print_exc()
