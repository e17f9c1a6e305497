"""Where the text probe's text and a checkpoint's tokenizer come from (``probe.kind=text``,
docs/probes.md): documents from a Hugging Face dataset (``probe.dataset``, ``probe.split``,
``probe.column``) or a local file (``probe.text_file``: a ``.txt`` file is one document, a ``.jsonl``
file one per line, its ``probe.column`` field); the tokenizer files beside a checkpoint.

Every failure to get the text or the tokenizer is a ``UsageError`` naming what is missing and
how to get it: it is raised before the weights load.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path

from emergence.core.errors import UsageError, first_line


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
        raise UsageError(
            f"{name} has no tokenizer that loads ({type(err).__name__}: {first_line(err) if str(err) else ''}); {fix}"
        ) from None
    # Without tokenizer files, transformers builds the model type's tokenizer class empty (GPTNeoX,
    # GPT-2, Qwen2, Gemma): it encodes every text to nothing, and the text would be blamed for it.
    if set(tok.get_vocab().values()) <= set(tok.all_special_ids):
        raise UsageError(
            f"{name} has no tokenizer (no tokenizer files: its vocabulary is only the special tokens "
            f"{', '.join(sorted(tok.get_vocab()))}); save the model's tokenizer beside its weights, "
            f"or {fix}"
        )
    return tok


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
                    raise UsageError(
                        f"probe.text_file={str(path)!r} line {number} is not JSON ({err.msg}); a .jsonl "
                        "file holds one JSON object per line"
                    ) from None
                if p.column not in record:
                    raise UsageError(
                        f"probe.column={p.column!r} is not a field of {path} line {number} (it has "
                        f"{', '.join(sorted(record))}); set probe.column to the text's field"
                    )
                docs.append(record[p.column])
        return docs
    return dataset_documents(p.dataset, p.split, p.column)


def read_utf8(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(
            f"probe.text_file={str(path)!r} is not UTF-8 text: byte {err.start} is "
            f"0x{err.object[err.start]:02x}; convert it to UTF-8 (iconv -t UTF-8) or give another "
            "file"
        ) from None


def dataset_documents(name: str, split: str, column: str) -> Sequence[str]:
    import datasets

    try:
        data = datasets.load_dataset(name, split=split)
    except Exception as err:  # datasets raises many kinds (offline, not found, no such split): all one answer
        first = first_line(err) if str(err) else ""
        raise UsageError(
            f"probe.dataset={name!r} (split {split!r}) could not be loaded ({type(err).__name__}: "
            f"{first[:200]}); offline it must be in the datasets cache (load it once online), or use "
            "a local file: probe.text_file=PATH (.txt or .jsonl)"
        ) from None
    if column not in data.column_names:
        raise UsageError(
            f"probe.column={column!r} is not a column of {name} ({split}): it has {', '.join(data.column_names)}"
        )
    return data[column]
