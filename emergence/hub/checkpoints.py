"""Which checkpoint a run analyses, and loading it.

* ``resolve_revision``: the model's panel + the revision config -> branch, step, tokens.
* ``check_attention_support``: refuses model classes our attention function cannot run, from the
  config alone.
* ``load_config``: the checkpoint's config.json (a development ``model_type`` mapped to its
  released name, ``MODEL_TYPE_ALIASES``).
* ``checkpoint_files`` / ``load_model``: the weight files a run reads (``weights``: safetensors,
  else pickles through torch's restricted unpickler), fetched alone, and a safe ``from_pretrained``
  (no remote code) with our capturing attention function.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import pickle
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

from emergence.core.config import ModelConfig, RevisionConfig
from emergence.core.errors import UsageError, first_line
from emergence.hub import gguf, revisions, text_sources, weights
from emergence.hub.endpoint import caused_by, connection_lost, hub_endpoint, hub_reachable
from emergence.hub.integrity import MODEL_TYPE_ALIASES
from emergence.hub.revision_names import parse_revision_name

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Revision:
    name: str | None  # branch / tag / commit, None for the checkpoint as it is
    step: int | None
    tokens: int | None


def resolve_revision(model: ModelConfig, asked: RevisionConfig, cache_dir: str) -> Revision:
    """The revision ``asked`` names of ``model`` (``cache_dir``: where a discovered panel is kept)."""
    revision = _resolve(model, asked, cache_dir)
    required = model.revision_required_for
    if required and re.search(required, model.name_or_path) and revision.name in (None, "main"):
        raise UsageError(
            f"revision={revision.name or 'final'} is invalid for {model.name_or_path}: its main branch "
            "may hold no weights; name a checkpoint (revision=r0..r9 or revision=custom "
            "revision.name=<branch>)"
        )
    return revision


def _resolve(model: ModelConfig, rev: RevisionConfig, cache_dir: str) -> Revision:
    panel = list(model.panel)
    series = revisions.local_series(model)  # a local folder of a run's checkpoints: its panel is proposed
    if rev.index is not None:
        # revision=final on a model without a panel: the checkpoint as it is, unless its main may hold no
        # weights and its branches can be listed by name (SmolLM2's intermediate checkpoints): their last
        main_may_be_empty = model.revision_required_for and re.search(model.revision_required_for, model.name_or_path)
        if not panel and series is None and rev.index == -1 and not (main_may_be_empty and model.revision_pattern):
            return Revision(rev.name, None, None)
        if not panel and series is None and model.revision_pattern is None:
            raise UsageError(
                f"revision.index={rev.index} is invalid: model {model.key!r} has no panel; "
                "use revision=custom revision.name=<branch> or revision=final"
            )
        panel = panel or revisions.discovered_panel(model, cache_dir)
        if not -len(panel) <= rev.index < len(panel):
            raise UsageError(
                f"revision.index={rev.index} is invalid: model {model.key!r} has {len(panel)} panel "
                f"revisions, use r0..r{len(panel) - 1} or final"
            )
        return panel_revision(panel[rev.index], model.tokens_per_step)
    if not rev.name:
        raise UsageError("revision.name=None is invalid: revision=custom needs revision.name=<branch>")
    for entry in panel + (series or []):
        if entry.revision == rev.name:
            return panel_revision(entry, model.tokens_per_step)
    if series is not None:
        wanted = max(map(int, re.findall(r"\d+", rev.name) or [0]))
        nearest = sorted(series, key=lambda e: abs(e.step - wanted))
        raise UsageError(
            f"revision.name={rev.name!r} is invalid: {model.name_or_path} has no checkpoint folder of "
            f"that name; nearest: {', '.join(e.revision for e in nearest[:2])} (list them: "
            f"{revisions.listing_command(model)})"
        )
    revisions.check_revision_name(rev.name, model, panel)
    step, tokens = parse_revision_name(rev.name, model.revision_pattern, model.tokens_per_step)
    return Revision(rev.name, step, tokens)


def panel_revision(entry, tokens_per_step: int | None) -> Revision:
    """A panel entry; tokens it does not state are step x model.tokens_per_step where that is set."""
    tokens = (
        entry.tokens if entry.tokens is not None else (int(entry.step) * tokens_per_step if tokens_per_step else None)
    )
    return Revision(entry.revision, int(entry.step), None if tokens is None else int(tokens))


# Architectures these tests run against eager attention (tests/helpers/tiny_models.py); others whose
# class supports the attention interface are accepted too.
TESTED_ARCHITECTURES = (
    "gemma2",
    "gpt2",
    "gpt_neox",
    "llama",
    "mistral",
    "olmo",
    "olmo2",
    "olmoe",
    "phi3",
    "qwen2",
    "qwen3",
)


SUPPORTED = (
    "supported are decoder-only causal LMs whose attention goes through transformers' AttentionInterface "
    f"(tested: {', '.join(TESTED_ARCHITECTURES)})"
)


def check_attention_support(hf_config, trust_remote_code: bool) -> None:
    """Stop before the weights load if the model class cannot run our attention function.

    transformers 5 marks classes whose attention goes through ``AttentionInterface`` with
    ``_supports_attention_backend``; others (bloom, falcon) would run without our function
    (or silently without a causal mask). Remote code brings its own class: the discovery
    pass after loading checks that one."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    model_type = hf_config.model_type
    if trust_remote_code and "AutoModelForCausalLM" in (getattr(hf_config, "auto_map", None) or {}):
        return
    model_class: Any = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(hf_config), None)
    if model_class is None or not model_class._supports_attention_backend:
        raise UsageError(
            f"model architecture {model_type!r} is not supported: its attention does not go through "
            f"transformers' AttentionInterface; {SUPPORTED}"
        )


