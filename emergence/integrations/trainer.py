"""``EmergenceCallback``: ``track`` inside transformers' ``Trainer`` (docs/own-runs.md).

At each checkpoint the ``Trainer`` saves (or every ``every_steps`` steps), the recipe runs on the model
being trained, at the ``Trainer``'s step and tokens seen, into ``<output_dir>/emergence/step<step>/``;
where the ``Trainer`` reports to W&B (``report_to="wandb"``), into its run as well, beside the training
loss. Only the main process runs it (under DDP every rank holds the whole model); a model sharded
across ranks (FSDP, DeepSpeed ZeRO-3) holds no whole weights anywhere: it is refused in one line,
once, and the training goes on.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase, TrainerCallback

from emergence.core.errors import first_line
from emergence.integrations.track import count, run_dir, track
from emergence.run import tracking
from emergence.spectral_edge.live import LIVE_FILE
from emergence.spectral_edge.records import MODEL_SCOPE, Edge

log = logging.getLogger(__name__)


class EmergenceCallback(TrainerCallback):
    """``Trainer(..., callbacks=[EmergenceCallback(overrides=[...], every_steps=None)])``: ``overrides`` are
    the command line's (``probe=paper``, ``ablate.enabled=false``, ...); ``every_steps`` None analyses each
    checkpoint the ``Trainer`` saves, N every N steps whether it saves or not."""

    def __init__(self, overrides: Sequence[str] = (), every_steps: int | None = None):
        if every_steps is not None and not count(every_steps):  # None or 0: no count, or no steps between
            raise ValueError(f"every_steps={every_steps!r} is invalid: analyse every N >= 1 steps, or None (each save)")
        if isinstance(overrides, str):  # list() of it would be its characters
            raise ValueError(f"overrides={overrides!r} is invalid: pass a list of overrides, e.g. [{overrides!r}]")
        self.overrides, self.every_steps = list(overrides), every_steps
        self.refused = False  # a sharded model's line is said once

    def on_save(self, args, state, control, **kwargs):
        if self.every_steps is None:
            self.analyse(args, state, kwargs["model"], kwargs.get("processing_class"))

    def on_step_end(self, args, state, control, **kwargs):
        if self.every_steps is not None and state.global_step % self.every_steps == 0:
            self.analyse(args, state, kwargs["model"], kwargs.get("processing_class"))

    def analyse(self, args, state, model, processing_class) -> None:
        if not state.is_world_process_zero:
            return
        sharding = sharded(args, model)
        if sharding is not None:
            if not self.refused:
                log.warning(
                    f"emergence: a model sharded across ranks ({sharding}) is not supported: the recipe needs "
                    "the whole weights on one device; training goes on without it"
                )
                self.refused = True
            return
        # the Trainer counts tokens only with include_num_input_tokens_seen=True; 0 means it did not
        summary = track(
            model,
            state.global_step,
            state.num_input_tokens_seen or None,
            out=args.output_dir,
            overrides=self.overrides,
            tokenizer=tokenizer_of(processing_class),
        )
        # wandb is imported by the Trainer's W&B callback, if it reports there
        run = getattr(sys.modules.get("wandb"), "run", None)
        if summary is None or run is None:
            return
        try:
            edge = live_edge_metrics(args.output_dir, state.global_step)
            tracking.log_into_training(run, summary, run_dir(args.output_dir, state.global_step), edge)
        except Exception as err:  # W&B is an output, not the record: the training goes on
            log.warning(
                f"emergence: step {state.global_step} not logged to W&B ({type(err).__name__}: "
                f"{first_line(err)}); its results are in {run_dir(args.output_dir, state.global_step)}"
            )


def live_edge_metrics(output_dir: str, step: int) -> dict[str, float]:
    """The live edge's window ending at ``step`` (``track`` wrote it: the first W of ``edge.window``, the whole
    model's sketch) as ``edge/r12``, ``edge/r23``, ``edge/drift_speed``, ``edge/k95``; none until the kept
    sketches make one."""
    runs = run_dir(output_dir, step).parent
    if not (runs / LIVE_FILE).exists():
        return {}
    edge = Edge.load(runs, LIVE_FILE)
    if edge.first.scopes[MODEL_SCOPE][-1].last_step != step:
        return {}
    newest = edge.first.scopes[MODEL_SCOPE][-1]
    metrics = {"r12": newest.r12, "r23": newest.r23, "drift_speed": newest.drift_speed, "k95": newest.k95}
    return {f"edge/{k}": v for k, v in metrics.items() if v is not None}


def tokenizer_of(processing_class):
    """The ``Trainer``'s tokenizer (a multimodal processor's own), None where it has none."""
    if isinstance(processing_class, PreTrainedTokenizerBase):
        return processing_class
    return getattr(processing_class, "tokenizer", None)


def sharded(args, model) -> str | None:
    """How the model's weights are split across ranks, None where they are whole on this one: FSDP (named
    in the ``Trainer``'s arguments, or by ``accelerate launch``'s environment), DeepSpeed ZeRO-3 (which
    marks each partitioned parameter with a ``ds_id``)."""
    if getattr(args, "fsdp", None) or os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true"):
        return "FSDP"
    if any(hasattr(p, "ds_id") for p in model.parameters()):
        return "DeepSpeed ZeRO-3"
    return None
