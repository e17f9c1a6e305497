"""The per-token losses (``probe.kind=text`` and ``repeat``) from the final hidden states, blocked over
the vocabulary (``capture.token_losses``), against the full log-softmax of the full [b, T, V] logits:
on a 262,144-token vocabulary (with and without a bias and a soft-cap) and through the probe pass on
tiny models of every tested architecture (tied and untied embeddings, Gemma 2's final soft-cap)."""

from collections import Counter

import numpy as np
import pytest
import torch

from emergence.core.errors import UsageError
from emergence.recipe import capture
from emergence.recipe.ablation import metrics_per_sequence
from emergence.recipe.capture import (
    Architecture,
    PassOptions,
    Subject,
    Unembedding,
    register_attention,
    run_probe,
    token_losses,
)
from emergence.recipe.icl import curve_positions, text_scores
from emergence.recipe.probe import baseline_positions, make_probe_batch
from tests.helpers.tiny_models import ARCHS, tiny_model

T, N, BATCH = 48, 6, 4


def full_log_softmax_losses(logits: torch.Tensor, targets: torch.Tensor, dtype=torch.float32) -> np.ndarray:
    """The reference: -log_softmax(logits)[target] over the whole vocabulary at once; logits [..., V],
    targets [...]."""
    return -torch.log_softmax(logits.to(dtype), dim=-1).gather(-1, targets[..., None])[..., 0].numpy()


