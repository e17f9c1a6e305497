"""Step 1 - the synthetic induction batch (docs/method.md section 3).

Each sequence is uniform random tokens with one planted pair ``A B`` at ``ab, ab+1``
and a second ``A`` at the last position; a model that has induction heads predicts ``B``
there. The generator reproduces the reference study draw for draw (numpy's legacy
``RandomState``), so the first ``n`` sequences equal the reference batch for any ``n``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch

PAIR_START = 20  # the first possible position of the planted A (reference protocol)
LOCAL_OFFSETS = (3, 4, 5, 6)  # the "local" class averages T-3..T-6
BASELINE_EXCLUDED_TAIL = 6  # baseline positions avoid T-6..T-1


@dataclass(frozen=True)
class ProbeBatch:
    """The probe: ``tokens`` [n, T] int64, ``ab`` [n] (position of the first A),
    ``a`` [n] and ``b`` [n] (the planted tokens; ``b`` is the target at T-1)."""

    tokens: torch.Tensor
    ab: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor

    @property
    def n(self) -> int:
        return self.tokens.shape[0]

    @property
    def seq_len(self) -> int:
        return self.tokens.shape[1]

    def fingerprint(self) -> str:
        """sha256 of the token ids (int64, row-major): pins the batch so it cannot drift."""
        return hashlib.sha256(self.tokens.numpy().astype(np.int64).tobytes()).hexdigest()


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