def pick_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


def pick_dtype(requested: str) -> torch.dtype:
    """``auto`` is float32 on every device: the 1B panel fits any current GPU in it, and a 16-bit
    dtype moves selectivities by up to 0.6% (float16) or 2% (bfloat16) (docs/precision.md)."""
    return torch.float32 if requested == "auto" else getattr(torch, requested)


def dtype_name(dtype: torch.dtype) -> str:
    """torch.float32 -> "float32": how summaries and the measurement cache name a dtype."""
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Source:
    """Where ``from_pretrained`` reads a checkpoint from."""

    path: str  # local directory or Hub repo id
    revision: str | None
    local_only: bool  # a local directory or a revision already in the Hugging Face cache: no network
    cached_before: bool  # the Hub revision was in the cache before this run
    weights_format: str = "auto"  # model.weights_format: which weight files may be read (``weights.select``)
    gguf_file: str | None = None  # model.gguf_file: the one GGUF file that holds config, weights and tokenizer


def _cached_snapshot(src: Source) -> Path | None:
    """The cache's snapshot directory of a Hub revision if it holds the whole checkpoint
    (``weights.cached_snapshot``)."""
    cached = weights.cached_snapshot(src.path, src.revision, src.weights_format)
    return None if cached is None else cached[0]


def source(model: ModelConfig, revision: Revision) -> Source:
    """A toy panel and a local series keep each revision in a subdirectory, the way a Hub repo keeps it in
    a branch."""
    if model.toy is not None or (revision.name is not None and revisions.local_series(model) is not None):
        assert revision.name is not None  # a toy's revisions are named folders too
        return Source(
            str(Path(model.name_or_path).expanduser() / revision.name), None, True, True, model.weights_format
        )
    path = model.name_or_path
    if Path(path).expanduser().is_dir():
        return Source(str(Path(path).expanduser()), revision.name, True, True, model.weights_format, model.gguf_file)
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(path)
    except HFValidationError:
        raise UsageError(
            f"model.name_or_path={path!r} is invalid: it is neither a directory nor a Hub repo id (org/name)"
        ) from None
    if model.gguf_file:
        from huggingface_hub import try_to_load_from_cache

        cached = isinstance(try_to_load_from_cache(path, model.gguf_file, revision=revision.name), str)
    else:
        cached = weights.cached_snapshot(path, revision.name, model.weights_format) is not None
    return Source(path, revision.name, cached, cached, model.weights_format, model.gguf_file)


