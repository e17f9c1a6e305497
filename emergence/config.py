"""Structured configs (the schema behind ``conf/``) and their validation.

Hydra checks types and unknown keys against these dataclasses when it composes a
run; ``validate`` and ``validate_for_model`` check the values. A bad value raises
``UsageError`` whose message is one line naming the field, the value and what is
allowed; ``main`` prints it and exits with status 2 before writing anything.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from emergence.probe import min_seq_len
from emergence.screen import CLASSES, parse_head_name
from emergence.stats import NULL_RULES

DTYPES = ("auto", "float32", "bfloat16", "float16")
ABLATE_MODES = ("zero", "mean")
ABLATE_SEQUENCES = ("adaptive", "all")
WANDB_MODES = ("offline", "online", "disabled")
LR_SCHEDULES = ("constant", "cosine")  # the toy recipe's learning-rate schedule after warmup


class UsageError(Exception):
    """A bad input the user can fix; its message is the one line we print."""


@dataclass
class PanelEntry:
    revision: str = MISSING  # the branch name on the Hub
    step: int = MISSING
    tokens: Optional[int] = MISSING  # training tokens seen at this step; null where the family does not say


@dataclass
class StepRange:
    """Published steps first..last: every ``every`` steps, or multiplied by ``factor`` (1, 2, 4, ...)."""

    first: int = MISSING
    last: int = MISSING
    every: Optional[int] = None
    factor: Optional[int] = None


@dataclass
class ProbeFit:
    """The probe's model-dependent fields; ``probe/paper.yaml`` reads them from here.
    Real models keep the paper's values; toy models fit their vocabulary and context."""

    seq_len: int = 256
    vocab_low: int = 100
    vocab_high: int = 10000
    n_sequences: int = 2000


@dataclass
class ToyRecipe:
    """How a toy panel model is built and trained (``emergence/toy``)."""

    architecture: str = MISSING  # gpt_neox | olmo | olmoe
    n_layers: int = 4
    hidden_size: int = 64
    n_heads: int = 4
    intermediate_size: int = 128
    vocab_size: int = 256
    seq_len: int = 128
    batch_size: int = 32
    lr: float = 3e-3
    warmup_steps: int = 50
    weight_decay: float = 0.2
    seed: int = 0
    repeat_fraction: float = 0.5  # share of each batch that is one span repeated end to end
    skip_offsets: List[int] = field(default_factory=lambda: [2, 3, 4])  # filler tokens repeat the token k back
    skip_prob: float = 0.25  # ... with this probability, for each k
    trigger_fraction: float = 0.0  # share of the vocabulary whose next token repeats the one before them
    lr_schedule: str = "constant"  # constant | cosine (after warmup, down to min_lr_ratio x lr at the last step)
    min_lr_ratio: float = 0.1
    clip_qkv: Optional[float] = None
    n_experts: int = 8  # olmoe only
    experts_per_token: int = 2  # olmoe only
    numerics: str = "native"  # native | portable: kernels, MKL branch, threads pinned (emergence/toy/repro.py)
    # Also save a checkpoint every this many steps (folders step{N}, beside the panel's), so that a
    # milestone can be refined between panel revisions (python -m emergence.refine). Not part of
    # what the weights are: a panel trained with it serves runs without it, bit for bit.
    save_every: Optional[int] = None


@dataclass
class ModelConfig:
    key: str = MISSING  # the config name (pythia, olmo, ...): how results are grouped
    name_or_path: str = MISSING  # Hub repo id or local directory
    architecture: Optional[str] = None  # expected model_type (gpt_neox, olmo, olmoe); None: read it
    dtype: str = "auto"  # auto: float32 (README, "Precision")
    reference_dtype: Optional[str] = None  # the dtype the reference study ran this family in; None: not in it
    tokens_per_step: Optional[int] = None  # tokens = step x this, unless the branch name states them
    # How the family names its checkpoint branches: a regular expression (full match) with a named
    # group `step` and optionally `tokens` (in billions); null: any name (step/tokens read from
    # step{N}[-tokens{M}B] where a name looks like that). revision=custom names are checked against it.
    revision_pattern: Optional[str] = None
    revision_format: Optional[str] = None  # a step written as a branch name, e.g. step{step}: names the nearest
    published_steps: List[StepRange] = field(default_factory=list)  # the steps that exist; empty: any
    revision_required_for: Optional[str] = None  # regex on name_or_path: repos whose main branch may hold no weights
    panel: List[PanelEntry] = field(default_factory=list)  # empty: revision=rK proposes one from the Hub's branches
    trust_remote_code: bool = False
    cleanup: bool = False  # delete each Hub revision this run downloaded, once its results are written
    fp16_unsafe: bool = False  # early checkpoints underflow in float16 (Pythia): refuse it unless forced
    force_dtype: bool = False  # run a dtype this model is known to fail in anyway
    probe_fit: ProbeFit = field(default_factory=ProbeFit)
    toy: Optional[ToyRecipe] = None  # set for toy models: revisions are subdirectories, trained on demand


