"""``python -m emergence``: probe -> screen -> participation ratio -> ablate on one checkpoint.

``analyse`` is the recipe in order; each step's logic lives in its own module. ``main`` is
the command line around it: one line and exit 2 for bad input, a sweep that survives a
failing job, Ctrl-C without a traceback.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

import hydra
import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from emergence.core.config import Config, config_digest
from emergence.core.errors import UsageError
from emergence.hub import checkpoints, integrity
from emergence.recipe import ablation, capture, icl, probe, screen, sinks, stats, text
from emergence.run import cache, interrupt, prefetch, results, sweep, tracking
from emergence.run.validation import validate, validate_for_model
from emergence.toy import train as toy_train

log = logging.getLogger(__name__)


@dataclass
class Loaded:
    """Step 0's record: the checkpoint named, checked and (where the recipe needs it) loaded."""

    revision: checkpoints.Revision
    source: checkpoints.Source
    model_type_mapped_from: str | None  # the config's development model_type, read as its released name
    device: torch.device
    dtype: str  # "float32", "bfloat16" or "float16"
    weight_bytes: int
    batch: probe.ProbeBatch  # the probe (built before the weights load: the text probe's can fail)
    tokenizer: str | None  # the text probe's tokenizer: the checkpoint's (repo@revision) or bytes
    cached: cache.Measurements | None  # the probe's measurements from the cache (reuse=true), if there
    model: torch.nn.Module | None  # None: the cached measurements serve and ablation is off
    arch: checkpoints.Architecture | None
    batch_size: int  # sequences per forward pass


@dataclass
class Screened:
    """Step 2's record: the screen at the run's thresholds."""

    thresholds: np.ndarray  # [6] class thresholds (order ``screen.CLASSES``)
    screen: screen.Screen
    near_threshold: np.ndarray  # [layers, heads] bool: heads the dtype's rounding could flip


@dataclass
class Uncertainty:
    """The screen's uncertainty, from the same pass."""

    intervals: stats.ScreenIntervals  # the bootstrap over sequences
    null: stats.NullCalibration  # the reference null's floor
    below_floor: list[str]  # thresholds under the null floor that admit heads


