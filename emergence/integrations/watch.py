"""``python -m emergence.watch DIR [overrides] [--once]``: each checkpoint a training run saves in DIR,
analysed once, while it trains or after (docs/own-runs.md).

Every look at DIR (one each ``--poll`` seconds) lists its checkpoint folders (``hub/series.py``), in step
order. Each whole one (``series.unfinished``: its config, every weight file at the size its header
declares, a ``Trainer``'s ``trainer_state.json``) is analysed by the command line's recipe
(``emergence.main.analyse``, ``model=local model.name_or_path=DIR revision=custom revision.name=<folder>``)
into ``DIR/emergence/step<step>/``, ``track``'s layout, with ``track``'s defaults under the overrides.

* A checkpoint still being written waits for a later look; ``--once`` names it and leaves it.
* A folder that goes away before it is analysed (the ``Trainer``'s ``save_total_limit``) is named as
  missed.
* A step whose run directory already holds a run of the same settings on the same weights (``resume``'s
  rule, ``sweep.already_done``) is not analysed again: a watch stopped and started again recomputes
  nothing.
* Ctrl-C removes the run directory being written (``main.discard_run_dir``) and exits 130.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from enum import Enum, auto
from pathlib import Path

from emergence.core.config import PanelEntry
from emergence.core.errors import CommandParser, UsageError, first_line
from emergence.hub import series, weights
from emergence.integrations.track import RUNS_FOLDER, live_config, run_dir
from emergence.main import analyse, discard_run_dir
from emergence.run import interrupt, sweep, validation
from emergence.run.results import format_tokens

log = logging.getLogger(__name__)

# watch names each checkpoint itself: an override of these would name another
OWN_KEYS = ("model", "model.name_or_path", "revision", "revision.name", "revision.index")


class Outcome(Enum):
    ANALYSED = auto()
    DONE = auto()  # analysed before, with the same settings on the same weights
    FAILED = auto()
    GONE = auto()  # deleted before (or while) it was read


@dataclass(frozen=True)
class Look:
    """What one look at DIR found: its whole checkpoints in step order, and those not whole yet (folder ->
    why, ``series.unfinished``)."""

    whole: list[PanelEntry]
    unfinished: dict[str, str]

    @property
    def folders(self) -> set[str]:
        return {e.revision for e in self.whole} | set(self.unfinished)


def look(root: Path, tokens_per_step: int | None) -> Look:
    """DIR's checkpoints now; none before the run saved its first. A UsageError (one line) where they are
    not one model (``series.one_model``)."""
    if not series.is_series(root):
        return Look([], {})
    whole, unfinished = [], {}
    for entry in series.checkpoints(root, tokens_per_step):
        why = series.unfinished(root / entry.revision)
        if why is None:
            whole.append(entry)
        else:
            unfinished[entry.revision] = why
    return Look(whole, unfinished)


def analyse_checkpoint(root: Path, entry: PanelEntry, overrides: list[str]) -> Outcome:
    """One checkpoint of DIR analysed into its step's run directory, unless it is there already; a failure
    is one line and the run directory's ``FAILED``, as a sweep's job's."""
    out_dir = run_dir(root, entry.step)
    try:
        cfg = live_config(root, ["revision=custom", f"revision.name={entry.revision}", *overrides])
        if sweep.already_done(cfg, out_dir):
            log.info(f"{entry.revision}: already analysed ({out_dir})")
            return Outcome.DONE
        sweep.clear_failure(out_dir)
        log.info(
            f"{entry.revision}: analysing (step {entry.step}, tokens {format_tokens(entry.tokens)}) into {out_dir}"
        )
        analyse(cfg, out_dir)
        if interrupt.received.is_set():  # its KeyboardInterrupt was swallowed on the way
            raise KeyboardInterrupt
        return Outcome.ANALYSED
    except KeyboardInterrupt:
        discard_run_dir(out_dir)
        raise
    except Exception as err:
        discard_run_dir(out_dir)
        if not (root / entry.revision / weights.CONFIG_FILE).exists():  # deleted while it was read
            return Outcome.GONE
        why = str(err) if isinstance(err, UsageError) else f"{type(err).__name__}: {first_line(err)}"
        out_dir.mkdir(parents=True, exist_ok=True)
        sweep.record_failure(out_dir, why)
        log.error(f"{entry.revision}: failed: {why}")
        return Outcome.FAILED


