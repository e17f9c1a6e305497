"""The bookkeeping steps of one checkpoint's run: ``check_branch`` (the sweep's verdict), ``load``
(the checkpoint, the probe batch and the cache's entry, as one record; ``load_live``: a model in memory,
for ``emergence.track``), ``measure`` (the probe pass),
``summarise`` (the run record) and ``write_outputs`` (its files, the cache entry, W&B).
``emergence.main.analyse`` calls them between the recipe's own steps (``emergence/recipe/``).
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import cast

import numpy as np
import torch
from jaxtyping import Int
from omegaconf import OmegaConf

from emergence import measures
from emergence.core.atomic import atomic_write_text
from emergence.core.config import Config, config_digest
from emergence.core.errors import UsageError
from emergence.hub import checkpoints, integrity, revisions
from emergence.hub.gguf import GgufHeader
from emergence.measures.plugin import MeasureResult
from emergence.recipe import ablation, capture, icl, probe, stats
from emergence.recipe.pass_record import PassRecord
from emergence.recipe.screen import CLASSES, Screened
from emergence.recipe.tasks.batches import TaskBatch
from emergence.recipe.tasks.step import TaskResult
from emergence.run import batches, cache, prefetch, results, tracking
from emergence.run.validation import fit_probe, validate_for_model
from emergence.toy import train as toy_train

log = logging.getLogger(__name__)


@dataclass
class Loaded:
    """Step 0's record: the checkpoint named, checked and (where the recipe needs it) loaded, with
    everything later steps need of the Hub and the cache, so that none of them asks again."""

    name: str  # model@revision, for the log and W&B
    revision: checkpoints.Revision
    source: checkpoints.Source | None  # None: a model in memory (``load_live``)
    model_type_mapped_from: str | None  # the config's development model_type, read as its released name
    device: torch.device
    dtype: str  # "float32", "bfloat16" or "float16"
    weight_bytes: int
    weights_sha256: str | None  # the weights' content fingerprint (``checkpoints.weights_identity``); None: not known
    download: results.Download  # bytes downloaded and the prefetch's arrival (load_seconds set by ``summarise``)
    first_token: probe.FirstToken  # what position 0 of the probe and the task prompts holds, and why
    batch: probe.ProbeBatch  # the probe (built before the weights load: the text probe's can fail)
    baseline: Int[np.ndarray, " n_baseline"]  # the baseline's key positions
    tokenizer: str | None  # the text probe's tokenizer: the checkpoint's (repo@revision) or bytes
    cache_file: Path | None  # where the measurements are kept (reuse=true); None: not kept
    cached: PassRecord | None  # the probe's measurements from the cache (reuse=true), if there
    subject: capture.Subject | None  # model, layout, batch; None: the cache serves everything, ablation is off
    chosen: list[measures.Chosen]  # the measures the run computes (``Config.measures``)
    result_files: dict[str, Path | None]  # where each one's results are kept (reuse=true); None: not kept
    cached_results: dict[str, MeasureResult]  # the ones the cache serves
    task_batch: TaskBatch | None = None  # probe.task's prompts on the checkpoint's tokenizer; None: no task
    task_tokenizer: str | None = None  # that tokenizer's repo@revision
    gguf: GgufHeader | None = None  # model.gguf_file: the file's tensor types before dequantization
    # the run's settings with the probe fitted to the model (``validation.fit_probe``): what later steps use
    cfg: Config = field(kw_only=True)
    probe_fit: results.ProbeFitted | None = None  # what was fitted; None: the probe as asked
    config_digest: str = field(kw_only=True)  # the settings as asked (``resume`` compares them)


def check_branch(cfg: Config, store: Path | None) -> results.DuplicateRun | None:
    """The sweep's verdict on this job's branch: a branch holding another's shard, or no weights,
    stops the job in one line; a duplicate gives its record, written in place of an analysis."""
    if store is None:
        return None
    training_seed = results.training_seed(cfg.model)
    revision = checkpoints.resolve_revision(cfg.model, cfg.revision, cfg.cache_dir)
    repo = cfg.model.name_or_path
    if revision.name is None:  # the checkpoint as it is: no branch the sweep checked
        return None
    verdict = integrity.stored_verdicts(store).get(repo, {}).get(revision.name)
    if verdict is None or verdict.verdict == "ok":
        return None
    if verdict.fails:
        raise UsageError(
            f"revision={revision.name} of {repo} is defective: {verdict.line} "
            f"({revisions.listing_command(cfg.model)} --check); leave it out of the sweep"
        )
    if verdict.verdict == "duplicate":
        assert verdict.other is not None  # a duplicate names the branch analysed in its place
        return results.DuplicateRun(
            results.SCHEMA_VERSION,
            cfg.model.key,
            repo,
            training_seed,
            revision.name,
            revision.step,
            revision.tokens,
            verdict.other,
            verdict.weights_sha256,
            config_digest(cfg),
        )
    log.warning(f"{repo}@{revision.name}: {verdict.line}; read as {verdict.expected_model_type}")
    return None


@dataclass(frozen=True)
class Probes:
    """What the run probes a model with: its settings with the probe fitted to the model, and the batches."""

    cfg: Config  # the probe fitted to the model where it is smaller (``validation.fit_probe``)
    fitted: results.ProbeFitted | None  # what was fitted; None: the probe as asked
    asked: str  # the settings' digest as asked (``resume`` compares it)
    first_token: probe.FirstToken
    batch: probe.ProbeBatch
    baseline: Int[np.ndarray, " n_baseline"]  # the baseline's key positions
    tokenizer: str | None  # the text probe's tokenizer
    task_batch: TaskBatch | None  # probe.task's prompts; None: no task
    task_tokenizer: str | None


def probes_for(cfg: Config, hf_config, tokenizers: checkpoints.TokenizerLookup) -> Probes:
    """The probe fitted to the model (``hf_config``: its config), position 0 as its tokenizer says, the probe
    and task batches, and the settings checked against the model: step 0's part that needs no weights."""
    asked = config_digest(cfg)
    cfg, fitted = fit_probe(cfg, hf_config)
    if fitted is not None:
        log.info(fitted.line())
    first = batches.first_token(cfg, tokenizers)
    batch, tokenizer = batches.probe_batch(cfg, hf_config.vocab_size, first, tokenizers)
    task_batch, task_tokenizer = (None, None) if cfg.probe.task is None else batches.task_batch(cfg, first, tokenizers)
    validate_for_model(cfg, hf_config)
    p = cfg.probe
    return Probes(
        cfg,
        fitted,
        asked,
        first,
        batch,
        probe.baseline_positions(p.seq_len, p.n_baseline, p.baseline_seed),
        tokenizer,
        task_batch,
        task_tokenizer,
    )