class Laps:
    """Seconds per step of the recipe, in order (``summary.json`` ``timings``)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def __call__(self, step: str) -> None:
        now = time.perf_counter()
        self.seconds[step] = round(now - self._last, 3)
        self._last = now


def analyse(cfg: Config, out_dir: Path,
            integrity_store: Path | None = None) -> results.RunSummary | results.DuplicateRun:
    """Run the recipe on the checkpoint ``cfg`` names; write and return its summary. In a sweep,
    ``integrity_store`` holds the sweep's check of its branches (``sweep.CheckBranches``): a branch
    that duplicates a later one is not analysed again."""
    lap = Laps()
    validate(cfg)  # everything that can be checked without the weights, before they load
    tracking.check_login(cfg.wandb)
    duplicate = check_branch(cfg, integrity_store)
    if duplicate is not None:
        duplicate.save(out_dir)
        log.info(f"{duplicate.revision} serves the weights of {duplicate.duplicate_of}: analysed there, not again")
        return duplicate
    p = cfg.probe
    baseline = probe.baseline_positions(p.seq_len, p.n_baseline, p.baseline_seed)  # [n_baseline] key positions
    loaded = load(cfg)
    batch = loaded.batch
    lap("load")
    name = f"{cfg.model.key}@{loaded.revision.name or 'as-is'}"
    run_config = {**OmegaConf.to_container(OmegaConf.structured(cfg)), "step": loaded.revision.step,
                  "tokens": loaded.revision.tokens}
    with tracking.tracked_run(cfg.wandb, name, run_config, out_dir, tags=[cfg.model.key, loaded.revision.name]) as run:
        lap("tracker")  # starting W&B is bookkeeping, not the recipe's first step
        measured, cap = measure(cfg, loaded, batch, baseline, name)
        lap("capture")
        screened = screen_heads(cfg, measured, loaded.dtype)
        lap("screen_spectral")  # the spectral estimators came with the pass (step 3)
        uncertainty = quantify_uncertainty(cfg, measured, screened)
        lap("intervals")
        ablated = ablation.ablate(cfg.ablate, loaded.model, loaded.arch, batch, loaded.batch_size,
                                  screened.screen.circuit_heads(), measured.clean_metrics, measured.clean_loss,
                                  cap.position_mean if cap else None, cfg.stats)
        lap("ablate")
        summary = summarise(cfg, loaded, batch, baseline, measured, screened, uncertainty, ablated, lap.seconds)
        lap("summary")
        write_outputs(out_dir, run, summary, measured, batch.tokens, screened, uncertainty, name)
    if cfg.model.cleanup:  # the results are written: the weights can go
        prefetch.after_downloads(lambda: remove_from_cache(loaded.source))
    for line in results.report_lines(summary, screened.screen, out_dir):
        log.info(line)
    return summary


def check_branch(cfg: Config, store: Path | None) -> results.DuplicateRun | None:
    """The sweep's verdict on this job's branch: a branch holding another's shard, or no weights,
    stops the job in one line; a duplicate gives its record, written in place of an analysis."""
    if store is None:
        return None
    revision = checkpoints.resolve_revision(cfg)
    repo = cfg.model.name_or_path
    verdict = integrity.stored_verdicts(store).get(repo, {}).get(revision.name)
    if verdict is None or verdict.verdict == "ok":
        return None
    if verdict.fails:
        raise UsageError(f"revision={revision.name} of {repo} is defective: {verdict.line} (python -m "
                         f"emergence.revisions {cfg.model.key} --repo {repo} --check); leave it out of the sweep")
    if verdict.verdict == "duplicate":
        return results.DuplicateRun(results.SCHEMA_VERSION, cfg.model.key, repo, results.training_seed(cfg.model),
                                    revision.name, revision.step, revision.tokens, verdict.other,
                                    verdict.weights_sha256, config_digest(cfg))
    log.warning(f"{repo}@{revision.name}: {verdict.line}; read as {verdict.expected_model_type}")
    return None


def remove_from_cache(source: checkpoints.Source) -> None:
    freed = checkpoints.remove_from_cache(source)
    log.info(f"cleanup: removed {source.path}@{source.revision} from the Hugging Face cache ({freed / 2**20:.1f} MiB)")


def load(cfg: Config) -> Loaded:
    """Step 0: the checkpoint's revision, source and config, checked against the run's settings and
    the memory; the probe batch (``make_batch``); then its cached measurements (reuse=true), and
    the model unless they make it unnecessary (``cache.needs_weights``); mean ablation also needs
    the probe pass's per-position means."""
    revision = checkpoints.resolve_revision(cfg)
    device = checkpoints.pick_device(cfg.device)
    dtype = checkpoints.pick_dtype(cfg.model.dtype)
    if cfg.model.toy is not None:
        toy_train.ensure_trained(cfg.model)
    src = checkpoints.source(cfg, revision)  # before anything is fetched: was it cached already?
    # the sweep downloaded it: count it, and clean it up
    if prefetch.fetched_by_sweep((src.path, src.revision, src.weights_format)):
        src = dataclasses.replace(src, cached_before=False)
    checkpoint = checkpoints.load_config(cfg, src)
    hf_config = checkpoint.hf_config
    validate_for_model(cfg, hf_config)
    weight_bytes = checkpoints.check_memory(hf_config, dtype, device)
    batch, tokenizer = make_batch(cfg, src, hf_config.vocab_size)
    dtype_name = checkpoints.dtype_name(dtype)
    cached = cache.load(cfg.cache_dir, cache.entry_of(cfg, src.path, src.revision, dtype_name)) if cfg.reuse else None
    if cached is not None and cached.probe_fingerprint != batch.fingerprint():  # the dataset changed under its name
        cached = None
    need_model = cache.needs_weights(cfg, cached is not None)
    model = checkpoints.load_model(cfg, src, checkpoint, device, dtype) if need_model else None
    batch_size = cfg.probe.batch_size
    if need_model and device.type == "cuda" and cfg.probe.auto_batch:
        batch_size = checkpoints.auto_batch_size(checkpoints.free_memory(device), cfg.probe.seq_len, hf_config, dtype)
    return Loaded(revision, src, checkpoint.model_type_mapped_from, device, dtype_name, weight_bytes, batch,
                  tokenizer, cached, model, checkpoints.Architecture.of(model) if need_model else None, batch_size)


