"""The values of a composed config, checked before anything is loaded or written.

``validate`` checks what needs no model, ``validate_for_model`` what needs the checkpoint's
own config (loaded before the weights). A bad value raises ``UsageError`` whose message is
one line naming the field, the value and what is allowed; ``main`` prints it and exits with
status 2 before writing anything.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any

import torch

from emergence import measures
from emergence.core.config import (
    ABLATE_MODES,
    ABLATE_SEQUENCES,
    DTYPES,
    FIRST_TOKENS,
    PROBE_FITS,
    PROBE_KINDS,
    PROBE_TOKENIZERS,
    TASK_WORDS,
    WANDB_MODES,
    Config,
    ModelConfig,
    PerClassThresholds,
    ProbeConfig,
)
from emergence.core.errors import invalid
from emergence.hub import gguf
from emergence.hub.weights import WEIGHTS_FORMATS
from emergence.recipe.probe import PAIR_START, min_seq_len
from emergence.recipe.screen import head_of, parse_head_name
from emergence.recipe.stats import NULL_RULES
from emergence.recipe.tasks.batches import TASKS
from emergence.recipe.text import TEXT_FILE_SUFFIXES
from emergence.run.results import ProbeFitted
from emergence.toy.validation import validate_recipe


def _fail(field_name: str, value, allowed: str) -> None:
    raise invalid(field_name, value, allowed)


def validate(cfg: Config) -> None:
    """Checks that need no model."""
    p, t, a = cfg.probe, cfg.threshold, cfg.ablate
    measures.chosen(cfg.measures)  # names and settings
    if cfg.model.dtype not in DTYPES:
        _fail("model.dtype", cfg.model.dtype, f"use one of {', '.join(DTYPES)}")
    if cfg.model.weights_format not in WEIGHTS_FORMATS:
        _fail("model.weights_format", cfg.model.weights_format, f"use one of {', '.join(WEIGHTS_FORMATS)}")
    if cfg.model.reference_dtype not in (None, *DTYPES[1:]):
        _fail("model.reference_dtype", cfg.model.reference_dtype, f"use one of {', '.join(DTYPES[1:])} or null")
    if cfg.model.dtype == "float16" and cfg.model.fp16_unsafe and not cfg.model.force_dtype:
        _fail(
            "model.dtype",
            cfg.model.dtype,
            f"{cfg.model.key} underflows in float16 on early checkpoints; "
            "use float32 or bfloat16 (or model.force_dtype=true)",
        )
    for name in ("n_sequences", "batch_size", "n_baseline"):
        if getattr(p, name) < 1:
            _fail(f"probe.{name}", getattr(p, name), "must be >= 1")
    if p.seq_len < min_seq_len(p.n_baseline):
        _fail(
            "probe.seq_len",
            p.seq_len,
            f"must be >= {min_seq_len(p.n_baseline)} to hold the pair (ab in [20, T/2)), "
            f"the local window and {p.n_baseline} baseline positions",
        )
    if not 0 <= p.vocab_low < p.vocab_high - 1:
        _fail("probe.vocab_low/vocab_high", [p.vocab_low, p.vocab_high], "need 0 <= vocab_low < vocab_high - 1")
    if p.spectral_sequences is not None and p.spectral_sequences < 2:
        _fail("probe.spectral_sequences", p.spectral_sequences, "must be >= 2 or null (all sequences)")
    validate_probe_kind(p)
    if p.fit not in PROBE_FITS:
        _fail("probe.fit", p.fit, f"use one of {', '.join(PROBE_FITS)}")
    if p.first_token == "bos":  # the token's old spelling, the class's name: one line says which is meant
        _fail(
            "probe.first_token",
            p.first_token,
            "use bos_token (the tokenizer's BOS token at position 0; the class "
            "bos is attention to position 0, whatever it holds)",
        )
    if p.first_token not in FIRST_TOKENS:
        _fail("probe.first_token", p.first_token, f"use one of {', '.join(FIRST_TOKENS)}")
    if p.first_token == "bos_token" and p.kind == "text" and p.tokenizer == "bytes":
        _fail("probe.first_token", p.first_token, "probe.tokenizer=bytes has no BOS; use random or auto")
    if cfg.model.gguf_file is not None:
        if not cfg.model.gguf_file.endswith(".gguf"):
            _fail("model.gguf_file", cfg.model.gguf_file, "name a .gguf file in model.name_or_path")
        gguf.check_installed(cfg.model.gguf_file)
    thresholds = {
        "threshold.class_default": t.class_default,
        "threshold.circuit": t.circuit,
        "threshold.prev_token_circuit": t.prev_token_circuit,
        **{f"threshold.per_class.{cls}": value for cls, value in t.per_class.overrides().items()},
    }
    for name, value in thresholds.items():
        if not (math.isfinite(value) and value > 0):  # NaN compares false: it would pass a bare "<= 0"
            _fail(name, value, "must be a finite number > 0")
    if a.mode not in ABLATE_MODES:
        _fail("ablate.mode", a.mode, f"use one of {', '.join(ABLATE_MODES)}")
    for name in a.heads or []:
        if parse_head_name(name) is None:
            _fail("ablate.heads", name, "name heads like L4H4 (layer 4, head 4)")
    if a.n_controls < 5:
        _fail("ablate.n_controls", a.n_controls, "must be >= 5 control sets")
    if not 0 < a.control_exclude <= 1:
        _fail(
            "ablate.control_exclude",
            a.control_exclude,
            "must be in (0, 1]: the share of threshold.circuit from which on a head is never a control",
        )
    if not (math.isfinite(a.causal_factor) and a.causal_factor > 0):
        _fail("ablate.causal_factor", a.causal_factor, "must be a finite number > 0")
    if a.sequences not in ABLATE_SEQUENCES:
        _fail("ablate.sequences", a.sequences, f"use one of {', '.join(ABLATE_SEQUENCES)}")
    if a.min_sequences < 2:
        _fail("ablate.min_sequences", a.min_sequences, "must be >= 2 (an interval needs two sequences)")
    if a.mr_seeds < 0:
        _fail("ablate.mr_seeds", a.mr_seeds, "must be >= 0 fresh matched-random draws (0: the seed-123 draw alone)")
    if not 0 < a.confidence < 1:
        _fail("ablate.confidence", a.confidence, "must be in (0, 1), e.g. 0.95")
    if cfg.stats.n_boot < 100:
        _fail("stats.n_boot", cfg.stats.n_boot, "must be >= 100 bootstrap replicates (1000 is the default)")
    if not 0 < cfg.stats.ci < 1:
        _fail("stats.ci", cfg.stats.ci, "must be a coverage between 0 and 1, e.g. 0.95")
    if cfg.stats.n_null < 1:
        _fail("stats.n_null", cfg.stats.n_null, "must be >= 1 null draw (the reference used 500)")
    if cfg.stats.null_rule not in NULL_RULES:
        _fail("stats.null_rule", cfg.stats.null_rule, f"use one of {', '.join(NULL_RULES)}")
    validate_revision_naming(cfg.model)
    if cfg.model.toy is not None:
        validate_recipe(cfg.model.toy)
    if cfg.wandb.mode not in WANDB_MODES:
        _fail("wandb.mode", cfg.wandb.mode, f"use one of {', '.join(WANDB_MODES)} (the default is $WANDB_MODE)")
    if cfg.hub.prefetch < 0:
        _fail("hub.prefetch", cfg.hub.prefetch, "must be >= 0 checkpoints ahead (0: no prefetching)")
    check_device(cfg.device)


def check_device(device: str) -> None:
    """The device exists on this machine (before anything is loaded onto it)."""
    if device == "auto":
        return
    try:
        kind = torch.device(device)
    except RuntimeError:
        _fail("device", device, "use auto, cpu, cuda or cuda:N")
    if kind.type == "cuda":
        if not torch.cuda.is_available():
            _fail("device", device, "CUDA is not available on this machine; use device=cpu or device=auto")
        if kind.index is not None and kind.index >= torch.cuda.device_count():
            _fail("device", device, f"this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif kind.type == "mps" and not torch.backends.mps.is_available():
        _fail("device", device, "MPS is not available on this machine; use device=cpu or device=auto")
    elif kind.type not in ("cpu", "cuda", "mps"):
        _fail("device", device, "use auto, cpu, cuda, cuda:N or mps")


def validate_probe_kind(p: ProbeConfig) -> None:
    """The repeat and text probes' own fields."""
    if p.kind not in PROBE_KINDS:
        _fail("probe.kind", p.kind, f"use one of {', '.join(PROBE_KINDS)}")
    if p.task is not None:
        if p.task not in TASKS:
            _fail("probe.task", p.task, f"use one of {', '.join(TASKS)} (probe=ioi, ...) or null")
        if p.kind != "synthetic":  # the task's capability circuits come from the synthetic probe's screen
            _fail("probe.kind", p.kind, "a task (probe.task) runs beside the synthetic probe: use probe.kind=synthetic")
        if p.task_prompts is not None and p.task_prompts < 1:
            _fail("probe.task_prompts", p.task_prompts, "must be >= 1, or null (the study's)")
        if p.task_top_k < 1:
            _fail("probe.task_top_k", p.task_top_k, "must be >= 1 head")
        if p.task_words not in TASK_WORDS:
            _fail("probe.task_words", p.task_words, f"use one of {', '.join(TASK_WORDS)}")
    if p.kind == "repeat" and (p.seq_len - 1) // 2 < PAIR_START + 1:
        _fail("probe.seq_len", p.seq_len, f"the repeat probe's span (seq_len-1)//2 must reach {PAIR_START + 1} tokens")
    if p.kind != "text":
        return
    if p.tokenizer not in PROBE_TOKENIZERS:
        _fail("probe.tokenizer", p.tokenizer, f"use one of {', '.join(PROBE_TOKENIZERS)}")
    if p.text_file is None and not p.dataset:
        _fail(
            "probe.dataset",
            p.dataset,
            "the text probe needs a dataset (e.g. NeelNanda/pile-10k) or probe.text_file=PATH",
        )
    if p.text_file is not None:
        path = Path(p.text_file).expanduser()
        if path.suffix not in TEXT_FILE_SUFFIXES:
            _fail("probe.text_file", p.text_file, "use a .txt file (one document) or a .jsonl file (one per line)")
        if not path.is_file():
            _fail("probe.text_file", p.text_file, "no such file")
    if p.loss_curve not in ("sparse", "all"):
        _fail("probe.loss_curve", p.loss_curve, "use sparse (powers of two, T-1 and the ICL positions) or all")
    positions = list(p.icl_positions)
    if len(positions) != 2 or not 1 <= positions[0] < positions[1]:
        _fail("probe.icl_positions", positions, "give two positions [early, late] with 1 <= early < late")
    if positions[1] >= p.seq_len:
        _fail(
            "probe.seq_len",
            p.seq_len,
            f"must exceed the ICL score's later position {positions[1]} (probe.icl_positions={positions})",
        )


