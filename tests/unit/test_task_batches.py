"""The four task batches: the study's prompts (docs/tasks.md, The batches: check values) and their
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

from emergence.core.config import compose_config
from emergence.core.errors import UsageError
from emergence.hub import checkpoints
from emergence.hub.checkpoints import Source, TokenizerLookup, tokenizer_source
from emergence.recipe.probe import RANDOM_FIRST, FirstToken
from emergence.recipe.tasks.batches import (
    CITIES,
    NAMES,
    NOUNS,
    OBJECTS,
    PLACES,
    SEQUENCES,
    TaskPrompt,
    TaskWords,
    binding_prompts,
    build_task_batch,
    greater_than_pairs,
    greater_than_prompts,
    ioi_prompts,
    successor_items,
)
from emergence.run.batches import first_token, task_batch
from emergence.run.validation import validate

IOI_SHA1 = "8994feb7c551154c154bbe581e893f7e791ea51b"
BINDING_SHA1 = "e1b1646341f9ff0b50a2467ec8695552e512e43e"
TOKENIZER_NAME = "word-level-test"
DIGIT_PIECES = {"pairs": r" ?\d{1,2}", "single": r" ?\d", "whole": r" ?\d+"}
MERGED_YEAR = 1912  # one year the test vocabulary has as a single token


def _pattern(digits: str, merged: tuple[str, ...] = ()) -> str:
    """The pre-tokenizer's pieces: the ``merged`` pieces and the merged year, words and digit runs with
    their leading space, punctuation."""
    return "".join(re.escape(piece) + "|" for piece in merged) + (
        rf" {MERGED_YEAR}(?!\d)| ?[A-Za-z]+|{DIGIT_PIECES[digits]}| ?[^\sA-Za-z\d]+"
    )


def _corpus() -> list[str]:
    """Every text the four batches can hold, and their answer words."""
    texts = [p.text for p in ioi_prompts()] + [p.text for p in binding_prompts()]
    texts += [p.text + " " + p.target for p in successor_items()]
    texts += [f"The {noun} lasted from the year 14 to the year" for noun in NOUNS]
    texts += [f" {century}" for century in range(14, 20)] + [f"{d:02d}" for d in range(100)]
    texts += [" " + word for word in NAMES + CITIES + PLACES + OBJECTS] + [f" {MERGED_YEAR}"]
    return texts


def word_level_tokenizer(
    digits: str = "pairs", missing: tuple[str, ...] = (), merged: tuple[str, ...] = ()
) -> PreTrainedTokenizerFast:
    """A WordLevel tokenizer over the batches' pieces, less the pieces ``missing``; each piece of
    ``merged`` (a word and the punctuation after it, say) is one token where a prompt holds it."""
    pattern = _pattern(digits, merged)
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
        ("Denver", "Beijing", "Sandra"),
        ("London", "Atlanta", "Mary"),
        ("Bangkok", "Beijing", "Karen"),
    ]
    assert binding_prompts(n=3) == prompts[:3]


def test_successor_items_are_the_study_windows():
    windows = successor_items()
    assert len(windows) == 118
    assert [(w.text, w.target) for w in windows[:5]] == [
        (" 33 34 35 36 37", "38"),
        (" 66 67 68 69 70", "71"),
        (" Friday Saturday Sunday Monday Tuesday", "Wednesday"),
        (" 22 23 24 25 26", "27"),
        (" 3 4 5 6 7", "8"),
    ]
    counts = {s: sum(w.sequence == s for w in windows) for s in ("days", "months", "ordinals", "numbers")}
    assert counts == {"days": 7, "months": 12, "ordinals": 5, "numbers": 94}
    # the windows that wrap or end their list
    texts = {w.text: w.target for w in windows}
    assert texts[" December January February March April"] == "May"
    assert texts[" fifth sixth seventh eighth ninth"] == "tenth" and texts[" 94 95 96 97 98"] == "99"


def test_greater_than_prompts_draw_a_noun_then_a_pair():
    pairs = [(14, 2), (15, 33), (19, 88)]
    rng = np.random.RandomState(42)  # docs/tasks.md: per example a noun, then a pair
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
            name: p.tolist() for name, p in first.positions.items()
        }


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


# --- probe.task_words: the study's words, or those the tokenizer keeps as one token ----------------------------------

TASK_NAMES = ("ioi", "greater_than", "successor", "binding")
LENGTHS = {"ioi": 14, "greater_than": 12, "successor": 5, "binding": 13}  # docs/tasks.md: each task's T, no BOS
# the study's years, less 1912 (one token in the test vocabulary)
PAIRS = [(c, d) for c in range(14, 20) for d in range(2, 89) if (c, d) != (19, 12)]


def _texts(batch) -> list[str]:
    return [p.text for p in batch.prompts]


@pytest.mark.parametrize("task", TASK_NAMES)
def test_auto_is_the_study_batch_where_every_word_is_one_token(tokenizer, task):
    auto, study = build_task_batch(task, tokenizer, words="auto"), build_task_batch(task, tokenizer)
    assert auto.words.mode == "study" and auto.words == study.words
    assert not any(auto.words.dropped.values())
    assert auto.tokens.equal(study.tokens) and auto.fingerprint() == study.fingerprint()
    if task in ("ioi", "binding"):
        assert auto.prompts_sha1() == {"ioi": IOI_SHA1, "binding": BINDING_SHA1}[task]
    # filtered, with nothing to filter, draws the same prompts; only its record says filtered
    filtered = build_task_batch(task, tokenizer, words="filtered")
    assert filtered.words.mode == "filtered" and filtered.words.kept == auto.words.kept
    assert filtered.fingerprint() == auto.fingerprint()


def test_the_study_words_are_recorded_whole():
    words = build_task_batch("ioi", word_level_tokenizer(), n=3, words="study").words
    assert words == TaskWords(
        "study",
        kept={"names": list(NAMES), "places": list(PLACES), "objects": list(OBJECTS)},
        dropped={"names": [], "places": [], "objects": []},
    )


def test_filtered_ioi_draws_the_studys_order_over_the_kept_words():
    tokenizer = word_level_tokenizer(missing=(" Sandra", " Eve", " park"))
    batch = build_task_batch("ioi", tokenizer, n=60, words="auto")
    names = [name for name in NAMES if name not in ("Sandra", "Eve")]
    places = [place for place in PLACES if place != "park"]
    assert batch.words == TaskWords(
        "filtered",
        kept={"names": names, "places": places, "objects": list(OBJECTS)},
        dropped={"names": ["Sandra", "Eve"], "places": ["park"], "objects": []},
    )
    rng = np.random.RandomState(42)  # docs/tasks.md: per example two names at once, a place, an object
    expected = []
    for i in range(60):
        a, b = rng.choice(len(names), 2, replace=False)
        place, obj = places[rng.randint(len(places))], OBJECTS[rng.randint(len(OBJECTS))]
        first, second = (names[a], names[b]) if i % 2 == 0 else (names[b], names[a])
        expected.append(f"When {first} and {second} went to the {place}, {names[b]} gave a {obj} to")
    assert _texts(batch) == expected and expected != [p.text for p in ioi_prompts(60)]
    rows = np.arange(60)
    assert batch.tokens.shape == (60, 14) and (batch.tokens != tokenizer.unk_token_id).all()
    assert (batch.tokens[rows, batch.positions["io"]] == batch.target).all()
    assert (batch.tokens[rows, batch.positions["s2"]] == batch.distractor).all()
    assert build_task_batch("ioi", tokenizer, n=9, words="filtered").tokens.equal(batch.tokens[:9])


def test_filtered_greater_than_draws_over_the_kept_nouns():
    tokenizer = word_level_tokenizer(missing=(" war", " famine"))
    batch = build_task_batch("greater_than", tokenizer, n=40, words="auto")
    nouns = [noun for noun in NOUNS if noun not in ("war", "famine")]
    assert batch.words == TaskWords("filtered", {"nouns": nouns}, {"nouns": ["war", "famine"]})
    rng = np.random.RandomState(42)  # docs/tasks.md: a noun, then a pair
    expected = []
    for _ in range(40):
        noun = nouns[rng.randint(len(nouns))]
        century, decade = PAIRS[rng.randint(len(PAIRS))]
        expected.append(f"The {noun} lasted from the year {century}{decade:02d} to the year {century}")
    assert _texts(batch) == expected
    assert (batch.tokens[np.arange(40), batch.positions["decade"]] == batch.target).all()


def test_filtered_binding_draws_again_a_prompt_of_another_length():
    """ " Denver" is one token, and so is " Denver." where a prompt holds it: such a prompt is 12 tokens.
    The study's words refuse it; filtered draws that example again from the same generator."""
    tokenizer = word_level_tokenizer(merged=(" Denver.",))
    message = _one_line_error("binding", tokenizer, words="auto")  # every word is one token: the study's batch
    assert "' Sandra lives in Denver. Daniel lives in Beijing. Sandra lives in' is 12 tokens" in message
    batch = build_task_batch("binding", tokenizer, n=100, words="filtered")
    assert batch.words.mode == "filtered" and not any(batch.words.dropped.values())
    rng, expected, redrawn = np.random.RandomState(42), [], 0
    while len(expected) < 100:  # docs/tasks.md: two names, then two cities
        a, b = rng.choice(len(NAMES), 2, replace=False)
        city_a, city_b = (CITIES[c] for c in rng.choice(len(CITIES), 2, replace=False))
        if "Denver" in (city_a, city_b):
            redrawn += 1
            continue
        query = NAMES[a] if len(expected) % 2 == 0 else NAMES[b]
        expected.append(f" {NAMES[a]} lives in {city_a}. {NAMES[b]} lives in {city_b}. {query} lives in")
    assert redrawn > 0 and _texts(batch) == expected
    assert batch.tokens.shape == (100, 13)
    rows = np.arange(100)
    assert (batch.tokens[rows, batch.positions["binding"]] == batch.target).all()


