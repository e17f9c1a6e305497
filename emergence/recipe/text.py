"""The text probe's tokens (``probe.kind=text``, docs/probes.md): its documents (read by
``hub.text_sources``: a Hugging Face dataset or a local file), tokenized with the checkpoint's own
tokenizer (``probe.tokenizer=auto``, loaded by ``hub.text_sources``) or as UTF-8 bytes (``bytes``, for
models that read bytes, as the toys do), then packed into windows by ``probe.make_text_batch``.
Nothing here reads a file or the Hub: the documents and the tokenizer arrive as arguments.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from emergence.core.errors import UsageError
from emergence.recipe.probe import ProbeBatch, make_text_batch

TEXT_FILE_SUFFIXES = (".txt", ".jsonl")
STREAM_PER_WINDOW = 3  # tokenize documents until the stream holds this many windows per sequence asked for
DOCUMENTS_PER_CALL = 256  # documents per call of a fast tokenizer


@dataclass(frozen=True)
class Tokenizer:
    """What packing needs of a tokenizer: documents to ids, and the special tokens around them."""

    encode: Callable[[Sequence[str]], list[list[int]]]  # documents -> their ids, no special tokens
    bos: int | None  # starts every window where the model's tokenizer starts every text with it
    eos: int | None  # ends every document
    name: str


def byte_tokenizer() -> Tokenizer:
    return Tokenizer(encode=lambda docs: [list(d.encode("utf-8")) for d in docs], bos=None, eos=None, name="bytes")


def prepended_bos(tok) -> int | None:
    """The BOS id a Hugging Face tokenizer puts before every input it encodes; None if it puts none."""
    starts_with_bos = tok.bos_token_id is not None and tok("x")["input_ids"][:1] == [tok.bos_token_id]
    return tok.bos_token_id if starts_with_bos else None


def probe_tokenizer(tok, name: str) -> Tokenizer:
    """The text probe's tokenizer: a Hugging Face tokenizer (the checkpoint's own, ``load_tokenizer``), named
    ``name`` (repo@revision)."""
    return Tokenizer(
        encode=lambda docs: tok(docs, add_special_tokens=False)["input_ids"],
        bos=prepended_bos(tok),
        eos=tok.eos_token_id,
        name=name,
    )


def token_stream(docs: Sequence[str], tokenizer: Tokenizer, budget: int) -> np.ndarray:
    """The documents' ids, each followed by ``eos`` (if any), concatenated until ``budget`` ids."""
    pieces, total = [], 0
    for start in range(0, len(docs), DOCUMENTS_PER_CALL):
        for ids in tokenizer.encode(docs[start : start + DOCUMENTS_PER_CALL]):
            ids = ids + ([tokenizer.eos] if tokenizer.eos is not None else [])
            pieces.append(np.asarray(ids, dtype=np.int64))
            total += len(ids)
        if total >= budget:
            break
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)


def text_batch(docs: Sequence[str], probe_cfg, tokenizer: Tokenizer, vocab_size: int) -> ProbeBatch:
    """The text probe's batch: ``probe.n_sequences`` windows of ``probe.seq_len`` tokens from ``docs`` (the
    probe's documents, ``hub.text_sources.documents``)."""
    p = probe_cfg
    stream = token_stream(docs, tokenizer, STREAM_PER_WINDOW * p.n_sequences * p.seq_len)
    if len(stream) and stream.max() >= vocab_size:
        raise UsageError(
            f"the tokenizer ({tokenizer.name}) gives id {int(stream.max())}, beyond the model's "
            f"vocabulary of {vocab_size}: it is not this model's tokenizer"
        )
    try:
        return make_text_batch(stream, p.n_sequences, p.seq_len, p.seed, tokenizer.bos)
    except ValueError as err:
        raise UsageError(f"{source_name(p)}: {err}; use a larger text or fewer probe.n_sequences") from None


def source_name(probe_cfg) -> str:
    """The text file, or the dataset and its split."""
    return probe_cfg.text_file or f"{probe_cfg.dataset} ({probe_cfg.split})"
