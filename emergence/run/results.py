"""A run's files: ``heads.csv`` (one row per head, ``HeadRow``) and ``summary.json`` (its
schema is ``RunSummary``), and the lines a run reports.

Both files are written atomically (temporary file in the same directory, then rename),
and ``summary.json`` last: a run directory with a summary is a complete run.
"""

from __future__ import annotations

import csv
import io
import json
import platform
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
from jaxtyping import Float

import emergence
from emergence import measures
from emergence.core.atomic import atomic_write_bytes, atomic_write_text, npz_bytes
from emergence.core.config import ProbeConfig, StatsConfig
from emergence.core.record import Record
from emergence.hub.gguf import GgufHeader
from emergence.recipe.ablation import AblationResult
from emergence.recipe.probe import FirstToken
from emergence.recipe.screen import BASELINE, CLASSES, DTYPE_RELATIVE_ERROR, UNCLASSIFIED, HeadClasses, head_name
from emergence.recipe.stats import DEGENERATE_BASELINE_SHARE, NullSummary, ScreenIntervals
from emergence.recipe.tasks.ablation import sweep_text
from emergence.recipe.tasks.step import TaskSummary

HEADS_FILE = "heads.csv"
PROMPTS_FILE = "prompts.jsonl"  # a task run's prompts, one JSON object per line (``TaskPrompt``)
SUMMARY_FILE = "summary.json"
PER_SEQUENCE_FILE = "per_sequence.npz"  # the probe's per-sequence attentions: intervals in the panel report


@dataclass(frozen=True)
class HeadRow(Record):
    """One row of ``heads.csv``: one head of the screen. Its fields, in order, are the file's columns
    (``HEAD_COLUMNS``; ``class_`` is ``class``); the per-class ones follow ``screen.CLASSES``.

    Selectivities are multiples of the head's baseline attention; attentions are the mean attention
    of the last query over the probe's sequences; intervals are the bootstrap's [low, high] over
    sequences (``stats.screen_intervals``). A float not measured is NaN."""

    JSON_NAMES = {"class_": "class"}

    layer: int
    head: int
    sel_induction: float
    sel_duplicate_token: float
    sel_previous_token: float
    sel_self: float
    sel_bos: float
    sel_local: float
    best_class: str  # the class of its largest selectivity, whether above its threshold or not
    class_: str  # best_class if above its threshold, else unclassified (single label)
    induction_member: bool  # multi-label membership: the class's selectivity is at least its threshold
    duplicate_token_member: bool
    previous_token_member: bool
    self_member: bool
    bos_member: bool
    local_member: bool
    induction_circuit: bool  # induction selectivity at least the circuit threshold
    pr: float  # participation ratio of the head's outputs (``summary.json`` ``spectral``)
    pr_entropy_rank: float  # exp(entropy) of their normalised squared singular values
    attn_induction: float
    attn_duplicate_token: float
    attn_previous_token: float
    attn_self: float
    attn_bos: float
    attn_local: float
    attn_baseline: float
    sel_induction_ci_low: float
    sel_induction_ci_high: float
    sel_duplicate_token_ci_low: float
    sel_duplicate_token_ci_high: float
    sel_previous_token_ci_low: float
    sel_previous_token_ci_high: float
    sel_self_ci_low: float
    sel_self_ci_high: float
    sel_bos_ci_low: float
    sel_bos_ci_high: float
    sel_local_ci_low: float
    sel_local_ci_high: float
    p_induction_member: float  # share of bootstrap replicates in which the head is a member
    p_duplicate_token_member: float
    p_previous_token_member: float
    p_self_member: float
    p_bos_member: float
    p_local_member: float
    null_p99: float  # the 99th percentile of its null selectivity (``stats.null_calibration``)
    degenerate_baseline: bool  # its baseline attention is degenerate (``stats.degenerate_baseline``)
    near_threshold: bool  # the run's dtype could flip its screen (``screen.near_threshold``)
    # The columns after the screen's: the task step's head scores (``probe.task``: ``TaskScreen.scores``), then
    # the chosen measures' (``emergence.measures``), column -> value
    measure_columns: dict[str, float] = field(default_factory=dict)

    def columns(self) -> dict:
        """The row as heads.csv's columns, in order: the fields', then ``measure_columns``."""
        row = self.to_json()
        measure_columns = row.pop("measure_columns")
        return {**row, **measure_columns}

    @classmethod
    def from_columns(cls, row: dict[str, str]) -> HeadRow:
        """A row as ``csv.DictReader`` reads it (strings), typed by the fields: a float is written
        as its ``repr`` and so reads back exactly (NaN included), a boolean as True / False; a column
        that is no field is one of ``measure_columns`` (a float)."""
        names = {cls.JSON_NAMES.get(f.name, f.name): f.name for f in fields(cls) if f.name != "measure_columns"}
        types: dict[str, Any] = {f.name: f.type for f in fields(cls)}  # the annotations as written: "int", ...
        known = {names[column]: _PARSE[types[names[column]]](value) for column, value in row.items() if column in names}
        return cls(
            **known, measure_columns={column: float(value) for column, value in row.items() if column not in names}
        )