def gguf_file_path(src: Source) -> Path:
    """The GGUF file of a ``model.gguf_file`` source, on this machine (``gguf.gguf_path``)."""
    check_hub(src)
    assert src.gguf_file is not None  # a model.gguf_file source
    return gguf.gguf_path(src.path, src.gguf_file, src.revision, src.local_only)


def _where(src: Source) -> str:
    return f"{src.path}@{src.revision}" if src.revision else src.path


def _fetch_hint(src: Source) -> str:
    return f"hf download {src.path} --revision {src.revision or 'main'}"


def check_hub(src: Source) -> None:
    """Stop in one line when a checkpoint that is not cached cannot be fetched, before
    huggingface_hub retries each request for half a minute."""
    if src.local_only:
        return
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        why = "HF_HUB_OFFLINE=1"
    elif not hub_reachable():
        why = f"the Hub endpoint {hub_endpoint()} is not reachable"
    else:
        return
    raise UsageError(
        f"model.name_or_path={_where(src)!r} cannot be loaded: it is not in the local Hugging Face "
        f"cache and {why}; run again when the Hub is reachable, or fetch it where there is a network: "
        f"{_fetch_hint(src)}"
    )


def _download_error(model: ModelConfig, src: Source, err: OSError) -> UsageError | None:
    """A one-line UsageError for a Hub checkpoint whose download failed for a reason the user
    can act on: the server went away, or it has no such repo or revision. None otherwise."""
    if src.local_only:
        return None
    if connection_lost(err) or not hub_reachable():
        return UsageError(
            f"model.name_or_path={_where(src)!r} cannot be loaded: the Hub endpoint {hub_endpoint()} "
            "stopped answering during the download; run again when it is reachable (a sweep: relaunch "
            "it, finished jobs are kept)"
        )
    from huggingface_hub.errors import RepositoryNotFoundError

    if not caused_by(err, (RepositoryNotFoundError,)):
        return None
    # The Hub says "repository not found" for a missing revision too (olah, gated repos): the
    # repo's branches tell which one is missing.
    branches = revisions.list_branches(src.path)  # a UsageError if the repo does not exist
    return UsageError(
        f"model.name_or_path={_where(src)!r} cannot be loaded: {src.path} on {hub_endpoint()} has no "
        f"revision {src.revision!r} ({len(branches)} branches); list them: python -m emergence.revisions "
        f"{model.key} --repo {src.path}"
    )


@dataclass(frozen=True)
class CheckpointConfig:
    """A checkpoint's config.json, as transformers reads it."""

    hf_config: Any  # transformers' PreTrainedConfig (its fields depend on the model type)
    model_type_mapped_from: str | None  # the config's own model_type where it was mapped (MODEL_TYPE_ALIASES)
    gguf: gguf.GgufHeader | None = None  # model.gguf_file: its tensors' types before dequantization


def load_config(model: ModelConfig, src: Source) -> CheckpointConfig:
    """The checkpoint's config.json (a GGUF file's header): cheap, and enough to validate before loading weights."""
    if src.gguf_file:
        return _gguf_config(model, src)
    check_hub(src)
    options = dict(revision=src.revision, local_files_only=src.local_only)
    mapped_from = None
    try:
        hf_config = AutoConfig.from_pretrained(src.path, trust_remote_code=model.trust_remote_code, **options)
    except (OSError, ValueError) as err:  # unknown repo, branch or model type, bad path, broken download
        unknown = re.search(r"model type `([^`]+)` but Transformers does not recognize", str(err))
        if unknown and unknown.group(1) in MODEL_TYPE_ALIASES:
            mapped_from = unknown.group(1)
            hf_config = _aliased_config(src.path, options)
        elif unknown:
            raise UsageError(
                f"model architecture {unknown.group(1)!r} is not supported: transformers "
                f"{transformers.__version__} does not know it; {SUPPORTED}"
            ) from None
        else:
            hub_error = _download_error(model, src, err) if isinstance(err, OSError) else None
            if hub_error:
                raise hub_error from None
            raise UsageError(
                f"model.name_or_path={_where(src)!r} cannot be loaded: {type(err).__name__}: {first_line(err)}"
            ) from None
    check_attention_support(hf_config, model.trust_remote_code)
    return CheckpointConfig(hf_config, mapped_from)


