"""The task pass (recipe/tasks/measure.py) on tiny models of three architectures, loaded with our
attention function, against the study-style eager reference (tests/helpers/task_reference.py): the
per-prompt metrics and the head screens of the four tasks' real batches, tokenised by a word-level
tokenizer in which every task word is one token."""

import copy
import dataclasses
import functools

import numpy as np
import pytest
import torch

from emergence.core.errors import UsageError
from emergence.recipe import capture
from emergence.recipe.capture import Architecture
from emergence.recipe.tasks.batches import CITIES, build_task_batch
from emergence.recipe.tasks.measure import task_pass
from tests.helpers.task_reference import (
    TINY_ARCHS,
    plant_marker_head,
    reference_metrics,
    reference_screens,
    tiny_task_model,
)
from tests.unit.test_task_batches import word_level_tokenizer

TASK_NAMES = ("ioi", "greater_than", "successor", "binding")
N = 10  # prompts per task batch: minibatches of 5 divide it, of 4 do not
PLANTED_HEAD = 2
BOS_ID = 0  # the unknown-word id, which no prompt holds, standing in for a BOS


@functools.cache
def tokenizer():
    return word_level_tokenizer()


@functools.cache
def batch(task):
    return build_task_batch(task, tokenizer(), n=N)


def eager_model(arch):
    """``tiny_task_model`` with the tokenizer's vocabulary; the unembedding redrawn at unit scale so the
    logits are spread (~5) and no argmax or comparison sits within rounding of a tie."""
    model = tiny_task_model(arch)
    model.resize_token_embeddings(len(tokenizer()), mean_resizing=False)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        unembedding = model.get_output_embeddings().weight
        unembedding.copy_(torch.randn(unembedding.shape, generator=generator))
    return model


def ours(eager):
    """The same weights, loaded with our attention function, and the layout ``discover`` finds."""
    model = copy.deepcopy(eager)
    model.set_attn_implementation(capture.register_attention())
    return model, Architecture.of(model)


@functools.cache
def models(arch):
    """(eager reference model, our model, its Architecture): the same weights."""
    eager = eager_model(arch)
    return (eager, *ours(eager))


def reference_values(model, b):
    """The reference's per-prompt metrics (name -> [n]) of the batch ``b``."""
    return reference_metrics(
        model,
        b.task,
        b.tokens.numpy(),
        target=b.target.numpy(),
        distractor=None if b.distractor is None else b.distractor.numpy(),
        decade_value=None if b.decade is None else b.decade.numpy(),
        answer_ids=None if b.answer_tokens is None else b.answer_tokens.numpy(),
    )


