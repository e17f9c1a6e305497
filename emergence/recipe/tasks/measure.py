"""The task pass: one forward pass over a task batch gives both the capability and the screen.

Per minibatch of ``batch_size`` prompts the model runs once (``logits_to_keep=1``, no KV cache,
under ``torch.inference_mode``) with a listener as the forward's ``capture.LISTENER``:

* the logits at T-1 give the per-prompt capability values (``metrics.per_prompt``);
* every attention layer reports its call, and the listener keeps the last query's attention row
  exactly as the layer computed it (``AttentionCall.last_query_row``); after the forward the rows
  are stacked to [b, layers, heads, T] and summed into the screen's ``ScreenSums``, so no more
  than one minibatch's rows are ever held.

The same pass serves the ablations: run under ``ablation.ablating`` with ``screen=False`` it
yields only the per-prompt values (an ablated model's screen is not needed, and the listener
then only counts the layers that reported).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from emergence.core.errors import UsageError
from emergence.recipe import capture
from emergence.recipe.tasks.batches import TaskBatch
from emergence.recipe.tasks.metrics import PromptMetrics, Task, concatenate, per_prompt
from emergence.recipe.tasks.screens import ScreenSums, TaskScreen, task_screen


@dataclass(frozen=True)
class TaskSubject:
    """What a task's passes run on (as ``capture.Subject`` for the probe): the model loaded with
    ``capture.register_attention()``, its attention layout, the task's prompts and the prompts per forward."""

    model: Any
    arch: capture.Architecture
    batch: TaskBatch
    batch_size: int


@dataclass(frozen=True, eq=False)
class TaskPass:
    """What one pass over a task batch measured."""

    task: Task
    seq_len: int  # T
    vocab_size: int  # V: the logits' width, over which top-1 is an argmax
    values: PromptMetrics  # per-prompt capability values, prompts in batch order ([n] each)
    sums: ScreenSums | None  # attention from T-1, summed over the prompts; None for a pass with screen=False

    def screen(self, k: int = 5) -> TaskScreen:
        """The task's head screen from this pass's sums (``screens.task_screen``), top ``k`` per screen."""
        if self.sums is None:
            raise UsageError(f"this {self.task} pass did not screen the heads; run task_pass with screen=True")
        return task_screen(self.task, self.sums, self.seq_len, k)


class _LayerRows:
    """The forward's listener: counts the attention layers that report and, when screening,
    keeps each one's last query row [b, heads, T] until the minibatch's forward pass ends."""

    def __init__(self, arch: capture.Architecture, screen: bool):
        self.layer_of = {id(module): i for i, module in enumerate(arch.attentions)}  # id(attention module) -> layer
        self.screen = screen
        self.n_layers = arch.n_layers
        self.begin()

    def begin(self) -> None:
        """Before each minibatch's forward pass: no layer has reported yet."""
        self.calls = 0
        self.rows: list = [None] * self.n_layers  # per layer: its rows [b, heads, T] once it reported

    def __call__(self, call: capture.AttentionCall) -> None:
        self.calls += 1
        if self.screen:
            self.rows[self.layer_of[id(call.module)]] = call.last_query_row()

    def stacked(self) -> torch.Tensor:
        """[b, layers, heads, T] float32: this minibatch's rows."""
        return torch.stack(self.rows, dim=1)


def minibatch_values(task: Task, logits: torch.Tensor, batch: TaskBatch, rows: slice) -> PromptMetrics:
    """Per-prompt values of the prompts ``rows`` from their logits at T-1 [b, V]."""
    return per_prompt(
        task,
        logits,
        target=batch.target[rows],
        distractor=None if batch.distractor is None else batch.distractor[rows],
        decade_value=None if batch.decade is None else batch.decade[rows],
        answer_ids=batch.answer_tokens,
    )


def task_pass(model, arch: capture.Architecture, batch: TaskBatch, batch_size: int, screen: bool = True) -> TaskPass:
    """Forward ``batch`` through ``model`` (loaded with ``attn_implementation=capture.register_attention()``;
    ``arch`` its ``capture.Architecture``) in minibatches of ``batch_size`` prompts: the per-prompt
    values and, with ``screen``, the screen's sums. Refuses a model whose attention layers did not all
    report (remote code that skips the attention interface) and non-finite logits or attention."""
    capture.check_loaded_for_capture(model)
    if batch_size < 1:
        raise UsageError(f"batch_size = {batch_size}; give at least 1 prompt per forward pass")
    device = next(model.parameters()).device
    n, T = batch.tokens.shape
    listener = _LayerRows(arch, screen)
    sums = ScreenSums.zeros(batch.task, arch.n_layers, arch.n_heads) if screen else None
    values: list[PromptMetrics] = []
    vocab_size = 0
    with torch.inference_mode():
        for start in tqdm(range(0, n, batch_size), desc=f"task {batch.task}", unit="batch", leave=False):
            rows = slice(start, min(start + batch_size, n))
            listener.begin()
            logits = model(
                batch.tokens[rows].to(device), logits_to_keep=1, use_cache=False, **{capture.LISTENER: listener}
            ).logits[:, -1]  # [b, V]
            if listener.calls != arch.n_layers:
                raise UsageError(
                    f"model architecture {arch.model_type!r} is not supported: {listener.calls} of "
                    f"{arch.n_layers} attention layers went through the capture"
                )
            if not torch.isfinite(logits).all():
                raise capture.non_finite(model.dtype)
            if sums is not None:  # screen
                attention = listener.stacked()  # [b, layers, heads, T]
                if not torch.isfinite(attention).all():
                    raise capture.non_finite(model.dtype)
                sums.add(attention, {name: p[rows].numpy() for name, p in batch.positions.items()})
            values.append(minibatch_values(batch.task, logits, batch, rows))
            vocab_size = logits.shape[-1]
    return TaskPass(task=batch.task, seq_len=T, vocab_size=vocab_size, values=concatenate(values), sums=sums)
