"""Structured configs (the schema behind ``conf/``), the values some fields allow, and composing them.

Hydra checks types and unknown keys against these dataclasses when it composes a
run; ``validation`` checks the values. ``register_configs`` puts the schema in Hydra's
ConfigStore (and the ``cache_dir`` resolver in OmegaConf's): the entry points call it
before Hydra composes, and ``compose_config`` calls it itself. The schema imports no step
of the recipe.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, cast

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

DTYPES = ("auto", "float32", "bfloat16", "float16")
PROBE_KINDS = ("synthetic", "repeat", "text")  # emergence/recipe/probe.py, docs/probes.md
PROBE_TOKENIZERS = ("auto", "bytes")  # the text probe's: the checkpoint's own, or UTF-8 bytes
PROBE_FITS = ("auto", "off")  # probe.fit: fit the probe to a model smaller than it (run/validation.py fit_probe)
FIRST_TOKENS = ("auto", "random", "bos_token")  # what position 0 of every sequence holds (recipe/probe.py FirstToken)
# probe.task_words: the study's word lists, those restricted to the tokenizer's single tokens, or
# the study's where it has them all (emergence/recipe/tasks/batches.py, docs/tasks.md)
TASK_WORDS = ("auto", "study", "filtered")
ABLATE_MODES = ("zero", "mean")
ABLATE_SEQUENCES = ("adaptive", "all")
WANDB_MODES = ("offline", "online", "disabled")
LR_SCHEDULES = ("constant", "cosine")  # the toy recipe's learning-rate schedule after warmup
# the toy recipe's tokenizer: ids only, or the task toy's words (emergence/toy/words.py)
TOY_TOKENIZERS = (None, "words")
TOY_NUMERICS = ("native", "portable")  # the toy training's kernels, oneMKL branch and threads (emergence/toy/repro.py)


@dataclass
class PanelEntry:
    revision: str = MISSING  # the branch name on the Hub
    step: int = MISSING
    tokens: int | None = MISSING  # training tokens seen at this step; null where the family does not say


@dataclass
class StepRange:
    """Published steps first..last: every ``every`` steps, or multiplied by ``factor`` (1, 2, 4, ...)."""

    first: int = MISSING
    last: int = MISSING
    every: int | None = None
    factor: int | None = None


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
    skip_offsets: list[int] = field(default_factory=lambda: [2, 3, 4])  # filler tokens repeat the token k back
    skip_prob: float = 0.25  # ... with this probability, for each k
    trigger_fraction: float = 0.0  # share of the vocabulary whose next token repeats the one before them
    lr_schedule: str = "constant"  # constant | cosine (after warmup, down to min_lr_ratio x lr at the last step)
    min_lr_ratio: float = 0.1
    clip_qkv: float | None = None
    n_experts: int = 8  # olmoe only
    experts_per_token: int = 2  # olmoe only
    # portable: kernels, MKL branch and threads pinned, the same bits on any x86 CPU with AVX2; native: this
    # machine's own, faster, its own bits (emergence/toy/repro.py)
    numerics: str = "portable"
    threads: int = 2  # a portable training's threads: they move its bits (native: the process's own)
    # The task toy (emergence/toy/task_corpus.py): the share of each batch that is runs of task sentences
    # (IOI, greater-than, successor, variable binding), and the tokenizer that writes them as ids (words:
    # emergence/toy/words.py, saved with every checkpoint). Both or neither: the defaults are the other toys'.
    task_fraction: float = 0.0
    tokenizer: str | None = None  # null (ids only) | words
    home_city_share: float = 0.0  # the bindings that use the name's home city (task_corpus.py says why)
    # Also save a checkpoint every this many steps (folders step{N}, beside the panel's), so that a
    # milestone can be refined between panel revisions (python -m emergence.refine). Not part of
    # what the weights are: a panel trained with it serves runs without it, bit for bit.
    save_every: int | None = None


@dataclass
class ModelConfig:
    key: str = MISSING  # the config name (pythia, olmo, ...): how results are grouped
    name_or_path: str = MISSING  # Hub repo id or local directory
    architecture: str | None = None  # expected model_type (gpt_neox, olmo, olmoe); None: read it
    dtype: str = "auto"  # auto: float32 (docs/precision.md)
    reference_dtype: str | None = None  # the dtype the reference study ran this family in; None: not in it
    tokens_per_step: int | None = None  # tokens = step x this, unless the branch name states them
    # How the family names its checkpoint branches: a regular expression (full match) with a named
    # group `step` and optionally `tokens` (in billions); null: any name (step/tokens read from
    # step{N}[-tokens{M}B] where a name looks like that). revision=custom names are checked against it.
    revision_pattern: str | None = None
    revision_format: str | None = None  # a step written as a branch name, e.g. step{step}: names the nearest
    published_steps: list[StepRange] = field(default_factory=list)  # the steps that exist; empty: any
    revision_required_for: str | None = None  # regex on name_or_path: repos whose main branch may hold no weights
    panel: list[PanelEntry] = field(default_factory=list)  # empty: revision=rK proposes one from the Hub's branches
    trust_remote_code: bool = False
    # a .gguf file in name_or_path (a folder or a Hub repo): config, weights and tokenizer read through
    # transformers' GGUF loader, dequantized to model.dtype (needs the [gguf] extra; docs/real-models.md)
    gguf_file: str | None = None
    # auto: a revision's safetensors where it has them, else its pickled .bin through torch's restricted
    # unpickler; safetensors: refuse pickles (docs/hub.md)
    weights_format: str = "auto"
    cleanup: bool = False  # delete each Hub revision this run downloaded, once its results are written
    fp16_unsafe: bool = False  # early checkpoints underflow in float16 (Pythia): refuse it unless forced
    force_dtype: bool = False  # run a dtype this model is known to fail in anyway
    probe_fit: ProbeFit = field(default_factory=ProbeFit)
    toy: ToyRecipe | None = None  # set for toy models: revisions are subdirectories, trained on demand


@dataclass
class RevisionConfig:
    index: int | None = None  # index into model.panel; -1 is the last entry
    name: str | None = None  # a branch name (revision=custom)


@dataclass
class ProbeConfig:
    """The protocol's values (``probe/paper.yaml``) are the probe; the rest are run settings.
    ``kind`` picks the batch (docs/probes.md); the text probe's source and scores follow."""

    kind: str = "synthetic"  # synthetic (the reference protocol) | repeat | text
    n_sequences: int = MISSING
    seq_len: int = MISSING
    vocab_low: int = MISSING
    vocab_high: int = MISSING
    seed: int = MISSING
    n_baseline: int = MISSING
    baseline_seed: int = MISSING
    batch_size: int = 16  # sequences per forward on a CPU (and on a GPU when auto_batch is false)
    auto_batch: bool = True  # on a GPU: size batches to the free memory after loading the weights
    spectral_sequences: int | None = None  # rows for the spectral estimators; None: all (the reference: 500)
    # kind=text: a Hugging Face dataset (its split and text column), unless text_file names a local
    # .txt (one document) or .jsonl (one per line, its `column` field)
    dataset: str | None = None
    split: str = "train"
    column: str = "text"
    text_file: str | None = None
    tokenizer: str = "auto"  # auto: the checkpoint's own (its repo and revision) | bytes: UTF-8 bytes as ids
    # auto: a model whose context or vocabulary is smaller than the probe's gets the probe fitted to it (seq_len
    # to its context, the id range to its vocabulary, the thresholds scaled by the fitted T / the probe's T, as
    # threshold=toy; summary.json probe_fit) | off: such a model is refused (probe.seq_len / probe.vocab_high)
    fit: str = "auto"
    # Position 0 of every sequence and task prompt: random (the study's: an ordinary random token) | bos_token
    # (the tokenizer's BOS id, the rest drawn as for random) | auto: bos_token where the checkpoint's tokenizer
    # puts its BOS before every input (the model was trained behind it), else random. (Not the class ``bos``:
    # that is attention to position 0, whichever of these it holds.)
    first_token: str = "auto"
    # Olsson et al.'s in-context learning score: mean loss at icl_positions[1] minus at [0]
    # (0-based positions of the predicted token)
    icl_positions: list[int] = field(default_factory=lambda: [50, 500])
    # kind=text: the positions whose loss the pass computes for text.loss_by_position (``icl.curve_positions``):
    # sparse (the powers of two below seq_len, seq_len - 1 and the ICL positions) | all (every position)
    loss_curve: str = "sparse"
    # A task circuit measured beside the synthetic probe, on the checkpoint's own tokenizer
    # (docs/tasks.md): ioi | greater_than | successor | binding; null: none (probe=ioi, ... set it)
    task: str | None = None
    task_prompts: int | None = None  # the task's prompts: the study's (500; successor's 118) unless set
    task_top_k: int = 5  # heads ranked by each task screen and ablated as its "screen" condition (the study's 5)
    # the words the task's prompts are drawn from (TASK_WORDS): study | filtered (those the tokenizer keeps as
    # one token) | auto (study where every word is one token, else filtered)
    task_words: str = "auto"