def assert_values_equal(values, expected):
    assert {f.name for f in dataclasses.fields(values)} == set(expected)
    for name, column in expected.items():
        np.testing.assert_allclose(getattr(values, name), column, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("arch", TINY_ARCHS)
@pytest.mark.parametrize("task", TASK_NAMES)
@pytest.mark.parametrize("batch_size", [5, 4])
def test_pass_equals_the_eager_reference(arch, task, batch_size):
    eager, model, layout = models(arch)
    b = batch(task)
    got = task_pass(model, layout, b, batch_size)
    assert (got.task, got.seq_len, got.sums.n_prompts) == (task, b.tokens.shape[1], N)
    assert_values_equal(got.values, reference_values(eager, b))
    expected_scores, expected_ranked = reference_screens(
        eager, task, b.tokens.numpy(), {name: p.numpy() for name, p in b.positions.items()}
    )
    screen = got.screen(k=5)
    assert set(screen.scores) == set(expected_scores)
    for name, scores in expected_scores.items():
        np.testing.assert_allclose(screen.scores[name], scores, rtol=1e-5, atol=1e-5, err_msg=name)
    assert screen.ranked == expected_ranked


@pytest.mark.parametrize("task", TASK_NAMES)
def test_a_bos_before_every_prompt_equals_the_eager_reference_on_the_same_tokens(task):
    """Behind a BOS (an id no prompt holds), the pass reads the shifted positions and T + 1 keys as the
    reference reads them from the same tokens; the numbers differ from the batch without it."""
    eager, model, layout = models("llama")
    b = build_task_batch(task, tokenizer(), n=N, bos=BOS_ID)
    assert not np.isin(batch(task).tokens.numpy(), BOS_ID).any() and (b.tokens[:, 0] == BOS_ID).all()
    got = task_pass(model, layout, b, batch_size=4)
    assert_values_equal(got.values, reference_values(eager, b))
    expected_scores, expected_ranked = reference_screens(
        eager, task, b.tokens.numpy(), {name: p.numpy() for name, p in b.positions.items()}
    )
    screen = got.screen(k=5)
    for name, scores in expected_scores.items():
        np.testing.assert_allclose(screen.scores[name], scores, rtol=1e-5, atol=1e-5, err_msg=name)
    assert screen.ranked == expected_ranked
    without = task_pass(model, layout, batch(task), batch_size=4).values
    logit = {"greater_than": "logit_diff_above_below", "successor": "target_logit"}.get(task, "logit_diff")
    assert not np.allclose(getattr(without, logit), getattr(got.values, logit))


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_a_planted_head_is_the_top_name_mover(arch):
    """Layer 0's head 2 attends to city tokens, which the IOI batch holds only at the IO position."""
    b = batch("ioi")
    markers = [tokenizer().convert_tokens_to_ids(" " + city) for city in CITIES[:N]]
    assert not np.isin(b.tokens.numpy(), markers).any()
    tokens = b.tokens.clone()
    tokens[torch.arange(N), b.positions["io"]] = torch.tensor(markers)
    planted_batch = dataclasses.replace(b, tokens=tokens)
    eager = eager_model(arch)
    plant_marker_head(eager, arch, PLANTED_HEAD, markers)
    model, layout = ours(eager)
    screen = task_pass(model, layout, planted_batch, batch_size=3).screen()
    assert screen.ranked["name_mover"][0] == (0, PLANTED_HEAD)
    assert screen.scores["io_attn"][0, PLANTED_HEAD] > 0.99
    expected_scores, expected_ranked = reference_screens(
        eager, "ioi", tokens.numpy(), {name: p.numpy() for name, p in b.positions.items()}
    )
    np.testing.assert_allclose(screen.scores["nm_sel"], expected_scores["nm_sel"], rtol=1e-5)
    assert screen.ranked == expected_ranked


def test_a_pass_without_the_screen_gives_the_same_values():
    _, model, layout = models("olmo")
    b = batch("binding")
    screened, plain = task_pass(model, layout, b, 4), task_pass(model, layout, b, 4, screen=False)
    assert plain.sums is None
    for field in dataclasses.fields(plain.values):
        np.testing.assert_array_equal(getattr(plain.values, field.name), getattr(screened.values, field.name))
    with pytest.raises(UsageError, match="did not screen"):
        plain.screen()


def test_a_layer_that_does_not_report_is_refused():
    _, model, layout = models("llama")
    one_more = dataclasses.replace(layout, n_layers=layout.n_layers + 1)
    for screen in (True, False):
        with pytest.raises(UsageError, match=f"{layout.n_layers} of {layout.n_layers + 1} attention layers"):
            task_pass(model, one_more, batch("successor"), 4, screen=screen)


def test_non_finite_attention_and_logits_are_refused():
    eager = eager_model("gpt_neox")
    with torch.no_grad():
        eager.get_input_embeddings().weight[int(batch("successor").tokens[0, 0])] = float("nan")
    model, layout = ours(eager)
    for screen in (True, False):
        with pytest.raises(FloatingPointError, match="non-finite"):
            task_pass(model, layout, batch("successor"), 4, screen=screen)


def test_a_model_loaded_without_our_attention_is_refused():
    eager, _, layout = models("gpt_neox")
    with pytest.raises(RuntimeError, match="attn_implementation"):
        task_pass(eager, layout, batch("ioi"), 4)
