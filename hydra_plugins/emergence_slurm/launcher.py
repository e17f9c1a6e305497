"""``hydra/launcher=slurm`` (``conf/hydra/launcher/slurm.yaml``): submitit's SLURM launcher, with what
a sweep of this tool needs from it:

* it submits only the jobs without a complete run of their configuration (``resume=true``), under
  their own job numbers, so a relaunch into the same sweep directory asks the cluster for exactly
  what is missing;
* a job the scheduler ended before it returned (``scancel``, out of memory, its time limit, a node
  lost) is recorded as failed in its own directory, with the scheduler's state, and its partial
  results removed; the sweep then lists it (``sweep.ReportFailures``) instead of stopping at it;
* a job that reaches its time limit runs to it and is ended by SLURM (TIMEOUT, listed with the
  limit to raise), not by submitit's requeue handler from inside the job;
* a controller that stops answering ends the sweep with one line (``wait_for``), where submitit
  would wait for ever.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher import submitit_launcher
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from omegaconf import OmegaConf

from emergence.core.errors import UsageError
from emergence.run import results, sweep

log = logging.getLogger(__name__)

ADVICE = {  # what to change when the scheduler ended a job in this state
    "TIMEOUT": "it ran past hydra.launcher.timeout_min={timeout_min} minutes: raise it "
    "(hydra.launcher.timeout_min=<minutes>) and relaunch",
    "OUT_OF_MEMORY": "it needed more than hydra.launcher.mem_gb={mem_gb} GB: raise it "
    "(hydra.launcher.mem_gb=<GB>) and relaunch",
}


def ended_by_scheduler(job_id: str, state: str, params: dict) -> str:
    """The FAILED line of a job that SLURM ended before it returned."""
    advice = ADVICE.get(state.split()[0], "relaunch the sweep to run it again").format(**params)
    return f"SLURM ended job {job_id} ({state}) before it finished: {advice}"


POLL_S = 5  # how often the submitting process asks whether a job has ended
CONTROLLER_GRACE_S = 30  # how long the controller may stay silent before the sweep stops waiting for it


def controller_answers() -> bool:
    """``scontrol ping`` finds the SLURM controller up."""
    try:
        done = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and "UP" in done.stdout


def wait_for(job: Any) -> None:
    """Until ``job`` has ended. Without the controller no job state can be known (submitit would wait
    for ever): silent for ``CONTROLLER_GRACE_S`` seconds, the sweep ends with one line and exit 1,
    and a relaunch into the same sweep directory, once the controller is back, submits what is missing."""
    silent_since = None
    while not job.done():
        if controller_answers():
            silent_since = None
        elif silent_since is None:
            silent_since = time.monotonic()
        elif time.monotonic() - silent_since > CONTROLLER_GRACE_S:
            array = job.job_id.split("_")[0]
            print(
                f"error: the SLURM controller stopped answering (scontrol ping) while job {job.job_id} was "
                f"not done: once it is back, cancel what is left (scancel {array}) and relaunch the same "
                "command: it submits only the jobs without a complete run",
                file=sys.stderr,
            )
            sys.exit(1)
        time.sleep(POLL_S)


class SlurmLauncher(submitit_launcher.SlurmLauncher):
    def __call__(self, *args: Any, **kwargs: Any) -> JobReturn:
        """The job, on its node. submitit answers SLURM's warning (USR2, ``signal_delay_s`` before
        ``timeout_min`` runs out; a preemption) by requeuing the job, or, with no requeue left
        (``max_num_timeout``), by raising inside it: the run would record that as a failure of its
        own and SLURM would see a COMPLETED job. Instead it runs on to its limit, SLURM ends it
        (TIMEOUT) and the submitting process lists it with the limit to raise (``outcome``)."""
        import submitit

        requeue = signal.getsignal(signal.SIGUSR2)
        if callable(requeue):

            def on_warning(signum: int, frame: Any) -> None:
                try:
                    requeue(signum, frame)
                except submitit.core.utils.UncompletedJobError as err:
                    log.warning(f"{err} Running on until SLURM's time limit (hydra.launcher.timeout_min).")

            signal.signal(signal.SIGUSR2, on_warning)
        return super().__call__(*args, **kwargs)

    def missing(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> list[tuple[list[str], int, Path]]:
        """(overrides, job number, run directory) of each job without a complete run."""
        todo = []
        for num, overrides in enumerate(job_overrides, start=initial_job_idx):
            try:
                cfg, out_dir = sweep.compose_job(self.config, list(overrides), num)
            except (UsageError, ValueError):  # the job itself says why, once it runs
                cfg, out_dir = None, None
            if cfg is not None and sweep.already_done(cfg, out_dir):
                log.info(f"\t#{num} : already done (resume=true): {out_dir}")
                continue
            todo.append((list(overrides), num, out_dir))
        return todo

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import submitit

        todo = self.missing(job_overrides, initial_job_idx)
        if not todo:
            log.info("every job of the sweep is done: nothing to submit")
            return []
        executor = submitit.AutoExecutor(
            cluster="slurm", folder=self.params["submitit_folder"], slurm_max_num_timeout=self.params["max_num_timeout"]
        )
        shared = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(
            **{
                key if key in shared else f"slurm_{key}": value
                for key, value in self.params.items()
                if key not in ("submitit_folder", "max_num_timeout")
            }
        )
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        for overrides, num, _ in todo:
            log.info(f"\t#{num} : {' '.join(filter_overrides(overrides))}")
        jobs = executor.map_array(
            self,
            *zip(
                *[
                    (overrides, "hydra.sweep.dir", num, f"job_id_for_{num}", Singleton.get_state())
                    for overrides, num, _ in todo
                ]
            ),
        )
        log.info(
            f"submitted to SLURM: {len(jobs)} job(s), {' '.join(job.job_id for job in jobs)} "
            f"(one array task each where more than one; logs in {jobs[0].paths.folder.parent}/<job id>/)"
        )
        return [self.outcome(job, overrides, out_dir) for job, (overrides, _, out_dir) in zip(jobs, todo)]

    def outcome(self, job: Any, overrides: list[str], out_dir: Path | None) -> JobReturn:
        """The job's return once it has ended; one the scheduler ended is recorded as failed."""
        import submitit

        wait_for(job)
        try:
            return job.results()[0]
        except submitit.core.utils.UncompletedJobError:
            state = job.state
            line = ended_by_scheduler(job.job_id, state, self.params)
            log.error(f"error: {line}")
            if out_dir is None:
                raise
            results.discard_partial(out_dir)
            sweep.record_failure(out_dir, line)
            return JobReturn(overrides=overrides, working_dir=str(out_dir), status=JobStatus.COMPLETED)
