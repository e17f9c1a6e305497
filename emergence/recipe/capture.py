"""The one forward pass over the probe that feeds steps 2 and 3, reduced on the fly.

``register_attention`` registers an attention function ("emergence") through transformers'
``AttentionInterface``, so it serves every architecture whose attention goes through that
interface, q/k/v already transformed by the model (RoPE, q/k norms, OLMo's ``clip_qkv``);
whoever loads a model for the capture calls it (``checkpoints.load_model``). The function
computes the layer's attention output itself (SDPA, or the eager formula where the
model passes a logit ``softcap`` that SDPA cannot apply), always with the ``scaling`` and
the mask the model passes: the mask function is transformers' ``eager_mask`` registered
under our name, so every layer gets its real additive mask (causal, sliding window,
padding).

This module keeps no state: a pass hands the attention function what it needs as keyword
arguments of the model's forward, which transformers passes on to every attention call
(and which the function passes on to no one):

* ``emergence_listener`` (``LISTENER``): called with each layer's tensors (the pass's ``Dispatch``
  in the probe pass, ``discover``'s collector in the discovery pass, a task's rows in its pass);
* ``emergence_last_query_only`` (``LAST_QUERY_ONLY``): the attention modules that attend
  from their last query alone (``last_query_only``; the last layer in ablation).

A layer that does not pass them on is not seen: ``discover`` and ``run_probe`` count the
layers that reported and refuse the model when one is missing.

In the probe pass the listener is a ``Dispatch``: it hands the hook sites (``sites``: each layer's
attention call, each block's residual output, the minibatch's final hidden states and losses) to the
accumulators that subscribe, and the attention kernel computes the union of the pattern reads they
ask for. One of them is the screen's own, the ``Recorder``, which keeps only:

* ``targets`` [n, layers, heads, 7]: attention from T-1 to each class's target
  position(s) and to the baseline positions (order: ``screen.CLASSES``, baseline);
* ``gram`` [layers, heads, d, d] and ``total`` [layers, heads, d] (float64): running
  sums of x x^T and x over the head outputs x at T-1 (the head's slice of the input to
  the output projection), which is all the spectral estimators need;
* optionally ``position_sum`` [layers, T, heads, d]: the batch sum of every head output
  at every position, for mean ablation;
* optionally ``null_sums`` [layers, heads, draws] (float64): for each draw of the
  reference null (``stats.null_positions``), the attention from T-1 to that draw's random
  position, summed over sequences.

The registry's measures bring theirs (``emergence.measures``; Gu et al.'s key-0 importance is one,
read off the softmax normaliser the attention kernel computes anyway). On the text and repeat probes, a hook
on the output embeddings keeps the final hidden states and lets the model project T-1 alone;
every token's loss then comes from them for all positions at once, over blocks of the vocabulary
(``token_losses``), so the [b, T, vocabulary] logits never exist and W_U is read once per minibatch.

The full attention pattern [n, layers, heads, T, T] is never materialised; each layer's
pieces wait in the Recorder until the minibatch's forward pass ends and are then reduced
for all layers at once.

``discover`` finds the layout by capability, not by a table of names: one short forward
pass lists the modules that call the attention function (the attention layers, in call
order) and, for each, the child module whose input is exactly that call's output (the
output projection, whose input holds the per-head outputs).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from tqdm.auto import tqdm
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import repeat_kv
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from emergence.core.errors import UsageError
from emergence.recipe.probe import LOCAL_OFFSETS, ProbeBatch
from emergence.recipe.screen import N_TARGETS
from emergence.recipe.sites import SITES, Accumulator, AttentionCall, BatchSlice, Final, Reads, Site, softcapped

ATTN_IMPLEMENTATION = "emergence"

# Keyword arguments some models pass that change the attention in ways we do not compute
# (gpt_oss's attention sinks, T5-style position bias, sparse index selection): refused, never ignored.
UNSUPPORTED_KWARGS = ("s_aux", "sinks", "position_bias", "indices", "block_indices")

# The model forward's keyword arguments that reach the attention function (the module docstring).
LISTENER = "emergence_listener"
LAST_QUERY_ONLY = "emergence_last_query_only"


def kernel_returns_lse(query: torch.Tensor) -> bool:
    """Whether the attention kernel we can call directly also returns each query's log-sum-exp
    (the softmax normaliser): SDPA's flash kernel on a CPU does."""
    return query.device.type == "cpu"