def subject_of(
    cfg: Config, model, batch: probe.ProbeBatch, device: torch.device, dtype: torch.dtype
) -> capture.Subject:
    """The model with its attention layout and the probe batch; on a GPU (``probe.auto_batch``) as many
    sequences per forward as fit the memory left beside its weights."""
    batch_size = cfg.probe.batch_size
    if device.type == "cuda" and cfg.probe.auto_batch:
        free = checkpoints.free_memory(device)
        assert free is not None  # CUDA reports it
        batch_size = checkpoints.auto_batch_size(free, cfg.probe.seq_len, model.config, dtype)
    return capture.Subject(model, capture.Architecture.of(model), batch, batch_size)


def load(cfg: Config) -> Loaded:
    """Step 0: the checkpoint's revision, source and config, checked against the run's settings and
    the memory; the probe batch; then its cached measurements (reuse=true), and the model unless they
    make it unnecessary (``cache.needs_weights``); mean ablation also needs the probe pass's
    per-position means. A model smaller than the probe gets the probe fitted to it (``Loaded.cfg``)."""
    if cfg.model.toy is not None:
        toy_train.ensure_trained(cfg.model)
    # the Hub: what the checkpoint is, before its weights
    revision = checkpoints.resolve_revision(cfg.model, cfg.revision, cfg.cache_dir)
    device = checkpoints.pick_device(cfg.device)
    dtype = checkpoints.pick_dtype(cfg.model.dtype)
    src = checkpoints.source(cfg.model, revision)  # before anything is fetched: was it cached already?
    checkpoint = checkpoints.load_config(cfg.model, src)
    hf_config = checkpoint.hf_config
    weight_bytes = checkpoints.check_memory(hf_config, dtype, device)
    probes = probes_for(cfg, hf_config, checkpoints.TokenizerLookup(cfg.model, src))
    cfg, batch = probes.cfg, probes.batch
    dtype_name = checkpoints.dtype_name(dtype)
    # the run's bookkeeping: the sweep's prefetch, the cache
    prefetched = (src.path, src.revision, src.weights_format)
    if prefetch.fetched_by_sweep(prefetched):  # the sweep downloaded it: count it, and clean it up
        src = dataclasses.replace(src, cached_before=False)
    arrival = prefetch.arrival(prefetched)
    identity = cache.checkpoint_identity(src, hf_config)
    entry = cache.entry_of(cfg, identity, dtype_name)
    cache_file = cache.entry_path(cfg.cache_dir, entry) if cfg.reuse and entry is not None else None
    cached = None if cache_file is None else cache.load(cache_file)
    if cached is not None and cached.probe_fingerprint != batch.fingerprint():  # the dataset changed under its name
        cached = None
    chosen = measures.chosen(cfg.measures)
    result_files = {c.name: cache.measure_entry_path(cfg, identity, dtype_name, c) for c in chosen}
    cached_results = {
        c.name: result
        for c in chosen
        # a pass measure's entry is read where the pass's own is: its key names the probe, not the batch's content
        if (cached is not None or not c.measure.in_pass) and (result := cache.load_result(result_files[c.name]))
    }
    need_model = cache.needs_weights(cfg, cached is not None, len(cached_results) < len(chosen))
    # the Hub again: the weights, where the run needs them
    subject = None
    if need_model:
        model = checkpoints.load_model(cfg.model, src, checkpoint, device, dtype, capture.register_attention())
        subject = subject_of(cfg, model, batch, device, dtype)
    download = results.Download(
        bytes_downloaded=checkpoints.downloaded_bytes(src),
        load_seconds=0.0,
        prefetched=arrival.prefetched,
        wait_seconds=arrival.wait_seconds,
    )
    # named before the cache was asked; a Hub revision not cached then is named by the Hub's digests
    weights_sha256 = identity["weights_sha256"] if identity else checkpoints.weights_sha256(src)
    return Loaded(
        f"{cfg.model.key}@{revision.name or 'as-is'}",
        revision,
        src,
        checkpoint.model_type_mapped_from,
        device,
        dtype_name,
        weight_bytes,
        weights_sha256,
        download,
        probes.first_token,
        batch,
        probes.baseline,
        probes.tokenizer,
        cache_file,
        cached,
        subject,
        chosen,
        result_files,
        cached_results,
        probes.task_batch,
        probes.task_tokenizer,
        checkpoint.gguf,
        probes.fitted,
        cfg=cfg,
        config_digest=probes.asked,
    )


