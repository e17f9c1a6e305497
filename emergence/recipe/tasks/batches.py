"""The reference study's four task batches, drawn exactly as its code draws them.

Two layers:

* Text, no tokenizer: ``ioi_prompts``, ``greater_than_prompts`` (given the year pairs a
  tokenizer allows), ``successor_items`` and ``binding_prompts`` give typed records (the text,
  the answer word, the distractor word where the task has one, ...). The word lists, templates,
  ``numpy.random.RandomState(seed)`` and the order of its draws are the study's (docs/tasks.md,
  "The batches"; its generators are ``cross_architecture/scripts/shared/{ioi,gt,succ,vb}_batch.py``
  in its repository, ``skydancerosel/spectral-probe-circuits``), so seed 42 gives its prompts:
  the IOI and binding texts hash to the SHA-1s its batches hash to. Each example's draws follow
  the previous example's, so the first n prompts are the same for any n. Each generator also
  takes restricted word lists (successor: a filter on its windows) and a predicate under which an
  example is drawn again from the same generator.
* Tokens: ``build_task_batch(task, tokenizer, words=..., bos=...)`` encodes every prompt with
  ``tokenizer.encode(text, add_special_tokens=False)``, checks that each prompt has its task's
  length and each answer word is one token, and gives a ``TaskBatch``: the tokens [n, T], answer
  and distractor ids [n], the named positions [n] the screens and metrics read, the words it was
  drawn from (``TaskWords``) and the rows of the run's ``prompts.jsonl``.

Words (``task_words``, ``probe.task_words``): ``study`` draws from the study's lists and refuses
a tokenizer that splits a word it draws or gives a prompt another length; ``filtered`` draws the
same way from each list restricted to the words the tokenizer keeps as one token after a space
(successor: the windows whose six items are), drawing an example again while its prompt has
another length (a word can merge with the punctuation after it), never padding; ``auto`` is
``study`` where every word of the task's lists is one token (then the batch is the study's, bit
for bit), else ``filtered``. Greater-than needs "00".."99" as single tokens under any words.

BOS: without one (the study's), position 0 is the prompt's first word. With ``bos`` (the token a
model was trained behind) every prompt's ids start with it, every named position below moves
one on and T is one more; the checks read the prompt without it.

The query is always the last position, ``end`` = T - 1. Per task (no BOS):

* ``ioi`` (T = 14): "When {A} and {B} went to the {place}, {B} gave a {object} to", A and B
  swapped in the first clause for odd i (ABBA for even i, BABA for odd). Target = " A" (the
  indirect object), distractor = " B" (the subject). Positions ``io`` (1 or 3), ``s1`` (3 or 1),
  ``s2`` (9), ``end`` (13). Stricter than the study: it took the first sub-token of a name and
  never checked the length; here every name must be one token and every prompt 14 tokens.
* ``greater_than`` (T = 12): "The {noun} lasted from the year {CC}{DD} to the year {CC}". The
  (century, decade) pairs are those whose year the tokenizer splits into " CC" + "DD"
  (``greater_than_pairs``). Target = the start decade's "DD" token; ``answer_tokens`` holds the
  ids of "00".."99", so the answers above the start decade are ``answer_tokens[DD+1:]`` and
  those below ``answer_tokens[:DD+1]``. Positions ``century`` (6), ``decade`` (7), ``end`` (11).
* ``successor`` (T = 5): five consecutive items of a cyclic week or year, the ordinals first to
  tenth or the numbers 1 to 99, each with a leading space; target = the sixth item. All 118
  windows, shuffled once; ``n`` takes the first n. Position ``end`` (4).
* ``binding`` (T = 13): " {A} lives in {city A}. {B} lives in {city B}. {Q} lives in", Q = A
  for even i and B for odd i. Target = Q's city, distractor = the other city. Positions
  ``binding`` (3 or 8), ``distractor`` (8 or 3), ``query_name`` (10), ``end`` (12).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

import numpy as np
import torch
from jaxtyping import Int

from emergence.core.config import TASK_WORDS
from emergence.core.errors import UsageError
from emergence.core.record import Record
from emergence.recipe.tasks import TASKS, Task

SEED = 42  # the study's seed for every task batch
N_PROMPTS = 500  # the study's n for IOI, greater-than and binding
PROMPT_LENGTH: dict[Task, int] = {"ioi": 14, "greater_than": 12, "successor": 5, "binding": 13}

NAMES = (
    "John",
    "Mary",
    "Alice",
    "Bob",
    "Anna",
    "Tom",
    "Lisa",
    "Sarah",
    "James",
    "David",
    "Michael",
    "Jessica",
    "Emily",
    "Daniel",
    "Laura",
    "Mark",
    "Susan",
    "Helen",
    "Paul",
    "Karen",
    "Steven",
    "Linda",
    "Kevin",
    "Donna",
    "Brian",
    "Sandra",
    "Ruth",
    "Frank",
    "George",
    "Henry",
    "Eric",
    "Carl",
    "Joe",
    "Jane",
    "Kate",
    "Beth",
    "Sam",
    "Max",
    "Ben",
    "Will",
    "Adam",
    "Eve",
)  # IOI and binding
PLACES = ("store", "park", "school", "office", "house", "bar")
OBJECTS = ("drink", "book", "ball", "ring", "phone", "gift")
NOUNS = (
    "war",
    "drought",
    "famine",
    "exile",
    "voyage",
    "feast",
    "trial",
    "siege",
    "rebellion",
    "tournament",
    "plague",
    "festival",
    "treaty",
    "blockade",
    "uprising",
    "summit",
    "purge",
    "revolt",
    "expedition",
    "campaign",
    "feud",
    "boycott",
    "rally",
)  # greater-than
CENTURIES = range(14, 20)  # greater-than: years 14DD to 19DD ...
DECADES = range(2, 89)  # ... with DD from 02 to 88
CITIES = (
    "Paris",
    "Rome",
    "Berlin",
    "London",
    "Madrid",
    "Vienna",
    "Boston",
    "Dublin",
    "Sydney",
    "Seoul",
    "Cairo",
    "Moscow",
    "Athens",
    "Tokyo",
    "Mumbai",
    "Beijing",
    "Delhi",
    "Manila",
    "Bangkok",
    "Toronto",
    "Chicago",
    "Miami",
    "Seattle",
    "Houston",
    "Detroit",
    "Denver",
    "Atlanta",
    "Portland",
    "Phoenix",
    "Dallas",
)  # binding
SuccessorSequence = Literal["days", "months", "ordinals", "numbers"]
# successor: each list, whether it wraps around, in the study's enumeration order
SEQUENCES: dict[SuccessorSequence, tuple[tuple[str, ...], bool]] = {
    "days": (("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"), True),
    "months": (
        (
            "January",
            "February",
            "March",
            "April",
            "May",
            "June",
            "July",
            "August",
            "September",
            "October",
            "November",
            "December",
        ),
        True,
    ),
    "ordinals": (
        ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth"),
        False,
    ),
    "numbers": (tuple(str(k) for k in range(1, 100)), False),
}
SUCCESSOR_SHOWN = 5  # items shown; the target is the next one
# The word lists each task draws from, by the names ``TaskWords`` gives them; a prompt holds each
# word after a space. Successor's lists are its sequences' items.
TASK_LISTS: dict[Task, dict[str, tuple[str, ...]]] = {
    "ioi": {"names": NAMES, "places": PLACES, "objects": OBJECTS},
    "greater_than": {"nouns": NOUNS},
    "successor": {sequence: words for sequence, (words, _) in SEQUENCES.items()},
    "binding": {"names": NAMES, "cities": CITIES},
}
# filtered: the fewest words a list may keep, what one prompt draws from it (two distinct names, two
# cities); successor keeps windows, not words (``_successor_rows`` refuses where none is left)
MIN_WORDS = {"names": 2, "places": 1, "objects": 1, "nouns": 1, "cities": 2}
# filtered: draws of one example a tokenizer may refuse in a row before the batch is refused (a tokenizer
# that gives so many the wrong length gives it to nearly all)
MAX_DRAWS = 1000


# --- text, no tokenizer ----------------------------------------------------------------------


@dataclass(frozen=True)
class IoiPrompt(Record):
    text: str
    target: str  # the indirect object's name (A)
    distractor: str  # the subject's name (B), said twice
    template: Literal["ABBA", "BABA"]
    place: str
    object: str


@dataclass(frozen=True)
class GreaterThanPrompt(Record):
    text: str
    noun: str
    century: int  # CC of the years CCDD
    decade: int  # DD of the start year; the answer is a 2-digit number above it


@dataclass(frozen=True)
class SuccessorPrompt(Record):
    text: str
    sequence: SuccessorSequence
    items: list[str]  # the five items shown
    target: str  # the sixth


@dataclass(frozen=True)
class BindingPrompt(Record):
    text: str
    target: str  # the queried name's city
    distractor: str  # the other name's city
    query_name: str
    query_is_first: bool  # the query names A (binding position 3) rather than B (8)


def _check_n(task: Task, n: int, most: int | None = None) -> None:
    if n < 1 or (most is not None and n > most):
        limit = f"1 to {most}" if most is not None else "at least 1"
        raise UsageError(f"{task}: n = {n} prompts; give n from {limit}")


def _two_names(rng: np.random.RandomState, names: Sequence[str]) -> tuple[str, str]:
    """Two distinct names, the study's one draw for both (IOI and binding)."""
    a, b = rng.choice(len(names), 2, replace=False)
    return names[a], names[b]


