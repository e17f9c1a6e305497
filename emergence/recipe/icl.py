"""In-context learning measured on the per-token losses of the probe pass (docs/probes.md).

* **ICL score** (Olsson et al. 2022, on ``probe.kind=text``): the mean loss of the token at
  ``icl_positions[1]`` minus that at ``icl_positions[0]`` (0-based positions of the predicted
  token; 500 and 50 in a 512-token context). Negative when the context helps: below 0.15 nats
  in magnitude before the induction phase change, about 0.4 after.
* **Loss drop** (on ``probe.kind=repeat``): the mean loss on the span's first copy minus on its
  second, over the tokens the copy makes predictable (each but the span's first; the same
  positions in the first copy, where nothing predicts them). Positive when the model copies.

Both come with percentile bootstrap intervals over sequences (the run's ``StatsConfig``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from emergence.core.config import StatsConfig
from emergence.core.record import Record
from emergence.recipe.probe import RepeatLayout
from emergence.recipe.stats import interval, replicate_means, resample_weights


@dataclass
class TextScores(Record):
    """``summary.json`` ``text``."""

    # [T]: mean loss of the token at each position; None at 0 and where the curve was not measured
    # (``curve_positions``)
    loss_by_position: list[float | None]
    icl_positions: list[int]
    icl_score: float  # mean loss at icl_positions[1] minus at icl_positions[0] (nats)
    icl_score_ci: list[float]
    source: str  # the dataset (split) or the text file
    tokenizer: str  # the checkpoint's own (repo@revision) or bytes


@dataclass
class RepeatScores(Record):
    """``summary.json`` ``repeat``."""

    span: int  # tokens in the repeated span
    first_copy_loss: float  # mean loss over the first copy's tokens 1..span-1
    later_copy_loss: float  # ... over the same tokens of the second copy
    loss_drop: float  # first_copy_loss - later_copy_loss (nats)
    loss_drop_ci: list[float]


def bootstrap_interval(per_sequence: np.ndarray, settings: StatsConfig) -> list[float]:
    """The percentile interval of the mean of ``per_sequence`` [n] over sequences."""
    weights = resample_weights(len(per_sequence), settings.n_boot, settings.seed)
    return interval(replicate_means(per_sequence, weights), settings.ci)


def curve_positions(seq_len: int, icl_positions: list[int], curve: str) -> np.ndarray:
    """The positions (in 1..T-1, ascending) whose token's loss the text probe computes: every one
    (``curve=all``), or (``sparse``) the powers of two below T, T-1 and the ICL score's two."""
    if curve == "all":
        return np.arange(1, seq_len)
    powers = [2**k for k in range(seq_len.bit_length()) if 2**k < seq_len]
    return np.array(sorted({*powers, seq_len - 1, *icl_positions}))


def text_scores(
    losses: np.ndarray, icl_positions: list[int], settings: StatsConfig, source: str, tokenizer: str
) -> TextScores:
    """``losses`` [n, T-1]: the loss of the token at positions 1..T-1 (``capture.sequence_losses``; NaN
    where not measured, ``curve_positions``)."""
    early, late = icl_positions
    per_sequence = losses[:, late - 1].astype(np.float64) - losses[:, early - 1]
    by_position = losses.mean(axis=0, dtype=np.float64)
    return TextScores(
        loss_by_position=[None, *(None if np.isnan(v) else float(v) for v in by_position)],
        icl_positions=[early, late],
        icl_score=float(per_sequence.mean()),
        icl_score_ci=bootstrap_interval(per_sequence, settings),
        source=source,
        tokenizer=tokenizer,
    )


def repeat_scores(losses: np.ndarray, layout: RepeatLayout, settings: StatsConfig) -> RepeatScores:
    """``losses`` [n, T-1] as in ``text_scores``; the copies as ``layout`` lays them out."""
    # column j holds the loss at position j + 1: positions prefix+1 .. copy_start-1, and copy_start+1 .. T-1
    first = slice(layout.prefix, layout.copy_start - 1)
    later = slice(layout.copy_start, layout.seq_len - 1)
    first_loss = losses[:, first].mean(axis=1, dtype=np.float64)
    later_loss = losses[:, later].mean(axis=1, dtype=np.float64)
    drop = first_loss - later_loss
    return RepeatScores(
        span=layout.span,
        first_copy_loss=float(first_loss.mean()),
        later_copy_loss=float(later_loss.mean()),
        loss_drop=float(drop.mean()),
        loss_drop_ci=bootstrap_interval(drop, settings),
    )