@dataclass
class RevisionConfig:
    index: Optional[int] = None  # index into model.panel; -1 is the last entry
    name: Optional[str] = None  # a branch name (revision=custom)


@dataclass
class ProbeConfig:
    """The protocol's values (``probe/paper.yaml``) are the probe; the rest are run settings."""

    n_sequences: int = MISSING
    seq_len: int = MISSING
    vocab_low: int = MISSING
    vocab_high: int = MISSING
    seed: int = MISSING
    n_baseline: int = MISSING
    baseline_seed: int = MISSING
    batch_size: int = 16  # sequences per forward on a CPU (and on a GPU when auto_batch is false)
    auto_batch: bool = True  # on a GPU: size batches to the free memory after loading the weights
    spectral_sequences: Optional[int] = None  # rows for the spectral estimators; None: all (the reference: 500)


@dataclass
class PerClassThresholds:
    """Optional per-class overrides of ``threshold.class_default`` (None: the default)."""

    induction: Optional[float] = None
    duplicate_token: Optional[float] = None
    previous_token: Optional[float] = None
    self: Optional[float] = None
    first_token: Optional[float] = None
    local: Optional[float] = None

    def overrides(self) -> Dict[str, float]:
        return {c: getattr(self, c) for c in CLASSES if getattr(self, c) is not None}


@dataclass
class ThresholdConfig:
    class_default: float = 30.0  # selectivity for class assignment and membership
    per_class: PerClassThresholds = field(default_factory=PerClassThresholds)
    circuit: float = 50.0  # induction selectivity for the induction circuit
    # Gu et al.'s sink metric (emergence/sinks.py): a head is a sink on a sequence when key 0 gets
    # more than this share of the attention of the queries that see it (absolute, not a ratio)
    sink_epsilon: float = 0.3


@dataclass
class AblateConfig:
    enabled: bool = True
    mode: str = "zero"  # zero (the reference) | mean (the batch mean of the head's output at each position)
    n_random: int = 5  # matched-random control sets (same number of heads from the same layers)
    causal_factor: float = 3.0  # causal: circuit's loss-of-B rise > this x the size of the controls' mean change
    seed: int = 0
    heads: Optional[List[str]] = None  # ablate these heads ("L4H4", ...) instead of the screened circuit
    # adaptive: stop once the interval of the causal criterion excludes zero (emergence/verdict.py);
    # all: every probe sequence (the reference protocol)
    sequences: str = "adaptive"
    min_sequences: int = 64  # adaptive: sequences measured before the first look
    confidence: float = 0.95  # adaptive: level of the interval, over all looks together


@dataclass
class StatsConfig:
    """Uncertainty from the probe pass (METHOD.md section 9); no extra forward pass."""

    n_boot: int = 1000  # bootstrap replicates over sequences
    ci: float = 0.95  # interval coverage
    seed: int = 0  # the resample matrix: one seed keeps the replicates paired across a panel
    n_null: int = 500  # draws of the reference null (the target replaced by a random position)
    # which heads' null draws make the floor: nondegenerate (every head but those with a degenerate
    # baseline) | reference (every head, the study's rule); see stats.NULL_RULES
    null_rule: str = "nondegenerate"


@dataclass
class WandbConfig:
    """W&B's own environment variables are the defaults; an explicit override still wins."""

    mode: str = "${oc.env:WANDB_MODE,offline}"  # offline | online | disabled
    project: str = "${oc.env:WANDB_PROJECT,emergence}"
    entity: Optional[str] = "${oc.env:WANDB_ENTITY,null}"
    dir: Optional[str] = "${oc.env:WANDB_DIR,null}"  # where wandb/ goes; None: the run directory
    group: Optional[str] = None  # None: a multirun's jobs share the sweep's name as their group
    tags: List[str] = field(default_factory=list)  # the model key and revision are always added