def _parse_bool(value: str) -> bool:
    if value not in ("True", "False"):
        raise ValueError(f"not a boolean: {value!r}")
    return value == "True"


# heads.csv's cells by HeadRow's field types
_PARSE: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "bool": _parse_bool, "str": str}

# the screen's columns; the task's and the measures' follow them (``HeadRow.measure_columns``)
HEAD_COLUMNS = [HeadRow.JSON_NAMES.get(f.name, f.name) for f in fields(HeadRow) if f.name != "measure_columns"]


@dataclass(frozen=True)
class HeadValues:
    """The per-head values a run writes beside the screen's classes: the recipe's, then the task's and the
    measures' columns."""

    # batch-mean attention to each target (``screen.CLASSES``, baseline)
    mean_attention: Float[np.ndarray, "layers heads 7"]
    pr: Float[np.ndarray, "layers heads"]  # the participation ratio of the head's outputs at T-1
    entropy_rank: Float[np.ndarray, "layers heads"]  # their entropy effective rank
    # the columns after the screen's: the task step's scores, then the chosen measures' (``HeadRow.measure_columns``)
    measure_columns: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def of(cls, measured, measure_results: dict, task_scores: dict[str, np.ndarray] | None = None) -> HeadValues:
        """From a run's ``pass_record.PassRecord``, its measures' results (``MeasureResult`` by name) and
        its task's scores (``TaskScreen.scores``; None: no task)."""
        measure_columns = dict(task_scores or {})
        measure_columns.update({column: grid for r in measure_results.values() for column, grid in r.per_head.items()})
        return cls(measured.mean_attention, measured.pr, measured.entropy_rank, measure_columns)