def test_filtered_successor_keeps_the_windows_whose_items_are_one_token():
    tokenizer = word_level_tokenizer(digits="single")  # " 33" -> " 3", "3": the numbers 10..99 are two tokens
    batch = build_task_batch("successor", tokenizer, words="auto")
    assert batch.words.mode == "filtered"
    assert batch.words.dropped == {
        "days": [],
        "months": [],
        "ordinals": [],
        "numbers": [str(k) for k in range(10, 100)],
    }
    windows = []  # docs/tasks.md's windows, those of six items below 10, shuffled once
    for words, wraps in SEQUENCES.values():
        for start in range(len(words) if wraps else len(words) - 5):
            window = [words[(start + k) % len(words)] for k in range(6)]
            if not any(item.isdigit() and int(item) >= 10 for item in window):
                windows.append(window)
    np.random.RandomState(42).shuffle(windows)
    assert len(windows) == 7 + 12 + 5 + 4  # the numbers' windows 1-6, 2-7, 3-8, 4-9
    assert [(p.text, _piece(tokenizer, p.target)) for p in batch.prompts] == [
        (" " + " ".join(w[:5]), " " + w[5]) for w in windows
    ]
    assert "1 to 28" in _one_line_error("successor", tokenizer, words="filtered", n=29)


def test_greater_than_cannot_be_posed_without_two_digit_tokens():
    for words in ("auto", "filtered", "study"):
        message = _one_line_error("greater_than", word_level_tokenizer(digits="single"), words=words)
        assert message == (
            f"greater_than cannot be posed on the tokenizer '{TOKENIZER_NAME}': its two-digit numbers "
            "are not one token each ('00' is 2 tokens), and the answers '00'..'99' must be; run "
            "greater_than with another model, or leave it out"
        )