@dataclass
class HubConfig:
    """Reading checkpoints from the Hugging Face Hub (or the mirror ``HF_ENDPOINT`` names)."""

    # In a sweep run by the basic launcher: fetch the next jobs' checkpoints while the current
    # one is analysed, this many ahead (emergence/prefetch.py); 0: each job downloads its own.
    prefetch: int = 1


@dataclass
class Config:
    model: ModelConfig = MISSING
    revision: RevisionConfig = MISSING
    probe: ProbeConfig = MISSING
    threshold: ThresholdConfig = MISSING
    ablate: AblateConfig = field(default_factory=AblateConfig)
    stats: StatsConfig = field(default_factory=StatsConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    hub: HubConfig = field(default_factory=HubConfig)
    device: str = "auto"  # auto: cuda if available, else cpu
    cache_dir: str = "${emergence_cache_dir:}"  # toy panels and cached measurements live here
    # Per-head measurements are cached under ${cache_dir}/measurements (delete it to clear): a
    # threshold re-sweep with ablate.enabled=false then loads no model. reuse=false recomputes.
    reuse: bool = True
    # A relaunched sweep (same hydra.sweep.dir) skips jobs whose directory already holds a
    # complete run of the same configuration.
    resume: bool = True


def default_cache_dir() -> str:
    """$EMERGENCE_CACHE, else $XDG_CACHE_HOME/emergence, else ~/.cache/emergence."""
    if os.environ.get("EMERGENCE_CACHE"):
        return os.environ["EMERGENCE_CACHE"]
    return str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "emergence")


def register_configs() -> None:
    if not OmegaConf.has_resolver("emergence_cache_dir"):
        OmegaConf.register_new_resolver("emergence_cache_dir", default_cache_dir)
    cs = ConfigStore.instance()
    cs.store(name="emergence_schema", node=Config)


register_configs()  # on import, so that compose() in tests and tools sees the schema and resolver


def _fail(field_name: str, value, allowed: str) -> None:
    raise UsageError(f"{field_name}={value!r} is invalid: {allowed}")


def validate(cfg: Config) -> None:
    """Checks that need no model."""
    p, t, a = cfg.probe, cfg.threshold, cfg.ablate
    if cfg.model.dtype not in DTYPES:
        _fail("model.dtype", cfg.model.dtype, f"use one of {', '.join(DTYPES)}")
    if cfg.model.reference_dtype not in (None, *DTYPES[1:]):
        _fail("model.reference_dtype", cfg.model.reference_dtype, f"use one of {', '.join(DTYPES[1:])} or null")
    if cfg.model.dtype == "float16" and cfg.model.fp16_unsafe and not cfg.model.force_dtype:
        _fail("model.dtype", cfg.model.dtype, f"{cfg.model.key} underflows in float16 on early checkpoints; "
              "use float32 or bfloat16 (or model.force_dtype=true)")
    for name in ("n_sequences", "batch_size", "n_baseline"):
        if getattr(p, name) < 1:
            _fail(f"probe.{name}", getattr(p, name), "must be >= 1")
    if p.seq_len < min_seq_len(p.n_baseline):
        _fail("probe.seq_len", p.seq_len,
              f"must be >= {min_seq_len(p.n_baseline)} to hold the pair (ab in [20, T/2)), "
              f"the local window and {p.n_baseline} baseline positions")
    if not 0 <= p.vocab_low < p.vocab_high - 1:
        _fail("probe.vocab_low/vocab_high", [p.vocab_low, p.vocab_high], "need 0 <= vocab_low < vocab_high - 1")
    if p.spectral_sequences is not None and p.spectral_sequences < 2:
        _fail("probe.spectral_sequences", p.spectral_sequences, "must be >= 2 or null (all sequences)")
    if t.class_default <= 0:
        _fail("threshold.class_default", t.class_default, "must be > 0")
    if t.circuit <= 0:
        _fail("threshold.circuit", t.circuit, "must be > 0")
    for cls, value in t.per_class.overrides().items():
        if value <= 0:
            _fail(f"threshold.per_class.{cls}", value, "must be > 0")
    if not 0 < t.sink_epsilon < 1:
        _fail("threshold.sink_epsilon", t.sink_epsilon, "must be in (0, 1): a share of attention")
    if a.mode not in ABLATE_MODES:
        _fail("ablate.mode", a.mode, f"use one of {', '.join(ABLATE_MODES)}")
    for name in a.heads or []:
        if parse_head_name(name) is None:
            _fail("ablate.heads", name, "name heads like L4H4 (layer 4, head 4)")
    if a.n_random < 5:
        _fail("ablate.n_random", a.n_random, "must be >= 5 matched-random control sets")
    if not a.causal_factor > 0:
        _fail("ablate.causal_factor", a.causal_factor, "must be > 0")
    if a.sequences not in ABLATE_SEQUENCES:
        _fail("ablate.sequences", a.sequences, f"use one of {', '.join(ABLATE_SEQUENCES)}")
    if a.min_sequences < 2:
        _fail("ablate.min_sequences", a.min_sequences, "must be >= 2 (an interval needs two sequences)")
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
        validate_toy_recipe(cfg.model.toy)
    if cfg.wandb.mode not in WANDB_MODES:
        _fail("wandb.mode", cfg.wandb.mode, f"use one of {', '.join(WANDB_MODES)} (the default is $WANDB_MODE)")
    if cfg.hub.prefetch < 0:
        _fail("hub.prefetch", cfg.hub.prefetch, "must be >= 0 checkpoints ahead (0: no prefetching)")
    check_device(cfg.device)