def head_rows(
    scr: HeadClasses,
    measures: HeadValues,
    intervals: ScreenIntervals,
    null_p99: np.ndarray,
    degenerate_baseline: np.ndarray,
    near_threshold: np.ndarray,
) -> list[HeadRow]:
    """One ``HeadRow`` per head; ``null_p99`` [layers, heads] is the head's 99th percentile of null
    selectivity, ``degenerate_baseline`` [layers, heads] whether its baseline attention is degenerate
    (``stats.degenerate_baseline``: its selectivities are ratios over the softmax's far tail),
    ``near_threshold`` [layers, heads] whether the run's dtype could flip it (``screen.near_threshold``)."""
    mean_attention, pr, entropy_rank = measures.mean_attention, measures.pr, measures.entropy_rank
    rows = []
    for layer in range(scr.n_layers):
        for head in range(scr.n_heads):
            row: dict[str, Any] = {"layer": layer, "head": head}
            row.update({f"sel_{c}": float(scr.sel[layer, head, i]) for i, c in enumerate(CLASSES)})
            row["best_class"] = str(scr.best_class[layer, head])
            row["class_"] = str(scr.head_class[layer, head])
            row.update({f"{c}_member": bool(scr.members[layer, head, i]) for i, c in enumerate(CLASSES)})
            row["induction_circuit"] = bool(scr.induction_circuit[layer, head])
            row["pr"] = float(pr[layer, head])
            row["pr_entropy_rank"] = float(entropy_rank[layer, head])
            row.update({f"attn_{c}": float(mean_attention[layer, head, i]) for i, c in enumerate(CLASSES)})
            row["attn_baseline"] = float(mean_attention[layer, head, BASELINE])
            for i, c in enumerate(CLASSES):
                row[f"sel_{c}_ci_low"] = float(intervals.sel_low[layer, head, i])
                row[f"sel_{c}_ci_high"] = float(intervals.sel_high[layer, head, i])
            row.update({f"p_{c}_member": float(intervals.p_member[layer, head, i]) for i, c in enumerate(CLASSES)})
            row["null_p99"] = float(null_p99[layer, head])
            row["degenerate_baseline"] = bool(degenerate_baseline[layer, head])
            row["near_threshold"] = bool(near_threshold[layer, head])
            row["measure_columns"] = {name: float(grid[layer, head]) for name, grid in measures.measure_columns.items()}
            rows.append(HeadRow(**row))
    return rows


SCHEMA_VERSION = 5  # summary.json's layout: bump when a field is renamed or changes meaning
# Schema 3 types the summary's parts as records, under schema 2's keys. Schemas 4 and 5 move per-run
# numbers of the run's own into ``measures`` (4: the massive activations; 5: the text and repeat probes'
# scores, Sink_eps, the toys' copy loss drop, and heads.csv's key-0 importance among the measures'
# columns): each registry measure reads its fields from an old summary (``Measure.legacy``).
READABLE_SCHEMAS = (2, 3, 4, SCHEMA_VERSION)


@dataclass
class NearThreshold(Record):
    """Heads whose screen the run's dtype could flip (``screen.near_threshold``)."""

    relative_error: float  # the dtype's relative error on a selectivity (``screen.DTYPE_RELATIVE_ERROR``)
    count: int
    heads: list[str]


@dataclass
class ProbeSummary(ProbeConfig, Record):
    """``summary.json`` ``probe``: the probe's settings as the run used them (``ProbeConfig``), the
    fingerprint of its token batch and the positions its baseline attention averages over."""

    fingerprint: str = field(kw_only=True)  # sha256 of the token batch (``ProbeBatch.fingerprint``)
    baseline_positions: list[int] = field(kw_only=True)  # 0-based key positions
    # what position 0 held and why (``probe.first_token`` resolved); None: a run before the field (random)
    first: FirstToken | None = field(kw_only=True, default=None)


@dataclass
class Thresholds(Record):
    """``summary.json`` ``thresholds``: the selectivities (multiples of the head's baseline) the screen used."""

    classes: dict[str, float]  # class -> its threshold for the class and membership, order ``screen.CLASSES``
    circuit: float  # the induction selectivity from which on a head is in the induction circuit


@dataclass
class ProbeFitted(Record):
    """``summary.json`` ``probe_fit``: the probe fitted to a model smaller than it (``probe.fit=auto``):
    the model's context and vocabulary, each fitted field [asked, used], and the thresholds that apply,
    the asked ones x ``threshold_scale`` (the fitted T / the asked T, as threshold=toy does for T=128)."""

    context: int | None
    vocab_size: int
    fitted: dict[str, list[int]]  # probe field -> [asked, used]
    threshold_scale: float
    thresholds: dict[str, float]  # threshold field -> the value the screen used

    def line(self) -> str:
        fields = ", ".join(f"probe.{k} {a} -> {b}" for k, (a, b) in self.fitted.items())
        used = ", ".join(f"{k} {v:g}" for k, v in self.thresholds.items())
        return (
            f"probe fitted to the model (context {self.context}, vocabulary {self.vocab_size}): {fields}; "
            f"thresholds x{self.threshold_scale:g} (fitted T / asked T): {used} (probe.fit=off refuses instead)"
        )