def attend(
    query, key, value, mask, scaling: float, softcap: float | None, reads: Reads | None = None
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """query [b, h, T, d], key/value [b, h_kv, S, d], additive mask [b, 1, T, S] -> the attention
    output [b, T, h, d]; with ``reads.first_key``, every query's attention to key 0 [b, h, T] in float32
    (None without); with ``reads.lag``, the attention of each query q >= lag to key q - lag
    [b, h, T - lag] in float32 (None without)."""
    first_key, lag = (False, None) if reads is None else (reads.first_key, reads.lag)
    n_rep = query.shape[1] // key.shape[1]  # grouped-query attention: each KV head serves n_rep query heads
    to_key0 = to_lagged = None
    reading = first_key or lag is not None
    if softcap is not None or (reading and not kernel_returns_lse(query)):
        # The eager formula (softmax in float32, as the models' eager path): SDPA has no softcap and
        # returns no softmax normaliser; the score matrix lives for this layer of this minibatch only.
        key, value = repeat_kv(key, n_rep), repeat_kv(value, n_rep)
        scores = softcapped(torch.matmul(query, key.transpose(2, 3)) * scaling, softcap)
        if mask is not None:
            scores = scores + mask
        probs = scores.softmax(dim=-1, dtype=torch.float32)
        out = torch.matmul(probs.to(query.dtype), value)
        to_key0 = probs[..., 0] if first_key else None
        to_lagged = None if lag is None else probs.diagonal(offset=-lag, dim1=-2, dim2=-1)
    elif reading:
        # The kernel SDPA runs on a CPU, called directly because it also returns each query's
        # log-sum-exp: attention to key 0 is then exp(score(q, k0) - lse), at no extra pass.
        key, value = repeat_kv(key, n_rep), repeat_kv(value, n_rep)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, attn_mask=mask, scale=scaling
        )
        lse = lse.float()
        if first_key:  # key 0 against every query as a row-by-matrix product ([1, d] x [d, T]: BLAS's fast orientation)
            score0 = torch.matmul(key[:, :, :1].float(), query.float().transpose(2, 3))[:, :, 0] * scaling
            if mask is not None:
                score0 = score0 + mask[..., 0].float()
            to_key0 = torch.exp(score0 - lse)
        if lag is not None:  # query q against key q - lag: one dot product per query
            T = query.shape[2]
            scores = (query[:, :, lag:].float() * key[:, :, : T - lag].float()).sum(-1) * scaling
            if mask is not None:
                scores = scores + mask.diagonal(offset=-lag, dim1=-2, dim2=-1).float()
            to_lagged = torch.exp(scores - lse[..., lag:])
    elif query.device.type == "cpu":  # the CPU kernel takes GQA with a mask at full speed
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling, enable_gqa=n_rep > 1)
    else:  # CUDA kernels with a mask do not all take GQA: expand the KV heads, as transformers does
        out = F.scaled_dot_product_attention(
            query, repeat_kv(key, n_rep), repeat_kv(value, n_rep), attn_mask=mask, scale=scaling
        )
    return out.transpose(1, 2).contiguous(), to_key0, to_lagged