P = TypeVar("P", IoiPrompt, GreaterThanPrompt, BindingPrompt)


def _drawn(task: Task, draw: Callable[[], P], accept: Callable[[P], bool] | None) -> P:
    """One example: ``draw()`` (the generator's next draws), drawn again while ``accept`` refuses it."""
    for _ in range(MAX_DRAWS):
        prompt = draw()
        if accept is None or accept(prompt):
            return prompt
    raise UsageError(
        f"{task}: {MAX_DRAWS} draws in a row were refused, the last {prompt.text!r}; "
        f"run {task} with a model whose tokenizer splits its prompts as the study's models do, "
        f"or leave {task} out"
    )


def ioi_prompts(
    n: int = N_PROMPTS,
    seed: int = SEED,
    names: Sequence[str] = NAMES,
    places: Sequence[str] = PLACES,
    objects: Sequence[str] = OBJECTS,
    accept: Callable[[IoiPrompt], bool] | None = None,
) -> list[IoiPrompt]:
    """The study's IOI prompts: per example two distinct names (A, B), a place, an object, drawn
    from the given lists (the study's by default); an example ``accept`` refuses is drawn again."""
    _check_n("ioi", n)
    rng = np.random.RandomState(seed)

    def draw(i: int) -> IoiPrompt:
        io, subject = _two_names(rng, names)
        place, obj = places[rng.randint(len(places))], objects[rng.randint(len(objects))]
        first, second = (io, subject) if i % 2 == 0 else (subject, io)
        return IoiPrompt(
            text=f"When {first} and {second} went to the {place}, {subject} gave a {obj} to",
            target=io,
            distractor=subject,
            template="ABBA" if i % 2 == 0 else "BABA",
            place=place,
            object=obj,
        )

    return [_drawn("ioi", functools.partial(draw, i), accept) for i in range(n)]