def make_batch(cfg: Config, src: checkpoints.Source, vocab_size: int) -> tuple[probe.ProbeBatch, str | None]:
    """The probe batch ``probe.kind`` names, and the text probe's tokenizer (None for the others)."""
    p = cfg.probe
    if p.kind == "text":
        if p.tokenizer == "bytes":
            tokenizer = text.byte_tokenizer()
        else:
            found = checkpoints.tokenizer_source(cfg, src)
            tokenizer = text.checkpoint_tokenizer(found.directory, found.name, cfg.model.trust_remote_code)
        return text.text_batch(p, tokenizer, vocab_size), tokenizer.name
    make = probe.make_repeat_batch if p.kind == "repeat" else probe.make_probe_batch
    return make(p.n_sequences, p.seq_len, p.vocab_low, p.vocab_high, p.seed), None


def measure(cfg: Config, loaded: Loaded, batch: probe.ProbeBatch, baseline: np.ndarray,
            name: str) -> tuple[cache.Measurements, capture.Capture | None]:
    """Step 1: the probe pass, reduced on the fly, unless the measurements are cached (mean
    ablation runs it anyway: it needs the per-position means); saved to the cache when computed."""
    p, cap = cfg.probe, None
    mean_ablation = cfg.ablate.enabled and cfg.ablate.mode == "mean"
    if loaded.cached is None or mean_ablation:
        log.info(f"probe: {p.n_sequences} sequences x {p.seq_len} tokens through {name}")
        null_positions = stats.null_positions(batch.ab.numpy(), p.seq_len, cfg.stats.n_null)
        cap = capture.run_probe(loaded.model, loaded.arch, batch, baseline, loaded.batch_size,
                                p.spectral_sequences or p.n_sequences, mean_ablation,
                                ablation.metrics_per_sequence, null_positions, position_losses=p.kind != "synthetic",
                                repeat=probe.RepeatLayout(p.seq_len) if p.kind == "repeat" else None)
    measured = loaded.cached or cache.Measurements.of(cap, loaded.arch, batch.fingerprint())
    if loaded.cached is None and cfg.reuse:
        cache.save(cfg.cache_dir, cache.entry_of(cfg, loaded.source.path, loaded.source.revision, loaded.dtype),
                   measured)
    return measured, cap


def screen_heads(cfg: Config, measured: cache.Measurements, dtype: str) -> Screened:
    """Step 2: selectivities, classes, memberships and the circuit at the run's thresholds, and the
    heads the run's dtype could flip."""
    thresholds = screen.class_thresholds(cfg.threshold.class_default, cfg.threshold.per_class.overrides())
    scr = screen.screen(screen.selectivity(measured.mean_attention), thresholds, cfg.threshold.circuit)
    near = screen.near_threshold(scr.sel, thresholds, cfg.threshold.circuit, screen.DTYPE_RELATIVE_ERROR[dtype])
    return Screened(thresholds, scr, near)


