"""``emergence.track``: the recipe on a model while it trains (docs/own-runs.md).

``track(model, step, ...)`` runs ``emergence.main.analyse`` on the model object itself: step 0 is
``steps.load_live`` (the probe fitted to the model, its batches, the model as it is) instead of a
checkpoint loaded from disk; every later step, and every file it writes, is the command line's. Its
run directory is ``<out>/emergence/step<step>/``, which ``python -m emergence.report <out>/emergence``
reads as a panel; beside the runs, ``edge_sketch/step<step>.npz`` keeps the count sketch of the model's
weights at the step, from which the live spectral edge is drawn (``spectral_edge/live.py``).

The training must not notice: the model is never copied or reloaded, and runs in eval mode under
``torch.no_grad`` with our attention function only for the call; each module's train mode, the
attention implementation and every random stream the training draws from are as they were after it.
A failure of the recipe is one warning line and a ``FAILED`` file in the step's run directory (where
the disk takes it), never an exception into the training loop. A SIGTERM in the middle of a call
discards the step's run directory, then reaches whatever the training set for it (its own handler, or
Python's default: the process ends), as if no call had been running.
"""

from __future__ import annotations

import functools
import logging
import operator
import random
import signal
import threading
import traceback
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from emergence.core.config import PanelEntry, compose_config
from emergence.core.errors import UsageError, first_line
from emergence.hub import checkpoints
from emergence.main import analyse, discard_run_dir
from emergence.recipe import capture
from emergence.run import results, steps, sweep
from emergence.spectral_edge.live import keep_sketch, live_edge

log = logging.getLogger(__name__)

RUNS_FOLDER = "emergence"  # <out>/emergence/step<N>/: one run directory per analysed step
# What a call runs unless its overrides say otherwise: the quick probe (fitted to the model by
# probe.fit=auto, ablation with adaptive stopping, as every run), and no W&B run of its own (the
# callback logs into the training's run).
LIVE_DEFAULTS = ("model=local", "probe=quick", "wandb.mode=disabled")


def run_dir(out: str | Path, step: int) -> Path:
    """Where the analysis of a run's checkpoint at ``step`` goes: ``<out>/emergence/step<step>``."""
    return Path(out).expanduser() / RUNS_FOLDER / f"step{step}"


def live_config(out: str | Path, overrides: Sequence[str]):
    """The ``Config`` of a call writing under ``out``: ``LIVE_DEFAULTS``, the model named by ``out`` (the
    folder the training saves into), then ``overrides`` (the command line's)."""
    return compose_config([*LIVE_DEFAULTS, f"model.name_or_path={Path(out).expanduser()}", *overrides])


def track(
    model, step: int, tokens: int | None = None, out: str | Path = ".", overrides: Sequence[str] = (), tokenizer=None
) -> results.RunSummary | None:
    """Run the recipe on ``model`` (a transformers causal LM, as it is in memory) at training step
    ``step`` after ``tokens`` tokens (None: unknown; then step x ``model.tokens_per_step`` where an
    override sets it), with the command line's ``overrides``; ``tokenizer``: the model's tokenizer, where
    it puts a BOS before every input (``probe.first_token=auto``) or the probe needs one. Writes
    ``<out>/emergence/step<step>/`` and returns its ``summary.json`` record; None where the recipe failed
    (one warning line, and the step's ``FAILED`` file says why): the training goes on either way."""
    # no step<-1>/ in the user's folder, no negative or fractional token count in its results
    at, seen = count(step), None if tokens is None else count(tokens)
    if at is None:
        log.warning(f"emergence: step={step!r} is invalid: pass the training step, an int >= 0; nothing analysed")
        return None
    if tokens is not None and seen is None:
        log.warning(
            f"emergence: tokens={tokens!r} is invalid: pass the tokens seen so far, an int >= 0, or None; "
            "nothing analysed"
        )
        return None
    if isinstance(overrides, str):  # its characters would be read as overrides, one by one
        log.warning(
            f"emergence: overrides={overrides!r} is invalid: pass a list of overrides, e.g. [{overrides!r}]; "
            "nothing analysed"
        )
        return None
    step, tokens = at, seen
    out_dir = run_dir(out, step)
    try:
        cfg = live_config(out, overrides)
        revision = checkpoints.panel_revision(PanelEntry(f"step{step}", step, tokens), cfg.model.tokens_per_step)
        sweep.clear_failure(out_dir)  # an earlier call at this step failed: this one is run again
        # innermost: a SIGTERM during the analysis still finds the model's modes and the random state restored
        with rng_untouched(), live(model), sigterm_interrupts():
            summary = analyse(
                cfg,
                out_dir,
                load=functools.partial(steps.load_live, model=model, revision=revision, tokenizer=tokenizer),
            )
            keep_live_edge(model, PanelEntry(f"step{step}", step, revision.tokens), out_dir.parent, cfg)
        assert isinstance(summary, results.RunSummary)  # no integrity store: never a duplicate branch
        return summary
    except KeyboardInterrupt:  # the user stops the training: no half-written run directory stays
        discard_run_dir(out_dir)
        raise
    except Terminated:  # so does a SIGTERM, which then goes on as if no call had been running
        discard_run_dir(out_dir)
        log.warning(f"emergence: step {step} not analysed (SIGTERM); the signal goes on to the training")
        signal.raise_signal(signal.SIGTERM)  # the training's own handler is back: it decides
        return None
    except Exception as err:  # whatever went wrong, the training goes on
        why = str(err) if isinstance(err, UsageError) else f"{type(err).__name__}: {first_line(err)}"
        discard_run_dir(out_dir)
        # a bad setting is its one line; anything else keeps its traceback for whoever reads the file
        where = leave_failure(out_dir, why if isinstance(err, UsageError) else f"{why}\n{traceback.format_exc()}")
        log.warning(f"emergence: step {step} not analysed ({why}); training goes on ({where})")
        return None


