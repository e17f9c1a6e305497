"""A local checkpoint series: the folder one training run saves its checkpoints in, read as a model
family (docs/own-runs.md). ``model=local model.name_or_path=DIR`` where DIR holds, one per subfolder:

* ``checkpoint-<step>/`` (transformers' ``Trainer``): step and tokens from the folder's
  ``trainer_state.json`` (``global_step``; ``num_input_tokens_seen`` where the run recorded it,
  ``include_num_input_tokens_seen=True``), the step from the name where that file is missing;
* ``step<N>/`` and ``step<N>-tokens<M>B/`` (the Hub families' branch names, as folders);
* the toy layout (``step<N>/`` beside a ``manifest.json`` that states each one's tokens).

Tokens a folder does not state are step x ``model.tokens_per_step`` where that is set. A folder holding
``config.json`` itself is one checkpoint, not a series. Only each checkpoint's ``config.json``,
``trainer_state.json`` and weight files are ever read: never its optimizer, scheduler or RNG states.

The run may still be writing to DIR: a checkpoint folder whose files are not all whole yet
(``unfinished``) is listed, but ``python -m emergence.watch`` reads it only once it is.
"""

from __future__ import annotations

import json
import logging
import re
import struct
import zipfile
from pathlib import Path

from emergence.core.config import PanelEntry
from emergence.core.errors import UsageError
from emergence.hub import weights
from emergence.hub.revision_names import parse_revision_name

log = logging.getLogger(__name__)
_unreadable_warned: set[Path] = set()  # each unreadable trainer_state.json is named once per process

TRAINER_STATE = "trainer_state.json"
TRAINER_FOLDER = re.compile(r"checkpoint-(?P<step>\d+)")
MANIFEST = "manifest.json"  # a trained toy's (``toy.train``): each saved checkpoint's revision, step and tokens
LAYOUTS = "checkpoint-<step>/, step<N>/ or step<N>-tokens<M>B/"
# The config fields that fix a model's shape; checkpoints of one run agree on all of them.
SHAPE_KEYS = (
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "hidden_size",
    "intermediate_size",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
    "n_layer",
    "n_head",
    "n_embd",
    "n_inner",
    "n_positions",
    "num_experts",
    "num_local_experts",
    "num_experts_per_tok",
)


def is_series(path: str | Path) -> bool:
    """A local folder that is no checkpoint itself (no ``config.json``) but holds checkpoint folders."""
    root = Path(path).expanduser()
    return (
        root.is_dir()
        and not (root / weights.CONFIG_FILE).exists()
        and any(step_of_name(p.name) is not None for p in root.iterdir() if p.is_dir())
    )


def step_of_name(name: str) -> int | None:
    """The step a checkpoint folder's name states (``checkpoint-<step>``, ``step<N>...``); None: no
    checkpoint's name."""
    found = TRAINER_FOLDER.fullmatch(name)
    return int(found.group("step")) if found else parse_revision_name(name, None, None)[0]


def checkpoints(path: str | Path, tokens_per_step: int | None) -> list[PanelEntry]:
    """Every checkpoint of the series at ``path``, ordered by step; a UsageError (one line) for a folder
    that holds none, or whose checkpoints are not one model (``one_model``)."""
    root = Path(path).expanduser()
    manifest = _toy_tokens(root)
    entries = []
    for folder in root.iterdir():
        if not folder.is_dir() or step_of_name(folder.name) is None:
            continue
        if TRAINER_FOLDER.fullmatch(folder.name):
            entries.append(_trainer_entry(folder, tokens_per_step))
        else:
            step, tokens = parse_revision_name(folder.name, None, tokens_per_step)
            assert step is not None  # _step_of_name read it
            entries.append(PanelEntry(folder.name, step, manifest.get(folder.name, tokens)))
    if not entries:
        raise UsageError(
            f"model.name_or_path={str(path)!r} is invalid: it holds neither a checkpoint (config.json) "
            f"nor checkpoint folders ({LAYOUTS}); name a checkpoint or the output folder of a run"
        )
    entries.sort(key=lambda e: (e.step, e.revision))
    one_model(root, entries)
    return entries


