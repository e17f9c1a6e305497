"""Checking checkpoint branches before their weights are downloaded (docs/hub.md).

Real repositories carry defects that silently corrupt a developmental study: branches whose
weights are byte-identical to another branch's (pythia#83, pythia#205, OLMo#915), a branch
holding one shard of another checkpoint (pythia#206), branches without weights (pythia#202),
configs with a development ``model_type`` (OLMo#813). From each branch's weight files and their
content sha256 (the Hub's tree API: LFS oids, nothing downloaded; offline, the cached snapshot's
blob names) and its config's ``model_type``, each branch gets one verdict:

    ok | duplicate of <branch> | foreign shard <file> from <branch> | no weights |
    truncated <file> | model_type <x> is not <family's>

A local checkpoint series (``series``: a training run's folder) is checked the same way, its checkpoint
folders as branches: each weight file's sha256 read from disk, and its size against what its header
declares (a truncated file).

Identical weights belong to the latest branch (by step) that holds them, because the known cases
are earlier branches serving later weights (pythia#205: branches equal to ``main``; pythia#206: the
final model's first shard); the earlier branch is the defective one. Equal sha256 means identical
bytes; different hashes do not prove different weights (a safetensors and a pickled copy of the
same tensors differ), so each branch is compared in the format a run reads.

The listings are kept in a JSON file (a sweep's ``integrity.json``), so that a resumed sweep or
a refinement asks the Hub only about branches it has not seen.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from emergence.core.atomic import atomic_write_text
from emergence.core.record import Record
from emergence.hub import series, weights
from emergence.hub.endpoint import hub_reachable

log = logging.getLogger(__name__)

INTEGRITY_FILE = "integrity.json"  # in a sweep directory: every branch's listing, per repo

# Development model_type names that published configs still carry, and the released name
# transformers knows the architecture by: OLMo-2-1124 branches uploaded before transformers
# renamed ``olmo_1124`` to ``olmo2`` (its PR 34864; OLMo#813).
MODEL_TYPE_ALIASES = {"olmo_1124": "olmo2"}

Verdict = Literal["ok", "duplicate", "foreign_shard", "no_weights", "truncated", "model_type"]


@dataclass(frozen=True)
class BranchFiles(Record):
    """What the check reads of one branch: no weights are downloaded."""

    step: int | None  # its training step (the family's naming), which orders branches
    weight_sha256: dict[str, str]  # weight file -> its content's sha256 (the format a run reads); {}: no weights
    model_type: str | None  # its config.json's model_type; None: no config
    truncated: str | None = None  # a local weight file whose size is not the one its header declares


@dataclass(frozen=True)
class RepoListing(Record):
    """The listed branches of one repo, and the model_type its family's configs must say."""

    expected_model_type: str | None
    branches: dict[str, BranchFiles]


@dataclass(frozen=True)
class BranchCheck(Record):
    """One branch's verdict."""

    branch: str
    verdict: Verdict
    other: str | None = None  # duplicate: the branch analysed in its place; foreign_shard: the one the file is of
    file: str | None = None  # foreign_shard: the weight file it shares; truncated: the file cut short
    model_type: str | None = None  # model_type: the config's, and the family's
    expected_model_type: str | None = None
    weights_sha256: str | None = None  # its weights' fingerprint (``weights.fingerprint``)

    @property
    def line(self) -> str:
        return {
            "ok": "ok",
            "duplicate": f"duplicate of {self.other}",
            "no_weights": "no weights",
            "foreign_shard": f"foreign shard {self.file} from {self.other}",
            "truncated": f"truncated {self.file}",
            "model_type": f"model_type {self.model_type} is not {self.expected_model_type}",
        }[self.verdict]

    @property
    def fails(self) -> bool:
        """A run of this branch would analyse wrong or no weights: it must stop (a duplicate is not
        wrong, only not distinct; a development model_type with a released name loads as that)."""
        if self.verdict == "model_type":
            aliased = None if self.model_type is None else MODEL_TYPE_ALIASES.get(self.model_type)
            return aliased != self.expected_model_type
        return self.verdict in ("foreign_shard", "no_weights", "truncated")


def verdicts(listings: dict[str, BranchFiles], expected_model_type: str | None) -> dict[str, BranchCheck]:
    """Each branch's verdict among ``listings`` (branch -> its files)."""
    listings = dict(sorted(listings.items(), key=lambda item: (item[1].step is None, item[1].step or 0)))
    owner_of_file: dict[str, str] = {}  # sha256 -> the latest branch holding it
    owner_of_weights: dict[tuple, str] = {}  # every weight file's sha256 -> the latest branch holding them all
    for branch, files in listings.items():
        for sha in files.weight_sha256.values():
            owner_of_file[sha] = branch
        if files.weight_sha256:
            owner_of_weights[tuple(sorted(files.weight_sha256.values()))] = branch
    checks = {}
    for branch, files in listings.items():
        fingerprint = weights.fingerprint(files.weight_sha256) if files.weight_sha256 else None
        foreign = [
            (name, owner_of_file[sha])
            for name, sha in sorted(files.weight_sha256.items())
            if owner_of_file[sha] != branch
        ]
        owner = owner_of_weights.get(tuple(sorted(files.weight_sha256.values())))
        if not files.weight_sha256:
            check = BranchCheck(branch, "no_weights")
        elif files.truncated:
            check = BranchCheck(branch, "truncated", file=files.truncated)
        elif owner != branch:
            check = BranchCheck(branch, "duplicate", other=owner)
        elif foreign:
            check = BranchCheck(branch, "foreign_shard", other=foreign[0][1], file=foreign[0][0])
        elif expected_model_type and files.model_type and files.model_type != expected_model_type:
            check = BranchCheck(
                branch, "model_type", model_type=files.model_type, expected_model_type=expected_model_type
            )
        else:
            check = BranchCheck(branch, "ok")
        checks[branch] = dataclasses.replace(check, weights_sha256=fingerprint)
    return checks


