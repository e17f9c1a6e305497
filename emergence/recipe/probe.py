"""Step 1 - the probe batch: ``probe.kind`` synthetic (docs/method.md section 3), repeat or text
(docs/probes.md).

Every kind gives each sequence an ``A`` at the last position T-1 that occurred earlier at ``ab``,
followed there by ``B`` at ``ab+1``: a model that has induction heads predicts ``B`` at T-1, and
the screen reads the attention from T-1 to ``ab+1`` (induction) and ``ab`` (duplicate token).

* **synthetic**: uniform random tokens with one planted pair ``A B`` at ``ab, ab+1`` and a
  second ``A`` at T-1. The generator reproduces the reference study draw for draw (numpy's
  legacy ``RandomState``), so the first ``n`` sequences equal the reference batch for any ``n``.
* **repeat**: a random span repeated (TransformerLens's convention for the prefix-matching
  score): ``prefix`` random tokens, then a span of L = (T-1)//2 random tokens, then the span
  again, ending at T-1 (``RepeatLayout``).
* **text**: windows of natural text (``make_text_batch``), each chosen so that its last token
  occurred earlier; ``ab`` is its latest earlier occurrence in [20, T/2).
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from jaxtyping import Int

from emergence.core.errors import UsageError
from emergence.core.record import Record

PAIR_START = 20  # the first possible position of the planted A (reference protocol)
LOCAL_OFFSETS = (3, 4, 5, 6)  # the "local" class averages T-3..T-6
BASELINE_EXCLUDED_TAIL = 6  # baseline positions avoid T-6..T-1


@dataclass(frozen=True)
class ProbeBatch:
    """The probe: ``tokens`` [n, T] int64, ``ab`` [n] (position of the first A),
    ``a`` [n] and ``b`` [n] (the planted tokens; ``b`` is the target at T-1)."""

    tokens: Int[torch.Tensor, "n T"]
    ab: Int[torch.Tensor, " n"]
    a: Int[torch.Tensor, " n"]
    b: Int[torch.Tensor, " n"]

    @property
    def n(self) -> int:
        return self.tokens.shape[0]

    @property
    def seq_len(self) -> int:
        return self.tokens.shape[1]

    def fingerprint(self) -> str:
        """sha256 of the token ids (int64, row-major): pins the batch so it cannot drift."""
        return hashlib.sha256(self.tokens.numpy().astype(np.int64).tobytes()).hexdigest()


@dataclass(frozen=True)
class RepeatLayout:
    """Where the repeat probe's pieces lie in a sequence of ``seq_len`` tokens: positions
    [0, prefix) random, the span at [prefix, prefix + span), its copy at [prefix + span, T)."""

    seq_len: int

    @property
    def span(self) -> int:
        return (self.seq_len - 1) // 2

    @property
    def prefix(self) -> int:
        return self.seq_len - 2 * self.span  # 1 for odd T, 2 for even

    @property
    def copy_start(self) -> int:
        return self.prefix + self.span

    @property
    def lag(self) -> int:
        """A token of the copy at q reads ahead of its earlier occurrence at q - span: key q - lag."""
        return self.span - 1


def min_seq_len(n_baseline: int) -> int:
    """Shortest T for which the pair, local, and baseline positions all exist."""
    pair_ok = 2 * (PAIR_START + 1)  # ab is drawn from [20, T // 2): needs T // 2 > 20
    baseline_ok = n_baseline + BASELINE_EXCLUDED_TAIL + 1  # distinct draws from [1, T-7]
    return max(pair_ok, baseline_ok)


def make_probe_batch(n: int, seq_len: int, vocab_low: int, vocab_high: int, seed: int) -> ProbeBatch:
    """The reference generator: the draws below, in this order, per sequence."""
    rs = np.random.RandomState(seed)
    candidates = np.arange(vocab_low, vocab_high)
    T = seq_len
    tokens = np.empty((n, T), dtype=np.int64)
    ab = np.empty(n, dtype=np.int64)
    a_tok = np.empty(n, dtype=np.int64)
    b_tok = np.empty(n, dtype=np.int64)
    for i in range(n):
        seq = rs.randint(vocab_low, vocab_high, size=T)
        a, b = rs.choice(candidates, size=2, replace=False)
        pos = rs.randint(PAIR_START, T // 2)
        seq[pos], seq[pos + 1] = a, b
        # Remove every other A, then every other B; the reference does not re-check
        # the replacement draws, and neither do we (draw-for-draw reproduction).
        for token, keep in ((a, pos), (b, pos + 1)):
            for j in np.flatnonzero(seq == token):
                if j != keep:
                    seq[j] = rs.randint(vocab_low, vocab_high)
        seq[T - 1] = a
        tokens[i], ab[i], a_tok[i], b_tok[i] = seq, pos, a, b
    return ProbeBatch(
        tokens=torch.from_numpy(tokens),
        ab=torch.from_numpy(ab),
        a=torch.from_numpy(a_tok),
        b=torch.from_numpy(b_tok),
    )


def make_repeat_batch(n: int, seq_len: int, vocab_low: int, vocab_high: int, seed: int) -> ProbeBatch:
    """The repeat probe (``RepeatLayout``): T-1 ends the copy, its earlier occurrence ends the span
    (``ab``), and ``B`` is the token after it, the copy's first (the span read a third time)."""
    layout = RepeatLayout(seq_len)
    rs = np.random.RandomState(seed)
    prefix = rs.randint(vocab_low, vocab_high, size=(n, layout.prefix))
    span = rs.randint(vocab_low, vocab_high, size=(n, layout.span))
    tokens = np.concatenate([prefix, span, span], axis=1).astype(np.int64)
    ab = np.full(n, layout.copy_start - 1, dtype=np.int64)
    return ProbeBatch(
        tokens=torch.from_numpy(tokens),
        ab=torch.from_numpy(ab),
        a=torch.from_numpy(tokens[:, -1].copy()),
        b=torch.from_numpy(tokens[:, layout.copy_start].copy()),
    )


