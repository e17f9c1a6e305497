"""Downloads overlapped with analysis: while a sweep's job analyses its checkpoint, the next
jobs' checkpoints are fetched into the Hugging Face cache (``hub.prefetch`` of them ahead).

``Prefetch`` is a Hydra callback (registered in ``conf/config.yaml``). Under the basic
launcher a multirun's jobs run one after another in this process, so at each job's start it
knows the jobs still to come: it composes them from the sweep's overrides as the basic
sweeper does. One background thread has the Hub revisions downloaded, one at a time and in
job order: the starting job's own (if no earlier job fetched it; the job waits for it) and
then the next ones, while the job runs. Each download is a child process
(``python -m emergence.run.prefetch REPO REVISION FORMAT``), so that it does not compete with the
analysis for this process's interpreter lock. Other launchers run jobs elsewhere: nothing is prefetched
and each job downloads its own checkpoint, as with ``hub.prefetch=0``.

With ``model.cleanup=true`` a job's revision is removed on the same thread once the downloads
asked before it are done (removing it while a download links a blob both share would leave
that link dangling), so the job goes on without waiting for the next revision's download;
the sweep waits for the last removals at its end.

A prefetch never raises: a revision it could not fetch (unreachable server, too big for the
free disk, an error) is downloaded, and its errors reported, by its own job as without it.
A revision this sweep fetched counts as downloaded by the sweep (``summary.download``, and
``model.cleanup`` removes it once its results are written).
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from emergence.core.errors import UsageError
from emergence.hub import weights
from emergence.hub.endpoint import hub_reachable
from emergence.hub.integrity import INTEGRITY_FILE, stored_verdicts
from emergence.run.sweep import BASIC_SWEEPER, already_done, compose_job, job_overrides

log = logging.getLogger(__name__)

BASIC_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"

Key = tuple[str, str | None, str]  # (repo id, revision (None: the default branch), model.weights_format)


class Downloader:
    """One background thread that has Hub revisions fetched into the cache, one at a time (the
    whole bandwidth for the one a job needs next), in the order they are asked for, and runs
    the cleanups handed to it in the same order."""

    def __init__(self) -> None:
        self._queue: queue.Queue[Key | Callable[[], None]] = queue.Queue()
        self._finished: dict[Key, threading.Event] = {}
        self.fetched: set[Key] = set()  # revisions this sweep put in the cache
        threading.Thread(target=self._work, name="prefetch", daemon=True).start()

    def later(self, task: Callable[[], None]) -> None:
        """Run ``task`` on this thread once everything asked before it is done."""
        self._queue.put(task)

    def finish(self) -> None:
        """Wait until everything asked so far is done."""
        self._queue.join()

    def ask(self, key: Key) -> None:
        if key not in self._finished:  # asked again (or already fetched): nothing to do
            self._finished[key] = threading.Event()
            self._queue.put(key)

    def asked(self, key: Key) -> bool:
        return key in self._finished

    def wait(self, key: Key) -> None:
        if key in self._finished:
            self._finished[key].wait()

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if callable(item):
                    item()
                else:
                    self._download(item)
            except Exception as err:  # a cleanup that failed leaves files behind, nothing worse
                log.warning(f"prefetch thread: {type(err).__name__}: {err}")
            finally:
                self._queue.task_done()

    def _download(self, key: Key) -> None:
        # a failure is the job's to report: it downloads the revision itself
        if hub_reachable():
            repo, revision, weights_format = key
            done = subprocess.run(
                [sys.executable, "-m", __name__, repo, revision or "main", weights_format],
                capture_output=True,
                text=True,
            )  # its progress bars stay out of the job's output
            if done.returncode == 0 and done.stdout.strip() == "fetched":
                self.fetched.add(key)
            else:
                log.debug(f"prefetch of {repo}@{revision}: {(done.stdout + done.stderr).strip()[-500:]}")
        self._finished[key].set()


def fetch(repo: str, revision: str, weights_format: str) -> bool:
    """Download what a run of ``repo@revision`` reads (its config and the weight files of the format
    ``weights.select`` picks) into the Hugging Face cache if the free disk holds them; True if it did."""
    from huggingface_hub import constants

    listing = weights.remote_files(repo, revision)  # with their sizes (a mirror's model_info has none)
    files = weights.select(weights.formats_in(f.path for f in listing), weights_format, f"{repo}@{revision}")
    size = sum(f.size for f in listing if f.path in files.files)
    cache = Path(constants.HF_HUB_CACHE)
    cache.mkdir(parents=True, exist_ok=True)
    if size > shutil.disk_usage(cache).free:
        return False
    weights.download(repo, revision, files)
    return True


@dataclass(frozen=True)
class Arrival:
    """How the job of a revision got its files (``summary.download``)."""

    prefetched: bool  # fetched by the sweep during an earlier job
    # what the job still waited for them at its start (the whole download where no earlier job fetched them)
    wait_seconds: float


_downloader: Downloader | None = None  # the sweep's, once a job asked for a prefetch
_started: dict[Key, Arrival] = {}  # per revision, how its job found it


def arrival(key: Key) -> Arrival:
    """How the job of a revision (repo, revision, weights format) got its files; a revision no
    prefetch saw was neither prefetched nor waited for here (the job downloads it while loading)."""
    return _started.get(key, Arrival(prefetched=False, wait_seconds=0.0))


def fetched_by_sweep(key: Key) -> bool:
    """In the cache because this sweep's prefetch downloaded it (so not "cached before")."""
    return _downloader is not None and key in _downloader.fetched


