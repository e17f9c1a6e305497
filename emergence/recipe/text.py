"""The text probe's tokens (``probe.kind=text``, docs/probes.md): documents from a Hugging Face
dataset (``probe.dataset``, ``probe.split``, ``probe.column``) or a local file
(``probe.text_file``: a ``.txt`` file is one document, a ``.jsonl`` file one per line, its
``probe.column`` field), tokenized with the checkpoint's own tokenizer (``probe.tokenizer=auto``)
or as UTF-8 bytes (``bytes``, for models that read bytes, as the toys do), then packed into
windows by ``probe.make_text_batch``.

Every failure to get the text or the tokenizer is a ``UsageError`` naming what is missing and
how to get it: it is raised before the weights load.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from emergence.core.errors import UsageError, first_line
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


@functools.lru_cache(maxsize=4)  # a run asks for it up to three times (first token, text probe, task)
def _auto_tokenizer(directory: str, trust_remote_code: bool, gguf_file: str | None):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory, trust_remote_code=trust_remote_code, gguf_file=gguf_file)


def load_tokenizer(directory: str, name: str, trust_remote_code: bool, fix: str, gguf_file: str | None = None):
    """The tokenizer in ``directory`` (``AutoTokenizer``; the one ``gguf_file`` holds, where given): a
    checkpoint's own, named ``name`` (repo@revision); one line ending in ``fix`` if none loads, or if it is empty."""
    try:
        tok = _auto_tokenizer(directory, trust_remote_code, gguf_file)
    except (OSError, ValueError, TypeError) as err:
        raise UsageError(f"{name} has no tokenizer that loads ({type(err).__name__}: "
                         f"{first_line(err) if str(err) else ''}); {fix}") from None
    # Without tokenizer files, transformers builds the model type's tokenizer class empty (GPTNeoX,
    # GPT-2, Qwen2, Gemma): it encodes every text to nothing, and the text would be blamed for it.
    if set(tok.get_vocab().values()) <= set(tok.all_special_ids):
        raise UsageError(f"{name} has no tokenizer (no tokenizer files: its vocabulary is only the special tokens "
                         f"{', '.join(sorted(tok.get_vocab()))}); save the model's tokenizer beside its weights, "
                         f"or {fix}")
    return tok


def prepended_bos(tok) -> int | None:
    """The BOS id a Hugging Face tokenizer puts before every input it encodes; None if it puts none."""
    starts_with_bos = tok.bos_token_id is not None and tok("x")["input_ids"][:1] == [tok.bos_token_id]
    return tok.bos_token_id if starts_with_bos else None


def probe_tokenizer(tok, name: str) -> Tokenizer:
    """The text probe's tokenizer: a Hugging Face tokenizer (the checkpoint's own, ``load_tokenizer``), named
    ``name`` (repo@revision)."""
    return Tokenizer(encode=lambda docs: tok(docs, add_special_tokens=False)["input_ids"], bos=prepended_bos(tok),
                     eos=tok.eos_token_id, name=name)


def documents(probe_cfg) -> Sequence[str]:
    """The probe's documents, in the order the file or dataset holds them (a dataset's column is
    read lazily: ``token_stream`` slices it only as far as it needs)."""
    p = probe_cfg
    if p.text_file:
        path = Path(p.text_file).expanduser()
        content = read_utf8(path)
        if path.suffix == ".txt":
            return [content]
        docs = []
        for number, line in enumerate(content.splitlines(), 1):
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as err:
                    raise UsageError(f"probe.text_file={str(path)!r} line {number} is not JSON ({err.msg}); a .jsonl "
                                     "file holds one JSON object per line") from None
                if p.column not in record:
                    raise UsageError(f"probe.column={p.column!r} is not a field of {path} line {number} (it has "
                                     f"{', '.join(sorted(record))}); set probe.column to the text's field")
                docs.append(record[p.column])
        return docs
    return dataset_documents(p.dataset, p.split, p.column)


def read_utf8(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(f"probe.text_file={str(path)!r} is not UTF-8 text: byte {err.start} is "
                         f"0x{err.object[err.start]:02x}; convert it to UTF-8 (iconv -t UTF-8) or give another "
                         "file") from None


def dataset_documents(name: str, split: str, column: str) -> Sequence[str]:
    import datasets

    try:
        data = datasets.load_dataset(name, split=split)
    except Exception as err:  # datasets raises many kinds (offline, not found, no such split): all one answer
        first = first_line(err) if str(err) else ""
        raise UsageError(f"probe.dataset={name!r} (split {split!r}) could not be loaded ({type(err).__name__}: "
                         f"{first[:200]}); offline it must be in the datasets cache (load it once online), or use "
                         "a local file: probe.text_file=PATH (.txt or .jsonl)") from None
    if column not in data.column_names:
        raise UsageError(f"probe.column={column!r} is not a column of {name} ({split}): it has "
                         f"{', '.join(data.column_names)}")
    return data[column]


def token_stream(docs: Sequence[str], tokenizer: Tokenizer, budget: int) -> np.ndarray:
    """The documents' ids, each followed by ``eos`` (if any), concatenated until ``budget`` ids."""
    pieces, total = [], 0
    for start in range(0, len(docs), DOCUMENTS_PER_CALL):
        for ids in tokenizer.encode(docs[start:start + DOCUMENTS_PER_CALL]):
            ids = ids + ([tokenizer.eos] if tokenizer.eos is not None else [])
            pieces.append(np.asarray(ids, dtype=np.int64))
            total += len(ids)
        if total >= budget:
            break
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)


def text_batch(probe_cfg, tokenizer: Tokenizer, vocab_size: int) -> ProbeBatch:
    """The text probe's batch: ``probe.n_sequences`` windows of ``probe.seq_len`` tokens."""
    p = probe_cfg
    stream = token_stream(documents(p), tokenizer, STREAM_PER_WINDOW * p.n_sequences * p.seq_len)
    if len(stream) and stream.max() >= vocab_size:
        raise UsageError(f"the tokenizer ({tokenizer.name}) gives id {int(stream.max())}, beyond the model's "
                         f"vocabulary of {vocab_size}: it is not this model's tokenizer")
    try:
        return make_text_batch(stream, p.n_sequences, p.seq_len, p.seed, tokenizer.bos)
    except ValueError as err:
        raise UsageError(f"{source_name(p)}: {err}; use a larger text or fewer probe.n_sequences") from None


def source_name(probe_cfg) -> str:
    """The text file, or the dataset and its split."""
    return probe_cfg.text_file or f"{probe_cfg.dataset} ({probe_cfg.split})"