class Recorder(Accumulator):
    """The screen's accumulator (see the module docstring): the targets, the spectral sums, the null's
    sums and, for mean ablation, the per-position sums.

    Each layer's call keeps only what needs that layer's queries, keys and output: its last
    query row [b, h, T] and its head outputs at T-1. ``end_batch``
    then reduces all layers of the minibatch at once (one gather for every target and null
    position), so the fixed cost of the reductions is paid once per minibatch, not per layer."""

    sites = frozenset({"attention"})

    def __init__(self, subject: Subject, options: PassOptions, device: torch.device):
        arch, n, seq_len = subject.arch, subject.batch.n, subject.batch.seq_len
        n_layers, n_heads, head_dim = arch.n_layers, arch.n_heads, arch.head_dim
        null_positions = options.null_positions
        self.targets = torch.zeros(n, n_layers, n_heads, N_TARGETS, dtype=torch.float32)
        self.gram = torch.zeros(n_layers, n_heads, head_dim, head_dim, dtype=torch.float64, device=device)
        self.total = torch.zeros(n_layers, n_heads, head_dim, dtype=torch.float64, device=device)
        self.position_sum = (
            torch.zeros(n_layers, seq_len, n_heads, head_dim, dtype=torch.float64, device=device)
            if options.keep_position_means
            else None
        )
        self.null_positions = None if null_positions is None else torch.as_tensor(null_positions, device=device)
        self.null_sums = torch.zeros(
            n_layers, n_heads, 0 if null_positions is None else len(null_positions), dtype=torch.float64, device=device
        )
        self.spectral_n = min(options.spectral_n, n)
        # The key positions read off every T-1 row besides ab + 1 and ab (induction, duplicate token):
        # previous token, self, first token, then the local window and the baseline, each averaged.
        self.fixed = torch.tensor(
            [
                seq_len - 2,
                seq_len - 1,
                0,
                *(seq_len - o for o in LOCAL_OFFSETS),
                *np.asarray(options.baseline).tolist(),
            ],
            device=device,
        )
        # Columns of the gathered rows (``end_batch``): 0-4 the single positions, then the local
        # window, the baseline and the null's draws.
        self._local_cols = slice(5, 5 + len(LOCAL_OFFSETS))
        self._baseline_cols = slice(self._local_cols.stop, 2 + len(self.fixed))
        self._draw_cols = slice(self._baseline_cols.stop, None)
        self._start = 0
        self._read_at: torch.Tensor | None = None  # [b, positions]: where each sequence's rows are read
        self._take = 0  # this minibatch's sequences that enter the spectral sums (the first spectral_n overall)
        self._rows: list = [None] * n_layers  # this minibatch's per-layer pieces, reduced by end_batch
        self._last_out: list = [None] * n_layers
        self.finite = torch.ones((), dtype=torch.bool, device=device)  # checked once per minibatch

    def begin_batch(self, batch: BatchSlice) -> None:
        start, ab = batch.start, batch.ab
        self._start = start
        b = len(ab)
        self._take = max(0, min(b, self.spectral_n - start))
        draws = (
            torch.empty(b, 0, dtype=torch.long, device=ab.device)
            if self.null_positions is None
            else self.null_positions[:, start : start + b].T
        )  # [b, draws]
        self._read_at = torch.cat([ab[:, None] + 1, ab[:, None], self.fixed.expand(b, -1), draws], dim=1)

    def attention(self, layer: int, call: AttentionCall) -> None:
        out = call.out
        self._rows[layer] = call.last_query_row()
        self._last_out[layer] = out[: self._take, -1].to(torch.float64, copy=True)  # a copy: ``out`` itself can go
        if self.position_sum is not None:
            self.position_sum[layer] += out.double().sum(0)
            self.finite &= torch.isfinite(out).all()  # the mean ablation reads every position

    def end_batch(self) -> None:
        """Reduce this minibatch's layers into the accumulators (after its forward pass)."""
        n_layers = len(self._rows)
        rows = torch.stack(self._rows, dim=1)  # [b, layers, heads, T]
        last_out = torch.stack(self._last_out, dim=1)  # [take, layers, heads, d]
        self._rows, self._last_out = ([None] * n_layers for _ in range(2))  # the stacks hold them
        # The targets, null sums and spectral sums come from the rows and the T-1 outputs: a non-finite
        # value anywhere upstream (an earlier layer's output, at any position) reaches them.
        self.finite &= torch.isfinite(rows).all() & torch.isfinite(last_out).all()
        b, _, n_heads, _ = rows.shape
        assert self._read_at is not None  # begin_batch set it
        read = rows.gather(3, self._read_at[:, None, None, :].expand(b, n_layers, n_heads, -1))
        targets = torch.cat(
            [
                read[..., :5],  # induction, duplicate token, previous token, self, first token
                read[..., self._local_cols].mean(-1, keepdim=True),
                read[..., self._baseline_cols].mean(-1, keepdim=True),
            ],
            dim=-1,
        )  # order: screen.CLASSES
        self.targets[self._start : self._start + b] = targets.cpu()
        self.null_sums += read[..., self._draw_cols].sum(0, dtype=torch.float64)
        if len(last_out):
            self.gram += torch.einsum("blhd,blhe->lhde", last_out, last_out)
            self.total += last_out.sum(0)