def _gguf_config(model: ModelConfig, src: Source) -> CheckpointConfig:
    """A GGUF file's config, as transformers maps its header onto the architecture's config class;
    the header is read first, which refuses a truncated or foreign file in one line."""
    path = gguf_file_path(src)
    header = gguf.read_header(path)
    try:
        hf_config = AutoConfig.from_pretrained(
            path.parent, gguf_file=path.name, trust_remote_code=model.trust_remote_code
        )
    except (ValueError, KeyError) as err:  # an architecture transformers' GGUF path does not map
        raise UsageError(
            f"model.gguf_file={src.gguf_file!r} cannot be loaded: transformers {transformers.__version__} "
            f"does not read GGUF architecture {header.architecture!r} ({first_line(err)})"
        ) from None
    check_attention_support(hf_config, model.trust_remote_code)
    return CheckpointConfig(hf_config, None, header)


def _aliased_config(path: str, options: dict):
    """A config whose model_type is a development name, read as the released architecture."""
    from transformers import CONFIG_MAPPING, PretrainedConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    values, _ = PretrainedConfig.get_config_dict(path, **options)
    model_type = MODEL_TYPE_ALIASES[values.pop("model_type")]
    values["architectures"] = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]]
    return CONFIG_MAPPING[model_type].from_dict(values)


def checkpoint_files(model: ModelConfig, src: Source) -> tuple[Path, weights.WeightFiles]:
    """The local directory holding the checkpoint's config and weights, and the weight files a run
    reads there (``weights.select``): a local checkpoint as it is; a Hub revision from the cache,
    or else downloaded (its config and those files only)."""
    local = Path(src.path).expanduser()
    if local.is_dir():
        found = weights.formats_in(p.name for p in local.iterdir())
        return local, weights.select(found, src.weights_format, str(local))
    cached = weights.cached_snapshot(src.path, src.revision, src.weights_format)
    if cached is not None:
        return cached
    check_hub(src)
    try:
        listing = weights.remote_files(src.path, src.revision)
        files = weights.select(weights.formats_in(f.path for f in listing), src.weights_format, _where(src))
        weights.download(src.path, src.revision, files)
    except OSError as err:  # the server gone, no such revision (huggingface_hub's errors are OSErrors)
        raise (
            _download_error(model, src, err)
            or UsageError(f"model.name_or_path={_where(src)!r} cannot be loaded: {first_line(err)}")
        ) from None
    cached = weights.cached_snapshot(src.path, src.revision, src.weights_format)
    if cached is None:  # the server listed files it then did not serve whole
        raise UsageError(
            f"model.name_or_path={_where(src)!r} cannot be loaded: its download is incomplete; "
            f"run again, or fetch it: {_fetch_hint(src)}"
        )
    return cached


# A tokenizer's vocabulary, in the files transformers reads it from (a revision holding none of
# them has no tokenizer of its own), and the files that go with it.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")
TOKENIZER_COMPANIONS = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "merges.txt")


@dataclass(frozen=True)
class TokenizerSource:
    """Where the text probe's tokenizer is read from."""

    directory: str  # a local checkpoint, or the cache's snapshot holding the tokenizer's files
    name: str  # repo@revision it comes from (``summary.json`` ``text.tokenizer``)
    gguf_file: str | None = None  # a GGUF file in ``directory`` that holds the tokenizer (``model.gguf_file``)