def quantify_uncertainty(cfg: Config, measured: cache.Measurements, screened: Screened) -> Uncertainty:
    """The screen's uncertainty from the same pass: a bootstrap over sequences and the null's floor;
    a warning names the heads a threshold below the floor admits."""
    p, scr = cfg.probe, screened.screen
    intervals = stats.screen_intervals(measured.targets, screened.thresholds, cfg.threshold.circuit, cfg.stats)
    null = stats.null_calibration(measured.null_sums, measured.mean_attention[..., screen.BASELINE], p.n_sequences,
                                  p.seq_len, cfg.stats.null_rule)
    low = stats.below_floor(scr, screened.thresholds, cfg.threshold.circuit, null.floor)
    if null.floor is None:
        log.warning(f"warning: no null floor: every head's baseline attention is degenerate (under "
                    f"{null.degenerate_below:.3g} = {stats.DEGENERATE_BASELINE_SHARE:g}/T)")
    if low:
        log.warning(f"warning: thresholds below the null floor {null.floor:.2f}x admit heads not told apart "
                    f"from chance: {'; '.join(low)}")
    return Uncertainty(intervals, null, low)


def summarise(cfg: Config, loaded: Loaded, batch: probe.ProbeBatch, baseline: np.ndarray, measured: cache.Measurements,
              screened: Screened, uncertainty: Uncertainty, ablated: ablation.AblationResult,
              timings: dict[str, float]) -> results.RunSummary:
    """The run's record, ``summary.json``."""
    revision, scr, null = loaded.revision, screened.screen, uncertainty.null
    arrival = prefetch.arrival((loaded.source.path, loaded.source.revision, loaded.source.weights_format))
    download = results.Download(bytes_downloaded=checkpoints.downloaded_bytes(loaded.source),
                                load_seconds=timings["load"], prefetched=arrival.prefetched,
                                wait_seconds=arrival.wait_seconds)
    return results.RunSummary(
        schema_version=results.SCHEMA_VERSION, model=cfg.model.key, name_or_path=cfg.model.name_or_path,
        training_seed=results.training_seed(cfg.model), revision=revision.name, step=revision.step,
        tokens=revision.tokens, architecture=measured.model_type, n_layers=measured.n_layers,
        n_heads=measured.n_heads, head_dim=measured.head_dim, dtype=loaded.dtype,
        reference_dtype=cfg.model.reference_dtype,
        near_threshold=results.near_threshold_record(screened.near_threshold, loaded.dtype),
        device=str(loaded.device), weight_bytes=loaded.weight_bytes,
        weights_sha256=checkpoints.weights_sha256(loaded.source), download=download, batch_size=loaded.batch_size,
        probe=results.ProbeSummary(**asdict(cfg.probe), fingerprint=batch.fingerprint(),
                                   baseline_positions=baseline.tolist()),
        thresholds=results.Thresholds(classes=dict(zip(screen.CLASSES, screened.thresholds.tolist())),
                                      circuit=cfg.threshold.circuit),
        class_counts=scr.class_counts(), member_counts=scr.member_counts(), bos_fraction=scr.bos_fraction(),
        bos_fraction_ci=uncertainty.intervals.bos_fraction, bos_per_layer=scr.bos_per_layer(),
        sink_metric=sinks.sink_metric(measured.sink_importance, cfg.threshold.sink_epsilon, cfg.stats),
        induction_circuit=scr.circuit_names(), intervals=results.intervals_summary(uncertainty.intervals, cfg.stats),
        null=null.as_summary(),
        threshold_warnings=[f"below the null floor {null.floor:.2f}x: {t}" for t in uncertainty.below_floor],
        spectral=results.SpectralSummary(n_sequences=measured.spectral_n),
        reused_measurements=loaded.cached is not None, ablation=ablated,
        copy_loss_drop=toy_train.copy_loss_drop(cfg.model, revision.name), config_digest=config_digest(cfg),
        timings=timings, versions=results.versions(), massive_activations=measured.residual.records(),
        text=None if cfg.probe.kind != "text" else icl.text_scores(
            measured.position_losses, list(cfg.probe.icl_positions), cfg.stats, text.source_name(cfg.probe),
            loaded.tokenizer),
        repeat=None if cfg.probe.kind != "repeat" else icl.repeat_scores(
            measured.position_losses, probe.RepeatLayout(cfg.probe.seq_len), cfg.stats),
        model_type_mapped_from=loaded.model_type_mapped_from)


