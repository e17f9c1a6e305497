"""The probe pass's hook sites: what an accumulator reads while the one forward pass runs.

The pass (``capture.run_probe``) forwards the probe in minibatches and hands each subscribed
``Accumulator`` the tensors of three sites, named as TransformerLens names its hook points and shaped
with the glossary's dimension names (docs/glossary.md):

========== ============ =============================================================================
site       when         what
========== ============ =============================================================================
attention  per layer    ``AttentionCall``: ``query`` [b, heads, T, d_head] and ``key``/``value``
                        [b, kv_heads, T, d_head] as the layer transformed them (RoPE, q/k norms,
                        clipping), the additive ``mask`` [b, 1, T, T], each head's output ``out``
                        [b, T, heads, d_head]; pattern rows on request: ``rows(queries)``
                        [b, heads, Q, T], ``pattern()`` [b, heads, T, T] (one layer of one
                        minibatch, never kept), and the kernel's ``to_key0`` [b, heads, T] and
                        ``to_lagged`` [b, heads, T - lag] where an accumulator's ``reads`` ask
resid_post per layer    the decoder block's output, the residual stream [b, T, d_model]
final      per batch    ``Final``: the clean logits at T-1 [b, d_vocab]; the final hidden states
                        [b, T, d_model] and each token's loss [b, T-1] where the probe computes
                        per-position losses (text and repeat probes), else None
========== ============ =============================================================================

An accumulator declares the sites it reads (``sites``) and the pattern reads it needs (``reads``);
the pass calls ``begin_batch``, then its sites in the order the model computes them, then
``end_batch``, for every minibatch, and keeps nothing itself: each accumulator reduces as it goes.
The screen's own sums (``capture.Recorder``) are one accumulator among them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from jaxtyping import Float, Int

Site = Literal["attention", "resid_post", "final"]
SITES: tuple[Site, ...] = ("attention", "resid_post", "final")


def softcapped(scores: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """Gemma 2's logit soft-capping, softcap * tanh(scores / softcap); identity without a cap."""
    return scores if softcap is None else torch.tanh(scores / softcap) * softcap


def pattern_rows(
    query, key, mask, scaling: float, softcap: float | None, queries: torch.Tensor | slice
) -> torch.Tensor:
    """The attention of the ``queries`` (positions) to every key, [b, heads, Q, T] in float32, as the
    layer computes it (its scaling, soft-cap and mask, sliding window included)."""
    b, h, _, d = query.shape
    q = query[:, :, queries].float()  # [b, h, Q, d]
    Q = q.shape[2]
    # query head i reads KV head i // n_rep (grouped-query attention), without copying the keys
    grouped = q.reshape(b, key.shape[1], -1, d)  # [b, kv_heads, n_rep * Q, d]
    scores = torch.matmul(grouped, key.float().transpose(2, 3)).reshape(b, h, Q, -1) * scaling
    scores = softcapped(scores, softcap)
    if mask is not None:
        scores = scores + mask[:, :, queries, :].float()
    return scores.softmax(dim=-1)


@dataclass(frozen=True)
class Reads:
    """What the attention kernel reads off the pattern besides its output, for the accumulators
    that ask (``Accumulator.reads``): the union of theirs is computed once per layer."""

    first_key: bool = False  # every query's attention to key 0 (Gu et al.'s sink importance)
    lag: int | None = None  # each query q >= lag's attention to key q - lag (the prefix-matching score)

    def __or__(self, other: Reads) -> Reads:
        if self.lag is not None and other.lag is not None and self.lag != other.lag:
            raise ValueError(f"two accumulators read different lags ({self.lag}, {other.lag}) in one pass")
        return Reads(self.first_key or other.first_key, self.lag if self.lag is not None else other.lag)


@dataclass(frozen=True)
class AttentionCall:
    """One attention layer's call in a forward pass (the ``attention`` site)."""

    module: torch.nn.Module  # the attention module that called
    query: Float[torch.Tensor, "b heads T d_head"]  # as the model transformed it (RoPE, q/k norms, clipping)
    key: Float[torch.Tensor, "b kv_heads T d_head"]
    value: Float[torch.Tensor, "b kv_heads T d_head"]
    mask: Float[torch.Tensor, "b 1 T T"] | None  # additive
    scaling: float
    softcap: float | None
    out: Float[torch.Tensor, "b T heads d_head"]  # each head's output (TransformerLens's hook_z)
    to_key0: Float[torch.Tensor, "b heads T"] | None = None  # float32, where some accumulator reads first_key
    to_lagged: Float[torch.Tensor, "b heads lagged"] | None = None  # float32, where one reads a lag

    def rows(self, queries: torch.Tensor | slice) -> torch.Tensor:
        """[b, heads, Q, T] float32: the attention of the ``queries`` to every key (``pattern_rows``)."""
        return pattern_rows(self.query, self.key, self.mask, self.scaling, self.softcap, queries)

    def last_query_row(self) -> torch.Tensor:
        """[b, heads, T] float32: the last query's attention to every key."""
        return self.rows(slice(-1, None))[:, :, 0]

    def pattern(self) -> torch.Tensor:
        """[b, heads, T, T] float32: the whole pattern of this layer for this minibatch."""
        return self.rows(slice(None))


@dataclass(frozen=True)
class BatchSlice:
    """The minibatch a pass is at: sequences ``start:stop`` of the probe batch."""

    start: int
    stop: int
    tokens: Int[torch.Tensor, "b T"]  # on the model's device
    ab: Int[torch.Tensor, " b"]  # each sequence's pair position (``ProbeBatch.ab``), on the model's device


@dataclass(frozen=True)
class Final:
    """The end of one minibatch's forward (the ``final`` site)."""

    logits: Float[torch.Tensor, "b d_vocab"]  # the clean logits at T-1
    hidden: Float[torch.Tensor, "b T d_model"] | None  # the final hidden states (per-position losses only)
    losses: Float[torch.Tensor, "b T-1"] | None  # float32: each token's loss, NaN where not computed


class Accumulator:
    """Reduces what it reads of the pass's sites, minibatch by minibatch. Subclasses set ``sites``
    (and ``reads``) and override the methods of the sites they read; the rest do nothing."""

    sites: frozenset[Site] = frozenset()
    reads: Reads = Reads()

    def begin_batch(self, batch: BatchSlice) -> None:
        """Before the minibatch's forward."""

    def attention(self, layer: int, call: AttentionCall) -> None:
        """Each attention layer's call, in layer order (the ``attention`` site)."""

    def resid_post(self, layer: int, hidden: torch.Tensor) -> None:
        """hidden [b, T, d_model]: each decoder block's output (the ``resid_post`` site)."""

    def final(self, final: Final) -> None:
        """After the forward (the ``final`` site)."""

    def end_batch(self) -> None:
        """After every site of the minibatch."""