def greater_than_prompts(
    pairs: Sequence[tuple[int, int]],
    n: int = N_PROMPTS,
    seed: int = SEED,
    nouns: Sequence[str] = NOUNS,
    accept: Callable[[GreaterThanPrompt], bool] | None = None,
) -> list[GreaterThanPrompt]:
    """The study's greater-than prompts over the (century, decade) ``pairs`` a tokenizer allows
    (``greater_than_pairs``), in their order: per example a noun (of ``nouns``, the study's by
    default), then a pair; an example ``accept`` refuses is drawn again."""
    _check_n("greater_than", n)
    rng = np.random.RandomState(seed)

    def draw() -> GreaterThanPrompt:
        noun = nouns[rng.randint(len(nouns))]
        century, decade = pairs[rng.randint(len(pairs))]
        return GreaterThanPrompt(
            text=f"The {noun} lasted from the year {century}{decade:02d} to the year {century}",
            noun=noun,
            century=century,
            decade=decade,
        )

    return [_drawn("greater_than", draw, accept) for _ in range(n)]


def successor_items(seed: int = SEED, keep: Callable[[SuccessorPrompt], bool] | None = None) -> list[SuccessorPrompt]:
    """The study's 118 successor windows (days, months, ordinals, numbers; every start whose
    sixth item exists), or those ``keep`` keeps, shuffled once by ``RandomState(seed)``."""
    windows = []
    for sequence, (words, wraps) in SEQUENCES.items():
        starts = len(words) if wraps else len(words) - SUCCESSOR_SHOWN
        for start in range(starts):
            window = [words[(start + k) % len(words)] for k in range(SUCCESSOR_SHOWN + 1)]
            windows.append(
                SuccessorPrompt(
                    text=" " + " ".join(window[:SUCCESSOR_SHOWN]),
                    sequence=sequence,
                    items=window[:SUCCESSOR_SHOWN],
                    target=window[SUCCESSOR_SHOWN],
                )
            )
    # a window is kept whole or dropped (restricting its list would join items that do not follow each other)
    windows = [w for w in windows if keep is None or keep(w)]
    np.random.RandomState(seed).shuffle(windows)  # type: ignore[arg-type]  # a list, in place, as the study's
    return windows


