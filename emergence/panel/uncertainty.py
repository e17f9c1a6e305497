"""How far to trust a panel's findings (docs/method.md section 9).

* Brackets (any input): a milestone first seen at revision k happened after revision k-1
  and by revision k, so its time is the bracket (tokens[k-1], tokens[k]]; a ratio of two
  milestones has the range of the brackets' ratios.
* A bootstrap over sequences (run directories, which keep their per-sequence attentions):
  one seeded resample matrix is used for every revision, so a replicate sees the same
  sequences everywhere and first crossings stay paired; the screen is recomputed in each
  replicate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from emergence.core.config import StatsConfig
from emergence.panel.runs import Trajectory
from emergence.recipe import sinks
from emergence.recipe.screen import CLASSES
from emergence.recipe.stats import interval, replicate_means, replicate_selectivity, resample_weights

INDUCTION = CLASSES.index("induction")
BOS = CLASSES.index("bos")
RUN_STATS = StatsConfig()  # the runs' defaults: n_boot, ci, seed


def bracket(tokens: np.ndarray, index: int) -> list:
    """[tokens of the revision before (None before the first), tokens of the milestone]."""
    return [None if index == 0 else float(tokens[index - 1]), float(tokens[index])]


def ratio_range(
    later: int | None, earlier: int | None, tokens_later: np.ndarray, tokens_earlier: np.ndarray
) -> list | None:
    """The range of tokens(later milestone) / tokens(earlier milestone) over their brackets;
    None where a milestone is missing, an open end where a bracket has no lower end."""
    if later is None or earlier is None:
        return None
    low_later, high_later = bracket(tokens_later, later)
    low_earlier, high_earlier = bracket(tokens_earlier, earlier)
    low = None if low_later is None else low_later / high_earlier
    high = None if not low_earlier else high_later / low_earlier
    return [low, high]


@dataclass(frozen=True)
class Replicates:
    """Panel quantities in each bootstrap replicate; arrays are [replicates, revisions]."""

    bos_fraction: np.ndarray
    n_induction: np.ndarray
    induction_sel: np.ndarray  # [replicates, revisions, layers, heads]
    ci: float
    sink_fraction: np.ndarray | None = None  # Gu et al.'s Sink_0 share, where every revision measured it

    def interval(self, values: np.ndarray) -> list[float]:
        return interval(values, self.ci)


def replicates(
    traj: Trajectory,
    class_threshold: float,
    circuit_threshold: float,
    sink_epsilon: float = sinks.EPSILON,
    settings: StatsConfig = RUN_STATS,
) -> Replicates | None:
    """The bootstrap of a trajectory (``settings``: n_boot, ci, seed; the runs' defaults), or None
    without per-sequence attentions at every revision (the reference data, old runs) or when
    revisions were probed with different batch sizes."""
    targets = [c.targets for c in traj.checkpoints if c.targets is not None]
    if len(targets) != len(traj.checkpoints) or len({t.shape[0] for t in targets}) != 1:
        return None
    weights = resample_weights(targets[0].shape[0], settings.n_boot, settings.seed)
    bos, n_ind, ind = [], [], []
    for t in targets:  # one revision at a time: [n_boot, layers, heads, 6] is the largest array held
        sel = replicate_selectivity(t, weights)
        bos.append((sel[..., BOS] >= class_threshold).mean(axis=(1, 2)))
        n_ind.append((sel[..., INDUCTION] >= circuit_threshold).sum(axis=(1, 2)))
        ind.append(sel[..., INDUCTION])
    sink = None
    importances = [v for c in traj.checkpoints if (v := c.sink_values()) is not None]
    if len(importances) == len(traj.checkpoints):  # every revision measured them
        # a replicate's Sink_0 share is the resampled mean of each sequence's share of sink heads
        shares = np.stack([(s > sink_epsilon).mean(axis=(1, 2)) for s in importances], 1)
        sink = replicate_means(shares, weights)  # [n_boot, revisions]
    return Replicates(np.stack(bos, 1), np.stack(n_ind, 1), np.stack(ind, 1), settings.ci, sink)


def first_crossing_probability(reached: np.ndarray, revisions: list[str]) -> dict[str, float]:
    """``reached`` [replicates, revisions] bool -> the share of replicates whose first crossing
    is at each revision (and "never"); only revisions with a non-zero share are listed."""
    hit = reached.any(axis=1)
    first = np.where(hit, reached.argmax(axis=1), len(revisions))
    counts = np.bincount(first, minlength=len(revisions) + 1) / len(first)
    return {name: float(p) for name, p in zip([*revisions, "never"], counts) if p > 0}