class Dispatch:
    """The probe pass's listener (``LISTENER``): hands each site's tensors to the accumulators that
    read it (``sites.Accumulator``), the attention kernel computing the union of their pattern reads."""

    def __init__(self, accumulators: Sequence[Accumulator], attentions: list):
        self.layer_of = {id(a): i for i, a in enumerate(attentions)}  # id(attention module) -> layer index
        self.accumulators = list(accumulators)
        self.reads = functools.reduce(operator.or_, (a.reads for a in self.accumulators), Reads())
        self.calls = 0  # attention calls in this minibatch: one per layer, or a layer escaped us
        self._reading = {site: [a for a in self.accumulators if site in a.sites] for site in SITES}

    def reads_site(self, site: Site) -> bool:
        return bool(self._reading[site])

    def begin_batch(self, batch: BatchSlice) -> None:
        self.calls = 0
        for a in self.accumulators:
            a.begin_batch(batch)

    def attention(self, call: AttentionCall) -> None:
        self.calls += 1
        layer = self.layer_of[id(call.module)]
        for a in self._reading["attention"]:
            a.attention(layer, call)

    def resid_post_hook(self, layer: int):
        """A forward hook on decoder block ``layer``: its output to the ``resid_post`` site."""

        def hand_on(module, args, output):
            hidden = output[0] if isinstance(output, tuple) else output  # [b, T, d_model]
            for a in self._reading["resid_post"]:
                a.resid_post(layer, hidden)

        return hand_on

    def final(self, final: Final) -> None:
        for a in self._reading["final"]:
            a.final(final)

    def end_batch(self) -> None:
        for a in self.accumulators:
            a.end_batch()


def capture_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """The layer's attention output (see ``attend``), reported to the pass's listener (``LISTENER``,
    if any); for a module under ``LAST_QUERY_ONLY``, T-1's output at every position, reported to no one."""
    listener, softcap = kwargs.get(LISTENER), kwargs.get("softcap")
    refused = [k for k in UNSUPPORTED_KWARGS if kwargs.get(k) is not None]
    if refused:
        raise UsageError(
            f"model architecture {type(module).__name__} passes {refused[0]!r} to its attention, "
            "which the capture does not compute; this model is not supported"
        )
    if attention_mask is None and query.shape[2] > 1 and getattr(module, "is_causal", True):
        # eager_mask gives every causal layer a mask; without one the layer would attend to the future
        raise UsageError(
            f"model architecture {type(module).__name__} built no attention mask for our attention "
            "function (it would run non-causally); this model is not supported"
        )
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if module in kwargs.get(LAST_QUERY_ONLY, ()):
        # Only T-1 is read: attend from it alone (its mask row keeps any sliding window) and give
        # every position its output, the shape the layer expects.
        out, _, _ = attend(
            query[:, :, -1:], key, value, None if attention_mask is None else attention_mask[:, :, -1:], scale, softcap
        )
        return out.expand(-1, query.shape[2], -1, -1), None
    # only the probe pass's accumulators ask for pattern reads (``Dispatch.reads``)
    dispatch = listener if isinstance(listener, Dispatch) else None
    reads = None if dispatch is None else dispatch.reads
    out, to_key0, to_lagged = attend(query, key, value, attention_mask, scale, softcap, reads)
    call = AttentionCall(module, query, key, value, attention_mask, scale, softcap, out, to_key0, to_lagged)
    if dispatch is not None:
        dispatch.attention(call)
    elif listener is not None:
        listener(call)
    return out, None


def last_query_only(*modules) -> dict:
    """The forward's keyword arguments under which ``modules`` (attention layers) attend from
    their last query alone, every position of their output holding that query's output: for a
    layer of which nothing but the last position is read (the last layer in ablation,
    ``ablation.last_position_only``)."""
    return {LAST_QUERY_ONLY: frozenset(modules)}