def _trainer_entry(folder: Path, tokens_per_step: int | None) -> PanelEntry:
    """A ``Trainer`` checkpoint: its ``trainer_state.json`` states the step and (where the run counted
    them) the tokens seen; without it, the step in the folder's name."""
    found = TRAINER_FOLDER.fullmatch(folder.name)
    assert found is not None  # a Trainer folder's name
    step = int(found.group("step"))
    values = _json_or_none(folder / TRAINER_STATE)
    seen = None
    if values is None and (folder / TRAINER_STATE).exists() and folder not in _unreadable_warned:
        _unreadable_warned.add(folder)
        log.warning(
            f"warning: {folder / TRAINER_STATE} does not parse (cut short, or still being written): "
            f"step {step} from the folder's name, tokens unknown"
            + ("" if tokens_per_step is None else f" (step x model.tokens_per_step={tokens_per_step})")
        )
    if values is not None:
        step = int(values.get("global_step", step))
        seen = values.get("num_input_tokens_seen") or None  # 0: the run did not count them
    tokens = int(seen) if seen is not None else (step * tokens_per_step if tokens_per_step else None)
    return PanelEntry(folder.name, step, tokens)


def saved_checkpoints(root: Path) -> list[PanelEntry]:
    """Every checkpoint a trained toy's folder holds (its manifest), in the manifest's order (by step);
    empty for any other folder, or a toy not trained yet."""
    manifest = root / MANIFEST
    if not manifest.exists():
        return []
    return [
        PanelEntry(c["revision"], c["step"], c["tokens"])
        for c in json.loads(manifest.read_text()).get("checkpoints", [])
    ]


def _toy_tokens(root: Path) -> dict[str, int]:
    """The toy layout's tokens per checkpoint (its training manifest), {} for any other folder."""
    return {c.revision: int(c.tokens) for c in saved_checkpoints(root) if c.tokens is not None}


def _json_or_none(path: Path):
    """A JSON file's content; None where it is missing, or cut short because the run is still writing it
    (a checkpoint being saved beside the one a command reads must not stop that command)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _shape(config: Path) -> dict | None:
    values = _json_or_none(config)
    if values is None:
        return None
    return {"model_type": values.get("model_type"), **{k: values[k] for k in SHAPE_KEYS if k in values}}


def one_model(root: Path, entries: list[PanelEntry]) -> None:
    """Refuse a series whose checkpoints differ in architecture or shape, naming the first two that do."""
    first = None
    for entry in entries:
        shape = _shape(root / entry.revision / weights.CONFIG_FILE)
        if shape is None:  # no config (or one being written): the check (``local_listing``) names it
            continue
        if first is None:
            first = entry.revision, shape
        elif shape != first[1]:
            differ = [k for k in dict.fromkeys([*first[1], *shape]) if first[1].get(k) != shape.get(k)]
            said = ", ".join(f"{k} {first[1].get(k)} vs {shape.get(k)}" for k in differ)
            raise UsageError(
                f"model.name_or_path={str(root)!r} is invalid: its checkpoints are not one model: "
                f"{first[0]} and {entry.revision} differ ({said}); give the folder of one run"
            )


def truncated_file(folder: Path, files: weights.WeightFiles) -> str | None:
    """The first weight file shorter (or longer) than its own header declares, None if all are whole: a
    safetensors file's header states where its last tensor ends; a zip pickle ends in its directory."""
    for name in files.shards:
        path = folder / name
        size = path.stat().st_size
        if files.format == "pickle":
            if not zipfile.is_zipfile(path):
                return name
            continue
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return name
            (length,) = struct.unpack("<Q", head)
            try:
                header = json.loads(f.read(length))
            except ValueError:
                return name
        end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        if size != 8 + length + end:
            return name
    return None


def unfinished(folder: Path) -> str | None:
    """Why a checkpoint folder is not whole yet (its run is still writing it, or gave up), None when it is:
    ``config.json`` parses, every weight file its format needs is there (every shard its index names) at the
    size its header declares (``truncated_file``), and a ``Trainer``'s folder holds ``trainer_state.json``,
    which the ``Trainer`` writes after the weights."""
    try:
        if _json_or_none(folder / weights.CONFIG_FILE) is None:
            return f"no whole {weights.CONFIG_FILE} yet"
        files = weights.preferred(weights.formats_in(p.name for p in folder.iterdir()))
        if files is None:
            return "no weights yet"
        try:
            if not weights.shards_complete(folder, files):
                return f"not every shard {files.index} names is there yet"
        except ValueError:  # the index itself cut short
            return f"no whole {files.index} yet"
        cut = truncated_file(folder, files)
        if cut is not None:
            return f"{cut} is shorter than its header declares"
        if TRAINER_FOLDER.fullmatch(folder.name) and _json_or_none(folder / TRAINER_STATE) is None:
            return f"no whole {TRAINER_STATE} yet"
    except OSError:  # a file removed while it was read: the run is deleting the folder
        return "being removed"
    return None