def validate_revision_naming(model: ModelConfig) -> None:
    """A preset's revision naming is data: check it is usable before it is used."""
    pattern = model.revision_pattern
    if pattern is not None:
        try:
            groups = re.compile(pattern).groupindex
        except re.error as err:
            _fail("model.revision_pattern", pattern, f"not a regular expression ({err})")
        if "step" not in groups or not set(groups) <= {"step", "tokens"}:
            _fail("model.revision_pattern", pattern, "needs a named group (?P<step>...) and at most (?P<tokens>...)")
    for r in model.published_steps:
        if (
            (r.every is not None and r.every < 1)
            or (r.factor is not None and r.factor < 2)
            or (r.every and r.factor)
            or r.first > r.last
        ):
            _fail(
                "model.published_steps",
                {"first": r.first, "last": r.last, "every": r.every, "factor": r.factor},
                "need first <= last and at most one of every >= 1, factor >= 2",
            )


def fit_probe(cfg: Config, hf_config) -> tuple[Config, ProbeFitted | None]:
    """``cfg`` with its probe fitted to a model whose context or vocabulary is smaller than the probe's
    (``probe.fit=auto``), as the toy presets fit theirs (``model.probe_fit``): ``seq_len`` to the context,
    ``vocab_high`` to the vocabulary (``vocab_low`` then at most half of it), and every selectivity
    threshold scaled by the fitted T / the asked T (a head that puts a fixed share of its attention on the
    target scores T/256 of what it would at T=256: threshold=toy's rule). The record of what was fitted, or
    None where nothing was (the config unchanged; ``probe.fit=off`` leaves the refusals to
    ``validate_for_model``)."""
    p, t = cfg.probe, cfg.threshold
    context = getattr(hf_config, "max_position_embeddings", None)
    fitted: dict[str, list[int]] = {}
    if context is not None and p.seq_len > context:
        fitted["seq_len"] = [p.seq_len, context]
    if p.kind != "text" and p.vocab_high > hf_config.vocab_size:  # text ids come from the tokenizer
        fitted["vocab_high"] = [p.vocab_high, hf_config.vocab_size]
        if p.vocab_low > hf_config.vocab_size // 2:
            fitted["vocab_low"] = [p.vocab_low, hf_config.vocab_size // 2]
    if p.fit == "off" or not fitted:
        return cfg, None
    scale = fitted["seq_len"][1] / p.seq_len if "seq_len" in fitted else 1.0
    changes: dict[str, Any] = {k: used for k, (_, used) in fitted.items()}
    probe = dataclasses.replace(p, **changes)
    thresholds = dataclasses.replace(
        t,
        class_default=t.class_default * scale,
        circuit=t.circuit * scale,
        prev_token_circuit=t.prev_token_circuit * scale,
        per_class=PerClassThresholds(**{k: v * scale for k, v in t.per_class.overrides().items()}),
    )
    out = dataclasses.replace(cfg, probe=probe, threshold=thresholds)
    validate(out)  # the fitted probe's own limits (a context too short for the probe says so here)
    used = {
        "class_default": thresholds.class_default,
        "circuit": thresholds.circuit,
        "prev_token_circuit": thresholds.prev_token_circuit,
        **{f"per_class.{k}": v for k, v in thresholds.per_class.overrides().items()},
    }
    return out, ProbeFitted(context, hf_config.vocab_size, fitted, scale, used)


def validate_for_model(cfg: Config, hf_config) -> None:
    """Checks against the checkpoint's own config (loaded before the weights)."""
    p = cfg.probe
    context = getattr(hf_config, "max_position_embeddings", None)
    if context is not None and p.seq_len > context:
        _fail("probe.seq_len", p.seq_len, f"the model's context is {context} tokens")
    if p.kind != "text" and p.vocab_high > hf_config.vocab_size:  # text ids come from the tokenizer (checked there)
        _fail("probe.vocab_high", p.vocab_high, f"the model's vocabulary has {hf_config.vocab_size} ids")
    expected = cfg.model.architecture
    if expected is not None and hf_config.model_type != expected:
        _fail("model.architecture", expected, f"the checkpoint is a {hf_config.model_type!r} model")
    n_layers, n_heads = hf_config.num_hidden_layers, hf_config.num_attention_heads
    for name in cfg.ablate.heads or []:
        layer, head = head_of(name)  # validate checked the names
        if layer >= n_layers or head >= n_heads:
            _fail(
                "ablate.heads",
                name,
                f"the model has {n_layers} layers x {n_heads} heads (L0H0..L{n_layers - 1}H{n_heads - 1})",
            )