def tokenizer_source(model: ModelConfig, src: Source) -> TokenizerSource:
    """The text probe's tokenizer: the revision's own files, else ``main``'s, else those of the
    family's first branch that has them (tokenizers do not change in pretraining; Amber's and CRFM's
    step branches carry none, SmolLM2's main holds nothing). Only the tokenizer's files are fetched
    (offline: what the cache holds). A local checkpoint: itself. A GGUF file: the tokenizer it holds."""
    if src.gguf_file:
        path = gguf_file_path(src)
        return TokenizerSource(str(path.parent), f"{src.path}/{src.gguf_file}", path.name)
    if Path(src.path).expanduser().is_dir():
        return TokenizerSource(src.path, f"{src.path}@{src.revision or 'main'}")
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    candidates = list(dict.fromkeys([src.revision or "main", "main"]))
    if os.environ.get("HF_HUB_OFFLINE") == "1" or not hub_reachable():
        for revision in candidates:
            for name in TOKENIZER_FILES:
                found = try_to_load_from_cache(src.path, name, revision=revision)
                if isinstance(found, str):
                    return TokenizerSource(str(Path(found).parent), f"{src.path}@{revision}")
    else:
        branches = (
            e.revision
            for e in revisions.parse_branches(
                revisions.list_branches(src.path), model.revision_pattern, model.tokens_per_step
            )
        )
        for revision in itertools.chain(candidates, branches):  # the branches are listed only if needed
            try:
                names = {f.path for f in weights.remote_files(src.path, revision)}
            except OSError:  # no such revision (main of a repo that keeps none): look further
                continue
            if names & set(TOKENIZER_FILES):
                files = sorted(names & {*TOKENIZER_FILES, *TOKENIZER_COMPANIONS})
                paths = [hf_hub_download(src.path, f, revision=revision) for f in files]
                return TokenizerSource(str(Path(paths[0]).parent), f"{src.path}@{revision}")
    raise UsageError(
        f"{_where(src)} has no tokenizer files, nor has main or any branch of {src.path}; for a model "
        "that reads bytes use probe.tokenizer=bytes"
    )


class TokenizerLookup:
    """The checkpoint's tokenizer, located at most once a run: the first token, the text probe and the
    task each ask for it, and on the Hub each ``tokenizer_source`` lists the revision's files. A model in
    memory (``emergence.track``, ``src`` None) has no files: its tokenizer is the one handed in, if any."""

    def __init__(self, model: ModelConfig, src: Source | None, given=None):
        self.model, self.src, self.given = model, src, given

    @property
    def where(self) -> str:
        """The checkpoint, as the lines about its tokenizer name it."""
        return "the model in memory" if self.src is None else _where(self.src)

    def load(self, fix: str):
        """(the Hugging Face tokenizer, its name); ``UsageError`` (one line ending in ``fix``) where there is none."""
        if self.given is not None:
            return self.given, getattr(self.given, "name_or_path", None) or "the tokenizer handed to track"
        if self.src is None:
            raise UsageError(f"the model in memory has no tokenizer: hand it to track (tokenizer=...); {fix}")
        found = self.source()
        return text_sources.load_tokenizer(
            found.directory, found.name, self.model.trust_remote_code, fix, found.gguf_file
        ), found.name

    @functools.cached_property
    def _found(self) -> TokenizerSource | UsageError:
        if self.src is None:
            return UsageError("the model in memory has no tokenizer files: hand its tokenizer to track")
        try:
            return tokenizer_source(self.model, self.src)
        except UsageError as err:  # kept: each asker says it in its own way, or raises it
            return err

    def source(self) -> TokenizerSource:
        """Where the tokenizer is; ``UsageError`` (one line) where the checkpoint has none."""
        if isinstance(self._found, UsageError):
            raise self._found
        return self._found


def weights_sha256(src: Source) -> str | None:
    """A fingerprint of the checkpoint's weights (the files of the format a run reads, ``weights``),
    from each weight file's content sha256; None if they are not on this machine. Two revisions
    with the same fingerprint serve the same weights. In the Hub cache the digests are the blobs'
    names: no weights are read."""
    if src.gguf_file:
        path = gguf_file_path(src)
        return weights.file_sha256(path)
    snapshot = Path(src.path) if Path(src.path).is_dir() else _cached_snapshot(src)
    files = weights.preferred(weights.formats_in(p.name for p in snapshot.iterdir())) if snapshot else None
    if files is None or snapshot is None:  # files is None without a snapshot
        return None
    return weights.fingerprint({name: weights.file_sha256(snapshot / name) for name in files.shards})