def binding_prompts(
    n: int = N_PROMPTS,
    seed: int = SEED,
    names: Sequence[str] = NAMES,
    cities: Sequence[str] = CITIES,
    accept: Callable[[BindingPrompt], bool] | None = None,
) -> list[BindingPrompt]:
    """The study's variable-binding prompts: per example two distinct names, then two distinct
    cities, drawn from the given lists (the study's by default); an example ``accept`` refuses is
    drawn again."""
    _check_n("binding", n)
    rng = np.random.RandomState(seed)

    def draw(i: int) -> BindingPrompt:
        name_a, name_b = _two_names(rng, names)
        city_a, city_b = rng.choice(len(cities), 2, replace=False)
        first = i % 2 == 0
        query = name_a if first else name_b
        return BindingPrompt(
            text=f" {name_a} lives in {cities[city_a]}. {name_b} lives in {cities[city_b]}. {query} lives in",
            target=cities[city_a] if first else cities[city_b],
            distractor=cities[city_b] if first else cities[city_a],
            query_name=query,
            query_is_first=first,
        )

    return [_drawn("binding", functools.partial(draw, i), accept) for i in range(n)]


# --- tokens ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskPrompt(Record):
    """One row of a run's ``prompts.jsonl``."""

    text: str
    token_ids: list[int]  # [T]
    target: int  # token id
    distractor: int | None  # token id; None for greater-than and successor
    positions: dict[str, int]  # name -> position in token_ids


WordsMode = Literal["study", "filtered"]


@dataclass(frozen=True)
class TaskWords(Record):
    """The word lists a task batch was drawn from (``TASK_LISTS``), each word as the prompts hold it
    after a space."""

    mode: WordsMode  # study: the study's lists; filtered: restricted to the words the tokenizer keeps as one token
    kept: dict[str, list[str]]  # list name -> the words drawn from, in the study's order
    dropped: dict[str, list[str]]  # list name -> the study's words left out (none for study)


@dataclass(frozen=True, eq=False)
class TaskBatch:
    """A task's prompts as tokens (module docstring: the tasks' targets and positions)."""

    task: Task
    prompts: tuple[TaskPrompt, ...]
    tokens: Int[torch.Tensor, "n T"]  # int64
    target: Int[torch.Tensor, " n"]  # int64 token ids
    distractor: Int[torch.Tensor, " n"] | None  # int64 token ids (IOI, binding)
    positions: Mapping[str, torch.Tensor]  # name -> [n] int64
    words: TaskWords
    decade: Int[torch.Tensor, " n"] | None = None  # int64, greater-than's start decade DD
    answer_tokens: Int[torch.Tensor, " 100"] | None = None  # int64, greater-than: the ids of "00".."99"

    def fingerprint(self) -> str:
        """sha256 over the task's name, the batch's shape and its token ids: the same prompts
        tokenised the same way give the same fingerprint on any machine."""
        digest = hashlib.sha256(f"{self.task}:{tuple(self.tokens.shape)}:".encode())
        digest.update(self.tokens.cpu().numpy().astype("<i8").tobytes())
        return digest.hexdigest()

    def prompts_sha1(self) -> str:
        """SHA-1 of the texts joined by newlines (the study's IOI and binding check values)."""
        return hashlib.sha1("\n".join(p.text for p in self.prompts).encode()).hexdigest()

    def jsonl(self) -> str:
        """The text of ``prompts.jsonl``: one JSON object (a ``TaskPrompt``) per line."""
        return "".join(json.dumps(p.to_json()) + "\n" for p in self.prompts)


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _tokenizer_name(tokenizer) -> str:
    return repr(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)