def register_attention() -> str:
    """Register our attention and mask functions with transformers (idempotent); returns the
    name to load a model with: ``attn_implementation=register_attention()``."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, capture_attention)
    # Without a mask function of the same name the model would build no mask for us; eager_mask
    # gives every layer (not only sliding-window ones) its additive float mask.
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, eager_mask)
    return ATTN_IMPLEMENTATION


@dataclass(frozen=True)
class AttentionSite:
    """One attention layer as the discovery pass found it."""

    module: torch.nn.Module  # the module that called the attention function
    out_proj: torch.nn.Module  # its child whose input is the attention output: per-head outputs, head-major
    n_heads: int
    head_dim: int


def discover(model, n_tokens: int = 8) -> list[AttentionSite]:
    """The attention layers of ``model`` in call order, found by one short forward pass.

    A layer counts if it calls our attention function with the forward's ``LISTENER``; its
    output projection is the child module whose input equals that call's output (reshaped to
    [b, T, heads * d]). A model that calls no attention function of ours, that has a layer of
    the same class run without reporting (it does not pass the forward's keyword arguments
    on), or whose projection input is not the bare attention output, cannot be captured
    correctly: ``UsageError`` instead of zeros."""
    check_loaded_for_capture(model)
    calls: list[tuple[torch.nn.Module, torch.Tensor]] = []
    inputs: dict[int, torch.Tensor] = {}
    ran: set[int] = set()  # every module that ran in the pass

    def keep_input(module, args):
        ran.add(id(module))
        if args and isinstance(args[0], torch.Tensor):
            inputs.setdefault(id(module), args[0])

    def keep_call(call: AttentionCall):
        calls.append((call.module, call.out))

    hooks = [m.register_forward_pre_hook(keep_input) for m in model.modules()]
    tokens = (torch.arange(n_tokens) % model.config.vocab_size)[None].to(next(model.parameters()).device)
    try:
        with torch.inference_mode():
            model(tokens, **{LISTENER: keep_call})
    finally:
        for hook in hooks:
            hook.remove()
    model_type = model.config.model_type
    if not calls:
        raise UsageError(
            f"model architecture {model_type!r} is not supported: its attention does not go through "
            "transformers' AttentionInterface (no layer called it, or none passed the forward's keyword "
            "arguments on), so nothing could be captured"
        )
    if len({id(m) for m, _ in calls}) != len(calls):
        raise UsageError(
            f"model architecture {model_type!r} is not supported: an attention module ran twice in "
            "one forward pass, so its calls cannot be told apart"
        )
    kinds, reported = {type(m) for m, _ in calls}, {id(m) for m, _ in calls}
    silent = [m for m in model.modules() if type(m) in kinds and id(m) in ran and id(m) not in reported]
    if silent:  # e.g. remote code whose layers do not all pass the forward's keyword arguments on
        raise UsageError(
            f"model architecture {model_type!r} is not supported: {len(calls)} of "
            f"{len(calls) + len(silent)} attention layers went through the capture"
        )
    sites = []
    for module, out in calls:
        if not torch.isfinite(out).all():  # NaN matches NaN anywhere: no projection could be told apart
            raise non_finite(model.dtype)
        flat = out.reshape(*out.shape[:2], -1)
        proj = [
            child
            for child in module.children()
            if id(child) in inputs and inputs[id(child)].shape == flat.shape and torch.equal(inputs[id(child)], flat)
        ]
        if len(proj) != 1:
            raise UsageError(
                f"model architecture {model_type!r} is not supported: no single output projection of "
                f"{type(module).__name__} takes the bare attention output, so heads cannot be read"
            )
        sites.append(AttentionSite(module, proj[0], out.shape[2], out.shape[3]))
    return sites


# The most logits the per-token losses hold at a time (positions x a block of the vocabulary): 64 MiB
# in float32, so that neither the positions nor the vocabulary (262,144 for Gemma 3) size the pass's memory.
LOSS_CHUNK_ELEMENTS = 2**24


@dataclass(frozen=True)
class Unembedding:
    """The map from the final hidden states to the logits, as the tested architectures' forward makes
    it: the output embeddings (``weight`` [V, d], tied to the input embeddings or not, and ``bias``
    [V] or None), then, where the config has one, the final logit soft-cap (Gemma 2).
    ``checked_final_hidden`` checks it against the model's own logits at T-1 on every minibatch."""

    weight: Float[torch.Tensor, "d_vocab d_model"]
    bias: Float[torch.Tensor, " d_vocab"] | None
    softcap: float | None

    @classmethod
    def of(cls, model) -> Unembedding:
        head = model.get_output_embeddings()
        return cls(head.weight, getattr(head, "bias", None), getattr(model.config, "final_logit_softcapping", None))

    def logits(self, hidden: torch.Tensor, rows: slice = slice(None), out: torch.Tensor | None = None) -> torch.Tensor:
        """hidden [..., d] -> [..., V'] in the model's dtype: the logits of the vocabulary's ``rows``
        (all of them by default), written into ``out`` where given (contiguous, [..., V']): the bias
        and the soft-cap are applied in place, as ``softcapped`` computes it."""
        logits = torch.matmul(hidden, self.weight[rows].T, out=out)
        if self.bias is not None:
            logits += self.bias[rows]
        return logits if self.softcap is None else logits.div_(self.softcap).tanh_().mul_(self.softcap)


