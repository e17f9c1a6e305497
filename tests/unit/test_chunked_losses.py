"""The per-token losses (``probe.kind=text`` and ``repeat``) from the final hidden states in chunks
of positions (``capture.token_losses``) against the unchunked computation on the full [b, T, V]
logits, on tiny models with large vocabularies."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tests.helpers.tiny_models import ARCHS, tiny_model

from emergence.core.errors import UsageError
from emergence.hub.checkpoints import Architecture
from emergence.recipe import capture
from emergence.recipe.ablation import metrics_per_sequence
from emergence.recipe.capture import PassOptions, Subject, register_attention, run_probe, token_losses
from emergence.recipe.probe import baseline_positions, make_probe_batch

T, N, BATCH = 48, 6, 4


def full_logit_losses(logits: torch.Tensor, tokens: torch.Tensor) -> np.ndarray:
    """The unchunked reference: logits [b, T, V] -> [b, T-1] float32, the loss of the token at each
    position 1..T-1 from every position's logits at once (as the capture computed it before chunks)."""
    return F.cross_entropy(logits[:, :-1].float().transpose(1, 2), tokens[:, 1:], reduction="none").numpy()


def assert_losses_equal(losses: np.ndarray, logits: torch.Tensor, tokens: torch.Tensor) -> None:
    """Equal to the unchunked float32 losses up to rounding, and to float64 up to float32's error over
    a large vocabulary's log-sum-exp."""
    np.testing.assert_allclose(losses, full_logit_losses(logits, tokens), rtol=1e-6, atol=1e-6)
    log_probs = torch.log_softmax(logits.double(), dim=-1)
    exact = -log_probs[:, :-1].gather(2, tokens[:, 1:, None])[..., 0].numpy()
    np.testing.assert_allclose(losses, exact, rtol=1e-4)


@pytest.mark.parametrize("chunk", [1, 3, 16, T - 1, 1000])
def test_token_losses_in_chunks_equal_the_losses_of_the_full_logits(chunk):
    """262,144 logits per position over an 8-wide hidden state: any chunking gives each position's loss."""
    generator = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(8, 262_144, bias=False)
    with torch.no_grad():
        head.weight.normal_(0, 1.0, generator=generator)
    hidden = torch.randn(3, T, 8, generator=generator)
    tokens = torch.randint(0, 262_144, (3, T), generator=generator)
    calls = []

    def projected(h):
        calls.append(h.shape[1])
        return head(h)

    with torch.no_grad():
        losses = token_losses(hidden, tokens, projected, chunk)
        logits = head(hidden)
    assert losses.shape == (3, T - 1) and losses.dtype == torch.float32
    assert_losses_equal(losses.numpy(), logits, tokens)
    assert max(calls) == min(chunk, T - 1) and sum(calls) == T - 1  # every position once, chunk at a time


@pytest.mark.parametrize("arch", ARCHS)
def test_probe_pass_losses_and_scores_equal_the_full_logits_of_every_architecture(arch, monkeypatch):
    """Through ``run_probe`` (3 positions of 65,536 logits per chunk, the output embeddings watched):
    the losses equal the model's full logits' and the T-1 scores equal its last logits'; no call
    projects more than one chunk."""
    vocab = 65_536
    monkeypatch.setattr(capture, "LOSS_CHUNK_ELEMENTS", 3 * BATCH * vocab)
    model = tiny_model(arch, attn_implementation=register_attention(), vocab_size=vocab)
    batch = make_probe_batch(N, T, 10, vocab, 1)
    subject = Subject(model, Architecture.of(model), batch, BATCH)  # discovery's pass projects 8 tokens
    projected = []
    handle = model.get_output_embeddings().register_forward_hook(lambda m, a, out: projected.append(out.shape))
    try:
        cap = run_probe(subject, PassOptions(baseline_positions(T, 20), N, position_losses=True), metrics_per_sequence)
    finally:
        handle.remove()
    assert max(shape[0] * shape[1] for shape in projected) <= 3 * BATCH
    with torch.no_grad():
        logits = model(batch.tokens).logits  # the model's own forward, every position's logits
    assert cap.position_losses.shape == (N, T - 1)
    assert_losses_equal(cap.position_losses, logits, batch.tokens)
    np.testing.assert_allclose(cap.scores, metrics_per_sequence(logits[:, -1], batch.b).numpy(), rtol=1e-6, atol=1e-6)


def test_a_262k_vocabulary_is_projected_a_few_positions_at_a_time():
    """With the default budget, 4 sequences of a 262,144-token vocabulary: 16 positions per chunk, not T."""
    vocab = 262_144
    model = tiny_model("llama", attn_implementation=register_attention(), vocab_size=vocab)
    batch = make_probe_batch(BATCH, T, 10, vocab, 2)
    subject = Subject(model, Architecture.of(model), batch, BATCH)
    projected = []
    handle = model.get_output_embeddings().register_forward_hook(lambda m, a, out: projected.append(out.shape))
    try:
        cap = run_probe(subject, PassOptions(baseline_positions(T, 20), BATCH, position_losses=True),
                        metrics_per_sequence)
    finally:
        handle.remove()
    assert capture.LOSS_CHUNK_ELEMENTS // (BATCH * vocab) == 16
    assert sorted(shape[1] for shape in projected) == [1, 1, 15, 16, 16]  # T-1 (and its check), then 47 positions
    with torch.no_grad():
        logits = model(batch.tokens).logits
    assert_losses_equal(cap.position_losses, logits, batch.tokens)


def test_a_model_whose_logits_are_not_its_output_embeddings_is_refused():
    """A llama whose forward scales its logits (as Cohere's logit_scale does): the chunks would miss it."""
    model = tiny_model("llama", attn_implementation=register_attention())
    forward = type(model).forward

    def scaled(self, *args, **kwargs):
        out = forward(self, *args, **kwargs)
        out.logits = out.logits * 0.5
        return out

    model.forward = scaled.__get__(model)
    batch = make_probe_batch(BATCH, T, 10, 500, 1)
    options = PassOptions(baseline_positions(T, 20), BATCH, position_losses=True)
    with pytest.raises(UsageError, match="logits are not its output embeddings"):
        run_probe(Subject(model, Architecture.of(model), batch, BATCH), options, metrics_per_sequence)
    # the paper probe reads the model's own logits at T-1 alone: it runs
    run_probe(Subject(model, Architecture.of(model), batch, BATCH), PassOptions(baseline_positions(T, 20), BATCH),
              metrics_per_sequence)
