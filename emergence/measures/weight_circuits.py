"""Each head's weight circuits, read from the weights alone (no data, no forward pass).

Elhage et al. 2021 ("A Mathematical Framework for Transformer Circuits") read a head's behaviour
from two low-rank products of its weights (``recipe.head_weights`` gives them, TransformerLens's
shapes):

* the **QK circuit** ``W_Q[h] W_K[h]^T`` [d_model, d_model]: which residual directions attend to which;
* the **OV circuit** ``W_V[h] W_O[h]`` [d_model, d_model]: what an attended position writes;
  through the embedding and unembedding, ``W_E W_V[h] W_O[h] W_U`` [d_vocab, d_vocab] says which
  token a head raises when it attends to a token.

Columns of heads.csv:

* ``ov_copying``: sum(lambda) / sum(|lambda|) over the eigenvalues of ``W_E W_V W_O W_U`` (their
  real parts over their moduli; the sum of the eigenvalues is real): 1 for a head that copies the
  token it attends to, near 0 at random, -1 for one that suppresses it. Its nonzero eigenvalues are
  those of the [d_head, d_head] factor ``W_O (W_U W_E) W_V`` (eig(AB) = eig(BA)), so no
  [d_vocab, d_vocab] matrix is formed; ``W_U W_E`` [d_model, d_model] is summed over blocks of the
  vocabulary. As in Elhage et al.'s attention-only models, layer norms (and Gemma's embedding
  scale) are ignored, and so are biases.
* ``qk_sigma1``, ``qk_stable_rank``: the top singular value of the QK circuit and its stable rank
  (sum sigma^2 / sigma_1^2, between 1 and d_head);
* ``ov_sigma1``, ``ov_stable_rank``: the same of the OV circuit ``W_V W_O``.

Both products have rank at most d_head: with ``W = Q R`` (reduced QR), the singular values of
``A B^T`` are those of ``R_A R_B^T`` [d_head, d_head]. Everything per head is in float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from emergence.measures.plugin import Column, ColumnTrajectory, Crossing, Measure, MeasureInput, MeasureResult
from emergence.recipe import head_weights

VOCAB_BLOCK = 8192  # rows of W_E (columns of W_U) upcast at a time for W_U W_E


@dataclass(frozen=True)
class Settings:
    copying: float = 0.5  # ov_copying at least this: a copying head (``copying_heads``)

    def __post_init__(self):
        if not -1 <= self.copying <= 1:
            raise ValueError(f"copying={self.copying}: ov_copying lies in [-1, 1]; pick a level there")


def unembed_embed(W_U: torch.Tensor, W_E: torch.Tensor) -> torch.Tensor:
    """W_U [d_model, d_vocab] @ W_E [d_vocab, d_model] -> [d_model, d_model] float64, over blocks of the
    vocabulary (a 16-bit model's embeddings are never upcast whole)."""
    d_model, d_vocab = W_U.shape
    total = torch.zeros(d_model, d_model, dtype=torch.float64, device=W_U.device)
    for start in range(0, d_vocab, VOCAB_BLOCK):
        stop = min(start + VOCAB_BLOCK, d_vocab)
        total += W_U[:, start:stop].double() @ W_E[start:stop].double()
    return total


def ov_copying(W_V: torch.Tensor, W_O: torch.Tensor, UE: torch.Tensor) -> torch.Tensor:
    """W_V [heads, d_model, d_head], W_O [heads, d_head, d_model], UE = W_U W_E [d_model, d_model] ->
    [heads] sum(lambda) / sum(|lambda|) of each head's W_E W_V W_O W_U (NaN where all lambda are 0)."""
    factor = W_O.double() @ UE @ W_V.double()  # [heads, d_head, d_head]: the nonzero spectrum's carrier
    eigenvalues = torch.linalg.eigvals(factor)
    moduli = eigenvalues.abs().sum(-1)
    return torch.where(moduli > 0, eigenvalues.sum(-1).real / moduli, torch.nan)


def low_rank_spectrum(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """A, B [heads, d_model, d_head] -> [heads, d_head] the singular values of A B^T, decreasing."""
    _, R_A = torch.linalg.qr(A.double())
    _, R_B = torch.linalg.qr(B.double())
    return torch.linalg.svdvals(R_A @ R_B.transpose(-1, -2))


def top_and_stable_rank(singular_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[heads, k] decreasing singular values -> ([heads] sigma_1, [heads] sum sigma^2 / sigma_1^2; NaN where 0)."""
    top = singular_values[:, 0]
    squares = (singular_values**2).sum(-1)
    return top, torch.where(top > 0, squares / top**2, torch.nan)


def compute(inputs: MeasureInput) -> MeasureResult:
    model = inputs.model
    assert model is not None  # needs the weights: the run loads them (``cache`` keeps the results)
    columns: dict[str, list[np.ndarray]] = {name: [] for name in COLUMN_NAMES}
    with torch.no_grad():
        UE = unembed_embed(head_weights.unembedding(model), head_weights.embedding(model))
        parameters = dict(model.named_parameters())
        for slices in head_weights.layer_slices(model):
            w = head_weights.layer_weights(parameters, slices)
            qk_top, qk_rank = top_and_stable_rank(low_rank_spectrum(w.W_Q, w.W_K))
            ov_top, ov_rank = top_and_stable_rank(low_rank_spectrum(w.W_V, w.W_O.transpose(-1, -2)))
            for name, values in zip(COLUMN_NAMES, (ov_copying(w.W_V, w.W_O, UE), qk_top, qk_rank, ov_top, ov_rank)):
                columns[name].append(values.cpu().numpy())
    grids = {name: np.stack(rows) for name, rows in columns.items()}
    copying = float((grids["ov_copying"] >= inputs.settings.copying).sum())
    return MeasureResult(grids, {"copying_heads": copying})


COLUMN_NAMES = ("ov_copying", "qk_sigma1", "qk_stable_rank", "ov_sigma1", "ov_stable_rank")

MEASURE = Measure(
    name="weight_circuits",
    version=1,
    needs=frozenset({"weights"}),
    columns=(
        Column(
            "ov_copying",
            "sum(lambda) / sum(|lambda|) over the eigenvalues of the head's OV circuit W_E W_V W_O W_U: 1 "
            "copies the attended token, near 0 at random, -1 suppresses it (layer norms and biases ignored)",
        ),
        Column("qk_sigma1", "the top singular value of the QK circuit W_Q W_K^T"),
        Column("qk_stable_rank", "the QK circuit's stable rank, sum sigma^2 / sigma_1^2 (1 to d_head)"),
        Column("ov_sigma1", "the top singular value of the OV circuit W_V W_O"),
        Column("ov_stable_rank", "the OV circuit's stable rank, sum sigma^2 / sigma_1^2 (1 to d_head)"),
    ),
    run_fields=("copying_heads",),  # heads with ov_copying >= settings.copying
    trajectories=(
        ColumnTrajectory("ov_copying", "max", "top OV copying score"),
        ColumnTrajectory("qk_sigma1", "max", "top QK sigma_1"),
        ColumnTrajectory("ov_stable_rank", "mean", "mean OV stable rank"),
    ),
    compute=compute,
    settings=Settings,
    crossings=(Crossing("ov_copying", Settings().copying),),  # F6: a head's OV circuit turns to copying
)