def token_losses(unembedding: Unembedding, hidden: torch.Tensor, targets: torch.Tensor, block: int) -> torch.Tensor:
    """hidden [N, d] final hidden states, targets [N] the tokens they predict -> [N] float32: each
    target's cross-entropy, -log softmax(logits)[target] (the model's own next-token loss, unreduced).

    Blocked over the vocabulary: the logits of all N positions exist ``block`` rows of W_U at a time,
    [N, block] (cast to float32); a running maximum and a rescaled running sum of exponentials give
    the log-sum-exp (an online softmax, as Cut Cross-Entropy and Liger's fused linear cross-entropy
    compute it), and each target's logit is taken from the block that holds it. So W_U is read once
    per call and no more than one block of logits is ever held: every block is written into one
    buffer and exponentiated in place (a fresh [N, block] tensor per block would cost the
    allocator's page faults, about as much as the arithmetic on 2 CPU cores)."""
    n, vocab = hidden.shape[0], unembedding.weight.shape[0]
    running_max = torch.full((n,), -torch.inf, dtype=torch.float32, device=hidden.device)
    running_sum = torch.zeros(n, dtype=torch.float32, device=hidden.device)
    target_logit = torch.zeros(n, dtype=torch.float32, device=hidden.device)
    buffer = torch.empty(n * min(block, vocab), dtype=hidden.dtype, device=hidden.device)
    for start in range(0, vocab, block):
        width = min(block, vocab - start)
        logits = unembedding.logits(
            hidden,
            slice(start, start + width),  # [N, width]
            out=buffer[: n * width].view(n, width),
        ).float()
        inside = (targets >= start) & (targets < start + width)
        here = logits.gather(1, (targets - start).clamp(0, width - 1)[:, None])[:, 0]
        target_logit = torch.where(inside, here, target_logit)
        top = torch.maximum(running_max, logits.max(dim=1).values)
        running_sum = running_sum * torch.exp(running_max - top) + logits.sub_(top[:, None]).exp_().sum(dim=1)
        running_max = top
    return running_max + running_sum.log() - target_logit