def count(value) -> int | None:
    """``value`` as a count (an int >= 0, numpy's too), None where it is none (a bool, a float, negative)."""
    if isinstance(value, bool):
        return None
    try:
        number = operator.index(value)
    except TypeError:
        return None
    return number if number >= 0 else None


def leave_failure(out_dir: Path, message: str) -> str:
    """The step's ``FAILED`` file, and where it is; on a disk that takes nothing more, why there is none
    (the run directory is not left behind half-made)."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        sweep.record_failure(out_dir, message)
        return str(out_dir / sweep.FAILED_FILE)
    except OSError as err:
        discard_run_dir(out_dir)
        return f"no {sweep.FAILED_FILE} file either: {type(err).__name__}: {first_line(err)}"


class Terminated(BaseException):
    """SIGTERM arrived during a call (a BaseException, as KeyboardInterrupt: no ``except Exception`` of the
    recipe takes it for a failure of its own)."""


@contextmanager
def sigterm_interrupts():
    """SIGTERM raises ``Terminated`` for the call, so that the step's run directory can be discarded
    before the signal goes on; the training's handler is back afterwards. Signals reach only the main
    thread: a call from another thread leaves them alone, as does one where the training's handler was
    not set from Python (it could not be put back)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is None:
        yield
        return

    def interrupt(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def keep_live_edge(model, entry: PanelEntry, runs: Path, cfg) -> None:
    """The live edge (docs/edge.md): this step's sketch, a few numbers per scope kept beside the runs, and
    the windows the kept sketches make (``edge_live.json``). A failure is one warning line: the step's
    analysis stands."""
    try:
        keep_sketch(model, entry, runs, cfg.edge)
        live_edge(runs, cfg.model.key, cfg.edge)
    except Exception as err:
        log.warning(f"emergence: step {entry.step}: no live edge ({type(err).__name__}: {first_line(err)})")


@contextmanager
def live(model):
    """``model`` as the recipe reads it for the call (eval mode, no autograd, our attention function), and
    as the training had it afterwards: each module's train mode and the attention implementation."""
    if not hasattr(model, "set_attn_implementation"):
        raise UsageError(
            f"track needs a transformers causal LM, not a {type(model).__name__} (under DDP pass "
            "model.module, after torch.compile model._orig_mod)"
        )
    modes = [(module, module.training) for module in model.modules()]
    implementation = model.config._attn_implementation
    model.eval()  # no dropout: the probe measures the model, not a draw of it
    try:
        model.set_attn_implementation(capture.register_attention())
        with torch.no_grad():
            yield
    finally:
        model.set_attn_implementation(implementation)
        for module, training in modes:
            module.training = training


@contextmanager
def rng_untouched():
    """Every random stream a training draws from, as it was before the call: torch's CPU generator and
    CUDA's (where CUDA is in use), numpy's and Python's global ones. The recipe seeds its own draws; this
    keeps anything else it calls (a library drawing from a global generator) from moving the training's."""
    python, legacy_numpy = random.getstate(), np.random.get_state()
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=cuda):
        try:
            yield
        finally:
            random.setstate(python)
            np.random.set_state(legacy_numpy)