def write_outputs(out_dir: Path, run, summary: results.RunSummary, measured: cache.Measurements, tokens: torch.Tensor,
                  screened: Screened, uncertainty: Uncertainty, name: str) -> None:
    """heads.csv, per_sequence.npz (with the token batch ``tokens`` [n, T]) and summary.json (last),
    the class grid, and the W&B run's log."""
    null = uncertainty.null
    rows = results.head_rows(screened.screen, measured.mean_attention, measured.pr, measured.entropy_rank,
                             uncertainty.intervals, null.per_head_p99, null.degenerate, measured.mean_sink_importance,
                             screened.near_threshold, measured.value_norm_ratio, measured.prefix_matching)
    per_sequence = {"targets": measured.targets, "sink_importance": measured.sink_importance, "tokens": tokens.numpy()}
    if measured.position_losses is not None:
        per_sequence["position_losses"] = measured.position_losses
    results.write_run(out_dir, rows, summary, per_sequence)
    figure = tracking.class_figure(screened.screen.head_class, name)
    figure.savefig(out_dir / "classes.png", dpi=120)
    tracking.log_checkpoint(run, summary, rows, figure)
    tracking.plt.close(figure)


def discard_run_dir(out_dir: Path, job_name: str) -> None:
    """Remove what Hydra and W&B wrote for a run that never finished (its .hydra/, job log and
    wandb/), and the directory itself if that leaves it empty; nothing else is touched."""
    results.discard_partial(out_dir)
    for folder in (".hydra", "wandb"):
        shutil.rmtree(out_dir / folder, ignore_errors=True)
    logging.shutdown()  # closes the job log, so that it can go
    (out_dir / f"{job_name}.log").unlink(missing_ok=True)
    try:
        out_dir.rmdir()
    except OSError:  # not empty (or not ours): keep it
        pass


@hydra.main(version_base="1.3", config_path="pkg://emergence.conf", config_name="config")
def main(dict_cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    out_dir = Path(hydra_cfg.runtime.output_dir)
    in_sweep = hydra_cfg.mode == RunMode.MULTIRUN
    interrupt.install()
    try:
        cfg: Config = OmegaConf.to_object(dict_cfg)
        if in_sweep and cfg.wandb.group is None:  # one W&B group per sweep
            cfg.wandb.group = Path(hydra_cfg.sweep.dir).name
        if cfg.resume and results.is_done(out_dir, config_digest(cfg)):
            log.info(f"already done (resume=true): {out_dir}")
            return
        if in_sweep:  # a relaunched sweep runs its failed jobs again: their old FAILED must not list them
            sweep.clear_failure(out_dir)
        analyse(cfg, out_dir, Path(hydra_cfg.sweep.dir) / integrity.INTEGRITY_FILE if in_sweep else None)
        if interrupt.received.is_set():  # its KeyboardInterrupt was swallowed on the way
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        log.error(f"interrupted: no results written{'' if in_sweep else ' (run directory removed)'}")
        if in_sweep:
            results.discard_partial(out_dir)
        else:
            discard_run_dir(out_dir, hydra_cfg.job.name)
        sys.exit(130)
    except (UsageError, FloatingPointError) as err:  # bad input / NaN: one line, no traceback
        log.error(f"error: {err}")
        if in_sweep:  # the other jobs go on; the sweep lists this one at the end
            sweep.record_failure(out_dir, f"error: {err}")
            return
        if isinstance(err, UsageError):  # found before any result was written: leave nothing behind
            discard_run_dir(out_dir, hydra_cfg.job.name)
        sys.exit(2 if isinstance(err, UsageError) else 1)
    except Exception as err:
        if not in_sweep:
            raise
        sweep.record_failure(out_dir, f"{type(err).__name__}: {err}")
        traceback.print_exc()