def weights_identity(src: Source) -> str | None:
    """The content fingerprint of the weights a run of ``src`` reads (``weights.fingerprint``): of the
    files on this machine where they are (a local folder, a GGUF file, a Hub revision in the cache,
    which the loader reads as it is), else of the files the Hub lists for the revision, by the sha256
    it gives of each (what the run will download). None where neither is known (the Hub unreachable,
    or a weight file it stores outside LFS)."""
    local = weights_sha256(src)
    if local is not None or src.local_only:
        return local
    try:
        listing = weights.remote_files(src.path, src.revision)
    except OSError:
        return None
    files = weights.preferred(weights.formats_in(f.path for f in listing))
    digests = {f.path: f.sha256 for f in listing if files is not None and f.path in files.shards}
    if not digests or None in digests.values():
        return None
    return weights.fingerprint(cast(dict[str, str], digests))  # no None among them


def downloaded_bytes(src: Source) -> int:
    """Bytes of the revision's files in the cache if this run downloaded them, else 0."""
    if src.cached_before:
        return 0
    snapshot = _cached_snapshot(src)
    return 0 if snapshot is None else sum(f.resolve().stat().st_size for f in snapshot.rglob("*") if f.is_file())


def remove_from_cache(src: Source) -> int:
    """Delete a revision this run downloaded from the Hugging Face cache; returns bytes freed."""
    if src.cached_before:
        return 0
    snapshot = _cached_snapshot(src)
    if snapshot is None:
        return 0
    from huggingface_hub import scan_cache_dir

    strategy = scan_cache_dir(snapshot.parents[2]).delete_revisions(snapshot.name)
    strategy.execute()
    return strategy.expected_freed_size


def weight_bytes(hf_config, dtype: torch.dtype) -> int:
    """Bytes the weights take in ``dtype``, counted on the meta device (nothing allocated)."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    return sum(p.numel() for p in model.parameters()) * dtype.itemsize


def free_memory(device: torch.device) -> int | None:
    """Free bytes on the device (CUDA) or available RAM (Linux); None if unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return None


def check_memory(hf_config, dtype: torch.dtype, device: torch.device) -> int:
    """Stop before loading weights that cannot fit (weights + 20% for activations)."""
    need = weight_bytes(hf_config, dtype)
    free = free_memory(device)
    if free is not None and need * 1.2 > free:
        raise UsageError(
            f"model.dtype={str(dtype).removeprefix('torch.')!r} is invalid here: the weights need "
            f"{need / 2**30:.1f} GiB (+20% working memory) but {device.type} has "
            f"{free / 2**30:.1f} GiB free; use a larger device or a smaller dtype"
        )
    return need