def _is_one_token(tokenizer, ids: list[int]) -> bool:
    """``ids`` (a word's encoding) is one token of the vocabulary; an unknown-word token does not count."""
    return len(ids) == 1 and ids[0] != getattr(tokenizer, "unk_token_id", None)


def _found(ids: list[int]) -> str:
    """What a word that is not one token encodes to, in words."""
    return "the unknown token" if len(ids) == 1 else f"{len(ids)} tokens"


def _one_token(task: Task, tokenizer, word: str) -> int:
    """The id of ``word``, which the task needs as one token of the vocabulary."""
    ids = _encode(tokenizer, word)
    if not _is_one_token(tokenizer, ids):
        raise UsageError(
            f"{task}: {word!r} is {_found(ids)} in the tokenizer {_tokenizer_name(tokenizer)}, not one "
            f"token; run {task} with a model whose tokenizer has it as one token, or leave {task} out"
        )
    return ids[0]


def task_words(task: Task, tokenizer, words: str) -> TaskWords:
    """The word lists of ``task`` for the ``words`` choice (``config.TASK_WORDS``): ``study`` the
    study's lists; ``filtered`` each restricted to the words ``tokenizer`` encodes (after a space)
    as one token; ``auto`` study where every word is one token, else filtered. Raises ``UsageError``
    where a filtered list is left with fewer words than a prompt draws (``MIN_WORDS``)."""
    lists = TASK_LISTS[task]
    one_token = {
        name: [w for w in ws if _is_one_token(tokenizer, _encode(tokenizer, " " + w))] for name, ws in lists.items()
    }
    dropped = {name: [w for w in ws if w not in one_token[name]] for name, ws in lists.items()}
    mode = ("study" if not any(dropped.values()) else "filtered") if words == "auto" else words
    if mode == "study":
        return TaskWords(
            "study", kept={name: list(ws) for name, ws in lists.items()}, dropped={name: [] for name in lists}
        )
    if mode != "filtered":
        raise UsageError(f"probe.task_words={words!r} is invalid: use one of {', '.join(TASK_WORDS)}")
    for name, kept in one_token.items():
        if len(kept) < MIN_WORDS.get(name, 0):
            verb = "is" if len(kept) == 1 else "are"
            raise UsageError(
                f"{task} cannot be posed on the tokenizer {_tokenizer_name(tokenizer)}: "
                f"{len(kept)} of the study's {len(lists[name])} {name} {verb} one token there "
                f"({', '.join(map(repr, kept)) or 'none'}) and a prompt draws {MIN_WORDS[name]}; "
                f"run {task} with another model, or leave it out"
            )
    return TaskWords("filtered", kept=one_token, dropped=dropped)


def _token_ids(task: Task, tokenizer, text: str) -> list[int]:
    """The prompt's token ids, which must be as many as the task's prompts have."""
    ids = _encode(tokenizer, text)
    length = PROMPT_LENGTH[task]
    if len(ids) != length:
        raise UsageError(
            f"{task}: {text!r} is {len(ids)} tokens in the tokenizer {_tokenizer_name(tokenizer)}, "
            f"not {length}; run {task} with a model whose tokenizer splits it as the study's models do, "
            f"or leave {task} out"
        )
    return ids


def _checked(task: Task, tokenizer, row: TaskPrompt, expected: dict[str, int]) -> TaskPrompt:
    """A prompt's row with its ``end`` position, after checking that the tokens ``expected`` at named
    positions (name -> token id) are there."""
    text, ids, positions = row.text, row.token_ids, row.positions
    for name, token in expected.items():
        if ids[positions[name]] != token:
            raise UsageError(
                f"{task}: in {text!r} the {name} token is not at position {positions[name]} in the "
                f"tokenizer {_tokenizer_name(tokenizer)}; run {task} with another model, or leave it out"
            )
    return dataclasses.replace(row, positions={**positions, "end": PROMPT_LENGTH[task] - 1})