@dataclass
class Download(Record):
    """``summary.json`` ``download``: how the run got its weights."""

    bytes_downloaded: int  # the revision's files in the cache, downloaded for this run (its sweep's); 0: cached before
    load_seconds: float  # the run's load step (``timings`` ``load``): resolving, downloading, loading the checkpoint
    prefetched: bool  # fetched by the sweep during an earlier job (``prefetch.arrival``)
    wait_seconds: float  # what the job still waited for the prefetch at its start


@dataclass
class IntervalsSummary(Record):
    """``summary.json`` ``intervals``: the bootstrap's settings (``StatsConfig``) and the counts'
    intervals, each [low, high] in heads."""

    ci: float  # coverage, in (0, 1)
    n_boot: int  # replicates
    seed: int  # of the resample
    method: str  # the bootstrap in words
    circuit_size: list[float]
    class_counts: dict[str, list[float]]  # single label, unclassified included
    member_counts: dict[str, list[float]]  # multi-label membership


@dataclass
class RunSummary(Record):
    """``summary.json``: what was analysed, how, and what the screen and ablation found.

    Token counts are training tokens seen; fractions are in [0, 1]; intervals are [low, high]."""

    schema_version: int
    model: str  # the preset's key (``model=...``)
    name_or_path: str
    training_seed: int | None  # which training run of the family (``training_seed``)
    revision: str | None
    step: int | None
    tokens: int | None
    architecture: str  # the checkpoint's model_type
    n_layers: int
    n_heads: int
    head_dim: int
    dtype: str
    reference_dtype: str | None  # the dtype the reference study ran this family in
    near_threshold: NearThreshold
    device: str
    weight_bytes: int
    weights_sha256: str | None
    download: Download
    batch_size: int
    probe: ProbeSummary
    thresholds: Thresholds
    class_counts: dict[str, int]  # single label (best class above its threshold), unclassified included
    member_counts: dict[str, int]  # multi-label membership
    bos_fraction: float  # share of heads that are bos members
    bos_fraction_ci: list[float]
    bos_per_layer: list[int]
    induction_circuit: list[str]
    intervals: IntervalsSummary
    null: NullSummary  # the null calibration (``stats.NullCalibration``)
    threshold_warnings: list[str]  # thresholds below the null floor that admit heads
    spectral: SpectralSummary
    reused_measurements: bool  # the probe's measurements came from the cache
    ablation: AblationResult
    config_digest: str
    timings: dict[str, float]  # seconds per step
    versions: dict[str, str]
    # a config whose model_type is a development name (olmo_1124) is read as the released one (``architecture``)
    model_type_mapped_from: str | None = None
    task: TaskSummary | None = None  # probe.task's capability, screens and ablations (docs/tasks.md)
    gguf: GgufHeader | None = None  # model.gguf_file: the file's tensor types before dequantization
    probe_fit: ProbeFitted | None = None  # the probe fitted to a model smaller than it (probe.fit=auto); None: not
    # the measures' per-run fields (``emergence.measures``): measure -> field -> a JSON value
    measures: dict[str, dict[str, Any]] = field(default_factory=dict)
    # where each measure's results came from: "cache", "pass" (the probe pass) or "weights"
    measure_sources: dict[str, str] = field(default_factory=dict)

    def save(self, out_dir: Path) -> None:
        atomic_write_text(out_dir / SUMMARY_FILE, json.dumps(self.to_json(), indent=2, allow_nan=True) + "\n")

    @classmethod
    def read(cls, run_dir: Path) -> RunSummary:
        data = read_summary_json(run_dir)
        data["probe"].setdefault("loss_curve", "all")  # a run before the field measured every position
        if data["schema_version"] < SCHEMA_VERSION:  # fields the registry's measures hold now, under old names
            data["measures"] = {**measures.legacy_fields(data), **data.get("measures", {})}
        return cls.from_json(data)