def validate_toy_recipe(recipe: ToyRecipe) -> None:
    if recipe.lr_schedule not in LR_SCHEDULES:
        _fail("model.toy.lr_schedule", recipe.lr_schedule, f"use one of {', '.join(LR_SCHEDULES)}")
    if not 0 <= recipe.min_lr_ratio <= 1:
        _fail("model.toy.min_lr_ratio", recipe.min_lr_ratio, "must be in [0, 1]: a share of model.toy.lr")
    if not 0 <= recipe.trigger_fraction < 1:
        _fail("model.toy.trigger_fraction", recipe.trigger_fraction, "must be in [0, 1): a share of the vocabulary")
    if recipe.save_every is not None and recipe.save_every < 1:
        _fail("model.toy.save_every", recipe.save_every, "must be >= 1 step, or null (only the panel's checkpoints)")


def check_device(device: str) -> None:
    """The device exists on this machine (before anything is loaded onto it)."""
    import torch

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
        if (r.every is not None and r.every < 1) or (r.factor is not None and r.factor < 2) \
                or (r.every and r.factor) or r.first > r.last:
            _fail("model.published_steps", {"first": r.first, "last": r.last, "every": r.every, "factor": r.factor},
                  "need first <= last and at most one of every >= 1, factor >= 2")


def validate_for_model(cfg: Config, hf_config) -> None:
    """Checks against the checkpoint's own config (loaded before the weights)."""
    p = cfg.probe
    context = getattr(hf_config, "max_position_embeddings", None)
    if context is not None and p.seq_len > context:
        _fail("probe.seq_len", p.seq_len, f"the model's context is {context} tokens")
    if p.vocab_high > hf_config.vocab_size:
        _fail("probe.vocab_high", p.vocab_high, f"the model's vocabulary has {hf_config.vocab_size} ids")
    expected = cfg.model.architecture
    if expected is not None and hf_config.model_type != expected:
        _fail("model.architecture", expected, f"the checkpoint is a {hf_config.model_type!r} model")
    n_layers, n_heads = hf_config.num_hidden_layers, hf_config.num_attention_heads
    for name in cfg.ablate.heads or []:
        layer, head = parse_head_name(name)
        if layer >= n_layers or head >= n_heads:
            _fail("ablate.heads", name, f"the model has {n_layers} layers x {n_heads} heads "
                  f"(L0H0..L{n_layers - 1}H{n_heads - 1})")


def config_digest(cfg: Config) -> str:
    """Names what a run computes: its config without the W&B, resume and download settings."""
    content = OmegaConf.to_container(OmegaConf.structured(cfg))
    for key in ("wandb", "resume", "hub"):
        content.pop(key, None)
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:16]


def compose_config(overrides: list[str]) -> Config:
    """The validated-schema Config that ``python -m emergence <overrides>`` would run."""
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="emergence.conf", version_base="1.3"):
        return OmegaConf.to_object(compose(config_name="config", overrides=overrides))
