"""The task toy's word-level tokenizer: every task word one token, 2-digit pieces, a stable vocabulary,
and a save/load round trip through transformers' AutoTokenizer."""

import pytest
from transformers import AutoTokenizer

from emergence.core.errors import UsageError
from emergence.toy.task_corpus import GREATER_THAN_PROMPT, IOI_PROMPTS
from emergence.toy.words import (
    CITIES,
    DAYS,
    FIRST_FILLER_ID,
    MONTHS,
    NAMES,
    NOUNS,
    NUMBERS,
    OBJECTS,
    ORDINALS,
    PLACES,
    UNK,
    vocabulary,
    word_tokenizer,
)

VOCAB_SIZE = 512


@pytest.fixture(scope="module")
def tokenizer():
    return word_tokenizer(VOCAB_SIZE)


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_every_task_word_is_one_token_in_its_space_prefixed_form(tokenizer):
    words = [*NAMES, *PLACES, *OBJECTS, *NOUNS, *CITIES, *DAYS, *MONTHS, *ORDINALS, *NUMBERS]
    ids = [encode(tokenizer, " " + word) for word in words]
    assert all(len(i) == 1 for i in ids)
    assert UNK not in tokenizer.convert_ids_to_tokens([i[0] for i in ids])
    # Distinct words, distinct tokens (no two lists share a word).
    assert len({i[0] for i in ids}) == len(words) == 42 + 6 + 6 + 23 + 30 + 7 + 12 + 10 + 99


def test_two_digit_tokens_and_centuries(tokenizer):
    two_digits = [encode(tokenizer, f"{d:02d}") for d in range(100)]
    assert all(len(i) == 1 for i in two_digits) and len({i[0] for i in two_digits}) == 100
    assert all(len(encode(tokenizer, f" {century}")) == 1 for century in range(14, 20))
    # A year is a century and a decade, so the study's greater-than filter keeps every pair it tries.
    for century in range(14, 20):
        for decade in range(2, 89):
            assert encode(tokenizer, f" {century}{decade:02d}") == encode(tokenizer, f" {century}") + encode(
                tokenizer, f"{decade:02d}"
            )
    assert tokenizer.convert_ids_to_tokens(encode(tokenizer, " 1450")) == [" 14", "50"]
    assert tokenizer.convert_ids_to_tokens(encode(tokenizer, " 7")) == [" 7"]
    assert tokenizer.convert_ids_to_tokens(encode(tokenizer, " 1405")) == [" 14", "05"]


def test_the_study_prompts_have_its_token_counts_and_no_unknown_token(tokenizer):
    ioi = IOI_PROMPTS["ABBA"].format(io="Sandra", s="Daniel", place="store", obj="book")
    assert ioi == "When Sandra and Daniel went to the store, Daniel gave a book to"
    assert tokenizer.convert_ids_to_tokens(encode(tokenizer, ioi)) == [
        "When",
        " Sandra",
        " and",
        " Daniel",
        " went",
        " to",
        " the",
        " store",
        ",",
        " Daniel",
        " gave",
        " a",
        " book",
        " to",
    ]  # 14 tokens: the study's positions (IO at 1, subject at 3 and 9, query at 13)
    greater_than = GREATER_THAN_PROMPT.format(noun="war", century=14, start=5)
    assert tokenizer.convert_ids_to_tokens(encode(tokenizer, greater_than)) == [
        "The",
        " war",
        " lasted",
        " from",
        " the",
        " year",
        " 14",
        "05",
        " to",
        " the",
        " year",
        " 14",
    ]
    binding = " Sandra lives in Denver. Daniel lives in Beijing. Sandra lives in"
    assert len(encode(tokenizer, binding)) == 13
    assert len(encode(tokenizer, " 33 34 35 36 37")) == 5
    assert len(encode(tokenizer, " Friday Saturday Sunday Monday Tuesday")) == 5
    # Inside a run a sentence starts after a space: its first word exists in that form too.
    assert tokenizer.convert_ids_to_tokens(encode(tokenizer, " Mary. When 1483. The")) == [
        " Mary",
        ".",
        " When",
        " 14",
        "83",
        ".",
        " The",
    ]


def test_no_special_tokens_are_added_and_decoding_restores_the_text(tokenizer):
    text = "When Mary and John went to the store, John gave a book to Mary."
    ids = encode(tokenizer, text)
    assert tokenizer.encode(text) == ids  # add_special_tokens=True adds nothing either
    assert tokenizer.bos_token is None and tokenizer.eos_token is None and tokenizer.pad_token is None
    assert tokenizer.decode(ids) == text
    assert tokenizer.convert_ids_to_tokens(encode(tokenizer, "Mary")) == [UNK]  # not a template word's form


def test_vocabulary_order_is_stable(tokenizer):
    words = vocabulary(VOCAB_SIZE)
    assert len(tokenizer) == len(words) == VOCAB_SIZE
    assert tokenizer.convert_ids_to_tokens(list(range(VOCAB_SIZE))) == words
    assert words[:5] == [UNK, ".", ",", "When", "The"]
    # The documented order: template words, the lists, " 1".." 99", "00".."99", then the fillers.
    assert (
        words.index(" John")
        < words.index(" store")
        < words.index(" drink")
        < words.index(" war")
        < words.index(" Paris")
        < words.index(" Monday")
        < words.index(" January")
        < words.index(" first")
        < words.index(" 1")
        < words.index("00")
        < FIRST_FILLER_ID
    )
    assert words[FIRST_FILLER_ID - 100 : FIRST_FILLER_ID] == [f"{d:02d}" for d in range(100)]
    assert words[FIRST_FILLER_ID:] == [f"<f{i}>" for i in range(VOCAB_SIZE - FIRST_FILLER_ID)]
    assert vocabulary(FIRST_FILLER_ID + 1)[:FIRST_FILLER_ID] == words[:FIRST_FILLER_ID]  # fillers only at the end
    assert encode(tokenizer, "<f0><f7>") == [FIRST_FILLER_ID, FIRST_FILLER_ID + 7]
    with pytest.raises(UsageError, match="vocab_size"):
        vocabulary(FIRST_FILLER_ID)


def test_save_and_load_through_auto_tokenizer(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in tmp_path.iterdir()}
    loaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    assert loaded.convert_ids_to_tokens(list(range(VOCAB_SIZE))) == vocabulary(VOCAB_SIZE)
    text = "The war lasted from the year 1450 to the year 1483. Anna lives in Paris.<f3> 33 34"
    assert encode(loaded, text) == encode(tokenizer, text)
    assert UNK not in loaded.convert_ids_to_tokens(encode(loaded, text))
    assert loaded.decode(encode(loaded, text)) == text