@dataclass
class DuplicateRun(Record):
    """``summary.json`` of a sweep job whose branch serves the same weights as a later branch of the
    sweep (``integrity``): not analysed again; its results are those of ``duplicate_of``."""

    schema_version: int
    model: str
    name_or_path: str
    training_seed: int | None
    revision: str
    step: int | None
    tokens: int | None
    duplicate_of: str  # the branch analysed in its place
    weights_sha256: str | None
    config_digest: str

    def save(self, out_dir: Path) -> None:
        atomic_write_text(out_dir / SUMMARY_FILE, json.dumps(self.to_json(), indent=2) + "\n")

    @classmethod
    def read(cls, run_dir: Path) -> DuplicateRun:
        return cls.from_json(read_summary_json(run_dir))


def read_summary_json(run_dir: Path) -> dict:
    """A run directory's summary.json (a ``RunSummary``'s or a ``DuplicateRun``'s) as JSON; one of a
    schema this version does not read (``READABLE_SCHEMAS``) is a ValueError that says so."""
    data = read_json(run_dir / SUMMARY_FILE)
    found = data.get("schema_version", 1)
    if found not in READABLE_SCHEMAS:
        raise ValueError(
            f"{run_dir}: summary.json has schema {found}, this version of emergence reads "
            f"schemas {', '.join(map(str, READABLE_SCHEMAS))}; rerun its job (python -m emergence "
            "with the same overrides) to rewrite it"
        )
    return data


def is_duplicate(run_dir: Path) -> bool:
    """The run directory holds a ``DuplicateRun``'s summary."""
    return "duplicate_of" in read_json(run_dir / SUMMARY_FILE)


@dataclass
class SpectralSummary(Record):
    """``summary.json`` ``spectral``: what heads.csv's ``pr`` and ``pr_entropy_rank`` are, in words,
    and over how many of the probe's sequences (docs/method.md section 5)."""

    pr: str = "participation ratio of the centred covariance, (sum l)^2 / sum l^2"
    pr_entropy_rank: str = (
        "exp(entropy) of normalised squared singular values, uncentred (the reference code's estimator)"
    )
    n_sequences: int = field(kw_only=True)  # the rows of each head's output matrix


def intervals_summary(intervals: ScreenIntervals, settings: StatsConfig) -> IntervalsSummary:
    """``summary.json`` ``intervals`` of the screen's bootstrap (``settings``: the run's ``StatsConfig``)."""
    return IntervalsSummary(
        ci=settings.ci,
        n_boot=settings.n_boot,
        seed=settings.seed,
        method="percentile bootstrap over sequences (paired numerator and baseline), the "
        "classification recomputed in each replicate",
        circuit_size=intervals.circuit_size,
        class_counts=intervals.class_counts,
        member_counts=intervals.member_counts,
    )