def assert_losses_equal(losses: np.ndarray, logits: torch.Tensor, targets: torch.Tensor) -> None:
    """Equal to the full float32 log-softmax up to float32 rounding, and to float64's up to float32's
    error over a large vocabulary's log-sum-exp."""
    np.testing.assert_allclose(losses, full_log_softmax_losses(logits, targets), rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(losses, full_log_softmax_losses(logits, targets, torch.float64), rtol=1e-4)


@pytest.mark.parametrize("block", [1000, 8192, 262_144, 300_000])
@pytest.mark.parametrize("bias, softcap", [(False, None), (True, None), (False, 30.0)])
def test_token_losses_blocked_over_the_vocabulary_equal_the_full_log_softmax(block, bias, softcap):
    """262,144 logits per position over a 16-wide hidden state, 3 x 47 positions at once: any block of
    the vocabulary (one that does not divide it included) gives each position's loss; each call
    projects one block of rows of W_U for every position."""
    generator = torch.Generator().manual_seed(0)
    vocab, n = 262_144, 3 * (T - 1)
    weight = torch.randn(vocab, 16, generator=generator)
    unembedding = Unembedding(weight, torch.randn(vocab, generator=generator) if bias else None, softcap)
    hidden = torch.randn(n, 16, generator=generator) * 2
    targets = torch.randint(0, vocab, (n,), generator=generator)
    targets[:3] = torch.tensor([0, vocab - 1, min(block, vocab) - 1])  # the edges of the vocabulary and of a block
    widths = []
    logits_of = unembedding.logits

    class Watched(Unembedding):
        def logits(self, h, rows=slice(None), out=None):
            logits = logits_of(h, rows, out)
            widths.append(tuple(logits.shape))
            return logits

    losses = token_losses(Watched(*vars(unembedding).values()), hidden, targets, block)
    assert losses.shape == (n,) and losses.dtype == torch.float32
    assert_losses_equal(losses.numpy(), unembedding.logits(hidden), targets)
    assert all(w == (n, min(block, vocab - i * block)) for i, w in enumerate(widths))
    assert sum(w for _, w in widths) == vocab  # every row of W_U once


@pytest.mark.parametrize("arch", ARCHS)
def test_probe_pass_losses_and_scores_equal_the_full_logits_of_every_architecture(arch, monkeypatch):
    """Through ``run_probe`` (every position of a minibatch against as many rows of W_U per block as
    the budget allows, 2,048 x 188 logits; 65,536 rows): the losses equal the full log-softmax of the model's
    own logits at every position, and the T-1 scores its last logits'; no block holds more logits than the
    budget."""
    vocab = 65_536
    budget = 2048 * BATCH * (T - 1)
    monkeypatch.setattr(capture, "LOSS_CHUNK_ELEMENTS", budget)
    model = tiny_model(arch, attn_implementation=register_attention(), vocab_size=vocab)
    batch = make_probe_batch(N, T, 10, vocab, 1)
    subject = Subject(model, Architecture.of(model), batch, BATCH)
    held = []
    logits_of = Unembedding.logits
    monkeypatch.setattr(
        Unembedding,
        "logits",
        lambda self, h, rows=slice(None), out=None: (
            held.append((len(h), len(range(*rows.indices(len(self.weight)))))) or logits_of(self, h, rows, out)
        ),
    )
    options = PassOptions(baseline_positions(T, 20), N, loss_positions=np.arange(1, T))
    cap = run_probe(subject, options, metrics_per_sequence)
    blocks = [shape for shape in held if shape[0] > BATCH]  # the rest: the T-1 check
    # minibatches of 4 and 2 sequences: 188 positions against 2,048 rows, then 94 against 4,096 (the budget)
    assert Counter(tuple(shape) for shape in blocks) == {(188, 2048): vocab // 2048, (94, 4096): vocab // 4096}
    with torch.no_grad():
        logits = model(batch.tokens).logits  # the model's own forward, every position's logits
    assert cap.position_losses.shape == (N, T - 1)
    assert_losses_equal(cap.position_losses, logits[:, :-1], batch.tokens[:, 1:])
    np.testing.assert_allclose(cap.scores, metrics_per_sequence(logits[:, -1], batch.b).numpy(), rtol=1e-6, atol=1e-6)


def test_the_tested_architectures_cover_tied_and_untied_embeddings_and_a_final_soft_cap():
    models = {arch: tiny_model(arch) for arch in ARCHS}
    tied = {
        arch
        for arch, m in models.items()
        if m.get_output_embeddings().weight.data_ptr() == m.get_input_embeddings().weight.data_ptr()
    }
    assert tied and tied != set(ARCHS)
    assert Unembedding.of(models["gemma2"]).softcap == 30.0


def test_a_model_whose_logits_are_not_its_output_embeddings_is_refused():
    """A llama whose forward scales its logits (as Cohere's logit_scale does): the blocks would miss it."""
    model = tiny_model("llama", attn_implementation=register_attention())
    forward = type(model).forward

    def scaled(self, *args, **kwargs):
        out = forward(self, *args, **kwargs)
        out.logits = out.logits * 0.5
        return out

    model.forward = scaled.__get__(model)
    batch = make_probe_batch(BATCH, T, 10, 500, 1)
    options = PassOptions(baseline_positions(T, 20), BATCH, loss_positions=np.arange(1, T))
    with pytest.raises(UsageError, match="logits are not its output embeddings"):
        run_probe(Subject(model, Architecture.of(model), batch, BATCH), options, metrics_per_sequence)
    # the paper probe reads the model's own logits at T-1 alone: it runs
    run_probe(
        Subject(model, Architecture.of(model), batch, BATCH),
        PassOptions(baseline_positions(T, 20), BATCH),
        metrics_per_sequence,
    )


def test_the_text_curve_projects_only_its_positions_and_the_icl_score_is_unchanged(monkeypatch):
    """The sparse curve (powers of two below T, T-1, the ICL positions): the pass projects those
    positions alone, their losses equal every position's, the others are NaN (None in the curve),
    and the ICL score is the same as with every position."""
    icl = [5, 40]
    positions = curve_positions(T, icl, "sparse")
    assert positions.tolist() == [1, 2, 4, 5, 8, 16, 32, 40, 47]
    assert curve_positions(T, icl, "all").tolist() == list(range(1, T))
    model = tiny_model("gemma2", attn_implementation=register_attention(), vocab_size=4096)
    batch = make_probe_batch(N, T, 10, 4096, 1)
    subject = Subject(model, Architecture.of(model), batch, N)
    held = []
    logits_of = Unembedding.logits
    monkeypatch.setattr(
        Unembedding,
        "logits",
        lambda self, h, rows=slice(None), out=None: (
            held.append((len(h), len(range(*rows.indices(len(self.weight)))))) or logits_of(self, h, rows, out)
        ),
    )
    sparse = run_probe(
        subject, PassOptions(baseline_positions(T, 20), N, loss_positions=positions), metrics_per_sequence
    ).position_losses
    assert {shape[0] for shape in held} == {N, N * len(positions)}  # the T-1 check, then the curve's positions
    monkeypatch.undo()
    every = run_probe(
        subject, PassOptions(baseline_positions(T, 20), N, loss_positions=np.arange(1, T)), metrics_per_sequence
    ).position_losses
    measured = np.isin(np.arange(1, T), positions)
    np.testing.assert_allclose(sparse[:, measured], every[:, measured], rtol=1e-6, atol=1e-6)
    assert np.isnan(sparse[:, ~measured]).all() and not np.isnan(every).any()

    class Stats:
        n_boot, seed, ci = 200, 0, 0.95

    scores = {
        name: text_scores(losses, icl, Stats, "file", "bytes")
        for name, losses in (("sparse", sparse), ("every", every))
    }
    assert scores["sparse"].icl_score == pytest.approx(scores["every"].icl_score, rel=1e-6)
    curve = scores["sparse"].loss_by_position
    assert [p for p, v in enumerate(curve) if v is not None] == positions.tolist()
    assert [curve[p] for p in positions] == pytest.approx([scores["every"].loss_by_position[p] for p in positions])


@pytest.mark.parametrize("arch", ["gpt_neox", "olmo", "olmoe", "llama"])
def test_the_toys_copy_loss_drop_equals_the_full_log_softmax(arch):
    """``toy.train.measure_copy_loss_drop`` (blocked, the copies' positions alone) against the drop
    computed from the model's full logits' log-softmax at every position."""
    from types import SimpleNamespace

    from emergence.toy.corpus import copy_eval_batch
    from emergence.toy.train import COPY_EVAL_SEED, COPY_SPAN, measure_copy_loss_drop

    model = tiny_model(arch)
    recipe = SimpleNamespace(vocab_size=512, seq_len=128)
    tokens, first, second = copy_eval_batch(recipe.vocab_size, recipe.seq_len, 64, COPY_SPAN, COPY_EVAL_SEED)
    with torch.no_grad():
        nll = full_log_softmax_losses(model(tokens).logits[:, :-1], tokens[:, 1:])  # column t: token t+1
    expected = nll[:, first : first + COPY_SPAN - 1].mean() - nll[:, second : second + COPY_SPAN - 1].mean()
    assert measure_copy_loss_drop(model, recipe) == pytest.approx(float(expected), abs=1e-5)
