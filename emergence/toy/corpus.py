"""The toy panel's synthetic training corpus, generated on the fly from a seed.

Two kinds of sequence, half each in every batch (no BOS: position 0 holds an
arbitrary token, as in the packed documents the real panel models were trained on):

* filler: a Zipf-bigram chain (each token has its own Zipf-shaped distribution over a
  random ordering of the vocabulary) with random spans copied later in the sequence;
  optionally, each token is replaced with probability ``skip_prob`` by the token k back,
  for each k in ``skip_offsets``, which rewards heads that attend to fixed offsets;
  optionally (``trigger_fraction``), a share of the vocabulary are trigger tokens, and the
  token after a trigger repeats the token before it (the bigram-backcopy task of Guo et
  al. 2024): a job that applies only at triggers, so the heads that do it are idle
  elsewhere and need somewhere to put their attention;
* repeats: one random span repeated end to end.

Only the copies reward attending back to "the token after the previous occurrence of
the current token", so induction heads form, and abruptly, as in real pretraining. The
fixed-offset skips and the triggers give heads other jobs, so that not every head becomes
an induction head.
"""

from __future__ import annotations

import numpy as np
import torch

ZIPF_EXPONENT = 1.1  # each token's next-token distribution: Zipf-shaped over a random ordering
SPAN_MIN, SPAN_MAX = 8, 24  # a filler's copied spans are this long (a repeat's span up to 2 x SPAN_MAX)
SPANS_PER_FILLER = 2


class ToyCorpus:
    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        seed: int,
        repeat_fraction: float = 0.5,
        skip_offsets: tuple[int, ...] = (),
        skip_prob: float = 0.0,
        trigger_fraction: float = 0.0,
    ):
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed
        self.skip_offsets, self.skip_prob = tuple(skip_offsets), skip_prob
        self.span_min, self.span_max, self.spans_per_filler = SPAN_MIN, SPAN_MAX, SPANS_PER_FILLER
        self.repeat_fraction = repeat_fraction
        rng = np.random.default_rng(seed)
        ranks = np.arange(1, vocab_size + 1, dtype=np.float64) ** -ZIPF_EXPONENT
        order = np.argsort(rng.random((vocab_size, vocab_size)), axis=1)  # a random ordering per row
        probs = np.empty((vocab_size, vocab_size))
        np.put_along_axis(probs, order, ranks / ranks.sum(), axis=1)
        self.bigram_cdf = np.cumsum(probs, axis=1)
        self.is_trigger = np.zeros(vocab_size, dtype=bool)  # drawn after the bigrams: they stay as they were
        self.is_trigger[rng.permutation(vocab_size)[: round(trigger_fraction * vocab_size)]] = True

    def batch(self, step: int, size: int) -> torch.Tensor:
        """The training batch of ``step``: [size, seq_len] int64, a pure function of (seed, step)."""
        rng = np.random.default_rng([self.seed, step])
        n_repeat = int(size * self.repeat_fraction)
        return torch.from_numpy(np.concatenate([self._repeats(rng, n_repeat), self._filler(rng, size - n_repeat)]))

    def _bigram_chain(self, rng, n: int) -> np.ndarray:
        out = np.empty((n, self.seq_len), dtype=np.int64)
        out[:, 0] = rng.integers(0, self.vocab_size, size=n)
        for t in range(1, self.seq_len):
            u = rng.random(n)[:, None]
            out[:, t] = (self.bigram_cdf[out[:, t - 1]] < u).sum(1).clip(max=self.vocab_size - 1)
            for k in self.skip_offsets:
                if t >= k:
                    skip = rng.random(n) < self.skip_prob
                    out[skip, t] = out[skip, t - k]
            if t >= 2:  # after a trigger, the token before it (last: the triggers' rule always holds)
                after_trigger = self.is_trigger[out[:, t - 1]]
                out[after_trigger, t] = out[after_trigger, t - 2]
        return out

    def _filler(self, rng, n: int) -> np.ndarray:
        seqs = self._bigram_chain(rng, n)
        for seq in seqs:
            for _ in range(self.spans_per_filler):
                length = int(rng.integers(self.span_min, self.span_max + 1))
                first = int(rng.integers(0, self.seq_len - 2 * length))
                second = int(rng.integers(first + length, self.seq_len - length + 1))
                seq[first : first + length] = rng.integers(0, self.vocab_size, size=length)
                seq[second : second + length] = seq[first : first + length]
        return seqs

    def _repeats(self, rng, n: int) -> np.ndarray:
        out = np.empty((n, self.seq_len), dtype=np.int64)
        for seq in out:
            length = int(rng.integers(self.span_min, 2 * self.span_max + 1))
            span = rng.integers(0, self.vocab_size, size=length)
            seq[:] = np.resize(span, self.seq_len)
        return out


def copy_eval_batch(vocab_size: int, seq_len: int, n: int, span: int, seed: int) -> tuple[torch.Tensor, int, int]:
    """Uniform random tokens with one span copied: (tokens [n, T], first copy start, second copy start).

    The in-context-learning score compares the loss on the two copies."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab_size, size=(n, seq_len))
    first, second = seq_len // 4, seq_len // 4 + seq_len // 2
    tokens[:, second : second + span] = tokens[:, first : first + span]
    return torch.from_numpy(tokens), first, second