def load_live(cfg: Config, model, revision: checkpoints.Revision, tokenizer=None) -> Loaded:
    """Step 0 for a model in memory (``emergence.track``): the probe fitted to it and its batches, as ``load``
    makes them, on the model as it is, on its device and in its dtype; ``tokenizer`` (a Hugging Face tokenizer,
    or None) stands in for a checkpoint's tokenizer files. Nothing is read from disk, and no measurements are
    cached or served: no weight file names them (``reuse`` does not apply), and a training model is never
    measured twice at the same weights."""
    parameter = next(model.parameters())
    device, dtype = parameter.device, parameter.dtype
    probes = probes_for(cfg, model.config, checkpoints.TokenizerLookup(cfg.model, None, tokenizer))
    subject = subject_of(probes.cfg, model, probes.batch, device, dtype)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return Loaded(
        f"{cfg.model.key}@{revision.name}",
        revision,
        None,
        None,
        device,
        checkpoints.dtype_name(dtype),
        weight_bytes,
        None,
        results.Download(bytes_downloaded=0, load_seconds=0.0, prefetched=False, wait_seconds=0.0),
        probes.first_token,
        probes.batch,
        probes.baseline,
        probes.tokenizer,
        None,
        None,
        subject,
        measures.chosen(probes.cfg.measures),
        {},
        {},
        probes.task_batch,
        probes.task_tokenizer,
        None,
        probes.fitted,
        cfg=probes.cfg,
        config_digest=probes.asked,
    )