def versions() -> dict[str, str]:
    import torch
    import transformers

    return {
        "emergence": emergence.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


def near_threshold_record(near: np.ndarray, dtype: str) -> NearThreshold:
    """``near`` [layers, heads] bool (``screen.near_threshold``) -> the summary's record of it."""
    return NearThreshold(DTYPE_RELATIVE_ERROR[dtype], int(near.sum()), [head_name(l, h) for l, h in np.argwhere(near)])


def training_seed(model_cfg) -> int | None:
    """Which training run of a model family: a toy recipe's seed, a PolyPythias repo's ``-seed{N}``."""
    if model_cfg.toy is not None:
        return int(model_cfg.toy.seed)
    found = re.search(r"-seed(\d+)$", str(model_cfg.name_or_path))
    return int(found.group(1)) if found else None


def format_tokens(tokens) -> str:
    """Token counts the same way everywhere: 262K, 2.1M, 134M, 1.07B, 1.35T (three digits)."""
    if tokens is None:
        return "-"
    value = float(tokens)
    for unit in ("", "K", "M", "B", "T"):
        if abs(float(f"{value:.3g}")) < 1000 or unit == "T":
            break
        value /= 1000
    return (f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}") + unit


def report_lines(summary: RunSummary, scr: HeadClasses, out_dir: Path) -> list[str]:
    """What a run tells its user: classes per layer, BOS fraction, circuit, ablation verdict."""
    lines = [
        f"{summary.model} @ {summary.revision}  (step {summary.step}, tokens {format_tokens(summary.tokens)})",
        "classes per layer:",
    ]
    for layer in range(scr.n_layers):
        counts = {c: int((scr.head_class[layer] == c).sum()) for c in (*CLASSES, UNCLASSIFIED)}
        lines.append(f"  L{layer:<3}" + "  ".join(f"{c}={n}" for c, n in counts.items() if n))
    first = summary.probe.first
    if first is not None:
        lines.append(
            f"first token: {first.kind}"
            + (f" (id {first.bos_id})" if first.bos_id is not None else "")
            + f": {first.reason}"
        )
    low, high = summary.bos_fraction_ci
    lines.append(
        f"BOS fraction: {summary.bos_fraction:.1%} ({summary.intervals.ci:.0%} CI "
        f"{low:.1%}-{high:.1%})   induction circuit: {', '.join(summary.induction_circuit) or '(empty)'}"
    )
    near = summary.near_threshold
    lines.append(
        f"near a threshold (within {summary.dtype}'s {100 * near.relative_error:.2g}%): "
        f"{', '.join(near.heads) or 'none'}"
    )
    if dtype_differs(summary.dtype, summary.reference_dtype):
        lines.append(
            f"dtype {summary.dtype}, the reference study's {summary.reference_dtype}: "
            "compare with its published numbers only up to both dtypes' rounding"
        )
    null = summary.null
    floor = "none: every head set aside" if null.floor is None else f"p99 {null.p99:.2f}x, floor {null.floor:.2f}x"
    lines.append(
        f"null ({null.rule} rule, {null.draws} draws of {null.pooled_heads} heads): {floor}"
        + (
            f"; set aside, baseline attention under {null.degenerate_below:.3g} "
            f"({DEGENERATE_BASELINE_SHARE:g}/T): "
            f"{', '.join(null.set_aside)}"
            if null.set_aside
            else ""
        )
    )
    lines += ablation_lines(summary.ablation)
    if summary.task is not None:
        lines += task_lines(summary.task)
    lines.append(f"results: {out_dir}")
    return lines


def ablation_lines(ab: AblationResult) -> list[str]:
    """The ablation's verdict and how its controls were drawn. Every number of the verdict's line is
    over the same sequences (``sequences_used``): the clean and ablated losses of B and the rises."""
    if not ab.effect:
        return []
    e, draw = ab.effect, ab.control_draw
    assert ab.circuit is not None  # measured with the effect
    controls = (
        "no control set"
        if e.controls_loss_increase_mean is None
        else f"controls {e.controls_loss_increase_mean:+.3f}: "
        f"{'causal' if e.causal else 'not causal'} at {ab.causal_factor:g}x"
    )
    lines = [
        f"ablation ({ab.mode}, {ab.sequences_used} sequences): loss of B {ab.clean_loss_used:.3f} -> "
        f"{ab.circuit.loss:.3f} ({e.circuit_loss_increase:+.3f}); {controls}"
    ]
    if draw is not None:
        moved = ", ".join(f"{c} -> {f}" for c, f in draw.fallback_layers.items())
        lines.append(
            f"control sets: {draw.in_layer} in-layer, {draw.fallback} by the fallback"
            + (f" ({moved})" if moved else "")
            + f", {draw.asked} asked; never a control "
            f"(induction >= {draw.set_aside_level:g}x): {', '.join(draw.set_aside) or 'none'}"
            + (f"; {draw.note}" if draw.note else "")
        )
    return lines


def task_lines(task: TaskSummary) -> list[str]:
    """The task's capability, screens and screen-vs-random verdicts (``ablation.sweep_text``), a line each."""
    metrics = ", ".join(
        f"{name} {m.value:.3f} [{m.ci[0]:.3f}, {m.ci[1]:.3f}]" for name, m in task.metrics.metrics.items()
    )
    lines = [f"task {task.name}: {task.n_prompts} prompts x {task.seq_len} tokens ({task.tokenizer}): {metrics}"]
    if task.words is not None and task.words.mode == "filtered":  # not the study's prompts: say which words went
        dropped = "; ".join(f"{name} {' '.join(words)}" for name, words in task.words.dropped.items() if words)
        lines.append(f"task words: filtered to the tokenizer's single tokens, dropped {dropped or 'none'}")
    lines += [f"task screen {name}: {' '.join(heads) or '-'}" for name, heads in task.screens.items()]
    lines += [
        f"task ablation {sweep.screen}: {sweep_text(sweep)}"
        for sweep in (task.ablation.sweeps if task.ablation else [])
    ]
    return lines


def dtype_differs(dtype: str, reference_dtype: str | None) -> bool:
    """The run's dtype is not the one the reference study ran its model in (a family it ran)."""
    return reference_dtype not in (None, dtype)


def write_run(out_dir: Path, rows: list[HeadRow], run_summary: RunSummary, per_sequence: dict | None = None) -> None:
    """heads.csv, per_sequence.npz (if given: the probe's per-sequence arrays by name, e.g.
    ``targets`` [n, layers, heads, 7] and the measures' (``MeasureResult.per_sequence``) in float32, and
    the token batch ``tokens`` [n, T] as it is), then summary.json."""
    if per_sequence is not None:
        arrays = {
            name: a.astype(np.float32) if np.issubdtype(a.dtype, np.floating) else a for name, a in per_sequence.items()
        }
        atomic_write_bytes(out_dir / PER_SEQUENCE_FILE, npz_bytes(**arrays))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0].columns()), lineterminator="\n")
    writer.writeheader()
    writer.writerows(row.columns() for row in rows)
    atomic_write_text(out_dir / HEADS_FILE, buf.getvalue())
    run_summary.save(out_dir)  # last: a run directory with a summary is a complete run


