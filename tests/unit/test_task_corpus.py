"""The task toy's corpus: a pure function of (seed, step), well-formed task sentences (parsed here
with patterns of their own, not the corpus's templates), runs from position 0, the synthetic rows
on the filler tokens; and the recipe fields that leave every other toy's weights recipe as it was."""

import json
import re
from collections import Counter
from dataclasses import asdict

import numpy as np
import pytest
import torch

from emergence.core.config import compose_config
from emergence.core.errors import UsageError
from emergence.recipe.tasks.batches import binding_prompts
from emergence.toy.corpus import ToyCorpus
from emergence.toy.repro import documented_panels
from emergence.toy.task_corpus import (
    HOME_CITIES,
    TaskMixCorpus,
    binding_sentence,
    greater_than_sentence,
    ioi_sentence,
    successor_sentence,
    task_run,
)
from emergence.toy.train import build_corpus, weights_recipe
from emergence.toy.validation import validate_recipe
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
    word_tokenizer,
)

SEQ_LEN = 64
SYNTHETIC = dict(repeat_fraction=0.5, skip_offsets=(2, 3, 4), skip_prob=0.25)
WORD = r"[A-Za-z]+"
IOI = re.compile(rf"When ({WORD}) and ({WORD}) went to the ({WORD}), ({WORD}) gave a ({WORD}) to ({WORD})\.")
GREATER_THAN = re.compile(rf"The ({WORD}) lasted from the year (\d\d)(\d\d) to the year (\d\d)(\d\d)\.")
STATEMENT = re.compile(rf" ({WORD}) lives in ({WORD})\.")
BINDING = re.compile(rf"(?:{STATEMENT.pattern})+")  # one binding story or more, one after another
SUCCESSOR = re.compile(r"((?: (?:" + "|".join((*DAYS, *MONTHS, *ORDINALS, *NUMBERS)) + r"))+)\.")
SUCCESSOR_LISTS = {
    "days": (DAYS, True),
    "months": (MONTHS, True),
    "ordinals": (ORDINALS, False),
    "numbers": (NUMBERS, False),
}


@pytest.fixture(scope="module")
def tokenizer():
    return word_tokenizer(512)