def watch(root: Path, overrides: list[str], once: bool, poll_seconds: float) -> list[str]:
    """Analyse DIR's checkpoints as they become whole, until Ctrl-C (``once``: those whole now); returns the
    folders whose analysis failed."""
    # a refused override or setting: its one line now, before any checkpoint is read or any folder written
    cfg = live_config(root, ["revision=custom", "revision.name=watch", *overrides])
    validation.validate(cfg)
    tokens_per_step = cfg.model.tokens_per_step
    handled: set[str] = set()  # folders analysed, found analysed, failed or missed: never looked at again
    seen: set[str] = set()  # every folder a look listed
    failed: list[str] = []
    waiting: set[str] = set()  # folders said to be not whole yet (said once each)
    log.info(
        f"watching {root}: each whole checkpoint analysed into {root / RUNS_FOLDER}"
        + ("" if once else f", a look every {poll_seconds:g} s (Ctrl-C stops)")
    )
    while True:
        found = look(root, tokens_per_step)
        seen |= found.folders
        for entry in found.whole:
            if entry.revision in handled:
                continue
            outcome = analyse_checkpoint(root, entry, overrides)
            if outcome is not Outcome.GONE:  # a folder gone is named below, with those that never became whole
                handled.add(entry.revision)
            if outcome is Outcome.FAILED:
                failed.append(entry.revision)
        present = {p.name for p in root.iterdir() if p.is_dir()}
        for folder in sorted(seen - handled - present, key=lambda name: series.step_of_name(name) or 0):
            log.warning(f"missed {folder}: deleted before it was analysed")
            handled.add(folder)
        unfinished = {folder: why for folder, why in found.unfinished.items() if folder in present}
        if once:
            for folder, why in unfinished.items():
                log.warning(f"not analysed: {folder} is not whole ({why})")
            return failed
        for folder, why in unfinished.items():
            if folder not in waiting:
                log.info(f"{folder}: not whole yet ({why}); analysed once it is")
        waiting = set(unfinished)
        time.sleep(poll_seconds)


def main(argv=None) -> None:
    p = CommandParser("python -m emergence.watch", __doc__)
    p.add_argument(
        "dir", type=Path, help="the folder a training run saves its checkpoints in (checkpoint-<step>/, step<N>/, ...)"
    )
    p.add_argument("overrides", nargs="*", help="the command line's overrides (probe=paper, ablate.enabled=false, ...)")
    p.add_argument("--once", action="store_true", help="analyse the whole checkpoints there now, then exit")
    p.add_argument(
        "--poll",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="seconds between two looks at DIR (default %(default)s)",
    )
    args = p.parse_intermixed_args(argv)  # overrides may come before or after the options
    if not args.poll > 0:  # also refuses nan
        p.error(f"--poll {args.poll} is invalid: seconds between looks must be > 0")
    root = args.dir.expanduser()
    if not root.is_dir():
        p.error(f"{root} is not a directory: give the folder a training run saves its checkpoints in")
    if (root / weights.CONFIG_FILE).exists():
        p.error(f"{root} is one checkpoint (it holds config.json): give the folder a run saves its checkpoints in")
    for override in args.overrides:
        if override.split("=", 1)[0].lstrip("+~") in OWN_KEYS:
            p.error(
                f"{override} is invalid here: watch names each checkpoint itself (model.name_or_path={root}, "
                "revision=custom revision.name=<folder>)"
            )
    # the run's lines on the terminal, as the command line's (conf/hydra/job_logging): others only warn
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    logging.getLogger("emergence").setLevel(logging.INFO)
    interrupt.install()
    try:
        failed = watch(root, args.overrides, args.once, args.poll)
    except UsageError as err:  # a refused override, checkpoints of two models
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted: the checkpoint being analysed left no run directory; run again to go on", file=sys.stderr)
        sys.exit(130)
    if failed:
        print(
            f"{len(failed)} checkpoint(s) failed: {', '.join(failed)} (each run directory's {sweep.FAILED_FILE})",
            file=sys.stderr,
        )
        sys.exit(1)
