"""The one forward pass over the probe that feeds steps 2 and 3, reduced on the fly.

We register an attention function ("emergence") through transformers'
``AttentionInterface``. It runs the model's normal SDPA kernel, and, while a
``Recorder`` is active, also computes the one attention row that the screen needs
(query T-1 against all keys) and keeps only:

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

The full attention pattern [n, layers, heads, T, T] is never materialised; q/k/v reach
the function after the model's own transforms (RoPE, OLMo's ``clip_qkv``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from emergence.probe import LOCAL_OFFSETS, ProbeBatch
from emergence.screen import N_TARGETS

ATTN_IMPLEMENTATION = "emergence"

_active_recorder: "Recorder | None" = None


class Recorder:
    """Accumulates the reductions of one probe pass (see the module docstring)."""

    def __init__(self, n: int, n_layers: int, n_heads: int, head_dim: int, seq_len: int,
                 baseline: np.ndarray, spectral_n: int, keep_position_sums: bool, device: torch.device,
                 null_positions: np.ndarray | None = None):
        self.targets = torch.zeros(n, n_layers, n_heads, N_TARGETS, dtype=torch.float32)
        self.gram = torch.zeros(n_layers, n_heads, head_dim, head_dim, dtype=torch.float64, device=device)
        self.total = torch.zeros(n_layers, n_heads, head_dim, dtype=torch.float64, device=device)
        self.position_sum = (
            torch.zeros(n_layers, seq_len, n_heads, head_dim, dtype=torch.float64, device=device)
            if keep_position_sums else None
        )
        self.null_positions = None if null_positions is None else torch.as_tensor(null_positions, device=device)
        self.null_sums = torch.zeros(n_layers, n_heads, 0 if null_positions is None else len(null_positions),
                                     dtype=torch.float64, device=device)
        self.spectral_n = spectral_n
        self.baseline = torch.as_tensor(baseline, device=device)
        self.local = torch.tensor([seq_len - o for o in LOCAL_OFFSETS], device=device)
        self._start = 0
        self._ab: torch.Tensor | None = None
        self.finite = torch.ones((), dtype=torch.bool, device=device)  # checked once per minibatch

    def begin_batch(self, start: int, ab: torch.Tensor) -> None:
        self._start, self._ab = start, ab

    def record(self, layer: int, query, key, attention_mask, scaling: float, out: torch.Tensor) -> None:
        """query [b, h, T, d], key [b, h_kv, T, d], out [b, T, h, d] (the SDPA output)."""
        b, h, T, d = query.shape
        if key.shape[1] != h:  # grouped-query attention: each KV head serves h / h_kv query heads
            key = key.repeat_interleave(h // key.shape[1], dim=1)
        q_last = query[:, :, -1, :].float()
        scores = torch.einsum("bhd,bhtd->bht", q_last, key.float()) * scaling
        if attention_mask is not None:
            last = attention_mask[:, :, -1, :]
            scores = scores.masked_fill(~last, float("-inf")) if last.dtype == torch.bool else scores + last.float()
        row = scores.softmax(dim=-1)  # [b, h, T]
        self.finite &= torch.isfinite(row).all() & torch.isfinite(out).all()

        ab = self._ab
        idx = torch.arange(b, device=row.device)
        stats = torch.stack(
            [
                row[idx, :, ab + 1],  # induction: the B after the first A
                row[idx, :, ab],  # duplicate token: the first A
                row[:, :, T - 2],  # previous token
                row[:, :, T - 1],  # self
                row[:, :, 0],  # first token ("BOS")
                row[:, :, self.local].mean(-1),  # local
                row[:, :, self.baseline].mean(-1),  # baseline
            ],
            dim=-1,
        )
        self.targets[self._start:self._start + b, layer] = stats.cpu()
        if self.null_positions is not None:
            draws = self.null_positions[:, self._start:self._start + b].T  # [b, draws]
            self.null_sums[layer] += row.gather(2, draws[:, None, :].expand(-1, h, -1)).double().sum(0)

        take = max(0, min(b, self.spectral_n - self._start))
        if take:
            x = out[:take, -1].double()  # [take, h, d]
            self.gram[layer] += torch.einsum("bhd,bhe->hde", x, x)
            self.total[layer] += x.sum(0)
        if self.position_sum is not None:
            self.position_sum[layer] += out.double().sum(0)


def capture_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """SDPA attention that also feeds the active ``Recorder`` (if any)."""
    out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    if _active_recorder is not None:
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        _active_recorder.record(module.layer_idx, query, key, attention_mask, scale, out)
    return out, None


AttentionInterface.register(ATTN_IMPLEMENTATION, capture_attention)
# Without a mask function of the same name the model would build no mask for us.
AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)


@dataclass(frozen=True)
class Capture:
    """What one probe pass leaves: see the module docstring for shapes."""

    targets: np.ndarray  # [n, layers, heads, 7] float32
    gram: np.ndarray  # [layers, heads, d, d] float64
    total: np.ndarray  # [layers, heads, d] float64
    spectral_n: int
    position_mean: torch.Tensor | None  # [layers, T, heads, d] head outputs averaged over the batch
    clean_metrics: dict[str, float]  # clean next-token metrics of B at T-1
    null_sums: np.ndarray  # [layers, heads, draws] float64 (draws = 0 without the null)

    def mean_attention(self) -> np.ndarray:
        """[layers, heads, 7] batch-mean attention to each target."""
        return self.targets.mean(axis=0)


def run_probe(model, arch, batch: ProbeBatch, baseline: np.ndarray, batch_size: int,
              spectral_n: int, keep_position_means: bool, score, null_positions: np.ndarray | None = None) -> Capture:
    """Forward the probe in minibatches under a Recorder.

    ``arch`` is the model's ``checkpoints.Architecture``; ``score(logits [b, V], b [b])``
    returns summed next-token metrics, which we accumulate for the clean model;
    ``null_positions`` [draws, n] are the reference null's random key positions.
    """
    global _active_recorder
    if model.config._attn_implementation != ATTN_IMPLEMENTATION:
        raise RuntimeError(f"model must be loaded with attn_implementation={ATTN_IMPLEMENTATION!r}")
    device = next(model.parameters()).device
    n, spectral_n = batch.n, min(spectral_n, batch.n)
    rec = Recorder(n, arch.n_layers, arch.n_heads, arch.head_dim, batch.seq_len, baseline,
                   spectral_n, keep_position_means, device, null_positions)
    sums: dict[str, float] = {}
    _active_recorder = rec
    try:
        with torch.inference_mode():
            for start in tqdm(range(0, n, batch_size), desc="probe", unit="batch", leave=False):
                stop = min(start + batch_size, n)
                rec.begin_batch(start, batch.ab[start:stop].to(device))
                logits = model(batch.tokens[start:stop].to(device), logits_to_keep=1).logits[:, -1]
                if not rec.finite:
                    raise FloatingPointError(f"non-finite attention (NaN or inf) in {model.dtype}: "
                                             "rerun with model.dtype=float32")
                for k, v in score(logits, batch.b[start:stop].to(device)).items():
                    sums[k] = sums.get(k, 0.0) + v
    finally:
        _active_recorder = None
    return Capture(
        targets=rec.targets.numpy(),
        gram=rec.gram.cpu().numpy(),
        total=rec.total.cpu().numpy(),
        spectral_n=spectral_n,
        position_mean=None if rec.position_sum is None else (rec.position_sum / n).to(model.dtype),
        clean_metrics={k: v / n for k, v in sums.items()},
        null_sums=rec.null_sums.cpu().numpy(),
    )