def run_config(cfg: Config, loaded: Loaded) -> dict:
    """The W&B run's config: the run's settings, and the checkpoint's step and tokens."""
    return {
        **cast(dict, OmegaConf.to_container(OmegaConf.structured(cfg))),
        "step": loaded.revision.step,
        "tokens": loaded.revision.tokens,
    }


@dataclass(frozen=True)
class Measured:
    """Step 1's record: the probe pass (where it ran) and every chosen measure's results."""

    capture: capture.Capture | None  # None: the cache served the pass's measurements and no measure needed it
    results: dict[str, MeasureResult]  # each chosen measure's, in the config's order
    sources: dict[str, str]  # each one's: "cache", "pass" (computed in the probe pass) or "weights"


def training_data(cfg: Config, revision: checkpoints.Revision) -> measures.TrainingData | None:
    """The training distribution, where the tool knows it: a toy's corpus, at steps no training reaches,
    and what its training recorded at ``revision``."""
    recipe = cfg.model.toy
    if recipe is None:
        return None
    return measures.TrainingData(
        f"{cfg.model.key}'s training corpus (held-out steps from {toy_train.HELD_OUT_FIRST_STEP})",
        lambda n, seed: toy_train.held_out(recipe, n, seed),
        toy_train.recorded(cfg.model, revision.name),
    )


SCRATCH = ".measures-scratch"  # the measures' scratch folder inside the run directory, removed after step 1


def measure_input(loaded: Loaded, chosen: measures.Chosen, out_dir: Path | None = None) -> measures.MeasureInput:
    assert loaded.subject is not None  # a measure the cache lacks loads the model (``cache.needs_weights``)
    arch = loaded.subject.arch
    p = loaded.cfg.probe
    return measures.MeasureInput(
        loaded.subject.model,
        arch.n_layers,
        arch.n_heads,
        loaded.batch,
        cast(measures.plugin.ProbeKind, p.kind),
        loaded.tokenizer,
        loaded.device,
        chosen.settings,
        training_data(loaded.cfg, loaded.revision),
        None if out_dir is None else out_dir / SCRATCH / chosen.name,
        p,
        loaded.cfg.stats,
    )


def measure(cfg: Config, loaded: Loaded, out_dir: Path) -> Measured:
    """Step 1: the probe pass, reduced on the fly, with the accumulators of the measures that read it,
    unless the cache serves the pass and every such measure (mean ablation runs it anyway: it needs
    the per-position means); then the measures that read the weights alone, where the cache lacks them.
    Their scratch folder inside the run directory ``out_dir`` is gone when it returns (or raises)."""
    try:
        return _measure(cfg, loaded, out_dir)
    finally:
        shutil.rmtree(out_dir / SCRATCH, ignore_errors=True)