@dataclass
class PerClassThresholds:
    """Optional per-class overrides of ``threshold.class_default`` (None: the default); one field
    per class of ``screen.CLASSES``, in its order."""

    induction: float | None = None
    duplicate_token: float | None = None
    previous_token: float | None = None
    self: float | None = None
    bos: float | None = None
    local: float | None = None

    def overrides(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


@dataclass
class ThresholdConfig:
    class_default: float = 30.0  # selectivity for class assignment and membership
    per_class: PerClassThresholds = field(default_factory=PerClassThresholds)
    circuit: float = 50.0  # induction selectivity for the induction circuit
    # previous-token selectivity (and best class) for a task ablation's previous-token circuit (docs/tasks.md)
    prev_token_circuit: float = 100.0


@dataclass
class AblateConfig:
    enabled: bool = True
    mode: str = "zero"  # zero (the reference) | mean (the batch mean of the head's output at each position)
    n_controls: int = 5  # control sets (as many heads per layer as the circuit, outside it: ablation.draw_controls)
    # a head whose induction selectivity reaches this share of threshold.circuit is never a control
    control_exclude: float = 0.5
    causal_factor: float = 3.0  # causal: circuit's loss-of-B rise > this x the size of the controls' mean change
    seed: int = 0
    heads: list[str] | None = None  # ablate these heads ("L4H4", ...) instead of the screened circuit
    # (with probe.task, also the task's "user" condition, a spec in this rank order)
    mr_seed: int = 123  # a task screen's matched-random heads: the study's one draw (docs/tasks.md)
    mr_seeds: int = 10  # ... and this many more distinct draws, fresh generators seeded 0, 1, ... (docs/tasks.md)
    # adaptive: stop once the interval of the causal criterion excludes zero (emergence/recipe/verdict.py);
    # all: every probe sequence (the reference protocol)
    sequences: str = "adaptive"
    min_sequences: int = 64  # adaptive: sequences at the first look; the looks double from there (verdict.look_sizes)
    confidence: float = 0.95  # adaptive: level of the interval, over all looks together


@dataclass
class StatsConfig:
    """Uncertainty from the probe pass (docs/method.md section 9); no extra forward pass."""

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
    entity: str | None = "${oc.env:WANDB_ENTITY,null}"
    dir: str | None = "${oc.env:WANDB_DIR,null}"  # where wandb/ goes; None: the run directory
    group: str | None = None  # None: a multirun's jobs share the sweep's name as their group
    tags: list[str] = field(default_factory=list)  # the model key and revision are always added


@dataclass
class HubConfig:
    """Reading checkpoints from the Hugging Face Hub (or the mirror ``HF_ENDPOINT`` names)."""

    # In a sweep run by the basic launcher: fetch the next jobs' checkpoints while the current
    # one is analysed, this many ahead (emergence/run/prefetch.py); 0: each job downloads its own.
    prefetch: int = 1


@dataclass
class EdgeConfig:
    """``python -m emergence.edge``: spectral edge dynamics of the checkpoint series (docs/edge.md); the
    sketch of a model while it trains (``track``, the callback). Not part of what a run computes:
    ``config_digest`` leaves it out."""

    # W: consecutive updates (checkpoint deltas) per rolling window; a list ([10,20]) gives each W its windows
    window: Any = 10
    # exact: every window's Gram matrix in float64, the checkpoints streamed block by block (any size);
    # sketch: a count sketch of ``dim`` numbers per scope (what a model while it trains keeps)
    projection: str = "exact"
    dim: int | None = None  # sketch: its dimension per scope; None: 10 x the largest W
    seed: int = 0  # sketch: its buckets and signs, drawn block by block from it, never stored
    memory_mib: int = 512  # exact: the read buffers' bound, whatever the model's size

    @property
    def windows(self) -> list[int]:
        """``window`` as a list of W (an int is one W)."""
        return [self.window] if isinstance(self.window, int) else list(self.window)


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
    edge: EdgeConfig = field(default_factory=EdgeConfig)
    # The measures computed beside the screen, name -> settings (the ``measures`` group picks them;
    # emergence.measures.chosen checks them)
    measures: dict[str, Any] = field(default_factory=dict)
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
    """The schema (``emergence_schema``, which ``conf/config.yaml`` names) in Hydra's ConfigStore and
    the ``emergence_cache_dir`` resolver; idempotent. Called before anything composes a config."""
    if not OmegaConf.has_resolver("emergence_cache_dir"):
        OmegaConf.register_new_resolver("emergence_cache_dir", default_cache_dir)
    cs = ConfigStore.instance()
    cs.store(name="emergence_schema", node=Config)


def config_digest(cfg: Config) -> str:
    """Names what a run computes: its config without the W&B, resume, download and edge settings."""
    content = cast(dict, OmegaConf.to_container(OmegaConf.structured(cfg)))
    for key in ("wandb", "resume", "hub", "edge"):
        content.pop(key, None)
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:16]


