"""``python -m emergence``: probe -> screen -> participation ratio -> ablate on one checkpoint.

``analyse`` is the recipe in order; each step's logic lives in its own module. ``main`` is
the command line around it: one line and exit 2 for bad input, a sweep that survives a
failing job, Ctrl-C without a traceback.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import shutil
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from emergence import (ablation, cache, capture, checkpoints, prefetch, probe, results, screen, sinks, stats, sweep,
                       tracking)
from emergence.config import Config, config_digest
from emergence.errors import UsageError
from emergence.toy import train as toy_train
from emergence.validation import validate, validate_for_model

log = logging.getLogger(__name__)


def analyse(cfg: Config, out_dir: Path) -> dict:
    """Run the recipe on the checkpoint ``cfg`` names; write and return its summary."""
    timings: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[name] = round(now - clock, 3)
        clock = now

    # Everything that can be checked without the weights is checked before they load.
    validate(cfg)
    tracking.check_login(cfg.wandb)
    revision = checkpoints.resolve_revision(cfg)
    device = checkpoints.pick_device(cfg.device)
    dtype = checkpoints.pick_dtype(cfg.model.dtype)
    if cfg.model.toy is not None:
        toy_train.ensure_trained(cfg.model)
    src = checkpoints.source(cfg, revision)  # before anything is fetched: was it cached already?
    if prefetch.fetched_by_sweep(src.path, src.revision):  # the sweep downloaded it: count it, and clean it up
        src = dataclasses.replace(src, cached_before=False)
    hf_config = checkpoints.load_config(cfg, src)
    validate_for_model(cfg, hf_config)
    weight_bytes = checkpoints.check_memory(hf_config, dtype, device)
    p = cfg.probe
    batch = probe.make_probe_batch(p.n_sequences, p.seq_len, p.vocab_low, p.vocab_high, p.seed)
    baseline = probe.baseline_positions(p.seq_len, p.n_baseline, p.baseline_seed)
    lap("probe_batch")

    # Step 0: the model, unless cached measurements make it unnecessary. Ablation depends on
    # the thresholds (they pick the circuit), so it always needs the model; mean ablation
    # also needs this pass's per-position means.
    dtype_name = str(dtype).removeprefix("torch.")
    entry = cache.key(cache.checkpoint_identity(src.path, src.revision), asdict(p), cfg.stats.n_null, dtype_name)
    cached = cache.load(cfg.cache_dir, entry) if cfg.reuse else None
    mean_ablation = cfg.ablate.enabled and cfg.ablate.mode == "mean"
    need_model = cached is None or cfg.ablate.enabled
    model = checkpoints.load_model(cfg, src, device, dtype) if need_model else None
    arch = checkpoints.Architecture.of(model) if need_model else None
    batch_size = p.batch_size
    if need_model and device.type == "cuda" and p.auto_batch:
        batch_size = checkpoints.auto_batch_size(checkpoints.free_memory(device), p.seq_len, hf_config, dtype)
    lap("load")
    download = {"bytes_downloaded": checkpoints.downloaded_bytes(src), "load_seconds": timings["load"],
                **prefetch.arrival(src.path, src.revision)}

    name = f"{cfg.model.key}@{revision.name or 'as-is'}"
    run_config = {**OmegaConf.to_container(OmegaConf.structured(cfg)), "step": revision.step, "tokens": revision.tokens}
    with tracking.tracked_run(cfg.wandb, name, run_config, out_dir, tags=[cfg.model.key, revision.name]) as run:
        lap("tracker")  # starting W&B is bookkeeping, not the recipe's first step
        # Step 1: the probe pass, reduced on the fly (skipped when the measurements are cached).
        cap = None
        if cached is None or mean_ablation:
            log.info(f"probe: {p.n_sequences} sequences x {p.seq_len} tokens through {name}")
            clean_loss: list = []  # per sequence, for adaptive ablation's paired interval
            null_positions = stats.null_positions(batch.ab.numpy(), p.seq_len, cfg.stats.n_null)
            cap = capture.run_probe(model, arch, batch, baseline, batch_size, p.spectral_sequences or p.n_sequences,
                                    mean_ablation, functools.partial(ablation.score_logits, per_sequence=clean_loss),
                                    null_positions)
        measured = cached or cache.Measurements.of(cap, arch, torch.cat(clean_loss).numpy())
        if cached is None and cfg.reuse:
            cache.save(cfg.cache_dir, entry, measured)
        lap("capture")

        # Steps 2 and 3: the selectivity screen; the spectral estimators came with the pass.
        thresholds = screen.class_thresholds(cfg.threshold.class_default, cfg.threshold.per_class.overrides())
        scr = screen.screen(screen.selectivity(measured.mean_attention), thresholds, cfg.threshold.circuit)
        near = screen.near_threshold(scr.sel, thresholds, cfg.threshold.circuit,
                                     screen.DTYPE_RELATIVE_ERROR[dtype_name])  # heads the dtype's rounding could flip
        lap("screen_spectral")

        # Their uncertainty, from the same pass: a bootstrap over sequences and the null's floor.
        intervals = stats.screen_intervals(measured.targets, thresholds, cfg.threshold.circuit, cfg.stats)
        null = stats.null_calibration(measured.null_sums, measured.mean_attention[..., screen.BASELINE], p.n_sequences,
                                      p.seq_len, cfg.stats.null_rule)
        low = stats.below_floor(scr, thresholds, cfg.threshold.circuit, null.floor)
        if null.floor is None:
            log.warning(f"warning: no null floor: every head's baseline attention is degenerate (under "
                        f"{null.degenerate_below:.3g} = {stats.DEGENERATE_BASELINE_SHARE:g}/T)")
        if low:
            log.warning(f"warning: thresholds below the null floor {null.floor:.2f}x admit heads not told apart "
                        f"from chance: {'; '.join(low)}")
        lap("intervals")

        # Step 4: group ablation of the circuit against matched-random controls.
        ablation_result = ablation.ablate(cfg.ablate, model, arch, batch, batch_size, scr.circuit_heads(),
                                          measured.clean_metrics, measured.clean_loss,
                                          cap.position_mean if cap else None, cfg.stats)
        lap("ablate")

        sink_metric = sinks.sink_metric(measured.sink_importance, cfg.threshold.sink_epsilon, cfg.stats)
        rows = results.head_rows(scr, measured.mean_attention, measured.pr, measured.entropy_rank, intervals,
                                 null.per_head_p99, null.degenerate, measured.mean_sink_importance, near)
        summary = results.summary(
            cfg, revision, measured, scr, thresholds, intervals, null, low, sink_metric, dtype=dtype_name, near_threshold=near, device=str(device),
            weight_bytes=weight_bytes, weights_sha256=checkpoints.weights_sha256(src), download=download,
            batch_size=batch_size, probe_fingerprint=batch.fingerprint(), baseline_positions=baseline.tolist(),
            reused_measurements=cached is not None, ablation=ablation_result,
            icl_score=toy_train.icl_score(cfg.model, revision.name), config_digest=config_digest(cfg),
            timings=timings)
        lap("summary")
        results.write_run(out_dir, rows, summary,
                          {"targets": measured.targets, "sink_importance": measured.sink_importance})
        figure = tracking.class_figure(scr.head_class, name)
        figure.savefig(out_dir / "classes.png", dpi=120)
        tracking.log_checkpoint(run, summary, rows, figure)
        tracking.plt.close(figure)
    if cfg.model.cleanup:  # the results are written: the weights can go
        with prefetch.no_download_running():
            freed = checkpoints.remove_from_cache(src)
        log.info(f"cleanup: removed {src.path}@{src.revision} from the Hugging Face cache ({freed / 2**20:.1f} MiB)")
    for line in results.report_lines(summary, scr, out_dir):
        log.info(line)
    return summary


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
    try:
        cfg: Config = OmegaConf.to_object(dict_cfg)
        if in_sweep and cfg.wandb.group is None:  # one W&B group per sweep
            cfg.wandb.group = Path(hydra_cfg.sweep.dir).name
        if cfg.resume and results.is_done(out_dir, config_digest(cfg)):
            log.info(f"already done (resume=true): {out_dir}")
            return
        if in_sweep:  # a relaunched sweep runs its failed jobs again: their old FAILED must not list them
            sweep.clear_failure(out_dir)
        analyse(cfg, out_dir)
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
