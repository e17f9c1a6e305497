"""The task head screens (the study's task-circuit extensions), pure numpy.

Every screen reads the attention row of the query T-1. Two steps:

1. ``ScreenSums.add`` accumulates, over the minibatches, each head's attention from T-1 to the
   task's named keys (``SCREEN_KEYS``) and its row total, in float64 on the CPU, as the study did.
2. ``task_screen`` divides by the prompt count and scores every head (``TaskScreen``): the
   attentions, the task's selectivity (the key's attention over the mean attention per other key)
   and the screen's top k heads in rank order.

The study's constants and guards are kept exactly; the T-dependent denominators are written in
terms of T, with the study's value beside them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float

from emergence.core.errors import UsageError
from emergence.recipe.tasks.metrics import TASKS, Task

# The keys each screen reads, in the order of the last axis of ``ScreenSums.key_sums``. They are
# the batch's named positions, except successor's: "self" is the query's own position (the batch's
# "end", T-1) and "prev" the one before it (T-2).
SCREEN_KEYS: dict[Task, tuple[str, ...]] = {
    "ioi": ("io", "s1", "s2"),
    "greater_than": ("decade", "century"),
    "successor": ("self", "prev"),
    "binding": ("binding", "distractor", "query_name"),
}
# The screens each task ranks heads by (``TaskScreen.ranked``).
SCREENS: dict[Task, tuple[str, ...]] = {
    "ioi": ("name_mover", "s_inhibition"),
    "greater_than": ("greater_than",),
    "successor": ("successor",),
    "binding": ("binding",),
}
NAME_MOVER_GUARD = 1e-6  # nm_sel = io / max(max(s1, s2), 1e-6)
SUBJECT_GUARD = 1e-6  # subj_ratio = subj_max / max(io, 1e-6)
S_INHIBITION_MIN_RATIO = 2.0  # an S-inhibition head attends to a subject at least twice as much as to IO,
S_INHIBITION_MIN_SUBJECT = 0.1  # and gives a subject at least a tenth of its attention
SELECTIVITY_GUARD = 1e-8  # gt_sel, succ_sel, vb_sel = key / max(other per key, 1e-8)


def key_positions(task: Task, positions: dict[str, np.ndarray]) -> np.ndarray:
    """[b, k] int64: each prompt's position of each key of ``SCREEN_KEYS[task]``, from the batch's
    named positions (name -> [b])."""

    def named(name: str) -> np.ndarray:
        if name not in positions:
            raise UsageError(
                f"the {task} screen needs the position {name!r}; pass the batch's positions "
                f"(it has {', '.join(sorted(positions)) or 'none'})"
            )
        return np.asarray(positions[name], dtype=np.int64)

    if task == "successor":
        end = named("end")
        return np.stack([end, end - 1], axis=-1)
    return np.stack([named(name) for name in SCREEN_KEYS[task]], axis=-1)


@dataclass
class ScreenSums:
    """Attention from T-1, summed over the prompts seen so far (float64)."""

    task: Task
    key_sums: Float[np.ndarray, "layers heads k"]  # to each key of SCREEN_KEYS[task]
    row_sums: Float[np.ndarray, "layers heads"]  # the whole row (1 up to rounding)
    n_prompts: int = 0

    @classmethod
    def zeros(cls, task: Task, n_layers: int, n_heads: int) -> ScreenSums:
        if task not in SCREEN_KEYS:
            raise UsageError(f"unknown task {task!r}; use one of {', '.join(TASKS)}")
        return cls(
            task=task,
            key_sums=np.zeros((n_layers, n_heads, len(SCREEN_KEYS[task]))),
            row_sums=np.zeros((n_layers, n_heads)),
        )

    def add(self, rows: torch.Tensor | np.ndarray, positions: dict[str, np.ndarray]) -> None:
        """One minibatch: ``rows`` [b, layers, heads, T] the attention rows of the query T-1,
        ``positions`` the minibatch's named positions (name -> [b])."""
        if isinstance(rows, torch.Tensor):
            rows = rows.detach().cpu().to(torch.float64).numpy()
        rows = np.asarray(rows, dtype=np.float64)
        if rows.ndim != 4 or rows.shape[1:3] != self.row_sums.shape:
            raise UsageError(
                f"attention rows have shape {rows.shape}; pass [b, {self.row_sums.shape[0]} layers, "
                f"{self.row_sums.shape[1]} heads, T]"
            )
        keys = key_positions(self.task, positions)  # [b, k]
        if keys.shape[0] != rows.shape[0] or keys.min() < 0 or keys.max() >= rows.shape[-1]:
            raise UsageError(
                f"the {self.task} positions do not fit {rows.shape[0]} rows of {rows.shape[-1]} keys; "
                "pass the minibatch's own positions"
            )
        index = np.broadcast_to(keys[:, None, None, :], (*rows.shape[:3], keys.shape[1]))
        self.key_sums += np.take_along_axis(rows, index, axis=-1).sum(axis=0)
        self.row_sums += rows.sum(axis=(0, -1))
        self.n_prompts += rows.shape[0]


