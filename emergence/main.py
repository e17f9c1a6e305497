"""``python -m emergence``: probe -> screen -> participation ratio -> ablate on one checkpoint.

Thin glue: each step lives in its own module; this file only wires them in order and
writes the results (``results.py``) before telling W&B (``tracking.py``).
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path

import hydra
import torch
import transformers
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

import emergence
from emergence import ablation, cache, capture, checkpoints, probe, results, screen, spectral, sweep, tracking
from emergence.config import Config, UsageError, validate, validate_for_model
from emergence.toy import train as toy_train


def analyse(cfg: Config, out_dir: Path) -> dict:
    """Run the recipe on the checkpoint ``cfg`` names; write and return its summary."""
    timings: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[name] = round(now - clock, 3)
        clock = now

    validate(cfg)
    revision = checkpoints.resolve_revision(cfg)
    device = checkpoints.pick_device(cfg.device)
    dtype = checkpoints.pick_dtype(cfg.model.dtype, device)
    if cfg.model.toy is not None:
        toy_train.ensure_trained(cfg.model)
    src = checkpoints.source(cfg, revision)  # before anything is fetched: was it cached already?
    hf_config = checkpoints.load_config(cfg, src)
    validate_for_model(cfg, hf_config)
    weight_bytes = checkpoints.check_memory(hf_config, dtype, device)
    p = cfg.probe
    batch = probe.make_probe_batch(p.n_sequences, p.seq_len, p.vocab_low, p.vocab_high, p.seed)
    baseline = probe.baseline_positions(p.seq_len, p.n_baseline, p.baseline_seed)
    lap("probe_batch")

    dtype_name = str(dtype).removeprefix("torch.")
    entry = cache.key(cache.checkpoint_identity(src.path, src.revision), asdict(p), dtype_name)
    cached = cache.load(cfg.cache_dir, entry) if cfg.reuse else None
    # Ablation depends on the thresholds (they pick the circuit), so it always needs the model;
    # mean ablation also needs this pass's per-position means.
    need_model = cached is None or cfg.ablate.enabled
    need_capture = cached is None or (cfg.ablate.enabled and cfg.ablate.mode == "mean")
    model = checkpoints.load_model(cfg, src, device, dtype) if need_model else None
    arch = checkpoints.Architecture.of(model) if need_model else None
    batch_size = p.batch_size
    if need_model and device.type == "cuda" and p.auto_batch:
        batch_size = checkpoints.auto_batch_size(checkpoints.free_memory(device), p.seq_len, hf_config, dtype)
    lap("load")
    download = {"bytes_downloaded": checkpoints.downloaded_bytes(src), "load_seconds": timings["load"]}

    name = f"{cfg.model.key}@{revision.name or 'as-is'}"
    run_config = {**OmegaConf.to_container(OmegaConf.structured(cfg)), "step": revision.step, "tokens": revision.tokens}
    with tracking.tracked_run(cfg.wandb, name, run_config, out_dir) as run:
        cap = None
        if need_capture:
            spectral_n = p.spectral_sequences or p.n_sequences
            keep_means = cfg.ablate.enabled and cfg.ablate.mode == "mean"
            cap = capture.run_probe(model, arch, batch, baseline, batch_size, spectral_n, keep_means,
                                    ablation.score_logits)
        measured = cached or measurements(cap, arch)
        if cached is None and cfg.reuse:
            cache.save(cfg.cache_dir, entry, measured)
        lap("capture")

        mean_attention = measured.mean_attention
        thresholds = screen.class_thresholds(cfg.threshold.class_default, cfg.threshold.per_class.overrides())
        scr = screen.screen(screen.selectivity(mean_attention), thresholds, cfg.threshold.circuit)
        pr, rank = measured.pr, measured.entropy_rank
        lap("screen_spectral")

        ablation_result = ablate(cfg, model, arch, batch, batch_size, scr, measured.clean_metrics,
                                 cap.position_mean if cap else None)
        lap("ablate")

        rows = results.head_rows(scr, mean_attention, pr, rank)
        summary = {
            "model": cfg.model.key,
            "name_or_path": cfg.model.name_or_path,
            "revision": revision.name,
            "step": revision.step,
            "tokens": revision.tokens,
            "architecture": measured.model_type,
            "n_layers": measured.n_layers,
            "n_heads": measured.n_heads,
            "head_dim": measured.head_dim,
            "dtype": dtype_name,
            "device": str(device),
            "weight_bytes": weight_bytes,
            "weights_sha256": checkpoints.weights_sha256(src),
            "download": download,
            "batch_size": batch_size,
            "probe": {**asdict(p), "fingerprint": batch.fingerprint(), "baseline_positions": baseline.tolist()},
            "thresholds": {"classes": dict(zip(screen.CLASSES, thresholds.tolist())),
                           "circuit": cfg.threshold.circuit},
            "class_counts": scr.class_counts(),
            "member_counts": scr.member_counts(),
            "bos_fraction": scr.bos_fraction(),
            "bos_per_layer": scr.bos_per_layer(),
            "induction_circuit": scr.circuit_names(),
            "spectral": {"pr": "participation ratio of the centred covariance, (sum l)^2 / sum l^2",
                         "pr_entropy_rank": "exp(entropy) of normalised squared singular values, uncentred "
                                            "(the reference code's estimator)",
                         "n_sequences": measured.spectral_n},
            "reused_measurements": cached is not None,
            "ablation": ablation_result,
            "icl_score": toy_icl_score(cfg, revision),
            "config_digest": config_digest(cfg),
            "timings": timings,
            "versions": {"emergence": emergence.__version__, "torch": torch.__version__,
                         "transformers": transformers.__version__, "python": platform.python_version()},
        }
        lap("summary")
        results.write_run(out_dir, rows, summary)
        figure = tracking.class_figure(scr.head_class, name)
        figure.savefig(out_dir / "classes.png", dpi=120)
        tracking.log_checkpoint(run, summary, rows, figure)
        tracking.plt.close(figure)
    if cfg.model.cleanup:  # the results are written: the weights can go
        freed = checkpoints.remove_from_cache(src)
        print(f"cleanup: removed {src.path}@{src.revision} from the Hugging Face cache ({freed / 2**20:.1f} MiB)")
    print_report(summary, scr, out_dir)
    return summary


def config_digest(cfg: Config) -> str:
    """Names what a run computes: its config without the W&B and resume settings."""
    content = OmegaConf.to_container(OmegaConf.structured(cfg))
    for key in ("wandb", "resume"):
        content.pop(key, None)
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:16]


def toy_icl_score(cfg: Config, revision) -> float | None:
    """A toy checkpoint's in-context score from its training manifest (None for other models)."""
    if cfg.model.toy is None:
        return None
    record = toy_train.checkpoint_record(cfg.model, revision.name)
    return None if record is None else record["icl_score"]


