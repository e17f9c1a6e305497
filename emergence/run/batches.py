"""What a run probes a checkpoint with, from what the Hub gives of it: position 0's token (the
first-token policy, ``probe.first_token``), the probe batch and a task's batch, built on the
checkpoint's own tokenizer where they need one (``hub.checkpoints.TokenizerLookup``) and the text
probe's documents (``hub.text_sources``). The batches' maths is the recipe's (``recipe.probe``,
``recipe.text``, ``recipe.tasks.batches``); this is the glue between it and the Hub.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import cast

from emergence.core.config import Config
from emergence.core.errors import UsageError
from emergence.hub import checkpoints, text_sources
from emergence.recipe import probe, text
from emergence.recipe.tasks.batches import Task, TaskBatch, build_task_batch

log = logging.getLogger(__name__)


def first_token(cfg: Config, tokenizers: checkpoints.TokenizerLookup) -> probe.FirstToken:
    """What position 0 of the probe and the task prompts holds (``probe.first_token``): under ``auto``, the
    BOS id where the checkpoint's tokenizer puts it before every input (the model was trained behind it),
    else an ordinary random token, the study's. ``random`` where that tokenizer prepends a BOS warns: the
    model then reads a text unlike any it saw in training (its sinks may not show)."""
    requested, where = cfg.probe.first_token, tokenizers.where
    if cfg.probe.kind == "text" and cfg.probe.tokenizer == "bytes":
        return probe.FirstToken("random", None, "probe.tokenizer=bytes: ids without special tokens")
    tok, missing = _first_token_tokenizer(cfg, tokenizers)
    if tok is None:
        if requested == "bos_token":
            raise UsageError(f"probe.first_token=bos_token is invalid for {where}: {missing}; use random")
        return probe.FirstToken("random", None, f"probe.first_token={requested}: {missing}")
    prepended = text.prepended_bos(tok)
    says = (
        f"its tokenizer puts {tok.bos_token!r} (id {prepended}) before every input"
        if prepended is not None
        else "its tokenizer puts no BOS before an input"
    )
    if requested == "random":
        if prepended is not None:
            log.warning(
                f"probe.first_token=random on {where}, whose tokenizer puts {tok.bos_token!r} before "
                "every input: the model reads sequences unlike its training's (probe.first_token=auto "
                "puts it first)"
            )
        return probe.FirstToken("random", None, f"probe.first_token=random ({says})")
    if requested == "bos_token":
        if tok.bos_token_id is None:
            raise UsageError(
                f"probe.first_token=bos_token is invalid for {where}: its tokenizer has no BOS token; use random"
            )
        return probe.FirstToken("bos_token", tok.bos_token_id, f"probe.first_token=bos_token ({says})")
    if prepended is None:
        return probe.FirstToken("random", None, f"probe.first_token=auto: {says}")
    return probe.FirstToken("bos_token", prepended, f"probe.first_token=auto: {says}")


def _first_token_tokenizer(cfg: Config, tokenizers: checkpoints.TokenizerLookup):
    """The checkpoint's tokenizer for ``first_token``, or None and why there is none (a toy's folder, a
    Hub repo whose tokenizer is neither cached nor reachable, a model in memory handed none)."""
    src = tokenizers.src
    if src is None and tokenizers.given is None:
        return None, "track was handed no tokenizer"
    local = None if src is None or src.gguf_file else Path(src.path).expanduser()
    files = checkpoints.TOKENIZER_FILES
    if local is not None and local.is_dir() and not any((local / name).exists() for name in files):
        return None, f"{local} holds no tokenizer files"
    try:
        return tokenizers.load("or set probe.first_token")[0], None
    except UsageError as err:
        return None, f"no tokenizer ({err})"


def probe_batch(
    cfg: Config, vocab_size: int, first: probe.FirstToken, tokenizers: checkpoints.TokenizerLookup
) -> tuple[probe.ProbeBatch, str | None]:
    """The probe batch ``probe.kind`` names, position 0 as ``first`` says, and the text probe's tokenizer
    (None for the others): the checkpoint's own (``checkpoints.tokenizer_source``) or bytes."""
    p = cfg.probe
    if p.kind == "text":
        if p.tokenizer == "bytes":
            tokenizer = text.byte_tokenizer()
        else:
            tokenizer = text.probe_tokenizer(*tokenizers.load("for a model that reads bytes use probe.tokenizer=bytes"))
        tokenizer = dataclasses.replace(tokenizer, bos=first.bos_id)  # windows start with it (``make_text_batch``)
        return text.text_batch(text_sources.documents(p), p, tokenizer, vocab_size), tokenizer.name
    make = probe.make_repeat_batch if p.kind == "repeat" else probe.make_probe_batch
    return probe.with_first_token(make(p.n_sequences, p.seq_len, p.vocab_low, p.vocab_high, p.seed), first), None


def task_batch(cfg: Config, first: probe.FirstToken, tokenizers: checkpoints.TokenizerLookup) -> tuple[TaskBatch, str]:
    """The batch of the task ``probe.task`` names, built on the checkpoint's own tokenizer
    (``checkpoints.tokenizer_source``) from the words ``probe.task_words`` picks, each prompt behind ``first``'s BOS
    where it has one, and that tokenizer's name (repo@revision)."""
    tokenizer, name = tokenizers.load("probe.task needs the checkpoint's tokenizer: save it beside the weights")
    return build_task_batch(
        cast(Task, cfg.probe.task), tokenizer, cfg.probe.task_prompts, words=cfg.probe.task_words, bos=first.bos_id
    ), name
