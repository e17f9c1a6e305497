"""The task toy's training corpus: the synthetic toy corpus mixed with runs of task sentences.

The four tasks are the reference study's (IOI, greater-than, successor, variable binding), with its
word lists (``emergence/toy/words.py``) and its prompt templates (below); a training sentence is a
prompt followed by its answer and a full stop:

* IOI (ABBA or BABA, half each): "When Mary and John went to the store, John gave a book to Mary."
  (the answer is the indirect object: the name that appears once before it);
* greater-than: "The war lasted from the year 1450 to the year 1483." (the end year after the start
  year, same century; start decade 02..88 as the study's, end decade above it up to 99);
* successor: " Monday Tuesday Wednesday Thursday Friday Saturday." (6 to 10 consecutive items of the
  days or months, which wrap, or of the ordinals first..tenth or the numbers 1..99, which do not);
* variable binding, a story: 2 to 6 names each bound to a distinct city, then every name asked once
  in a random order, " Anna lives in Paris. Tom lives in Rome. Tom lives in Rome. Anna lives in
  Paris." (the study's prompt is the start of a 2-name story). Each name has a home city
  (``HOME_CITIES``), and a share of the bindings use it (``model.toy.home_city_share``, 0.5 in
  ``toy_tasks``): a name then predicts its city already at " in", which rewards carrying the name
  there, the step the in-context lookup builds on. Without it nothing rewards that step until the
  lookup works, and binding stays at chance (the model answers one of the story's cities): in a
  corpus of stories alone, at 50% through 2048 steps without home cities, at 100% by step 2048
  with them (docs/toy-panel.md). The study's prompts bind random cities, so a home city is right
  there only by chance.

A batch (``TaskMixCorpus.batch``) is ``ToyCorpus``'s synthetic sequences over the filler tokens
(the ones the induction probe draws) and, for ``task_fraction`` of it, runs of task sentences
(each sentence's task drawn with ``TASK_WEIGHTS``) starting at position 0 and cut at ``seq_len``:
the probe feeds a prompt with no BOS at position 0, so the tasks are learned from there. Everything
is drawn from the seed, a pure function of (seed, step). The study's evaluation prompts come from
``numpy.random.RandomState(42)``; the training never uses those draws (it draws from numpy's
``default_rng``): random combinations of the same word lists cover them anyway (IOI: 42 x 41 name
pairs x 36 place-object pairs x 2 orders).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
import torch
from transformers import PreTrainedTokenizerFast

from emergence.recipe.tasks import TASKS, Task
from emergence.toy.corpus import ToyCorpus
from emergence.toy.words import CITIES, DAYS, FIRST_FILLER_ID, MONTHS, NAMES, NOUNS, NUMBERS, OBJECTS, ORDINALS, PLACES

# The study's prompts (its query is the last token); a training sentence adds the answer and ".".
IOI_PROMPTS = {
    "ABBA": "When {io} and {s} went to the {place}, {s} gave a {obj} to",
    "BABA": "When {s} and {io} went to the {place}, {s} gave a {obj} to",
}
GREATER_THAN_PROMPT = "The {noun} lasted from the year {century}{start:02d} to the year {century}"
BINDING_STATEMENT = " {name} lives in {city}."
BINDING_NAMES = (2, 6)  # names in a binding story, inclusive
# Each name's home city: names spread over the cities by a fixed stride (7 is prime to 30).
HOME_CITIES = tuple(CITIES[(7 * i) % len(CITIES)] for i in range(len(NAMES)))
GREATER_THAN_CENTURIES = range(14, 20)  # 14..19, as the study's
GREATER_THAN_START_DECADES = range(2, 89)  # 02..88, as the study's
# The successor lists, and whether a run wraps from the last item to the first.
SUCCESSOR_LISTS: tuple[tuple[tuple[str, ...], bool], ...] = (
    (DAYS, True),
    (MONTHS, True),
    (ORDINALS, False),
    (NUMBERS, False),
)
SUCCESSOR_RUN = (6, 10)  # items per run, inclusive: the study's 5 shown and the 6th, or longer
TASK_STREAM = 1  # the task runs' random stream, apart from the synthetic sequences' (ToyCorpus: [seed, step])


def ioi_sentence(rng: np.random.Generator) -> str:
    """An IOI sentence: two distinct names, a place, an object, ABBA or BABA; ends with the indirect object."""
    io, s = rng.choice(len(NAMES), 2, replace=False)
    place, obj, order = rng.integers(len(PLACES)), rng.integers(len(OBJECTS)), rng.integers(2)
    prompt = IOI_PROMPTS[("ABBA", "BABA")[order]].format(
        io=NAMES[io], s=NAMES[s], place=PLACES[place], obj=OBJECTS[obj]
    )
    return f"{prompt} {NAMES[io]}."


def greater_than_sentence(rng: np.random.Generator) -> str:
    """A year range: start decade in 02..88, end decade above it (up to 99), the same century."""
    noun, century = NOUNS[rng.integers(len(NOUNS))], int(rng.choice(GREATER_THAN_CENTURIES))
    start = int(rng.choice(GREATER_THAN_START_DECADES))
    end = int(rng.integers(start + 1, 100))
    return f"{GREATER_THAN_PROMPT.format(noun=noun, century=century, start=start)}{end:02d}."


def successor_sentence(rng: np.random.Generator) -> str:
    """A run of consecutive items of one successor list (days, months wrap; ordinals, numbers do not)."""
    items, wraps = SUCCESSOR_LISTS[rng.integers(len(SUCCESSOR_LISTS))]
    length = int(rng.integers(SUCCESSOR_RUN[0], min(SUCCESSOR_RUN[1], len(items)) + 1))
    first = int(rng.integers(len(items) if wraps else len(items) - length + 1))
    return "".join(f" {items[(first + k) % len(items)]}" for k in range(length)) + "."


def binding_sentence(rng: np.random.Generator, home_city_share: float = 0.0) -> str:
    """A binding story: 2..6 names bound to distinct cities (each its home city with probability
    ``home_city_share``, unless two would then share a city: all random), then each name again with
    its city, in a random order."""
    k = int(rng.integers(BINDING_NAMES[0], BINDING_NAMES[1] + 1))
    names = rng.choice(len(NAMES), k, replace=False)
    cities = [CITIES[i] for i in rng.choice(len(CITIES), k, replace=False)]
    home = rng.random(k) < home_city_share
    with_homes = [HOME_CITIES[n] if h else c for n, c, h in zip(names, cities, home)]
    if len(set(with_homes)) == k:
        cities = with_homes
    order = list(range(k)) + [int(i) for i in rng.permutation(k)]
    return "".join(BINDING_STATEMENT.format(name=NAMES[names[i]], city=cities[i]) for i in order)


# The chance of each task (TASKS' order) for a sentence: binding half of them, since its lookup is the slowest
# to form and needs the most stories (docs/toy-panel.md); the other three tasks the rest, equally.
TASK_WEIGHTS = (1 / 6, 1 / 6, 1 / 6, 1 / 2)
# The fewest tokens a sentence has (a 6-item successor run and its "."): enough sentences for any run.
MIN_SENTENCE_TOKENS = SUCCESSOR_RUN[0] + 1


def task_run(rng: np.random.Generator, n_sentences: int, home_city_share: float = 0.0) -> str:
    """``n_sentences`` task sentences (a binding story counts as one), each of a task drawn with
    ``TASK_WEIGHTS``, one after another: the first as its template starts ("When ...", "The ...",
    " Anna ..."), the others after a space."""
    draw: dict[Task, Callable[[np.random.Generator], str]] = {
        "ioi": ioi_sentence,
        "greater_than": greater_than_sentence,
        "successor": successor_sentence,
        "binding": partial(binding_sentence, home_city_share=home_city_share),
    }
    sentences = [draw[TASKS[rng.choice(len(TASKS), p=TASK_WEIGHTS)]](rng) for _ in range(n_sentences)]
    return sentences[0] + "".join(s if s.startswith(" ") else " " + s for s in sentences[1:])


class TaskMixCorpus:
    """``ToyCorpus`` over the filler tokens, mixed with runs of task sentences (the module docstring)."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerFast,
        seq_len: int,
        seed: int,
        task_fraction: float,
        synthetic_options: dict,
        home_city_share: float = 0.0,
    ):
        """``synthetic_options``: ``ToyCorpus``'s keyword options (repeat_fraction, skip_offsets, ...);
        ``task_fraction`` in (0, 1] (``toy.validation``)."""
        self.tokenizer, self.seq_len, self.seed, self.task_fraction = tokenizer, seq_len, seed, task_fraction
        self.home_city_share = home_city_share
        self.synthetic = ToyCorpus(len(tokenizer) - FIRST_FILLER_ID, seq_len, seed, **synthetic_options)

    def batch(self, step: int, size: int) -> torch.Tensor:
        """The training batch of ``step``: [size, seq_len] int64 (synthetic rows first, then task runs), a
        pure function of (seed, step)."""
        n_task = round(size * self.task_fraction)
        synthetic = self.synthetic.batch(step, size - n_task) + FIRST_FILLER_ID  # [size - n_task, seq_len]
        return torch.cat([synthetic, self.task_runs(step, n_task)])

    def task_runs(self, step: int, n: int) -> torch.Tensor:
        """``n`` runs of task sentences from position 0, cut at ``seq_len``: [n, seq_len] int64."""
        rng = np.random.default_rng([self.seed, step, TASK_STREAM])
        n_sentences = -(-self.seq_len // MIN_SENTENCE_TOKENS)  # at least seq_len tokens whatever is drawn
        backend = self.tokenizer.backend_tokenizer  # one text at a time: no tokenizer threads
        texts = [task_run(rng, n_sentences, self.home_city_share) for _ in range(n)]
        runs = [backend.encode(text, add_special_tokens=False).ids[: self.seq_len] for text in texts]
        return torch.tensor(runs, dtype=torch.int64).reshape(n, self.seq_len)
