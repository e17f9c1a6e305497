"""Which files of a checkpoint revision a run reads, and fetching exactly those.

The families publish their weights in two formats (docs/hub.md):

* safetensors: ``model.safetensors``, or shards named in ``model.safetensors.index.json``;
* pickles: ``pytorch_model.bin``, or shards named in ``pytorch_model.bin.index.json`` (Pythia's
  and CRFM's step branches, Amber's ``ckpt_*``). transformers reads them with torch's restricted
  unpickler (``weights_only=True``), which refuses any pickle that would call code.

A revision is read in safetensors where it has them, else as pickles (``model.weights_format=auto``);
``model.weights_format=safetensors`` refuses pickles. Only root-level files count: a branch's
folders (CRFM's ``global_step*/`` DeepSpeed states) and its other files (optimizer and trainer
states, eval results, tokenizer, a second copy of the weights in the other format) are never
downloaded for the weights.

No torch here: the prefetch's download process imports this module.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from emergence.core.errors import UsageError

WeightsFormat = Literal["safetensors", "pickle"]
WEIGHTS_FORMATS = ("auto", "safetensors")  # model.weights_format
CONFIG_FILE = "config.json"
SINGLE_FILE = {"safetensors": "model.safetensors", "pickle": "pytorch_model.bin"}
INDEX_FILE = {"safetensors": "model.safetensors.index.json", "pickle": "pytorch_model.bin.index.json"}
# Shards as transformers names them; ``training_args.bin`` (a trainer's pickle) is no weight file.
SHARD_NAME = {
    "safetensors": re.compile(r"model-\d+-of-\d+\.safetensors"),
    "pickle": re.compile(r"pytorch_model-\d+-of-\d+\.bin"),
}


@dataclass(frozen=True)
class WeightFiles:
    """The weight files of one revision in one format, as paths relative to its root."""

    format: WeightsFormat
    shards: tuple[str, ...]  # the files holding tensors, in name order (one for an unsharded checkpoint)
    index: str | None  # the shard index (tensor name -> shard), None for a single file

    @property
    def files(self) -> list[str]:
        """What a run downloads of the weights: the shards and their index."""
        return [*self.shards, *([self.index] if self.index else [])]


def formats_in(names: Iterable[str]) -> dict[WeightsFormat, WeightFiles]:
    """The weight files of each format a revision holds, from its file names (root-level ones count)."""
    root = {n for n in names if "/" not in n}
    found: dict[WeightsFormat, WeightFiles] = {}
    for fmt in ("safetensors", "pickle"):
        if SINGLE_FILE[fmt] in root:
            found[fmt] = WeightFiles(fmt, (SINGLE_FILE[fmt],), None)
        else:  # shards (loading needs their index; a fingerprint does not)
            shards = tuple(sorted(n for n in root if SHARD_NAME[fmt].fullmatch(n)))
            if shards:
                found[fmt] = WeightFiles(fmt, shards, INDEX_FILE[fmt] if INDEX_FILE[fmt] in root else None)
    return found


def preferred(found: dict[WeightsFormat, WeightFiles]) -> WeightFiles | None:
    """Safetensors where a revision has them, else its pickles (None: it holds no weights)."""
    return found.get("safetensors") or found.get("pickle")


def select(found: dict[WeightsFormat, WeightFiles], policy: str, where: str) -> WeightFiles:
    """The format a run reads (``model.weights_format``: ``auto`` prefers safetensors, then pickles;
    ``safetensors`` refuses pickles); a UsageError where the revision holds none it may read."""
    files = preferred(found)
    if files is None:
        raise UsageError(
            f"model.name_or_path={where!r} cannot be loaded: it holds no weights (no model.safetensors, "
            "pytorch_model.bin or shard index); name another revision"
        )
    if files.format == "pickle" and policy == "safetensors":
        raise UsageError(
            f"model.weights_format=safetensors refuses {where}: it holds only pickled weights "
            f"({', '.join(files.shards)}); use model.weights_format=auto to read them "
            "through torch's restricted unpickler (weights_only=True)"
        )
    return files


def shards_complete(directory: Path, files: WeightFiles) -> bool:
    """Every shard of ``files`` is in ``directory``: those its index names, where it has one."""
    names = set(files.shards)
    if files.index is not None:
        names = set(json.loads((directory / files.index).read_text())["weight_map"].values())
    return all((directory / name).exists() for name in names)


def local_weights(directory: Path, policy: str) -> WeightFiles | None:
    """The weight files a run reads from a local directory (a checkpoint, or a cache snapshot),
    None where no format it may read is complete there."""
    found = formats_in(p.name for p in directory.iterdir())
    complete = {fmt: files for fmt, files in found.items() if shards_complete(directory, files)}
    try:
        return select(complete, policy, str(directory))
    except UsageError:
        return None


@dataclass(frozen=True)
class RemoteFile:
    """One root-level file of a Hub revision, as the tree API lists it."""

    path: str
    size: int
    sha256: str | None  # the LFS sha256 of its content; None for a file not stored in LFS


def remote_files(repo: str, revision: str | None) -> list[RemoteFile]:
    """The root-level files of ``repo@revision`` from the Hub's tree API (nothing is downloaded)."""
    from huggingface_hub import HfApi

    entries = HfApi().list_repo_tree(repo, revision=revision)
    return [
        RemoteFile(e.path, e.size, lfs.sha256 if (lfs := getattr(e, "lfs", None)) else None)
        for e in entries
        if hasattr(e, "size")
    ]  # files: a folder (RepoFolder) has no size


def download(repo: str, revision: str | None, files: WeightFiles) -> None:
    """Fetch the config and ``files`` of ``repo@revision`` into the Hugging Face cache, nothing else.
    The config comes last: a cached config marks the revision as
    there, so a download cut short is not mistaken for a complete one (``cached_snapshot`` checks
    every shard too)."""
    from huggingface_hub import hf_hub_download, snapshot_download

    snapshot_download(repo, revision=revision, allow_patterns=files.files)
    hf_hub_download(repo, CONFIG_FILE, revision=revision)


def cached_snapshot(repo: str, revision: str | None, policy: str) -> tuple[Path, WeightFiles] | None:
    """The cache's snapshot of ``repo@revision`` and its weight files, if it holds the config and
    every weight file of a format the run reads; None otherwise (huggingface_hub writes each file
    to a temporary name and moves it in place only when complete)."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo, CONFIG_FILE, revision=revision)
    if not isinstance(found, str):
        return None
    snapshot = Path(found).parent
    files = local_weights(snapshot, policy)
    return None if files is None else (snapshot, files)


def file_sha256(path: Path) -> str:
    """The sha256 of a file's content. In the Hub cache a weight file links to ``blobs/<sha256 of its
    content>`` (the LFS oid), so the digest is read from the link's target without reading it."""
    target = path.resolve()
    if path.is_symlink() and target.parent.name == "blobs" and re.fullmatch(r"[0-9a-f]{64}", target.name):
        return target.name
    digest = hashlib.sha256()
    with open(target, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fingerprint(digests: dict[str, str]) -> str:
    """One fingerprint of a checkpoint's weights from each weight file's content sha256: the file's
    own for a single file, else the sha256 of the "name digest" lines in name order."""
    if len(digests) == 1:
        return next(iter(digests.values()))
    return hashlib.sha256("".join(f"{name} {d}\n" for name, d in sorted(digests.items())).encode()).hexdigest()