def hub_listing(repo: str, branch: str, step: int | None) -> BranchFiles:
    """A branch's weight files with their LFS sha256 (the tree API) and its config's model_type."""
    from huggingface_hub import hf_hub_download

    listing = weights.remote_files(repo, branch)
    files = weights.preferred(weights.formats_in(f.path for f in listing))
    sha = {f.path: f.sha256 for f in listing if files and f.path in files.shards and f.sha256}
    has_config = any(f.path == weights.CONFIG_FILE for f in listing)
    config = Path(hf_hub_download(repo, weights.CONFIG_FILE, revision=branch)) if has_config else None
    return BranchFiles(step, sha, _model_type(config))


def cached_listing(repo: str, branch: str, step: int | None) -> BranchFiles | None:
    """The same from the Hugging Face cache (the blob names are the sha256), None if not cached whole."""
    cached = weights.cached_snapshot(repo, branch, "auto")
    if cached is None:
        return None
    snapshot, files = cached
    return BranchFiles(
        step,
        {name: weights.file_sha256(snapshot / name) for name in files.shards},
        _model_type(snapshot / weights.CONFIG_FILE),
    )


def _model_type(config: Path | None) -> str | None:
    return json.loads(config.read_text()).get("model_type") if config is not None and config.exists() else None


def local_listing(folder: Path, step: int | None) -> BranchFiles:
    """A local checkpoint folder's weight files with their sha256 read from disk, the first one cut
    short (``series.truncated_file``), and its config's model_type."""
    files = weights.preferred(weights.formats_in(p.name for p in folder.iterdir())) if folder.is_dir() else None
    if files is None:
        return BranchFiles(step, {}, _model_type(folder / weights.CONFIG_FILE))
    return BranchFiles(
        step,
        {name: weights.file_sha256(folder / name) for name in files.shards},
        _model_type(folder / weights.CONFIG_FILE),
        series.truncated_file(folder, files),
    )


def list_branch(repo: str, branch: str, step: int | None) -> BranchFiles | None:
    """A branch's files from the Hub, or offline from the cache; None where neither can tell. A local
    series' checkpoint folder (``repo`` a folder) from disk."""
    if Path(repo).expanduser().is_dir():
        return local_listing(Path(repo).expanduser() / branch, step)
    if os.environ.get("HF_HUB_OFFLINE") == "1" or not hub_reachable():
        return cached_listing(repo, branch, step)
    from huggingface_hub.errors import HfHubHTTPError

    try:
        return hub_listing(repo, branch, step)
    except (HfHubHTTPError, OSError) as err:  # no such branch, the server gone: its run says why
        log.debug(f"integrity: {repo}@{branch} not listed: {err}")
        return None


def check(
    repo: str, branches: dict[str, int | None], expected_model_type: str | None, store: Path | None = None
) -> dict[str, BranchCheck]:
    """The verdicts of ``branches`` (name -> step) of ``repo``; branches that cannot be listed
    (offline and not cached, or missing) get none. ``store``: a JSON file keeping the listings."""
    kept = read_store(store)
    known = kept.setdefault(repo, RepoListing(expected_model_type, {})).branches
    missing = [b for b in branches if b not in known]
    if missing:
        from tqdm import tqdm

        for branch in tqdm(missing, desc=f"checking {repo}", unit="branch", disable=len(missing) < 5):
            listing = list_branch(repo, branch, branches[branch])
            if listing is not None:
                known[branch] = listing
        if store is not None:
            atomic_write_text(store, json.dumps({r: listing.to_json() for r, listing in kept.items()}, indent=1) + "\n")
    return verdicts({b: known[b] for b in branches if b in known}, expected_model_type)


def stored_verdicts(store: Path) -> dict[str, dict[str, BranchCheck]]:
    """Every branch's verdict among the branches of its repo that ``store`` keeps (a sweep's check):
    {repo: {branch: check}}."""
    return {
        repo: verdicts(listing.branches, listing.expected_model_type) for repo, listing in read_store(store).items()
    }


def read_store(store: Path | None) -> dict[str, RepoListing]:
    if store is None or not store.exists():
        return {}
    return {repo: RepoListing.from_json(listing) for repo, listing in json.loads(store.read_text()).items()}
