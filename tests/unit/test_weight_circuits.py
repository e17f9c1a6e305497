"""The weight-circuit measure (``measures.weight_circuits``) on heads whose circuits are known by
construction, and its maths against dense computations."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from emergence.measures import weight_circuits
from emergence.recipe import head_weights
from tests.helpers.tiny_models import tiny_model


def _set_head_ov(model, layer: int, head: int, W_V: torch.Tensor, W_O: torch.Tensor) -> None:
    """Write head ``head``'s W_V [d_model, d_head] and W_O [d_head, d_model] into a Llama's weights."""
    attention = model.model.layers[layer].self_attn
    d_head = W_V.shape[1]
    group = model.config.num_attention_heads // model.config.num_key_value_heads
    with torch.no_grad():
        kv = head // group
        attention.v_proj.weight[kv * d_head : (kv + 1) * d_head] = W_V.T
        attention.o_proj.weight[:, head * d_head : (head + 1) * d_head] = W_O.T


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_head_that_copies_scores_one_and_one_that_suppresses_minus_one(sign):
    """With W_U = W_E^T (tied) and W_V W_O = +-U U^T, W_E W_V W_O W_U = +-(W_E U)(W_E U)^T: every
    eigenvalue has the sign, so the score is exactly +-1; the other heads, random, score in between."""
    model = tiny_model("llama")
    model.lm_head.weight = model.model.embed_tokens.weight  # tied
    d_model, d_head = model.config.hidden_size, model.config.hidden_size // model.config.num_attention_heads
    U = torch.linalg.qr(torch.randn(d_model, d_head, generator=torch.Generator().manual_seed(0)))[0]
    _set_head_ov(model, 1, 2, U, sign * U.T)
    settings = weight_circuits.Settings()
    inputs = weight_circuits.MeasureInput(
        model,
        2,
        4,
        None,
        "synthetic",
        None,
        torch.device("cpu"),
        settings,  # type: ignore[arg-type]  # weights only
    )
    result = weight_circuits.compute(inputs)
    copying = result.per_head["ov_copying"]
    assert copying[1, 2] == pytest.approx(sign, abs=1e-9)
    others = np.delete(copying.ravel(), 1 * 4 + 2)
    assert np.all(np.abs(others) < 0.9)
    assert result.per_run["copying_heads"] == float((copying >= settings.copying).sum())
    # W_V W_O = +-U U^T: a projection (to float32 rounding), whose singular values are d_head ones
    assert result.per_head["ov_sigma1"][1, 2] == pytest.approx(1.0, rel=1e-6)
    assert result.per_head["ov_stable_rank"][1, 2] == pytest.approx(d_head, rel=1e-6)


def test_the_vocabulary_is_summed_in_blocks(monkeypatch):
    """W_U W_E over blocks of the vocabulary equals the whole product (a block smaller than the vocabulary)."""
    monkeypatch.setattr(weight_circuits, "VOCAB_BLOCK", 100)
    model = tiny_model("gpt_neox")
    W_U, W_E = head_weights.unembedding(model), head_weights.embedding(model)
    whole = W_U.detach().double().numpy() @ W_E.detach().double().numpy()
    np.testing.assert_allclose(
        weight_circuits.unembed_embed(W_U.detach(), W_E.detach()).numpy(), whole, rtol=1e-12, atol=1e-12
    )


def test_the_low_rank_spectrum_is_the_dense_one():
    A, B = torch.randn(3, 40, 8, dtype=torch.float64), torch.randn(3, 40, 8, dtype=torch.float64)
    dense = np.linalg.svd((A @ B.transpose(-1, -2)).numpy(), compute_uv=False)[:, :8]
    np.testing.assert_allclose(weight_circuits.low_rank_spectrum(A, B).numpy(), dense, rtol=1e-10)
    top, stable = weight_circuits.top_and_stable_rank(torch.tensor([[3.0, 4.0, 0.0], [0.0, 0.0, 0.0]]))
    assert top.tolist()[0] == 3.0 and stable[0] == pytest.approx(25 / 9) and torch.isnan(stable[1])