def sequence_losses(
    unembedding: Unembedding, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """hidden [b, T, d] final hidden states, tokens [b, T], positions [P] (in 1..T-1) -> [b, T-1]
    float32: the loss of the token at each of ``positions`` given the ones before it (column p-1 for
    position p), NaN at the other positions, which are never projected. ``token_losses`` over the
    minibatch's P positions at once, in blocks of the vocabulary that hold at most
    ``LOSS_CHUNK_ELEMENTS`` logits."""
    b, T = tokens.shape
    block = max(1, LOSS_CHUNK_ELEMENTS // (b * len(positions)))
    read = token_losses(
        unembedding, hidden[:, positions - 1].reshape(b * len(positions), -1), tokens[:, positions].reshape(-1), block
    )
    losses = torch.full((b, T - 1), torch.nan, dtype=torch.float32, device=hidden.device)
    losses[:, positions - 1] = read.view(b, len(positions))
    return losses


@contextmanager
def final_hidden_kept(model):
    """While active, the output embeddings keep their input, the final hidden states [b, T, d], in
    the list this yields, and project it at the last position alone, [b, 1, d], as
    ``logits_to_keep=1`` would: the per-token losses project the rest in blocks (``sequence_losses``)."""
    kept: list[torch.Tensor] = []

    def hook(module, args):
        kept.append(args[0])
        return (args[0][:, -1:], *args[1:])

    handle = model.get_output_embeddings().register_forward_pre_hook(hook)
    try:
        yield kept
    finally:
        handle.remove()


def checked_final_hidden(model, kept: list, logits: torch.Tensor, model_type: str) -> torch.Tensor:
    """``kept``: what ``final_hidden_kept`` kept in one forward, logits [b, V] the model's own at T-1
    -> the final hidden states [b, T, d], once ``Unembedding`` gives those logits from them. A model
    that scales or caps its logits some other way would get wrong per-token losses; the tolerance
    only spares a GPU kernel that rounds differently between two calls."""
    if len(kept) != 1 or not torch.allclose(
        Unembedding.of(model).logits(kept[0][:, -1]).float(), logits.float(), rtol=1e-4, atol=1e-5
    ):
        raise UsageError(
            f"model architecture {model_type!r} is not supported with probe.kind=text or repeat: its "
            "logits are not its output embeddings of the final hidden states (with a final soft-cap), "
            "so the per-token losses cannot be computed in blocks"
        )
    return kept[0]


def decoder_layers(model, attentions: list) -> list:
    """Each attention layer's decoder block: the module holding it, found in the model's own tree
    (so no architecture needs its layer list spelled out)."""
    parents = {id(child): module for module in model.modules() for child in module.children()}
    return [parents[id(attention)] for attention in attentions]


def non_finite(dtype: torch.dtype) -> FloatingPointError:
    return FloatingPointError(f"non-finite attention (NaN or inf) in {dtype}: rerun with model.dtype=float32")


def check_loaded_for_capture(model) -> None:
    if model.config._attn_implementation != ATTN_IMPLEMENTATION:
        raise RuntimeError(f"model must be loaded with attn_implementation={ATTN_IMPLEMENTATION!r}")


@dataclass(frozen=True)
class Capture:
    """What one probe pass leaves: see the module docstring for shapes."""

    targets: Float[np.ndarray, "n layers heads 7"]  # float32
    gram: Float[np.ndarray, "layers heads d_head d_head"]  # float64
    total: Float[np.ndarray, "layers heads d_head"]  # float64
    spectral_n: int
    position_mean: Float[torch.Tensor, "layers T heads d_head"] | None  # head outputs averaged over the batch
    scores: Float[np.ndarray, "n metrics"]  # float64: ``score`` of each sequence's clean logits at T-1
    null_sums: Float[np.ndarray, "layers heads draws"]  # float64 (draws = 0 without the null)
    position_losses: Float[np.ndarray, "n T-1"] | None  # float32: the loss of the token at each position 1..T-1
    # (NaN where ``PassOptions.loss_positions`` holds no position)


@dataclass(frozen=True)
class Architecture:
    """A loaded model's attention layout, found by capability (``discover``)."""

    model_type: str
    n_layers: int
    n_heads: int
    head_dim: int
    attentions: list  # the modules that call the attention function, in layer order
    out_projs: list  # each one's output projection: its input holds the per-head outputs
    decoder_layers: list  # the decoder block that holds each attention module (``decoder_layers``)

    @classmethod
    def of(cls, model) -> Architecture:
        sites = discover(model)
        shapes = {(s.n_heads, s.head_dim) for s in sites}
        if len(shapes) != 1:  # one [layers, heads, ...] array per measurement needs one shape
            raise UsageError(
                f"model architecture {model.config.model_type!r} is not supported: its layers "
                f"differ in (heads, head_dim): {sorted(shapes)}"
            )
        ((n_heads, head_dim),) = shapes
        attentions = [s.module for s in sites]
        return cls(
            model.config.model_type,
            len(sites),
            n_heads,
            head_dim,
            attentions,
            [s.out_proj for s in sites],
            decoder_layers(model, attentions),
        )


@dataclass(frozen=True)
class Subject:
    """What a pass runs on: a model loaded with our attention function, its layout, and the batch."""

    model: PreTrainedModel
    arch: Architecture  # the model's attention layout (found by ``discover``)
    batch: ProbeBatch
    batch_size: int  # sequences per forward pass


@dataclass(frozen=True)
class PassOptions:
    """What one probe pass measures besides the targets, the clean scores and the spectral sums."""

    baseline: Int[np.ndarray, " n_baseline"]  # the baseline's key positions
    spectral_n: int  # the first this many sequences enter the spectral sums
    keep_position_means: bool = False  # every head output's per-position mean, for mean ablation
    null_positions: Int[np.ndarray, "draws n"] | None = None  # the reference null's random key positions
    # The positions (in 1..T-1) whose token's loss the pass computes from the final hidden states
    # (``sequence_losses``); None: none
    loss_positions: Int[np.ndarray, " positions"] | None = None


def run_probe(subject: Subject, options: PassOptions, score, accumulators: Sequence[Accumulator] = ()) -> Capture:
    """Forward the probe in minibatches, the screen's ``Recorder`` and ``accumulators`` (the measures',
    ``sites``) reading its sites through one ``Dispatch``.

    ``score(logits [b, V], b [b])`` returns each sequence's next-token metrics [b, metrics]
    (``ablation.metrics_per_sequence``), kept for the clean model.
    """
    model, arch, batch, batch_size = subject.model, subject.arch, subject.batch, subject.batch_size
    position_losses = options.loss_positions is not None
    check_loaded_for_capture(model)
    device = next(model.parameters()).device
    loss_positions = None if not position_losses else torch.as_tensor(options.loss_positions, device=device)
    n = batch.n
    rec = Recorder(subject, options, device)
    dispatch = Dispatch([rec, *accumulators], arch.attentions)
    hooks = (
        [layer.register_forward_hook(dispatch.resid_post_hook(i)) for i, layer in enumerate(arch.decoder_layers)]
        if dispatch.reads_site("resid_post")
        else []
    )
    scores: list[torch.Tensor] = []  # per minibatch, [b, metrics]
    losses: list[torch.Tensor] = []  # per minibatch, [b, T-1] (position_losses)
    try:
        with torch.inference_mode():
            for start in tqdm(range(0, n, batch_size), desc="probe", unit="batch", leave=False):
                stop = min(start + batch_size, n)
                tokens = batch.tokens[start:stop].to(device)
                dispatch.begin_batch(BatchSlice(start, stop, tokens, batch.ab[start:stop].to(device)))
                # Every position reaches the output embeddings only for final_hidden_kept, which keeps
                # them and projects T-1 alone; no KV cache: nothing generates after the pass.
                keeping: AbstractContextManager[Any] = final_hidden_kept(model) if position_losses else nullcontext([])
                with keeping as kept:
                    logits = model(
                        tokens, logits_to_keep=0 if position_losses else 1, use_cache=False, **{LISTENER: dispatch}
                    ).logits[:, -1]
                hidden = sequence_loss = None
                if loss_positions is not None:  # position_losses
                    hidden = checked_final_hidden(model, kept, logits, arch.model_type)
                    sequence_loss = sequence_losses(Unembedding.of(model), hidden, tokens, loss_positions)
                    losses.append(sequence_loss.cpu())
                if dispatch.calls != arch.n_layers:  # e.g. remote code that skips the interface after discovery
                    raise UsageError(
                        f"model architecture {arch.model_type!r} is not supported: {dispatch.calls} of "
                        f"{arch.n_layers} attention layers went through the capture"
                    )
                dispatch.final(Final(logits, hidden, sequence_loss))
                dispatch.end_batch()
                if not rec.finite:
                    raise non_finite(model.dtype)
                scores.append(score(logits, batch.b[start:stop].to(device)).cpu())
    finally:
        for hook in hooks:
            hook.remove()
    return Capture(
        targets=rec.targets.numpy(),
        gram=rec.gram.cpu().numpy(),
        total=rec.total.cpu().numpy(),
        spectral_n=rec.spectral_n,
        position_mean=None if rec.position_sum is None else (rec.position_sum / n).to(model.dtype),
        scores=torch.cat(scores).double().numpy(),
        null_sums=rec.null_sums.cpu().numpy(),
        position_losses=torch.cat(losses).numpy() if position_losses else None,
    )