def measurements(cap: capture.Capture, arch) -> cache.Measurements:
    """Reduce a probe pass to what the screen and spectral steps (and the cache) keep."""
    return cache.Measurements(
        mean_attention=cap.mean_attention(),
        pr=spectral.participation_ratio(cap.gram, cap.total, cap.spectral_n),
        entropy_rank=spectral.entropy_rank(cap.gram),
        spectral_n=cap.spectral_n, clean_metrics=cap.clean_metrics, model_type=arch.model_type,
        n_layers=arch.n_layers, n_heads=arch.n_heads, head_dim=arch.head_dim)


def ablate(cfg: Config, model, arch, batch, batch_size: int, scr: screen.Screen, clean_metrics: dict,
           position_mean: torch.Tensor | None) -> dict:
    """Clean vs circuit-ablated vs matched-random controls; see ``ablation.py``."""
    result: dict = {"enabled": cfg.ablate.enabled, "mode": cfg.ablate.mode,
                    "causal_factor": cfg.ablate.causal_factor, "clean": clean_metrics,
                    "circuit": None, "random": [], "effect": None}
    circuit = scr.circuit_heads()
    if cfg.ablate.heads is not None:  # the user's head set instead of the screened circuit
        circuit = [screen.parse_head_name(h) for h in cfg.ablate.heads]  # validated names
        outside = [h for (l, hh), h in zip(circuit, cfg.ablate.heads) if l >= arch.n_layers or hh >= arch.n_heads]
        if outside:
            raise UsageError(f"ablate.heads={outside[0]!r} is invalid: the model has {arch.n_layers} layers "
                             f"x {arch.n_heads} heads")
        result["heads"] = list(cfg.ablate.heads)
    if not cfg.ablate.enabled:
        return result
    if not circuit:
        result["note"] = "empty induction circuit: nothing to ablate"
        return result
    shortfall = ablation.control_shortfall(circuit, arch.n_heads)
    controls = [] if shortfall else ablation.matched_random_sets(circuit, arch.n_heads, cfg.ablate.n_random,
                                                                 cfg.ablate.seed)
    conditions = {"circuit": circuit, **{f"random_{i}": heads for i, heads in enumerate(controls)}}
    scores = ablation.run_ablation(model, arch, batch, conditions, batch_size, position_mean)
    result["circuit"] = scores["circuit"]
    result["random"] = [{**scores[f"random_{i}"], "heads": [screen.head_name(*h) for h in heads]}
                        for i, heads in enumerate(controls)]
    result["effect"] = ablation.effect(clean_metrics["loss"], scores["circuit"]["loss"],
                                       [s["loss"] for s in result["random"]], cfg.ablate.causal_factor)
    if shortfall:
        result["note"] = shortfall
    elif result["effect"]["ratio"] is None:
        result["note"] = (f"the matched-random controls did not raise the loss of B "
                          f"(mean {result['effect']['random_loss_increase_mean']:+.4f}): no ratio")
    return result