def _accept(task: Task, tokenizer, words: TaskWords) -> Callable[[P | SuccessorPrompt], bool] | None:
    """filtered: a prompt of another length than the task's is drawn again (a word that is one token
    alone can merge with its neighbour, as a city with the full stop after it); study: every prompt is
    kept, and one of another length is refused (``_token_ids``)."""
    if words.mode == "study":
        return None
    return lambda prompt: len(_encode(tokenizer, prompt.text)) == PROMPT_LENGTH[task]


def _ioi_rows(tokenizer, n: int, seed: int, words: TaskWords) -> list[TaskPrompt]:
    rows = []
    for prompt in ioi_prompts(n, seed, **words.kept, accept=_accept("ioi", tokenizer, words)):
        io, subject = (_one_token("ioi", tokenizer, " " + name) for name in (prompt.target, prompt.distractor))
        first = prompt.template == "ABBA"
        positions = {"io": 1 if first else 3, "s1": 3 if first else 1, "s2": 9}
        ids = _token_ids("ioi", tokenizer, prompt.text)
        rows.append(
            _checked(
                "ioi",
                tokenizer,
                TaskPrompt(prompt.text, ids, io, subject, positions),
                expected={"io": io, "s1": subject, "s2": subject},
            )
        )
    return rows


def greater_than_pairs(tokenizer) -> list[tuple[int, int]]:
    """The (century, decade) pairs whose year " CCDD" the tokenizer encodes as " CC" then
    "DD" (years it merges are dropped), centuries then decades ascending."""
    return [
        (century, decade)
        for century in CENTURIES
        for decade in DECADES
        if _encode(tokenizer, f" {century}{decade:02d}")
        == _encode(tokenizer, f" {century}") + _encode(tokenizer, f"{decade:02d}")
    ]


def _greater_than_answers(tokenizer) -> list[int]:
    """The ids of "00".."99", each of which must be one token: every prompt's metric reads all 100
    (the answers above its start decade against those below), so no word list can leave one out."""
    encoded = [_encode(tokenizer, f"{d:02d}") for d in range(100)]
    split = next((d for d, ids in enumerate(encoded) if not _is_one_token(tokenizer, ids)), None)
    if split is not None:
        raise UsageError(
            f"greater_than cannot be posed on the tokenizer {_tokenizer_name(tokenizer)}: its two-digit "
            f"numbers are not one token each ('{split:02d}' is {_found(encoded[split])}), and the "
            f"answers '00'..'99' must be; run greater_than with another model, or leave it out"
        )
    return [ids[0] for ids in encoded]


def _greater_than_batch(tokenizer, n: int, seed: int, words: TaskWords, bos: int | None) -> TaskBatch:
    pairs = greater_than_pairs(tokenizer)
    if not pairs:
        raise UsageError(
            f"greater_than cannot be posed on the tokenizer {_tokenizer_name(tokenizer)}: it splits no "
            f"year 1402-1988 into ' CC' + 'DD'; run greater_than with a model whose tokenizer does, "
            f"or leave it out"
        )
    answers = _greater_than_answers(tokenizer)  # [100] "00".."99"
    prompts = greater_than_prompts(pairs, n, seed, **words.kept, accept=_accept("greater_than", tokenizer, words))
    rows = [
        _checked(
            "greater_than",
            tokenizer,
            TaskPrompt(
                p.text,
                _token_ids("greater_than", tokenizer, p.text),
                answers[p.decade],
                None,
                {"century": 6, "decade": 7},
            ),
            expected={"decade": answers[p.decade]},
        )
        for p in prompts
    ]
    return _stack(
        "greater_than",
        rows,
        words,
        bos,
        decade=torch.tensor([p.decade for p in prompts], dtype=torch.int64),
        answer_tokens=torch.tensor(answers, dtype=torch.int64),
    )