def sentences(draw, n=400, seed=0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [draw(rng) for _ in range(n)]


def test_ioi_sentences_end_with_the_name_that_appears_once():
    orders = Counter()
    for text in sentences(ioi_sentence):
        first, second, place, subject, obj, answer = IOI.fullmatch(text).groups()
        names = Counter([first, second, subject])
        assert first != second and names[answer] == 1 and names[subject] == 2
        assert {first, second} <= set(NAMES) and place in PLACES and obj in OBJECTS
        orders["ABBA" if first == answer else "BABA"] += 1
    assert 150 < orders["ABBA"] < 250 and orders["ABBA"] + orders["BABA"] == 400  # both orders, about half each


def test_greater_than_years_increase_within_a_century():
    starts, ends = [], []
    for text in sentences(greater_than_sentence):
        noun, century, start, end_century, end = GREATER_THAN.fullmatch(text).groups()
        assert noun in NOUNS and century == end_century and 14 <= int(century) <= 19
        assert 2 <= int(start) <= 88 and int(start) < int(end) <= 99
        starts.append(int(start))
        ends.append(int(end))
    assert min(starts) < 10 and max(starts) > 80 and max(ends) == 99  # the whole range is drawn


def test_successor_runs_follow_their_list():
    kinds = Counter()
    for text in sentences(successor_sentence):
        items = SUCCESSOR.fullmatch(text).group(1).split()
        assert 6 <= len(items) <= 10
        name, (words, wraps) = next((k, v) for k, v in SUCCESSOR_LISTS.items() if items[0] in v[0])
        first = words.index(items[0])
        positions = [first + k for k in range(len(items))]
        assert wraps or positions[-1] < len(words)  # ordinals and numbers do not wrap
        assert items == [words[p % len(words)] for p in positions]
        kinds[name] += 1
    assert set(kinds) == set(SUCCESSOR_LISTS)
    # The wrap itself is drawn: a days or months run that passes the end of its list.
    runs = [SUCCESSOR.fullmatch(t).group(1).split() for t in sentences(successor_sentence)]
    assert any(r[0] in DAYS and DAYS.index(r[-1]) < DAYS.index(r[0]) for r in runs)


def split_stories(text: str) -> list[list[tuple[str, str]]]:
    """Binding statements, one story or more one after another, as stories of (name, city): each the
    fewest statements whose first half binds distinct names and whose second half asks each of them
    once (a shorter split would ask a name its first half has not bound, so the fewest is the story).
    Statements that complete no story (a run's cut end) are left out."""
    statements = [m.groups() for m in STATEMENT.finditer(text)]
    assert "".join(f" {n} lives in {c}." for n, c in statements) == text
    stories = []
    while k := next(
        (
            k
            for k in range(2, len(statements) // 2 + 1)
            if len({n for n, _ in statements[:k]}) == k
            and sorted(n for n, _ in statements[k : 2 * k]) == sorted(n for n, _ in statements[:k])
        ),
        None,
    ):
        stories.append(statements[: 2 * k])
        statements = statements[2 * k :]
    return stories


def story_text(story: list[tuple[str, str]]) -> str:
    return "".join(f" {n} lives in {c}." for n, c in story)


def test_binding_stories_bind_names_then_ask_each_once():
    sizes, asked_in_order, homes, bindings = Counter(), 0, 0, 0
    for text in sentences(lambda rng: binding_sentence(rng, home_city_share=0.5), n=1000):
        (story,) = split_stories(text)
        k = len(story) // 2
        bound, asked = dict(story[:k]), story[k:]
        assert set(bound) <= set(NAMES) and set(bound.values()) <= set(CITIES)
        assert len(set(bound.values())) == k  # distinct cities
        assert all(bound[name] == city for name, city in asked)  # each asked name with its city
        sizes[k] += 1
        asked_in_order += [n for n, _ in asked] == [n for n, _ in story[:k]]
        homes += sum(HOME_CITIES[NAMES.index(n)] == c for n, c in bound.items())
        bindings += k
    assert set(sizes) == {2, 3, 4, 5, 6} and all(150 < sizes[k] < 250 for k in sizes)  # 2..6 names, uniform
    assert asked_in_order < 400  # the questions come in a random order (2 names: in order half the time)
    # A name's home city: about half the bindings (fewer where two homes collide: then all random),
    # the rest by chance (1 in 30).
    assert 0.3 < homes / bindings < 0.55
    text = binding_sentence(np.random.default_rng(0))  # by default no home cities: only chance
    none = [binding_sentence(np.random.default_rng(s)) for s in range(300)]
    chance = [HOME_CITIES[NAMES.index(n)] == c for t in none for story in split_stories(t) for n, c in story]
    assert text == none[0] and sum(chance) / len(chance) < 0.08


def test_the_study_binding_prompt_starts_a_two_name_story():
    study = re.compile(rf" ({WORD}) lives in ({WORD})\. ({WORD}) lives in ({WORD})\. ({WORD}) lives in")
    assert all(study.fullmatch(p.text) for p in binding_prompts(n=50))  # the study's own prompts have this shape
    two_names = [t for t in sentences(binding_sentence, n=200) if len(split_stories(t)[0]) == 4]
    assert len(two_names) > 20
    for text in two_names:
        name_a, city_a, name_b, city_b, query = study.match(text).groups()
        assert query in (name_a, name_b)
        assert text[study.match(text).end() :].startswith(f" {city_a if query == name_a else city_b}.")


def parse_run(text: str) -> list[str]:
    """The complete sentences of a run, in order (each after the first starts with a space), and checks that
    only the last, cut one is left over."""
    patterns = [re.compile(" ?" + IOI.pattern), re.compile(" ?" + GREATER_THAN.pattern), BINDING, SUCCESSOR]
    found, pos = [], 0
    while True:
        match = next((m for p in patterns if (m := p.match(text, pos))), None)
        if match is None:
            break
        if match.re is BINDING:  # stories one after another: one sentence each; statements after them are cut
            stories = [story_text(story) for story in split_stories(match.group(0))]
            found += stories
            pos += len("".join(stories))
            if pos < match.end():
                break
        else:
            found.append(match.group(0))
            pos = match.end()
    assert "." not in text[pos:] or text[pos:].startswith(" ")  # the cut sentence: no complete sentence missed
    if pos < len(text) and STATEMENT.match(text, pos):  # a cut story: the statements it has, then a cut one
        assert not split_stories(text[pos : pos + len("".join(m.group(0) for m in STATEMENT.finditer(text, pos)))])
    return found


def test_a_run_is_whole_sentences_from_position_0(tokenizer):
    run = task_run(np.random.default_rng(1), 12)
    parsed = parse_run(run)
    assert len(parsed) == 12 and "".join(parsed) == run
    assert not run.startswith(" When") and not run.startswith(" The")  # the first as its template starts
    corpus = TaskMixCorpus(tokenizer, SEQ_LEN, seed=0, task_fraction=0.5, synthetic_options=SYNTHETIC)
    rows = corpus.task_runs(step=3, n=64)  # [64, SEQ_LEN]
    assert rows.shape == (64, SEQ_LEN) and int(rows.max()) < FIRST_FILLER_ID and int(rows.min()) > 0  # no <unk>
    starts = Counter()
    for row in rows:
        text = tokenizer.decode(row)
        assert len(parse_run(text)) >= 1  # the longest sentence (a 6-name story) is 60 tokens
        starts[
            next(
                k
                for k, p in (("ioi", "When"), ("greater_than", "The"), ("binding", r" \w+ lives"), ("successor", " "))
                if re.match(p, text)
            )
        ] += 1
    assert set(starts) == {"ioi", "greater_than", "binding", "successor"}  # every task starts runs at position 0


def test_binding_is_half_the_sentences_and_the_other_tasks_a_sixth_each():
    tasks = Counter()
    for seed in range(200):
        for sentence in parse_run(task_run(np.random.default_rng(seed), 10)):
            tasks[
                next(
                    name
                    for name, p in (
                        ("ioi", IOI),
                        ("greater_than", GREATER_THAN),
                        ("binding", BINDING),
                        ("successor", SUCCESSOR),
                    )
                    if p.search(sentence)
                )
            ] += 1
    assert sum(tasks.values()) == 2000
    assert all(270 < tasks[name] < 400 for name in ("ioi", "greater_than", "successor"))  # 333 expected; sd 17
    assert 900 < tasks["binding"] < 1100  # 1000 expected; sd about 22


def test_batch_is_a_pure_function_of_seed_and_step_with_synthetic_rows_on_the_fillers(tokenizer):
    corpus = TaskMixCorpus(tokenizer, SEQ_LEN, seed=0, task_fraction=0.25, synthetic_options=SYNTHETIC)
    batch = corpus.batch(5, 32)  # [32, SEQ_LEN]
    assert torch.equal(batch, TaskMixCorpus(tokenizer, SEQ_LEN, 0, 0.25, SYNTHETIC).batch(5, 32))
    assert not torch.equal(batch, corpus.batch(6, 32))
    assert not torch.equal(batch, TaskMixCorpus(tokenizer, SEQ_LEN, 1, 0.25, SYNTHETIC).batch(5, 32))
    # 24 synthetic rows: ToyCorpus over the 159 fillers, shifted to their ids; then 8 task runs.
    filler = ToyCorpus(512 - FIRST_FILLER_ID, SEQ_LEN, 0, **SYNTHETIC).batch(5, 24)
    assert FIRST_FILLER_ID == 353 and torch.equal(batch[:24], filler + 353)
    assert torch.equal(batch[24:], corpus.task_runs(5, 8))
    assert int(batch[24:].max()) < 353 <= int(batch[:24].min())


@pytest.mark.parametrize(
    "overrides",
    [
        ["model=toy_olmo", "model.toy.task_fraction=0.5"],
        ["model=toy_olmo", "model.toy.tokenizer=words"],
        ["model=toy_tasks", "model.toy.task_fraction=0"],
        ["model=toy_tasks", "model.toy.tokenizer=null"],
    ],
)
def test_task_sentences_and_the_word_tokenizer_come_together(overrides):
    refused = r"^model\.toy\.task_fraction=.* set both \(task_fraction > 0, tokenizer=words\)"
    with pytest.raises(UsageError, match=refused):
        validate_recipe(compose_config(overrides).model.toy)


def test_the_task_toy_composes_its_corpus_and_probe(tokenizer):
    model = compose_config(["model=toy_tasks"]).model
    assert isinstance(build_corpus(model.toy, tokenizer), TaskMixCorpus)
    # The induction probe draws the fillers: the ids the synthetic half is written in.
    assert (model.probe_fit.vocab_low, model.probe_fit.vocab_high) == (FIRST_FILLER_ID, model.toy.vocab_size)
    # The toy screens its top 3 of 16 heads (the study's 5 elsewhere); the command line still wins.
    assert compose_config(["model=toy_tasks", "probe=ioi"]).probe.task_top_k == 3
    assert compose_config(["model=toy_tasks", "probe=ioi", "probe.task_top_k=5"]).probe.task_top_k == 5
    assert compose_config(["model=toy_neox", "probe=ioi"]).probe.task_top_k == 5
    assert compose_config(["model=toy_tasks"]).threshold.prev_token_circuit == 25.0  # threshold=toy_t64


@pytest.mark.parametrize("key", ["toy_neox", "toy_olmo", "toy_olmoe", "toy_olmo_sinks"])
def test_the_other_toys_weights_recipes_are_unchanged(key):
    recipe = asdict(compose_config([f"model={key}"]).model.toy)
    later = ("task_fraction", "tokenizer", "home_city_share")
    assert recipe["task_fraction"] == 0.0 and recipe["tokenizer"] is None and recipe["home_city_share"] == 0.0
    before = {k: v for k, v in recipe.items() if k not in later}  # a manifest from before
    assert weights_recipe(recipe) == weights_recipe(before)
    assert not set(later) & set(weights_recipe(recipe))
    for panel in documented_panels():  # the documented panels still match their recipe
        if panel["model"] == key:
            seed = panel["recipe"]["seed"]
            documented = asdict(compose_config([f"model={key}", f"model.toy.seed={seed}"]).model.toy)
            assert weights_recipe(documented) == panel["recipe"]
    tasks = weights_recipe(asdict(compose_config(["model=toy_tasks"]).model.toy))
    assert tasks["task_fraction"] > 0 and tasks["tokenizer"] == "words" and tasks["home_city_share"] > 0
    assert json.loads(json.dumps(tasks)) == tasks  # what the manifest stores reads back the same


@pytest.mark.slow
def test_training_saves_the_tokenizer_with_every_checkpoint(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from emergence.core.config import PanelEntry
    from emergence.toy.train import is_complete, train

    cfg = compose_config(["model=toy_tasks", f"cache_dir={tmp_path}", "model.toy.numerics=native"])
    cfg.model.panel = [PanelEntry(f"step{s}", s, s * 2048) for s in (0, 2)]
    manifest = train(cfg.model)
    root = tmp_path / "toy" / "toy_tasks" / "seed0"
    assert is_complete(root, cfg.model) and manifest["recipe"]["tokenizer"] == "words"
    for revision in ("step0", "step2"):
        loaded = AutoTokenizer.from_pretrained(root / revision, local_files_only=True)
        assert loaded.encode(" 1450", add_special_tokens=False) == [
            word_tokenizer(512).convert_tokens_to_ids(t) for t in (" 14", "50")
        ]
        model = AutoModelForCausalLM.from_pretrained(root / revision)
        assert model.config.vocab_size == len(loaded) == 512