@dataclass(frozen=True)
class TaskScreen:
    """The head scores of one task on one checkpoint. ``scores`` maps each score's name (a heads.csv
    column, after the screen's; docs/outputs.md) to its [layers, heads] float64 array, the rest of T-1's row
    (``other_attn``) last; ``ranked`` maps each of the task's screens
    (``SCREENS[task]``) to its top heads, (layer, head), best first."""

    task: Task
    n_prompts: int
    seq_len: int
    scores: dict[str, np.ndarray]
    ranked: dict[str, list[tuple[int, int]]]


def _top(score: np.ndarray, k: int, eligible: np.ndarray | None = None) -> list[tuple[int, int]]:
    """The ``k`` heads of highest ``score`` [layers, heads] (among the ``eligible`` ones), best first;
    equal scores keep layer-major order (a stable sort, as the study's Python ``sorted``)."""
    flat = score.ravel()
    order = np.argsort(-flat, kind="stable")
    if eligible is not None:
        order = order[eligible.ravel()[order]]
    n_heads = score.shape[1]
    return [(int(i) // n_heads, int(i) % n_heads) for i in order[:k]]


def _over_uniform(key: np.ndarray, other: np.ndarray, n_other: int) -> np.ndarray:
    """A key's attention over the mean attention per other key (the study's selectivity)."""
    return key / np.maximum(other / n_other, SELECTIVITY_GUARD)


def task_screen(task: Task, sums: ScreenSums, T: int, k: int = 5) -> TaskScreen:
    """Score every head from the accumulated attention of ``sums`` (prompts of ``T`` tokens) and rank
    the top ``k`` of each of the task's screens."""
    if sums.task != task:
        raise UsageError(f"the sums were accumulated for {sums.task!r}, not {task!r}; pass the {task} sums")
    if sums.n_prompts == 0:
        raise UsageError(f"no attention rows were added for {task!r}; add the minibatches before screening")
    means = sums.key_sums / sums.n_prompts  # [layers, heads, k]
    attn = {name: means[..., i] for i, name in enumerate(SCREEN_KEYS[task])}
    other = sums.row_sums / sums.n_prompts - means.sum(axis=-1)  # [layers, heads]
    if task == "ioi":
        subj_max = np.maximum(attn["s1"], attn["s2"])
        subj_ratio = subj_max / np.maximum(attn["io"], SUBJECT_GUARD)
        scores = {
            "io_attn": attn["io"],
            "s1_attn": attn["s1"],
            "s2_attn": attn["s2"],
            "nm_sel": attn["io"] / np.maximum(subj_max, NAME_MOVER_GUARD),  # max, not mean (docs/tasks.md)
            "subj_max": subj_max,
            "subj_ratio": subj_ratio,
            "other_attn": other,
        }
        s_inhibition = (subj_ratio >= S_INHIBITION_MIN_RATIO) & (subj_max >= S_INHIBITION_MIN_SUBJECT)
        ranked = {"name_mover": _top(scores["nm_sel"], k), "s_inhibition": _top(subj_max, k, s_inhibition)}
    elif task == "greater_than":
        scores = {
            "decade_attn": attn["decade"],
            "century_attn": attn["century"],
            "gt_sel": _over_uniform(attn["decade"], other, T - 2),
            "other_attn": other,
        }  # the study's 10 other keys (T = 12)
        ranked = {"greater_than": _top(scores["gt_sel"], k)}
    elif task == "successor":
        scores = {
            "self_attn": attn["self"],
            "prev_attn": attn["prev"],
            "succ_sel": _over_uniform(attn["self"], other, T - 2),
            "other_attn": other,
        }  # the study's 3 other keys (T = 5)
        ranked = {"successor": _top(scores["succ_sel"], k)}
    else:
        scores = {
            "binding_attn": attn["binding"],
            "distractor_attn": attn["distractor"],
            "query_name_attn": attn["query_name"],
            "vb_sel": _over_uniform(attn["binding"], other, T - 3),
            "other_attn": other,
        }  # the study's 10 other keys (T = 13)
        ranked = {"binding": _top(scores["vb_sel"], k)}
    return TaskScreen(task=task, n_prompts=sums.n_prompts, seq_len=T, scores=scores, ranked=ranked)