def _successor_rows(tokenizer, n: int | None, seed: int, words: TaskWords) -> list[TaskPrompt]:
    accept = _accept("successor", tokenizer, words)

    def keep(window: SuccessorPrompt) -> bool:  # filtered: each item one token, and the prompt the task's length
        return all(item in words.kept[window.sequence] for item in (*window.items, window.target)) and (
            accept is None or accept(window)
        )  # keep is given only with accept

    windows = successor_items(seed, keep=None if accept is None else keep)
    if not windows:
        raise UsageError(
            f"successor cannot be posed on the tokenizer {_tokenizer_name(tokenizer)}: no window of "
            f"{SUCCESSOR_SHOWN + 1} items has each item one token and the prompt "
            f"{PROMPT_LENGTH['successor']} tokens; run successor with another model, or leave it out"
        )
    if n is not None:
        _check_n("successor", n, most=len(windows))
        windows = windows[:n]
    rows = []
    for window in windows:
        ids = _token_ids("successor", tokenizer, window.text)  # the study checks the length before the target
        target = _one_token("successor", tokenizer, " " + window.target)
        rows.append(_checked("successor", tokenizer, TaskPrompt(window.text, ids, target, None, {}), expected={}))
    return rows


def _binding_rows(tokenizer, n: int, seed: int, words: TaskWords) -> list[TaskPrompt]:
    rows = []
    for prompt in binding_prompts(n, seed, **words.kept, accept=_accept("binding", tokenizer, words)):
        ids = _token_ids("binding", tokenizer, prompt.text)  # the study checks the length before the cities
        target, distractor = (
            _one_token("binding", tokenizer, " " + city) for city in (prompt.target, prompt.distractor)
        )
        bound, other = (3, 8) if prompt.query_is_first else (8, 3)
        positions = {"binding": bound, "distractor": other, "query_name": 10}
        rows.append(
            _checked(
                "binding",
                tokenizer,
                TaskPrompt(prompt.text, ids, target, distractor, positions),
                expected={"binding": target, "distractor": distractor},
            )
        )
    return rows


def _with_bos(row: TaskPrompt, bos: int) -> TaskPrompt:
    """The prompt behind the BOS id ``bos``: its named positions move one on with their tokens."""
    return dataclasses.replace(
        row, token_ids=[bos, *row.token_ids], positions={name: position + 1 for name, position in row.positions.items()}
    )


def _stack(task: Task, rows: list[TaskPrompt], words: TaskWords, bos: int | None, **greater_than) -> TaskBatch:
    def column(values) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64)

    if bos is not None:
        rows = [_with_bos(row, bos) for row in rows]
    has_distractor = rows[0].distractor is not None
    return TaskBatch(
        task=task,
        prompts=tuple(rows),
        tokens=column([r.token_ids for r in rows]),
        target=column([r.target for r in rows]),
        distractor=column([r.distractor for r in rows]) if has_distractor else None,
        positions={name: column([r.positions[name] for r in rows]) for name in rows[0].positions},
        words=words,
        **greater_than,
    )


def build_task_batch(
    task: Task, tokenizer, n: int | None = None, seed: int = SEED, words: str = "study", bos: int | None = None
) -> TaskBatch:
    """The batch of ``task``, tokenised by ``tokenizer`` (a Hugging Face tokenizer).

    ``n``: IOI, greater-than and binding draw n prompts (default 500), the first n of their
    sequence; successor takes the first n of its shuffled windows (default all). ``words``
    (``config.TASK_WORDS``, ``task_words``): ``study`` the study's batch exactly, ``filtered``
    the study's draws over its lists restricted to the tokenizer's single tokens, ``auto`` study
    where the tokenizer has every word as one token, else filtered. ``bos``: a token id put before
    every prompt (the named positions move one on); None: none, as the study. Raises
    ``UsageError`` where the tokenizer cannot give the batch its shape (module docstring)."""
    if task not in TASKS:
        raise UsageError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
    n_drawn = N_PROMPTS if n is None else n
    chosen = task_words(task, tokenizer, words)
    if task == "greater_than":
        return _greater_than_batch(tokenizer, n_drawn, seed, chosen, bos)
    if task == "ioi":
        rows = _ioi_rows(tokenizer, n_drawn, seed, chosen)
    elif task == "successor":
        rows = _successor_rows(tokenizer, n, seed, chosen)
    else:
        rows = _binding_rows(tokenizer, n_drawn, seed, chosen)
    return _stack(task, rows, chosen, bos)