def after_downloads(cleanup: Callable[[], None]) -> None:
    """Run ``cleanup`` (removing a revision from the cache) now where nothing is prefetched, else
    on the download thread after the downloads asked so far, so that the job need not wait."""
    if _downloader is None:
        cleanup()
    else:
        _downloader.later(cleanup)


class Prefetch(Callback):
    """The Hydra callback: at each job's start, fetch its revision and the next ``hub.prefetch``."""

    def __init__(self) -> None:
        self.master: DictConfig | None = None  # the multirun's config, from which jobs are composed
        self.jobs: list[list[str]] = []  # every job's overrides, in launch order
        self.revisions: dict[int, Key | None] = {}  # job number -> what it downloads (None: nothing)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        if os.environ.get("HF_HUB_OFFLINE") == "1":
            return  # no network: nothing can be fetched
        hydra = config.hydra
        if hydra.launcher._target_ == BASIC_LAUNCHER and hydra.sweeper._target_ == BASIC_SWEEPER:
            self.master, self.jobs = config, job_overrides(config)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        if _downloader is not None:  # the last jobs' cleanups
            _downloader.finish()

    def on_job_start(self, config: DictConfig, **kwargs) -> None:
        global _downloader
        if not self.jobs or config.hub.prefetch == 0:
            return
        _downloader = _downloader or Downloader()
        num = config.hydra.job.num
        wanted = [self.revision(j) for j in range(num, min(num + 1 + config.hub.prefetch, len(self.jobs)))]
        mine = wanted[0]
        ahead = mine is not None and _downloader.asked(mine)  # by an earlier job
        for key in filter(None, wanted):
            _downloader.ask(key)
        if mine is not None:
            start = time.perf_counter()
            _downloader.wait(mine)
            _started[mine] = Arrival(
                prefetched=ahead and mine in _downloader.fetched, wait_seconds=round(time.perf_counter() - start, 3)
            )

    def revision(self, num: int) -> Key | None:
        if num not in self.revisions:
            assert self.master is not None  # set with the jobs, at the multirun's start
            self.revisions[num] = hub_download_of(self.master, self.jobs[num], num)
        return self.revisions[num]


def hub_download_of(master: DictConfig, overrides: list[str], num: int) -> Key | None:
    """The Hub revision job ``num`` will download: None for a local checkpoint, one already in
    the cache, a job resume will skip, a job that will load no weights (its measurements are
    cached and ablation is off, or the sweep's check found its branch a duplicate or defective:
    ``integrity``), or one whose config does not resolve (the job itself then says why)."""
    # here, not at the top: the downloader's child needs no torch
    from emergence.hub import checkpoints
    from emergence.run import cache

    try:
        cfg, out_dir = compose_job(master, overrides, num)
        if already_done(cfg, out_dir):
            return None
        src = checkpoints.source(cfg.model, checkpoints.resolve_revision(cfg.model, cfg.revision, cfg.cache_dir))
        stored = stored_verdicts(Path(master.hydra.sweep.dir) / INTEGRITY_FILE).get(src.path, {})
        verdict = None if src.revision is None else stored.get(src.revision)
        if verdict is not None and (verdict.verdict == "duplicate" or verdict.fails):
            return None
        # a GGUF file is fetched by its own run (``checkpoints.gguf_file_path``), not as a revision's weights
        if src.local_only or src.gguf_file:
            return None
        dtype = checkpoints.dtype_name(checkpoints.pick_dtype(cfg.model.dtype))
        identity = cache.checkpoint_identity(src, checkpoints.load_config(cfg.model, src).hf_config)
        cached = cfg.reuse and cache.has(cfg.cache_dir, cache.entry_of(cfg, identity, dtype))
        if not cache.needs_weights(cfg, cached, cache.measures_missing(cfg, identity, dtype)):
            return None
    except (UsageError, ValueError) as err:
        log.debug(f"no prefetch for job {num}: {err}")
        return None
    return src.path, src.revision, src.weights_format


if __name__ == "__main__":  # the downloader's child process: python -m emergence.run.prefetch REPO REVISION FORMAT
    print("fetched" if fetch(*sys.argv[1:4]) else "skipped: larger than the free disk")
