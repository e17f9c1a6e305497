"""Checkpoints in one GGUF file (``model.gguf_file``): llama.cpp's format, in which many released
models are shipped quantized (4-bit, 8-bit blocks).

transformers reads such a file itself (``from_pretrained(folder, gguf_file=...)``) and dequantizes
every tensor to the run's dtype: the model analysed is the dequantized one, not the released
float weights (docs/precision.md). It needs the ``gguf`` and ``accelerate`` packages, the
optional extra ``emergence[gguf]``.

* ``check_installed``: one line naming the extra where they are missing (before anything loads);
* ``gguf_path``: the file on this machine (a local folder's, or downloaded from a Hub repo alone);
* ``read_header``: its tensors' quantization types, which also proves the file whole: a truncated
  or foreign file is one line, not a traceback from deep in the reader.
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from emergence.core.errors import UsageError, first_line
from emergence.core.record import Record

EXTRA = "pip install 'emergence[gguf]'"  # the packages transformers' GGUF path needs
NEEDED = ("gguf", "accelerate")


def check_installed(gguf_file: str) -> None:
    """Stop in one line where transformers' GGUF path cannot run for want of its packages."""
    missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
    if missing:
        raise UsageError(
            f"model.gguf_file={gguf_file!r} cannot be read: transformers' GGUF loader needs "
            f"{' and '.join(missing)}; install them: {EXTRA}"
        )


def gguf_path(name_or_path: str, gguf_file: str, revision: str | None, local_only: bool) -> Path:
    """The GGUF file: ``gguf_file`` in the local folder ``name_or_path``, or that file alone from the
    Hub repo ``name_or_path`` at ``revision`` (from the cache when ``local_only``)."""
    folder = Path(name_or_path).expanduser()
    if folder.is_dir():
        path = folder / gguf_file
        if not path.is_file():
            present = sorted(p.name for p in folder.glob("*.gguf"))
            raise UsageError(
                f"model.gguf_file={gguf_file!r} is invalid: {folder} holds no such file "
                f"({'its .gguf files: ' + ', '.join(present) if present else 'it holds no .gguf file'})"
            )
        return path
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(name_or_path, gguf_file, revision=revision, local_files_only=local_only))
    except OSError as err:  # no such file or repo, no network (huggingface_hub's errors are OSErrors)
        raise UsageError(
            f"model.gguf_file={gguf_file!r} cannot be fetched from {name_or_path}@{revision or 'main'}: "
            f"{first_line(err)}"
        ) from None


@dataclass(frozen=True)
class GgufHeader(Record):
    """``summary.json`` ``gguf``: what the file held before transformers dequantized it."""

    file: str  # the file's name
    architecture: str  # general.architecture (llama, gemma3, ...)
    quantization: dict[str, int]  # tensor type (Q4_1, Q8_0, F32, ...) -> tensors of that type


def read_header(path: Path) -> GgufHeader:
    """The file's architecture and its tensors' types. ``GGUFReader`` maps every tensor, so a file
    cut short (an interrupted download) or not GGUF at all fails here, in one line. The reader
    parses bytes it does not trust, and a file cut at another point fails in another of its
    errors (IndexError, KeyError, struct's, numpy's): any of them means the file is damaged."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
        field = reader.fields.get("general.architecture")
        architecture = bytes(field.parts[field.data[0]]).decode() if field is not None else "unknown"
        types = Counter(tensor.tensor_type.name for tensor in reader.tensors)
    except Exception as err:  # noqa: BLE001 (see above: every failure of the reader is a damaged file)
        raise UsageError(
            f"model.gguf_file={path.name!r} cannot be read: {path} is truncated or not a GGUF file "
            f"({first_line(err)}); download it again"
        ) from None
    return GgufHeader(path.name, architecture, dict(sorted(types.items())))
