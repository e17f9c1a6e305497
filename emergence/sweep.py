"""Sweeps that survive a failing job: each job records its failure in its own directory,
and the sweep ends with the list of what failed (a Hydra callback).

Registered in ``conf/config.yaml`` under ``hydra.callbacks``; works with any launcher
(basic, submitit_local, SLURM) because it only reads the job directories.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from emergence.atomic import atomic_write_text

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
