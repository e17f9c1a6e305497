"""The word-level tokenizer of the task toy (``model.toy.tokenizer: words``).

Every word of the four task templates (IOI, greater-than, successor, variable binding; the reference
study's word lists, in ``emergence/toy/task_corpus.py``) is ONE token, in the form the templates use
it: space-prefixed (" John", " lives", " Paris", " 33", " Monday", " first"), except the first word of
a template whose prompts start with it ("When", "The", which also exist as " When", " The" for a
sentence inside a run). Greater-than's answers are the 100 two-digit tokens "00".."99" without a
space, and a year is a space-prefixed century and a two-digit decade: the pre-tokenizer keeps a
leading space with the word after it and cuts digit runs into 2-digit pieces, so " 1450" is
" 14" + "50" and " 7" is " 7" (the study's greater-than filter, encode(" CCDD") == encode(" CC") +
encode("DD"), keeps every pair). The rest of the vocabulary, up to the recipe's ``vocab_size``, is
abstract filler tokens "<f0>", "<f1>", ... for the synthetic corpus (``ToyCorpus``) that makes the
induction circuit form.

Vocabulary order (ids are stable: a checkpoint's embedding rows follow it):

==========  =====================================================================
ids         tokens
==========  =====================================================================
0           "<unk>" (what a word outside the vocabulary becomes; never added to inputs)
1 ..        punctuation ".", ","; "When", "The"; the templates' other words in
            ``TEMPLATE_WORDS`` order (" When", " The", " and", " went", ...)
then        ``NAMES`` (42), ``PLACES`` (6), ``OBJECTS`` (6), ``NOUNS`` (23),
            ``CITIES`` (30), ``DAYS`` (7), ``MONTHS`` (12), ``ORDINALS`` (10), each
            space-prefixed, in list order
then        " 1" .. " 99" (the successor numbers; " 14" .. " 19" are the centuries)
then        "00" .. "99" (two-digit decades, no space)
then        "<f0>" .. up to ``vocab_size`` (``FIRST_FILLER_ID`` is the first)
==========  =====================================================================

No BOS, EOS or padding token is added to inputs (the study encodes with ``add_special_tokens=False``
and never prepends a BOS). The tokenizer is a ``tokenizers`` ``WordLevel`` model wrapped as
``transformers.PreTrainedTokenizerFast``; ``save_pretrained(dir)`` writes tokenizer.json and
tokenizer_config.json, so ``AutoTokenizer.from_pretrained(dir)`` loads it offline.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from emergence.core.errors import UsageError
from emergence.recipe.tasks.batches import CITIES, NAMES, NOUNS, OBJECTS, PLACES, SEQUENCES

# The reference study's word lists, as its task batches use them (``recipe/tasks/batches.py``).
DAYS, MONTHS, ORDINALS, NUMBERS = (SEQUENCES[name][0] for name in ("days", "months", "ordinals", "numbers"))
TWO_DIGITS = tuple(f"{d:02d}" for d in range(100))  # greater-than's decades and answers, no space
# The templates' own words: the first words without a space (prompts start with them), then the rest
# space-prefixed (a sentence inside a run starts with " When" or " The").
TEMPLATE_WORDS = (
    "When",
    "The",
    " When",
    " The",
    " and",
    " went",
    " to",
    " the",
    " gave",
    " a",
    " lasted",
    " from",
    " year",
    " lives",
    " in",
)

UNK = "<unk>"
# The words of the templates, in vocabulary order (space-prefixed where the templates put a space).
TASK_TOKENS: tuple[str, ...] = (
    ".",
    ",",
    *TEMPLATE_WORDS,
    *(" " + word for word in (*NAMES, *PLACES, *OBJECTS, *NOUNS, *CITIES, *DAYS, *MONTHS, *ORDINALS, *NUMBERS)),
    *TWO_DIGITS,
)
FIRST_FILLER_ID = 1 + len(TASK_TOKENS)  # after "<unk>" and the task tokens
# A piece is a word, a digit pair or a filler token, with the space before it, or one punctuation mark;
# a lone digit is a piece of its own (" 7"), and a longer run of digits is cut into pairs from its start.
PIECE = r" ?[A-Za-z]+| ?[0-9]{1,2}|[0-9]{1,2}| ?<f[0-9]+>|[.,]"


def filler_token(index: int) -> str:
    return f"<f{index}>"


def vocabulary(vocab_size: int) -> list[str]:
    """The tokens in id order: "<unk>", the task tokens, then fillers up to ``vocab_size``."""
    if vocab_size < FIRST_FILLER_ID + 1:
        raise UsageError(
            f"model.toy.vocab_size={vocab_size} cannot hold the {FIRST_FILLER_ID} task tokens and "
            "a filler token: use at least 512"
        )
    words = [UNK, *TASK_TOKENS]
    assert len(set(words)) == len(words), "a task word is listed twice"
    return words + [filler_token(i) for i in range(vocab_size - len(words))]


def word_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """The word-level tokenizer with ``vocab_size`` tokens (``vocabulary``), as transformers loads it."""
    model = models.WordLevel({token: i for i, token in enumerate(vocabulary(vocab_size))}, unk_token=UNK)
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(PIECE), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()  # the pieces carry their own spaces: decoding concatenates them
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token=UNK, model_max_length=1 << 30)