def _measure(cfg: Config, loaded: Loaded, out_dir: Path) -> Measured:
    p = cfg.probe
    mean_ablation = cfg.ablate.enabled and cfg.ablate.mode == "mean"
    missing = [c for c in loaded.chosen if c.name not in loaded.cached_results]
    in_pass = [c for c in missing if c.measure.in_pass]
    computed: dict[str, MeasureResult] = {}
    cap = None
    if loaded.cached is None or mean_ablation or in_pass:
        log.info(f"probe: {p.n_sequences} sequences x {p.seq_len} tokens through {loaded.name}")
        options = capture.PassOptions(
            loaded.baseline,
            p.spectral_sequences or p.n_sequences,
            keep_position_means=mean_ablation,
            null_positions=stats.null_positions(loaded.batch.ab.numpy(), p.seq_len, cfg.stats.n_null),
            loss_positions=loss_positions(p),
        )
        assert loaded.subject is not None  # the model loads where the pass runs (cache.needs_weights)
        accumulators = {
            c.name: c.measure.accumulate(measure_input(loaded, c, out_dir)) for c in in_pass if c.measure.accumulate
        }
        cap = capture.run_probe(loaded.subject, options, ablation.metrics_per_sequence, list(accumulators.values()))
        shape = (loaded.subject.arch.n_layers, loaded.subject.arch.n_heads)
        computed = {c.name: c.measure.checked(accumulators[c.name].result(), shape) for c in in_pass}
    for c in missing:
        if not c.measure.in_pass:
            computed[c.name] = c.measure.run(measure_input(loaded, c, out_dir))
    results = {c.name: loaded.cached_results.get(c.name) or computed[c.name] for c in loaded.chosen}
    sources = {
        c.name: "cache" if c.name in loaded.cached_results else ("pass" if c.measure.in_pass else "weights")
        for c in loaded.chosen
    }
    return Measured(cap, results, sources)


def loss_positions(p) -> np.ndarray | None:
    """The positions whose token's loss the probe pass computes (``capture.PassOptions``): the text
    probe's curve (``icl.curve_positions``, ``probe.loss_curve``), every position on the repeat probe
    (its scores read both copies, its saved losses every position), none on the synthetic probe."""
    if p.kind == "text":
        return icl.curve_positions(p.seq_len, list(p.icl_positions), p.loss_curve)
    return np.arange(1, p.seq_len) if p.kind == "repeat" else None


def remove_from_cache(source: checkpoints.Source) -> None:
    freed = checkpoints.remove_from_cache(source)
    log.info(f"cleanup: removed {source.path}@{source.revision} from the Hugging Face cache ({freed / 2**20:.1f} MiB)")


@dataclass(frozen=True)
class Findings:
    """What the recipe's steps found on the checkpoint, for its record and files."""

    screened: Screened
    uncertainty: stats.Uncertainty
    ablated: ablation.AblationResult
    task: TaskResult | None  # probe.task's step; None: no task
    measures: Measured  # step 1's measures