@pytest.mark.parametrize("task, listed, kept", [("ioi", "names", "John"), ("binding", "cities", "Paris")])
def test_a_list_left_with_one_word_cannot_pose_the_task(task, listed, kept):
    words = {"names": NAMES, "cities": CITIES}[listed]
    tokenizer = word_level_tokenizer(missing=tuple(" " + w for w in words if w != kept))
    message = _one_line_error(task, tokenizer, words="auto")
    assert message == (
        f"{task} cannot be posed on the tokenizer '{TOKENIZER_NAME}': 1 of the study's {len(words)} "
        f"{listed} is one token there ('{kept}') and a prompt draws 2; run {task} with another model, "
        "or leave it out"
    )


def test_filtered_gives_up_where_no_draw_has_the_tasks_length():
    tokenizer = word_level_tokenizer(merged=tuple(f" {place}," for place in PLACES))  # every IOI prompt: 13 tokens
    assert _one_line_error("ioi", tokenizer, words="filtered", n=3).startswith(
        "ioi: 1000 draws in a row were refused, the last 'When "
    )


def test_task_words_is_validated():
    assert compose_config(["model=toy_tasks", "probe=ioi"]).probe.task_words == "auto"
    with pytest.raises(UsageError, match=r"probe.task_words=.*study, filtered"):
        validate(compose_config(["model=toy_tasks", "probe=ioi", "probe.task_words=words"]))


