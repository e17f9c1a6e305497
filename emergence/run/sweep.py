"""Sweep bookkeeping (Hydra callbacks, registered in ``conf/config.yaml`` under ``hydra.callbacks``):

* ``CheckBranches``: before any job runs, the integrity check of every Hub branch (or checkpoint folder
  of a local series) the sweep will analyse (``integrity``), kept in the sweep directory; each job reads
  its verdict there.
* ``ReportFailures``: each job records its failure in its own directory, and the sweep ends with
  the list of what failed.

Both work with any launcher (basic, submitit_local, SLURM): they run where the sweep is launched
and only read and write the sweep directory.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

from emergence.core.atomic import atomic_write_text
from emergence.core.config import Config, config_digest
from emergence.core.errors import UsageError
from emergence.hub.integrity import INTEGRITY_FILE, check

log = logging.getLogger(__name__)

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"

FAILED_FILE = "FAILED"


def record_failure(out_dir: Path, message: str) -> None:
    atomic_write_text(out_dir / FAILED_FILE, message.strip() + "\n")


def clear_failure(out_dir: Path) -> None:
    """Forget the failure of an earlier launch of this job: it is being run again."""
    (out_dir / FAILED_FILE).unlink(missing_ok=True)


class ReportFailures(Callback):
    """At the end of a multirun: print the jobs that failed and exit non-zero if any did."""

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        failed = sorted(sweep_dir.rglob(FAILED_FILE))
        if not failed:
            return
        print(f"{len(failed)} job(s) of the sweep failed:", file=sys.stderr)
        for path in failed:
            print(f"  {path.parent}: {path.read_text().strip()}", file=sys.stderr)
        sys.exit(1)


def already_done(cfg: Config, out_dir: Path) -> bool:
    """``resume=true`` and ``out_dir`` holds a complete run of this configuration on these weights."""
    # here, not at the top: the downloader's child imports this module and needs no torch
    from emergence.hub import checkpoints
    from emergence.run import results

    def weights_now() -> str | None:  # the weights of the checkpoint the run names, as they are now
        revision = checkpoints.resolve_revision(cfg.model, cfg.revision, cfg.cache_dir)
        return checkpoints.weights_identity(checkpoints.source(cfg.model, revision))

    return cfg.resume and results.is_done(out_dir, config_digest(cfg), weights_now)


def job_overrides(config: DictConfig) -> list[list[str]]:
    """Every job's overrides in launch order, as ``BasicSweeper.sweep`` computes them."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = [f"{k}={v}" for k, v in (config.hydra.sweeper.get("params") or {}).items()]
    parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
    overrides = parser.parse_overrides(params + list(config.hydra.overrides.task))
    return [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]


def compose_job(master: DictConfig, overrides: list[str], num: int):
    """Job ``num``'s config (a ``Config``) and run directory, as ``run_job`` composes them."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    current = HydraConfig.instance().cfg
    try:
        job = GlobalHydra.instance().config_loader().load_sweep_config(master, overrides)
        with open_dict(job):
            job.hydra.job.num = job.hydra.job.id = num
        HydraConfig.instance().set_config(job)  # the job's own ${hydra:...} values, as run_job sets them
        out_dir = Path(job.hydra.sweep.dir) / str(job.hydra.sweep.subdir)  # where run_job puts it
        with open_dict(job):
            del job["hydra"]  # what the task function gets (run_job's task_cfg)
        return OmegaConf.to_object(job), out_dir
    finally:
        HydraConfig.instance().cfg = current


class CheckBranches(Callback):
    """At a multirun's start (the basic sweeper, any launcher): every Hub branch its jobs will analyse,
    checked (``integrity.check``) into ``<sweep dir>/integrity.json``. A relaunched sweep asks the
    Hub only about branches it has not listed before."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        if config.hydra.sweeper._target_ != BASIC_SWEEPER:
            return
        from emergence.hub.checkpoints import resolve_revision  # here: the callback module loads before torch is needed
        from emergence.hub.revisions import local_series

        branches: dict[tuple[str, str | None], dict[str, int | None]] = {}  # (repo, model_type) -> {branch: step}
        for num, overrides in enumerate(job_overrides(config)):
            try:
                cfg, _ = compose_job(config, overrides, num)
                if cfg.model.toy is not None or (
                    Path(cfg.model.name_or_path).expanduser().is_dir() and local_series(cfg.model) is None
                ):
                    continue  # a local checkpoint: no branches to compare (a run's folder of them: its folders)
                revision = resolve_revision(cfg.model, cfg.revision, cfg.cache_dir)
            except (UsageError, ValueError) as err:  # the job itself says why
                log.debug(f"no integrity check for job {num}: {err}")
                continue
            if revision.name is not None:
                branches.setdefault((cfg.model.name_or_path, cfg.model.architecture), {})[revision.name] = revision.step
        store = Path(config.hydra.sweep.dir) / INTEGRITY_FILE
        for (repo, model_type), named in branches.items():
            for verdict in check(repo, named, model_type, store).values():
                if verdict.verdict != "ok":
                    log.warning(f"integrity: {repo}@{verdict.branch}: {verdict.line}")
