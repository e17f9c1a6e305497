"""The sink mechanism, measured in the probe pass of any probe (docs/sinks.md, "Mechanism").

* **Massive activations** (Sun et al. 2024): a few activations of the residual stream, over
  1000x its median magnitude, at the first token and in fixed dimensions. For the output of
  each decoder layer, h [b, T, D], the pass keeps the largest |h| over the batch (with its
  position and dimension), the median |h|, and the mean norm of h at position 0 over the mean
  norm at the other positions (``first_position_norm_ratio``).
* **The value drain** (Guo et al. 2024): the sink token's value states shrink. For each
  attention layer, the mean norm of v at position 0 over its mean norm at the other positions
  (``value_norm_ratio``, per KV head; the ``value_drain`` measure sums the norms at the pass's
  attention site).

Everything is reduced per minibatch; nothing of size [n, T, D] outlives a layer's call. The
median is not a streaming statistic: ``median`` is the mean over sequences of each sequence's
lower median of |h| (``torch.median``) over its positions and dimensions, or, where a
sequence holds more than ``MEDIAN_SAMPLE`` activations, over every k-th of them in
(position, dimension) order (``median_stride``: k coprime with D, so that every dimension is
sampled alike). A selection over all T x D activations of every layer would cost the pass
7 % on a Pythia-160M shape; the sample's median is within a fraction of a percent of the
whole one, far less than the 1000x contrast it is read against.

The decoder layers are the attention modules' parents (``capture.decoder_layers``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float, Int

from emergence.core.record import Record
from emergence.recipe.sites import Accumulator

MEDIAN_SAMPLE = 1 << 15  # activations per sequence above which the median is taken over an even sample


def median_stride(seq_len: int, hidden: int) -> int:
    """k for the median's sample of a sequence's T x D activations: T x D // ``MEDIAN_SAMPLE``
    (so about that many samples), raised to the next integer coprime with D; 1: all of them."""
    k = max(1, (seq_len * hidden) // MEDIAN_SAMPLE)
    while math.gcd(k, hidden) != 1:
        k += 1
    return k


@dataclass(frozen=True)
class ResidualStats:
    """Per decoder layer, [layers] each: the reductions of its output h over the probe pass."""

    top: Float[np.ndarray, " layers"]  # float64: the largest |h| over the batch
    top_position: Int[np.ndarray, " layers"]  # int64: its position
    top_dimension: Int[np.ndarray, " layers"]  # int64: its dimension of the hidden state
    median: Float[np.ndarray, " layers"]  # float64: mean over sequences of each sequence's median |h|
    first_position_norm_ratio: Float[np.ndarray, " layers"]  # float64: mean |h[0]| over mean |h[p]|, p > 0

    def records(self) -> list[MassiveActivation]:
        return [
            MassiveActivation(
                layer=i,
                top=float(self.top[i]),
                position=int(self.top_position[i]),
                dimension=int(self.top_dimension[i]),
                median=float(self.median[i]),
                ratio=float(self.top[i] / self.median[i]),
                first_position_norm_ratio=float(self.first_position_norm_ratio[i]),
            )
            for i in range(len(self.top))
        ]


@dataclass
class MassiveActivation(Record):
    """``summary.json`` ``massive_activations``: one decoder layer's output over the probe."""

    layer: int
    top: float  # the largest |activation| over the batch
    position: int  # ... at this position
    dimension: int  # ... in this dimension
    median: float  # median |activation| (``mechanism``: the mean of the sequences' medians)
    ratio: float  # top / median: over 1000 for a massive activation (Sun et al. 2024)
    first_position_norm_ratio: float  # mean norm of the residual stream at position 0 over elsewhere


class ResidualRecorder(Accumulator):
    """Running reductions of the decoder layers' outputs (the pass's ``resid_post`` site)."""

    sites = frozenset({"resid_post"})

    def __init__(self, n_layers: int, device: torch.device):
        self.top = torch.full((n_layers,), -1.0, dtype=torch.float64, device=device)
        self.top_at = torch.zeros(n_layers, 2, dtype=torch.long, device=device)  # (position, dimension)
        self.median_sum = torch.zeros(n_layers, dtype=torch.float64, device=device)
        self.first_norm_sum = torch.zeros(n_layers, dtype=torch.float64, device=device)
        self.rest_norm_sum = torch.zeros(n_layers, dtype=torch.float64, device=device)
        self.sequences = 0
        self.seq_len = 0

    def resid_post(self, layer: int, hidden: torch.Tensor) -> None:
        """hidden [b, T, D]: one decoder layer's output for one minibatch."""
        b, T, D = hidden.shape
        magnitude = hidden.detach().abs().reshape(b, T * D)
        best, where = magnitude.max(dim=1)  # per sequence
        i = best.argmax()  # tensors throughout: no wait for the device
        candidate, at = best[i].double(), where[i]
        self.top_at[layer] = torch.where(
            candidate > self.top[layer], torch.stack([at // D, at % D]), self.top_at[layer]
        )
        self.top[layer] = torch.maximum(self.top[layer], candidate)
        stride = median_stride(T, D)
        self.median_sum[layer] += magnitude[:, ::stride].median(dim=1).values.double().sum()
        norms = hidden.detach().float().norm(dim=-1)  # [b, T]
        self.first_norm_sum[layer] += norms[:, 0].double().sum()
        self.rest_norm_sum[layer] += norms[:, 1:].double().sum()
        if layer == 0:
            self.sequences += b
            self.seq_len = T

    def result(self) -> ResidualStats:
        n, T = self.sequences, self.seq_len
        return ResidualStats(
            top=self.top.cpu().numpy(),
            top_position=self.top_at[:, 0].cpu().numpy(),
            top_dimension=self.top_at[:, 1].cpu().numpy(),
            median=(self.median_sum / n).cpu().numpy(),
            first_position_norm_ratio=first_over_rest(self.first_norm_sum, self.rest_norm_sum, n, T),
        )


def first_over_rest(first_sum: torch.Tensor, rest_sum: torch.Tensor, n: int, seq_len: int) -> np.ndarray:
    """Mean norm at position 0 (``first_sum`` over n sequences) over the mean norm at the other
    positions (``rest_sum`` over n (T - 1)); any shape, elementwise."""
    return ((first_sum / n) / (rest_sum / (n * (seq_len - 1)))).cpu().numpy()
