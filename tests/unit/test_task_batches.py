"""The four task batches: the study's prompts (TASKS.md section 12 check values) and their
tokenisation by a word-level tokenizer built here, which keeps a leading space with its word
and splits digit runs into 2-digit pieces (" 1450" -> " 14", "50"), as the study's models'
tokenizers do for these prompts."""

import hashlib
import json
import re

import numpy as np
import pytest
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from emergence.core.errors import UsageError
from emergence.recipe.tasks.batches import (
    CITIES,
    NAMES,
    NOUNS,
    TaskPrompt,
    binding_prompts,
    build_task_batch,
    greater_than_pairs,
    greater_than_prompts,
    ioi_prompts,
    successor_items,
)

IOI_SHA1 = "8994feb7c551154c154bbe581e893f7e791ea51b"
BINDING_SHA1 = "e1b1646341f9ff0b50a2467ec8695552e512e43e"
TOKENIZER_NAME = "word-level-test"
DIGIT_PIECES = {"pairs": r" ?\d{1,2}", "single": r" ?\d", "whole": r" ?\d+"}
MERGED_YEAR = 1912  # one year the test vocabulary has as a single token


def _pattern(digits: str) -> str:
    """The pre-tokenizer's pieces: the merged year, words and digit runs with their leading space, punctuation."""
    return rf" {MERGED_YEAR}(?!\d)| ?[A-Za-z]+|{DIGIT_PIECES[digits]}| ?[^\sA-Za-z\d]+"


def _corpus() -> list[str]:
    """Every text the four batches can hold, and their answer words."""
    texts = [p.text for p in ioi_prompts()] + [p.text for p in binding_prompts()]
    texts += [p.text + " " + p.target for p in successor_items()]
    texts += [f"The {noun} lasted from the year 14 to the year" for noun in NOUNS]
    texts += [f" {century}" for century in range(14, 20)] + [f"{d:02d}" for d in range(100)]
    texts += [" " + word for word in NAMES + CITIES] + [f" {MERGED_YEAR}"]
    return texts