def print_report(summary: dict, scr: screen.Screen, out_dir: Path) -> None:
    print(f"\n{summary['model']} @ {summary['revision']}  (step {summary['step']}, tokens {summary['tokens']})")
    print("classes per layer:")
    for layer in range(scr.n_layers):
        counts = {c: int((scr.head_class[layer] == c).sum()) for c in (*screen.CLASSES, screen.UNCLASSIFIED)}
        print(f"  L{layer:<3}" + "  ".join(f"{c}={n}" for c, n in counts.items() if n))
    print(f"BOS fraction: {summary['bos_fraction']:.1%}   induction circuit: "
          f"{', '.join(summary['induction_circuit']) or '(empty)'}")
    ab = summary["ablation"]
    if ab["effect"]:
        e = ab["effect"]
        controls = ("no matched-random control" if e["random_loss_increase_mean"] is None
                    else f"matched-random controls {e['random_loss_increase_mean']:+.3f}: "
                         f"{'causal' if e['causal'] else 'not causal'} at {ab['causal_factor']:g}x")
        print(f"ablation ({ab['mode']}): loss of B {ab['clean']['loss']:.3f} -> {ab['circuit']['loss']:.3f} "
              f"(+{e['circuit_loss_increase']:.3f}); {controls}")
    print(f"results: {out_dir}")


def discard_run_dir(out_dir: Path, job_name: str) -> None:
    """Remove what Hydra wrote for a run that never started (its .hydra/ and job log), and
    the directory itself if that leaves it empty; nothing else is touched."""
    shutil.rmtree(out_dir / ".hydra", ignore_errors=True)
    (out_dir / f"{job_name}.log").unlink(missing_ok=True)
    try:
        out_dir.rmdir()
    except OSError:  # not empty (or not ours): keep it
        pass


@hydra.main(version_base="1.3", config_path="pkg://emergence.conf", config_name="config")
def main(dict_cfg: DictConfig) -> None:
    cfg: Config = OmegaConf.to_object(dict_cfg)
    hydra_cfg = HydraConfig.get()
    out_dir = Path(hydra_cfg.runtime.output_dir)
    if cfg.resume and results.is_done(out_dir, config_digest(cfg)):
        print(f"already done (resume=true): {out_dir}")
        return
    in_sweep = hydra_cfg.mode == RunMode.MULTIRUN
    try:
        analyse(cfg, out_dir)
    except (UsageError, FloatingPointError) as err:  # bad input / NaN: one line, no traceback
        if isinstance(err, UsageError) and not in_sweep:  # found before any work: leave nothing behind
            discard_run_dir(out_dir, hydra_cfg.job.name)
        print(f"error: {err}", file=sys.stderr)
        if in_sweep:  # the other jobs go on; the sweep lists this one at the end
            sweep.record_failure(out_dir, f"error: {err}")
            return
        sys.exit(2 if isinstance(err, UsageError) else 1)
    except Exception as err:
        if not in_sweep:
            raise
        sweep.record_failure(out_dir, f"{type(err).__name__}: {err}")
        traceback.print_exc()