def discard_partial(out_dir: Path) -> None:
    """Remove the result files of a run that did not finish (no summary.json written)."""
    if not (out_dir / SUMMARY_FILE).exists():
        for name in (HEADS_FILE, PER_SEQUENCE_FILE, PROMPTS_FILE, "classes.png"):
            (out_dir / name).unlink(missing_ok=True)


def read_json(path: Path):
    """A JSON file; a broken one is a ValueError that names the file."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(
            f"{path} is not valid JSON ({err}): it was cut short or edited; rewrite it (rerun its job) or remove it"
        ) from None


def is_done(run_dir: Path, config_digest: str, weights_now: Callable[[], str | None]) -> bool:
    """A complete run of the same configuration, on the same weights, is already in ``run_dir`` (a
    broken summary, or one of another schema, is not one; nor is one whose checkpoint's weights have
    changed since: ``weights_now`` gives their fingerprint, asked only where the rest matches; where
    it cannot tell, None, as for a Hub revision gone from the cache while offline, the run stands)."""
    try:
        if not (run_dir / SUMMARY_FILE).exists():
            return False
        summary = (DuplicateRun if is_duplicate(run_dir) else RunSummary).read(run_dir)
    except ValueError:
        return False
    if summary.config_digest != config_digest:
        return False
    now = weights_now()
    return now is None or summary.weights_sha256 == now


def read_run(run_dir: Path) -> tuple[RunSummary, list[dict]]:
    """(summary, heads.csv's rows) of a complete run directory; each row is its ``HeadRow``'s
    columns, typed (ints, floats, booleans, strings)."""
    run_summary = RunSummary.read(run_dir)
    with open(run_dir / HEADS_FILE, newline="") as f:
        rows = [HeadRow.from_columns(r).columns() for r in csv.DictReader(f)]
    return run_summary, rows