def summarise(
    cfg: Config, loaded: Loaded, measured: PassRecord, found: Findings, timings: dict[str, float]
) -> results.RunSummary:
    """The run's record, ``summary.json``."""
    screened, uncertainty, ablated = found.screened, found.uncertainty, found.ablated
    revision, scr, null, p = loaded.revision, screened.classes, uncertainty.null, cfg.probe
    # the run's own records first, then the recipe's scores, then the settings' digest
    training_seed = results.training_seed(cfg.model)
    near = results.near_threshold_record(screened.near_threshold, loaded.dtype)
    intervals = results.intervals_summary(uncertainty.intervals, cfg.stats)
    versions = results.versions()
    digest = loaded.config_digest  # the settings as asked, before any fitting
    return results.RunSummary(
        schema_version=results.SCHEMA_VERSION,
        model=cfg.model.key,
        name_or_path=cfg.model.name_or_path,
        training_seed=training_seed,
        revision=revision.name,
        step=revision.step,
        tokens=revision.tokens,
        architecture=measured.model_type,
        n_layers=measured.n_layers,
        n_heads=measured.n_heads,
        head_dim=measured.head_dim,
        dtype=loaded.dtype,
        reference_dtype=cfg.model.reference_dtype,
        near_threshold=near,
        device=str(loaded.device),
        weight_bytes=loaded.weight_bytes,
        weights_sha256=loaded.weights_sha256,
        download=dataclasses.replace(loaded.download, load_seconds=timings["load"]),
        batch_size=loaded.subject.batch_size if loaded.subject else p.batch_size,
        probe=results.ProbeSummary(
            **asdict(p),
            fingerprint=loaded.batch.fingerprint(),
            baseline_positions=loaded.baseline.tolist(),
            first=loaded.first_token,
        ),
        thresholds=results.Thresholds(
            classes=dict(zip(CLASSES, screened.thresholds.tolist())), circuit=cfg.threshold.circuit
        ),
        class_counts=scr.class_counts(),
        member_counts=scr.member_counts(),
        bos_fraction=scr.bos_fraction(),
        bos_fraction_ci=uncertainty.intervals.bos_fraction,
        bos_per_layer=scr.bos_per_layer(),
        induction_circuit=scr.circuit_names(),
        intervals=intervals,
        null=null.as_summary(),
        threshold_warnings=[f"below the null floor {null.floor:.2f}x: {t}" for t in uncertainty.below_floor],
        spectral=results.SpectralSummary(n_sequences=measured.spectral_n),
        reused_measurements=loaded.cached is not None,
        ablation=ablated,
        config_digest=digest,
        timings=timings,
        versions=versions,
        model_type_mapped_from=loaded.model_type_mapped_from,
        task=found.task.summary if found.task else None,
        gguf=loaded.gguf,
        probe_fit=loaded.probe_fit,
        measures={name: r.per_run for name, r in found.measures.results.items()},
        measure_sources=found.measures.sources,
    )


def write_outputs(
    out_dir: Path, run, summary: results.RunSummary, loaded: Loaded, measured: PassRecord, found: Findings
) -> None:
    """The class grid, the W&B run's log, the cache entry (reuse=true), the task's prompts.jsonl,
    then heads.csv, per_sequence.npz (with the token batch [n, T]) and summary.json (last)."""
    screened, uncertainty = found.screened, found.uncertainty
    null = uncertainty.null
    out_dir.mkdir(parents=True, exist_ok=True)
    figure = tracking.class_figure(screened.classes.head_class, loaded.name)
    figure.savefig(out_dir / "classes.png", dpi=120)
    task_scores = found.task.screen.scores if found.task else None
    rows = results.head_rows(
        screened.classes,
        results.HeadValues.of(measured, found.measures.results, task_scores),
        uncertainty.intervals,
        null.per_head_p99,
        null.degenerate,
        screened.near_threshold,
    )
    tracking.log_checkpoint(run, summary, rows, figure)
    tracking.plt.close(figure)
    if loaded.cache_file is not None and loaded.cached is None:
        cache.save(loaded.cache_file, measured)
    for name, source in found.measures.sources.items():
        kept = loaded.result_files.get(name)
        if source != "cache" and kept is not None:
            cache.save_result(kept, found.measures.results[name])
    if loaded.task_batch is not None:
        atomic_write_text(out_dir / results.PROMPTS_FILE, loaded.task_batch.jsonl())
    per_sequence = {
        "targets": measured.targets,
        **{name: values for r in found.measures.results.values() for name, values in r.per_sequence.items()},
        "tokens": loaded.batch.tokens.numpy(),
    }
    if measured.position_losses is not None:
        per_sequence["position_losses"] = measured.position_losses
    results.write_run(out_dir, rows, summary, per_sequence)