def word_level_tokenizer(digits: str = "pairs", missing: tuple[str, ...] = ()) -> PreTrainedTokenizerFast:
    """A WordLevel tokenizer over the batches' pieces, less the pieces ``missing``."""
    pattern = _pattern(digits)
    pieces = {piece for text in _corpus() for piece in re.findall(pattern, text)} - set(missing)
    vocab = {piece: i for i, piece in enumerate(["[UNK]", *sorted(pieces)])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", name_or_path=TOKENIZER_NAME)


@pytest.fixture(scope="module")
def tokenizer():
    return word_level_tokenizer()


def _sha1(texts) -> str:
    return hashlib.sha1("\n".join(texts).encode()).hexdigest()


def _piece(tokenizer, token_id) -> str:
    return tokenizer.convert_ids_to_tokens(int(token_id))


# --- text, no tokenizer ---------------------------------------------------------------------------


def test_ioi_prompts_are_the_study_prompts():
    prompts = ioi_prompts()
    assert _sha1(p.text for p in prompts) == IOI_SHA1
    assert [(p.text, p.target, p.distractor, p.template) for p in prompts[:2]] == [
        ("When Sandra and Daniel went to the store, Daniel gave a book to", "Sandra", "Daniel", "ABBA"),
        ("When John and Eric went to the office, John gave a ring to", "Eric", "John", "BABA"),
    ]
    assert prompts[2].text == "When Will and Henry went to the bar, Henry gave a ball to"
    assert prompts[3].text == "When Alice and George went to the bar, Alice gave a drink to"
    assert (prompts[2].target, prompts[3].target) == ("Will", "George")
    assert prompts[499].text == "When Frank and Jessica went to the bar, Frank gave a ball to"
    assert [p.template for p in prompts].count("ABBA") == 250
    assert ioi_prompts(n=7) == prompts[:7]  # the first n are the same prompts for any n


def test_binding_prompts_are_the_study_prompts():
    prompts = binding_prompts()
    assert _sha1(p.text for p in prompts) == BINDING_SHA1
    assert [p.text for p in prompts[:3]] == [
        " Sandra lives in Denver. Daniel lives in Beijing. Sandra lives in",
        " Bob lives in Atlanta. Mary lives in London. Mary lives in",
        " Karen lives in Bangkok. Eve lives in Beijing. Karen lives in",
    ]
    assert [(p.target, p.distractor, p.query_name) for p in prompts[:3]] == [
        ("Denver", "Beijing", "Sandra"), ("London", "Atlanta", "Mary"), ("Bangkok", "Beijing", "Karen")]
    assert binding_prompts(n=3) == prompts[:3]


def test_successor_items_are_the_study_windows():
    windows = successor_items()
    assert len(windows) == 118
    assert [(w.text, w.target) for w in windows[:5]] == [
        (" 33 34 35 36 37", "38"), (" 66 67 68 69 70", "71"),
        (" Friday Saturday Sunday Monday Tuesday", "Wednesday"), (" 22 23 24 25 26", "27"), (" 3 4 5 6 7", "8")]
    counts = {s: sum(w.sequence == s for w in windows) for s in ("days", "months", "ordinals", "numbers")}
    assert counts == {"days": 7, "months": 12, "ordinals": 5, "numbers": 94}
    # the windows that wrap or end their list
    texts = {w.text: w.target for w in windows}
    assert texts[" December January February March April"] == "May"
    assert texts[" fifth sixth seventh eighth ninth"] == "tenth" and texts[" 94 95 96 97 98"] == "99"


def test_greater_than_prompts_draw_a_noun_then_a_pair():
    pairs = [(14, 2), (15, 33), (19, 88)]
    rng = np.random.RandomState(42)  # TASKS.md 2.1: per example a noun, then a pair
    expected = []
    for _ in range(4):
        noun = NOUNS[rng.randint(23)]
        century, decade = pairs[rng.randint(3)]
        expected.append(f"The {noun} lasted from the year {century}{decade:02d} to the year {century}")
    prompts = greater_than_prompts(pairs, n=4)
    assert [p.text for p in prompts] == expected
    assert all(f"{p.century}{p.decade:02d}" in p.text for p in prompts)
    assert greater_than_prompts(pairs)[:4] == prompts


# --- tokens ---------------------------------------------------------------------------------------


def test_ioi_batch_positions(tokenizer):
    batch = build_task_batch("ioi", tokenizer)
    assert batch.tokens.shape == (500, 14) and batch.tokens.dtype.is_floating_point is False
    assert batch.prompts_sha1() == IOI_SHA1
    rows = np.arange(500)
    io, s1, s2, end = (batch.positions[name] for name in ("io", "s1", "s2", "end"))
    assert (batch.tokens[rows, io] == batch.target).all()
    assert (batch.tokens[rows, s1] == batch.distractor).all() and (batch.tokens[rows, s2] == batch.distractor).all()
    assert (s2 == 9).all() and (end == 13).all() and set(io.tolist()) == {1, 3}
    assert {_piece(tokenizer, t) for t in batch.tokens[:, 13]} == {" to"}
    for prompt, row, target, distractor in zip(ioi_prompts(), batch.prompts, batch.target, batch.distractor):
        assert _piece(tokenizer, target) == " " + prompt.target
        assert _piece(tokenizer, distractor) == " " + prompt.distractor
        assert row.positions["io"] == (1 if prompt.template == "ABBA" else 3)
        assert "".join(tokenizer.convert_ids_to_tokens(row.token_ids)) == prompt.text


def test_greater_than_batch_positions_and_pairs(tokenizer):
    pairs = greater_than_pairs(tokenizer)
    expected_pairs = [(c, d) for c in range(14, 20) for d in range(2, 89) if (c, d) != (19, 12)]
    assert pairs == expected_pairs  # 1912 is one token in this vocabulary: its pair is dropped
    batch = build_task_batch("greater_than", tokenizer)
    assert batch.tokens.shape == (500, 12) and batch.distractor is None
    assert [p.text for p in batch.prompts] == [p.text for p in greater_than_prompts(expected_pairs)]
    assert [_piece(tokenizer, t) for t in batch.answer_tokens] == [f"{d:02d}" for d in range(100)]
    rows = np.arange(500)
    century, decade, end = (batch.positions[name] for name in ("century", "decade", "end"))
    assert (decade == 7).all() and (century == 6).all() and (end == 11).all()
    for prompt, tokens, start in zip(batch.prompts, batch.tokens, batch.decade.tolist()):
        year = re.search(r"year (\d\d)(\d\d) ", prompt.text)
        assert int(year.group(2)) == start and (year.group(1), start) != ("19", 12)
        assert _piece(tokenizer, tokens[7]) == f"{start:02d}"
        assert _piece(tokenizer, tokens[6]) == _piece(tokenizer, tokens[11]) == " " + year.group(1)
    assert (batch.tokens[rows, decade] == batch.target).all()
    assert (batch.answer_tokens[batch.decade] == batch.target).all()


def test_successor_batch(tokenizer):
    batch = build_task_batch("successor", tokenizer)
    assert batch.tokens.shape == (118, 5) and (batch.positions["end"] == 4).all() and batch.distractor is None
    for window, tokens, target in zip(successor_items(), batch.tokens, batch.target):
        assert [_piece(tokenizer, t) for t in tokens] == [" " + item for item in window.items]
        assert _piece(tokenizer, target) == " " + window.target
    first = build_task_batch("successor", tokenizer, n=5)
    assert first.tokens.equal(batch.tokens[:5]) and first.fingerprint() != batch.fingerprint()


def test_binding_batch_positions(tokenizer):
    batch = build_task_batch("binding", tokenizer)
    assert batch.tokens.shape == (500, 13) and batch.prompts_sha1() == BINDING_SHA1
    rows = np.arange(500)
    bound, other = batch.positions["binding"], batch.positions["distractor"]
    assert (batch.tokens[rows, bound] == batch.target).all() and (batch.tokens[rows, other] == batch.distractor).all()
    assert (batch.positions["end"] == 12).all() and (batch.positions["query_name"] == 10).all()
    for prompt, tokens, target in zip(binding_prompts(), batch.tokens, batch.target):
        assert _piece(tokenizer, target) == " " + prompt.target
        assert _piece(tokenizer, tokens[10]) == " " + prompt.query_name
        assert _piece(tokenizer, tokens[3 if prompt.query_is_first else 8]) == " " + prompt.target
        assert _piece(tokenizer, tokens[12]) == " in"


def test_n_takes_the_first_prompts(tokenizer):
    for task in ("ioi", "greater_than", "binding"):
        full, first = build_task_batch(task, tokenizer), build_task_batch(task, tokenizer, n=9)
        assert first.tokens.equal(full.tokens[:9]) and first.target.equal(full.target[:9])
        assert {name: p[:9].tolist() for name, p in full.positions.items()} == {
            name: p.tolist() for name, p in first.positions.items()}


def test_jsonl_rows_and_fingerprint(tokenizer):
    batch = build_task_batch("binding", tokenizer, n=20)
    lines = batch.jsonl().splitlines()
    assert len(lines) == 20 and batch.jsonl().endswith("\n")
    rows = [TaskPrompt.from_json(json.loads(line)) for line in lines]
    assert rows == list(batch.prompts)
    assert rows[0].positions == {"binding": 3, "distractor": 8, "query_name": 10, "end": 12}
    assert rows[0].token_ids == batch.tokens[0].tolist() and rows[0].target == int(batch.target[0])
    assert build_task_batch("binding", tokenizer, n=20).fingerprint() == batch.fingerprint()  # stable
    assert build_task_batch("binding", tokenizer, n=20, seed=0).fingerprint() != batch.fingerprint()
    assert len(batch.fingerprint()) == 64
    assert batch.prompts_sha1() == _sha1(p.text for p in binding_prompts(n=20))


def _one_line_error(task, tokenizer, **kwargs) -> str:
    with pytest.raises(UsageError) as refused:
        build_task_batch(task, tokenizer, **kwargs)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(task)
    return message


def test_a_name_outside_the_vocabulary_is_refused():
    message = _one_line_error("ioi", word_level_tokenizer(missing=(" Sandra",)))
    assert "' Sandra'" in message and TOKENIZER_NAME in message and "not one token" in message


def test_a_city_outside_the_vocabulary_is_refused():
    message = _one_line_error("binding", word_level_tokenizer(missing=(" Denver",)))
    assert "' Denver'" in message and TOKENIZER_NAME in message


def test_a_prompt_of_the_wrong_length_is_refused():
    message = _one_line_error("successor", word_level_tokenizer(digits="single"))  # " 33" -> " 3", "3"
    assert "' 33 34 35 36 37' is 10 tokens" in message and "not 5" in message and TOKENIZER_NAME in message


def test_a_two_digit_answer_that_is_not_one_token_is_refused():
    message = _one_line_error("greater_than", word_level_tokenizer(digits="single"))
    assert "'00'" in message and TOKENIZER_NAME in message


def test_greater_than_without_a_valid_year_is_refused():
    tokenizer = word_level_tokenizer(digits="whole")  # " 1450" is one (unknown) piece: every year merges
    assert greater_than_pairs(tokenizer) == []
    message = _one_line_error("greater_than", tokenizer)
    assert "no year" in message and TOKENIZER_NAME in message


def test_bad_n_and_task_are_refused(tokenizer):
    assert "1 to 118" in _one_line_error("successor", tokenizer, n=119)
    assert "n = 0" in _one_line_error("ioi", tokenizer, n=0)
    with pytest.raises(UsageError, match="unknown task 'gt'"):
        build_task_batch("gt", tokenizer)