def compose_config(overrides: list[str]) -> Config:
    """The validated-schema Config that ``python -m emergence <overrides>`` would run. An override
    Hydra or the schema refuses is a ``UsageError``: one line, where Hydra's message spans several."""
    from hydra import compose, initialize_config_module  # here: importing the schema imports no other module
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    register_configs()
    try:
        with initialize_config_module(config_module="emergence.conf", version_base="1.3"):
            return cast(Config, OmegaConf.to_object(compose(config_name="config", overrides=overrides)))
    except (HydraException, OmegaConfBaseException) as err:
        raise refused_override(err) from None
    except (ValueError, OSError) as err:  # a group option Hydra cannot look up (measures=null, a name too long)
        if not raised_by_hydra(err):
            raise
        raise refused_override(err) from None


def raised_by_hydra(err: BaseException) -> bool:
    """Whether ``err`` was raised while Hydra composed the config (its config loader is on the traceback),
    not by the run it composed."""
    tb = err.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.endswith(f"hydra{os.sep}_internal{os.sep}config_loader_impl.py"):
            return True
        tb = tb.tb_next
    return False


def refused_override(err: Exception):
    """The one-line ``UsageError`` for an override Hydra or the schema refuses (``err``: Hydra's or
    OmegaConf's exception), as ``compose_config`` and ``python -m emergence`` both say it."""
    from hydra.errors import MissingConfigException
    from omegaconf.errors import OmegaConfBaseException

    from emergence.core.errors import UsageError

    if isinstance(err, MissingConfigException) and err.missing_cfg_file:  # a group option not there
        group, _, option = err.missing_cfg_file.rpartition("/")  # e.g. model/gpt5
        # an option of a list (measures=[default,x]) comes without Hydra's list of the group's options
        options = err.options or sorted(f.name.removesuffix(".yaml") for f in group_files(group))
        if options:
            return UsageError(
                f"{group}={option} is invalid: no such preset in conf/{group}; use one of {', '.join(options)}"
            )
    if isinstance(err, OSError):  # its message holds the whole path asked for, whatever its length
        return UsageError(
            f"an override names a config option that cannot be read ({err.strerror}): use a preset's name"
        )
    # Hydra's "Error merging override x=y" says why only in its cause (OmegaConf's)
    cause = f": {one_line(err.__cause__)}" if isinstance(err.__cause__, OmegaConfBaseException) else ""
    return UsageError(one_line(err) + cause)


def group_files(group: str) -> list:
    """The option files of the config group ``group`` (conf/<group>/*.yaml); none where it is no group."""
    from importlib.resources import files

    folder = files("emergence.conf").joinpath(*group.split("/"))
    return [f for f in folder.iterdir() if f.name.endswith(".yaml")] if folder.is_dir() else []


def one_line(err: Exception) -> str:
    """Hydra's (or OmegaConf's) message on one line, without Hydra's search path and OmegaConf's types."""
    text = str(err).split("\nConfig search path:")[0]
    return "; ".join(
        line.strip()
        for line in text.splitlines()
        if line.strip() and not line.strip().startswith(("object_type=", "reference_type="))
    )
