"""The second sink definition (Gu et al. 2024, docs/method.md section 9), beside the screen's BOS class.

The screen's first-token class looks at one query (T-1) and a ratio to a baseline. Gu et
al. instead ask how much attention key 0 gets from *every* query that can see it:

    importance[l, h] = 1 / |Q0| * sum_{i in Q0} A[l, h, i, 0]

(Q0: the queries whose mask lets them see key 0, all T of them in a causal layer without a
sliding window), and count a (sequence, layer, head) as a sink when its importance exceeds
an absolute level epsilon (``EPSILON``, 0.3). The measure ``sink_importance`` keeps the importance per
sequence in the probe pass (``first_key_importance``); ``sink_metric`` reduces it for a run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from emergence.core.config import StatsConfig
from emergence.core.record import Record
from emergence.recipe.stats import interval, replicate_means, resample_weights

EPSILON = 0.3  # Gu et al.'s level: key 0's importance above it makes a sink


def first_key_importance(to_key0: torch.Tensor, mask_key0: torch.Tensor | None) -> torch.Tensor:
    """Every query's attention to key 0 [b, h, T] and the additive mask's column 0 ([b, 1, T] or
    None: all queries see it) -> [b, h] key 0's mean attention over the queries that see it."""
    if mask_key0 is None:
        return to_key0.mean(dim=-1)
    sees = mask_key0 > torch.finfo(mask_key0.dtype).min  # masked entries hold the dtype's minimum (or -inf)
    return (to_key0 * sees).sum(dim=-1) / sees.sum(dim=-1).clamp(min=1)


SINK_DEFINITION = (
    "share of (sequence, layer, head) whose key-0 importance (mean attention to key 0 over "
    "every query that sees it) exceeds epsilon (Gu et al. 2024)"
)


@dataclass
class SinkMetric(Record):
    """``summary.json`` ``sink_metric``: Gu et al.'s Sink_eps over the probe's sequences; shares in [0, 1]."""

    epsilon: float  # a head is a sink on a sequence when key 0's importance exceeds it (a share of attention)
    fraction: float  # share of (sequence, layer, head) that are sinks
    fraction_ci: list[float]  # its bootstrap interval over sequences, [low, high]
    per_layer: list[float]  # the same share within each layer
    definition: str  # the metric in words


def sink_metric(importance: np.ndarray, epsilon: float, settings: StatsConfig) -> SinkMetric:
    """``summary.json``'s ``sink_metric`` from the per-sequence importances [n, layers, heads]
    (``settings``: the run's ``StatsConfig``, the screen's resample)."""
    above = importance > epsilon  # [n, layers, heads]
    per_sequence = above.mean(axis=(1, 2))  # [n]: the sequence's share of sink heads
    weights = resample_weights(importance.shape[0], settings.n_boot, settings.seed)
    return SinkMetric(
        epsilon=float(epsilon),
        fraction=float(above.mean()),
        fraction_ci=interval(replicate_means(per_sequence, weights), settings.ci),
        per_layer=[float(x) for x in above.mean(axis=(0, 2))],
        definition=SINK_DEFINITION,
    )