def test_the_run_builds_its_batch_from_probe_task_words_and_the_bos(tmp_path):
    word_level_tokenizer(missing=(" Sandra",)).save_pretrained(tmp_path)
    overrides = ["model=local", f"model.name_or_path={tmp_path}", "probe=ioi", "probe.task_prompts=8"]
    source = Source(str(tmp_path), None, True, True)
    cfg = compose_config(overrides)
    batch, name = task_batch(cfg, FirstToken("bos_token", 3, "given"), TokenizerLookup(cfg.model, source))
    assert name == f"{tmp_path}@main" and batch.words.dropped["names"] == ["Sandra"]
    assert (batch.tokens[:, 0] == 3).all() and batch.tokens.shape == (8, 15)
    study = compose_config([*overrides, "probe.task_words=study"])
    with pytest.raises(UsageError, match="' Sandra' is the unknown token"):
        task_batch(study, RANDOM_FIRST, TokenizerLookup(study.model, source))


def test_the_tokenizer_is_located_once_for_the_first_token_and_the_task(tmp_path, monkeypatch):
    """On the Hub each ``tokenizer_source`` lists the revision's files: a run's first token, text probe and
    task share one lookup, which locates the tokenizer once, and raises a missing one to each asker."""
    word_level_tokenizer().save_pretrained(tmp_path)
    cfg = compose_config(["model=local", f"model.name_or_path={tmp_path}", "probe=ioi", "probe.task_prompts=8"])
    located = []

    def counted(*args):
        located.append(args)
        return tokenizer_source(*args)

    monkeypatch.setattr(checkpoints, "tokenizer_source", counted)
    tokenizers = TokenizerLookup(cfg.model, Source(str(tmp_path), None, True, True))
    first = first_token(cfg, tokenizers)
    task_batch(cfg, first, tokenizers)
    assert len(located) == 1 and tokenizers.source().directory == str(tmp_path)

    def none_here(*args):
        located.append(args)
        raise UsageError("no tokenizer here")

    monkeypatch.setattr(checkpoints, "tokenizer_source", none_here)
    missing = TokenizerLookup(cfg.model, Source(str(tmp_path), None, True, True))
    for _ in range(2):
        with pytest.raises(UsageError, match="no tokenizer here"):
            missing.source()
    assert len(located) == 2


# --- a BOS before every prompt -------------------------------------------------------------------------------------

BOS_ID = 1  # any id: the batch puts it first, whatever it encodes


@pytest.mark.parametrize("task", TASK_NAMES)
def test_a_bos_shifts_every_position_by_one(tokenizer, task):
    plain, behind = build_task_batch(task, tokenizer, n=12), build_task_batch(task, tokenizer, n=12, bos=BOS_ID)
    assert behind.tokens.shape == (12, LENGTHS[task] + 1)
    assert (behind.tokens[:, 0] == BOS_ID).all() and behind.tokens[:, 1:].equal(plain.tokens)
    assert {name: p.tolist() for name, p in behind.positions.items()} == {
        name: (p + 1).tolist() for name, p in plain.positions.items()
    }
    assert (behind.positions["end"] == LENGTHS[task]).all()  # still the last position
    assert behind.target.equal(plain.target) and behind.prompts_sha1() == plain.prompts_sha1()
    if behind.distractor is not None:
        assert behind.distractor.equal(plain.distractor)
    rows = np.arange(12)
    for name, answer in {
        "io": behind.target,
        "s1": behind.distractor,
        "decade": behind.target,
        "binding": behind.target,
        "distractor": behind.distractor,
    }.items():
        if name in behind.positions:  # each named position still holds its word
            assert (behind.tokens[rows, behind.positions[name]] == answer).all()
    row = json.loads(behind.jsonl().splitlines()[0])
    assert row["token_ids"][0] == BOS_ID and row["positions"]["end"] == LENGTHS[task]
    assert behind.fingerprint() != plain.fingerprint()


def test_the_checks_read_the_prompt_without_its_bos():
    message = _one_line_error("successor", word_level_tokenizer(digits="single"), bos=BOS_ID)
    assert "' 33 34 35 36 37' is 10 tokens" in message and "not 5" in message
    tokenizer = word_level_tokenizer(merged=(" Denver.",))
    filtered = build_task_batch("binding", tokenizer, n=30, words="filtered")
    behind = build_task_batch("binding", tokenizer, n=30, words="filtered", bos=BOS_ID)
    assert _texts(behind) == _texts(filtered) and behind.tokens[:, 1:].equal(filtered.tokens)