@dataclass(frozen=True)
class FirstToken(Record):
    """What position 0 of every probe sequence and task prompt holds (``probe.first_token``): an ordinary
    random token, as the study drew it for models trained without a BOS, or the BOS id the model was
    trained behind (``summary.json`` ``probe.first``)."""

    kind: Literal["random", "bos_token"]
    bos_id: int | None  # the id at position 0 for ``bos_token``; None for ``random``
    reason: str  # why: what was asked and what the checkpoint's tokenizer does

    def __post_init__(self):
        if self.kind == "bos":  # summary.json files of the token's old spelling read as they meant
            object.__setattr__(self, "kind", "bos_token")


RANDOM_FIRST = FirstToken("random", None, "probe.first_token=random")


def with_first_token(batch: ProbeBatch, first: FirstToken) -> ProbeBatch:
    """``batch`` with ``first.bos_id`` at position 0 of every sequence (``bos_token``), the rest as drawn; as it is
    for ``random``. Position 0 is never a planted A or B (the pair starts at 20 and the generators redraw
    every other occurrence of both), so only the random token that stood there changes."""
    if first.kind == "random":
        return batch
    assert first.bos_id is not None  # bos_token names its id
    if bool(((batch.a == first.bos_id) | (batch.b == first.bos_id)).any()):
        raise UsageError(
            f"probe.first_token=bos_token is invalid with this probe.vocab_low/vocab_high: the BOS id "
            f"{first.bos_id} lies in that range and is drawn as a planted A or B; use a range without it"
        )
    tokens = batch.tokens.clone()
    tokens[:, 0] = first.bos_id
    return dataclasses.replace(batch, tokens=tokens)


def latest_earlier_occurrence(window: np.ndarray) -> int | None:
    """The latest position in [PAIR_START, T/2) holding the window's last token (None: none does)."""
    T = len(window)
    hits = np.flatnonzero(window[PAIR_START : T // 2] == window[-1])
    return PAIR_START + int(hits[-1]) if len(hits) else None


def make_text_batch(stream: np.ndarray, n: int, seq_len: int, seed: int, bos: int | None) -> ProbeBatch:
    """``n`` windows of ``seq_len`` tokens from the token ``stream`` (documents concatenated): the
    stream cut into consecutive windows (of T - 1 tokens after ``bos`` where the model's tokenizer
    starts every text with one, else of T), taken in the order of a ``RandomState(seed)``
    permutation, keeping those whose last token occurred in [20, T/2) (``latest_earlier_occurrence``).
    Fewer than ``n`` such windows: ValueError, with the number found."""
    body = seq_len - (bos is not None)
    n_windows = len(stream) // body
    order = np.random.RandomState(seed).permutation(n_windows)
    tokens, ab = [], []
    for w in order:
        window = stream[w * body : (w + 1) * body]
        if bos is not None:
            window = np.concatenate([[bos], window])
        at = latest_earlier_occurrence(window)
        if at is not None:
            tokens.append(window)
            ab.append(at)
            if len(tokens) == n:
                break
    if len(tokens) < n:
        raise ValueError(
            f"the text holds {len(tokens)} windows of {seq_len} tokens whose last token occurred "
            f"in [{PAIR_START}, {seq_len // 2}) (of {n_windows} windows), fewer than the {n} asked for"
        )
    tokens_np, ab_np = np.stack(tokens).astype(np.int64), np.array(ab, dtype=np.int64)
    rows = np.arange(n)
    return ProbeBatch(
        tokens=torch.from_numpy(tokens_np),
        ab=torch.from_numpy(ab_np),
        a=torch.from_numpy(tokens_np[:, -1].copy()),
        b=torch.from_numpy(tokens_np[rows, ab_np + 1]),
    )


def baseline_positions(seq_len: int, n_baseline: int, seed: int = 0) -> np.ndarray:
    """The fixed baseline key positions: ``randint(1, T-1)`` repeated with
    ``RandomState(seed)``, skipping T-6..T-1 and repeats, until ``n_baseline`` are drawn."""
    if seq_len < min_seq_len(n_baseline):
        raise ValueError(f"seq_len {seq_len} is too short for {n_baseline} baseline positions")
    rs = np.random.RandomState(seed)
    chosen: list[int] = []
    while len(chosen) < n_baseline:
        p = int(rs.randint(1, seq_len - 1))
        if p >= seq_len - BASELINE_EXCLUDED_TAIL or p in chosen:
            continue
        chosen.append(p)
    return np.array(chosen, dtype=np.int64)