def auto_batch_size(free_bytes: int, seq_len: int, hf_config, dtype: torch.dtype, ceiling: int = 512) -> int:
    """Sequences per forward that fit in half the free memory (after the weights are loaded).

    Per sequence and layer, inference holds about the residual stream, q/k/v, the MLP
    activation and (if SDPA falls back to its math kernel) the attention scores; ablation
    multiplies rows, so the caller divides by its number of head sets itself."""
    hidden = hf_config.hidden_size
    mlp = getattr(hf_config, "intermediate_size", 4 * hidden)
    per_token = (4 * hidden + mlp + hf_config.num_attention_heads * seq_len) * dtype.itemsize
    per_sequence = 2 * seq_len * per_token + 4 * hf_config.vocab_size  # x2: a layer's input and output live
    return int(max(1, min(ceiling, free_bytes // 2 // per_sequence)))


def load_model(
    model: ModelConfig,
    src: Source,
    checkpoint: CheckpointConfig,
    device: torch.device,
    dtype: torch.dtype,
    attn_implementation: str,
):
    """The model, with the attention function ``attn_implementation`` names (the recipe's capturing one:
    ``capture.register_attention()``), from the weight files ``checkpoint_files`` picks: safetensors, or
    pickles through torch's restricted unpickler (``weights_only=True``, which refuses any pickle that
    would call code); never code from the checkpoint unless ``model.trust_remote_code``."""
    from safetensors import SafetensorError

    if src.gguf_file:
        return _load_gguf_model(model, src, checkpoint, (device, dtype), attn_implementation)
    directory, files = checkpoint_files(model, src)
    os.environ["DISABLE_SAFETENSORS_CONVERSION"] = "1"  # transformers must not ask the Hub to convert a pickle
    try:
        net: torch.nn.Module = AutoModelForCausalLM.from_pretrained(
            directory,
            config=checkpoint.hf_config,
            local_files_only=True,
            dtype=dtype,
            use_safetensors=files.format == "safetensors",
            weights_only=True,
            trust_remote_code=model.trust_remote_code,
            attn_implementation=attn_implementation,
        )
    except SafetensorError as err:  # a download cut short, a disk error
        fix = (
            "replace the file"
            if Path(src.path).expanduser().is_dir()
            else f"fetch it again: {_fetch_hint(src)} --force-download"
        )
        raise UsageError(
            f"model.name_or_path={_where(src)!r} cannot be loaded: its safetensors weights are truncated "
            f"or corrupt ({first_line(err)}); {fix}"
        ) from None
    except pickle.UnpicklingError as err:  # the restricted unpickler refused a pickle that calls code, or read garbage
        refused = _refused_global(err)
        if refused is None:  # no global refused: the bytes are no pickle torch can read
            broken = unreadable_shard(directory, files) or (files.shards[0], first_line(err))
            raise _broken_pickle(src, directory, broken) from None
        raise UsageError(
            f"model.name_or_path={_where(src)!r} cannot be loaded: {', '.join(files.shards)} is refused: "
            f"its pickle would call code ({refused}), which weights_only=True never runs; "
            "use a checkpoint in safetensors, or one from a source you trust"
        ) from None
    except (OSError, EOFError, RuntimeError, UnicodeDecodeError) as err:  # a broken pickle; a missing shard
        # torch reports a broken pickle by whatever its reader tripped on, so it is named only once a
        # shard is seen to fail on its own; any other error (a missing shard aside) is not ours to reword
        shard = unreadable_shard(directory, files) if files.format == "pickle" else None
        if shard is not None:
            raise _broken_pickle(src, directory, shard) from None
        if not isinstance(err, OSError):
            raise
        raise UsageError(f"model.name_or_path={_where(src)!r} cannot be loaded: {first_line(err)}") from None
    return net.to(device).eval()


def _load_gguf_model(
    model: ModelConfig,
    src: Source,
    checkpoint: CheckpointConfig,
    placement: tuple[torch.device, torch.dtype],
    attn_implementation: str,
):
    """A GGUF file's model: transformers dequantizes every tensor to the ``placement``'s dtype (no pickle, no
    code), then moves it to its device."""
    device, dtype = placement
    path = gguf_file_path(src)
    net: torch.nn.Module = AutoModelForCausalLM.from_pretrained(
        path.parent,
        gguf_file=path.name,
        config=checkpoint.hf_config,
        local_files_only=True,
        dtype=dtype,
        trust_remote_code=model.trust_remote_code,
        attn_implementation=attn_implementation,
    )
    return net.to(device).eval()


def _refused_global(err: pickle.UnpicklingError) -> str | None:
    """The global torch's restricted unpickler refused, as its message names it; None when it
    refused none (the file is no pickle it can read: cut short or corrupt)."""
    found = re.search(r"(?:unsupported|Unsupported global:) GLOBAL ([\w.]+)", str(err))
    return f"global {found.group(1)}" if found else None


def unreadable_shard(directory: Path, files: weights.WeightFiles) -> tuple[str, str] | None:
    """The first pickled weight file torch cannot read on its own, and why (its error's first line),
    or None. Zip pickles are memory-mapped, so a large shard is not read into memory for this."""
    import zipfile

    for name in files.shards:
        path = Path(directory) / name
        try:
            torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
        except Exception as err:  # whatever torch trips on: the file is unreadable
            return name, first_line(err)
    return None


def _broken_pickle(src: Source, directory: Path, broken: tuple[str, str]) -> UsageError:
    """The one line for a pickled weight file cut short or corrupt (``unreadable_shard``'s file and
    why): which file, and how to get it whole."""
    name, why = broken
    path = Path(directory) / name
    fix = (
        "replace the file"
        if Path(src.path).expanduser().is_dir()
        else f"delete it from the Hugging Face cache ({path.resolve()}) and download it again: "
        f"{_fetch_hint(src)} --force-download"
    )
    return UsageError(
        f"model.name_or_path={_where(src)!r} cannot be loaded: {path} is truncated or corrupt ({why[:200]}); {fix}"
    )
