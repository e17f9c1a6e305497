"""A run's files: ``heads.csv`` (one row per head) and ``summary.json`` (its schema is
``summary`` below), and the lines a run reports.

Both files are written atomically (temporary file in the same directory, then rename),
and ``summary.json`` last: a run directory with a summary is a complete run.
"""

from __future__ import annotations

import csv
import io
import json
import platform
import re
from dataclasses import asdict
from pathlib import Path

import numpy as np

import emergence
from emergence.atomic import atomic_write_bytes, atomic_write_text, npz_bytes
from emergence.screen import BASELINE, CLASSES, DTYPE_RELATIVE_ERROR, UNCLASSIFIED, Screen, head_name
from emergence.stats import DEGENERATE_BASELINE_SHARE, NullCalibration, ScreenIntervals

HEADS_FILE = "heads.csv"
SUMMARY_FILE = "summary.json"
PER_SEQUENCE_FILE = "per_sequence.npz"  # the probe's per-sequence attentions: intervals in the panel report


def member_column(cls: str) -> str:
    return "bos_member" if cls == "first_token" else f"{cls}_member"


HEAD_COLUMNS = (
    ["layer", "head"]
    + [f"sel_{c}" for c in CLASSES]
    + ["best_class", "class"]
    + [member_column(c) for c in CLASSES]
    + ["induction_circuit", "pr", "pr_entropy_rank"]
    + [f"attn_{c}" for c in CLASSES] + ["attn_baseline"]
    + [f"sel_{c}_ci_{end}" for c in CLASSES for end in ("low", "high")]
    + [f"p_{c}_member" for c in CLASSES]
    + ["null_p99", "degenerate_baseline", "sink_importance", "near_threshold"]
)


def head_rows(scr: Screen, mean_attention: np.ndarray, pr: np.ndarray, entropy_rank: np.ndarray,
              intervals: ScreenIntervals, null_p99: np.ndarray, degenerate_baseline: np.ndarray,
              sink_importance: np.ndarray, near_threshold: np.ndarray) -> list[dict]:
    """One dict per head, keys ``HEAD_COLUMNS``; ``mean_attention`` is [layers, heads, 7],
    ``null_p99`` [layers, heads] the head's 99th percentile of null selectivity,
    ``degenerate_baseline`` [layers, heads] whether its baseline attention is degenerate
    (``stats.degenerate_baseline``: its selectivities are ratios over the softmax's far tail),
    ``sink_importance`` [layers, heads] key 0's importance (``sinks``) averaged over sequences,
    ``near_threshold`` [layers, heads] whether the run's dtype could flip it (``screen.near_threshold``)."""
    rows = []
    for layer in range(scr.n_layers):
        for head in range(scr.n_heads):
            row = {"layer": layer, "head": head}
            row.update({f"sel_{c}": float(scr.sel[layer, head, i]) for i, c in enumerate(CLASSES)})
            row["best_class"] = str(scr.best_class[layer, head])
            row["class"] = str(scr.head_class[layer, head])
            row.update({member_column(c): bool(scr.members[layer, head, i]) for i, c in enumerate(CLASSES)})
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
            row["sink_importance"] = float(sink_importance[layer, head])
            row["near_threshold"] = bool(near_threshold[layer, head])
            rows.append(row)
    return rows


def summary(cfg, revision, measured, scr: Screen, thresholds: np.ndarray, intervals: ScreenIntervals,
            null: NullCalibration, below_floor: list[str], sink_metric: dict, **run) -> dict:
    """``summary.json``: what was analysed, how, and what the screen and ablation found.

    ``cfg`` is the run's ``Config``, ``revision`` its ``checkpoints.Revision``,
    ``measured`` the probe pass's ``cache.Measurements``, ``intervals`` and ``null`` the
    screen's bootstrap and null calibration (``stats``), ``below_floor`` the thresholds
    under the null's floor that admit heads (``stats.below_floor``), ``sink_metric`` the second sink
    definition's (``sinks.sink_metric``); ``run`` holds what only the run knows: dtype, near_threshold
    ([layers, heads] bool: heads the dtype's rounding could flip), device, weight_bytes, weights_sha256,
    download, batch_size, probe_fingerprint, baseline_positions, reused_measurements, ablation,
    icl_score, config_digest, timings."""
    import torch
    import transformers

    return {
        "model": cfg.model.key,
        "name_or_path": cfg.model.name_or_path,
        "training_seed": training_seed(cfg.model),
        "revision": revision.name,
        "step": revision.step,
        "tokens": revision.tokens,
        "architecture": measured.model_type,
        "n_layers": measured.n_layers,
        "n_heads": measured.n_heads,
        "head_dim": measured.head_dim,
        "dtype": run["dtype"],
        "reference_dtype": cfg.model.reference_dtype,
        "near_threshold": {"relative_error": DTYPE_RELATIVE_ERROR[run["dtype"]],
                           "count": int(run["near_threshold"].sum()),
                           "heads": [head_name(l, h) for l, h in np.argwhere(run["near_threshold"])]},
        "device": run["device"],
        "weight_bytes": run["weight_bytes"],
        "weights_sha256": run["weights_sha256"],
        "download": run["download"],
        "batch_size": run["batch_size"],
        "probe": {**asdict(cfg.probe), "fingerprint": run["probe_fingerprint"],
                  "baseline_positions": run["baseline_positions"]},
        "thresholds": {"classes": dict(zip(CLASSES, thresholds.tolist())), "circuit": cfg.threshold.circuit},
        "class_counts": scr.class_counts(),
        "member_counts": scr.member_counts(),
        "bos_fraction": scr.bos_fraction(),
        "bos_fraction_ci": intervals.bos_fraction,
        "bos_per_layer": scr.bos_per_layer(),
        "sink_metric": sink_metric,
        "induction_circuit": scr.circuit_names(),
        "intervals": {"ci": cfg.stats.ci, "n_boot": cfg.stats.n_boot, "seed": cfg.stats.seed,
                      "method": "percentile bootstrap over sequences (paired numerator and baseline), the "
                                "classification recomputed in each replicate",
                      "circuit_size": intervals.circuit_size, "class_counts": intervals.class_counts,
                      "member_counts": intervals.member_counts},
        "null": null.as_summary(),
        "threshold_warnings": [f"below the null floor {null.floor:.2f}x: {t}" for t in below_floor],
        "spectral": {"pr": "participation ratio of the centred covariance, (sum l)^2 / sum l^2",
                     "pr_entropy_rank": "exp(entropy) of normalised squared singular values, uncentred "
                                        "(the reference code's estimator)",
                     "n_sequences": measured.spectral_n},
        "reused_measurements": run["reused_measurements"],
        "ablation": run["ablation"],
        "icl_score": run["icl_score"],
        "config_digest": run["config_digest"],
        "timings": run["timings"],
        "versions": {"emergence": emergence.__version__, "torch": torch.__version__,
                     "transformers": transformers.__version__, "python": platform.python_version()},
    }


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


def report_lines(summary: dict, scr: Screen, out_dir: Path) -> list[str]:
    """What a run tells its user: classes per layer, BOS fraction, circuit, ablation verdict."""
    lines = [f"{summary['model']} @ {summary['revision']}  (step {summary['step']}, "
             f"tokens {format_tokens(summary['tokens'])})", "classes per layer:"]
    for layer in range(scr.n_layers):
        counts = {c: int((scr.head_class[layer] == c).sum()) for c in (*CLASSES, UNCLASSIFIED)}
        lines.append(f"  L{layer:<3}" + "  ".join(f"{c}={n}" for c, n in counts.items() if n))
    low, high = summary["bos_fraction_ci"]
    lines.append(f"BOS fraction: {summary['bos_fraction']:.1%} ({summary['intervals']['ci']:.0%} CI "
                 f"{low:.1%}-{high:.1%})   induction circuit: {', '.join(summary['induction_circuit']) or '(empty)'}")
    near = summary["near_threshold"]
    lines.append(f"near a threshold (within {summary['dtype']}'s {100 * near['relative_error']:.2g}%): "
                 f"{', '.join(near['heads']) or 'none'}")
    if dtype_differs(summary):
        lines.append(f"dtype {summary['dtype']}, the reference study's {summary['reference_dtype']}: "
                     "compare with its published numbers only up to both dtypes' rounding")
    null = summary["null"]
    floor = ("none: every head set aside" if null["floor"] is None
             else f"p99 {null['p99']:.2f}x, floor {null['floor']:.2f}x")
    lines.append(f"null ({null['rule']} rule, {null['draws']} draws of {null['pooled_heads']} heads): {floor}"
                 + (f"; set aside, baseline attention under {null['degenerate_below']:.3g} "
                    f"({DEGENERATE_BASELINE_SHARE:g}/T): "
                    f"{', '.join(null['set_aside'])}" if null["set_aside"] else ""))
    ab = summary["ablation"]
    if ab["effect"]:
        e = ab["effect"]
        controls = ("no matched-random control" if e["random_loss_increase_mean"] is None
                    else f"matched-random controls {e['random_loss_increase_mean']:+.3f}: "
                         f"{'causal' if e['causal'] else 'not causal'} at {ab['causal_factor']:g}x")
        lines.append(f"ablation ({ab['mode']}): loss of B {ab['clean']['loss']:.3f} -> {ab['circuit']['loss']:.3f} "
                     f"(+{e['circuit_loss_increase']:.3f}); {controls}")
    lines.append(f"results: {out_dir}")
    return lines


def dtype_differs(summary: dict) -> bool:
    """The run's dtype is not the one the reference study ran its model in (a family it ran)."""
    return summary.get("reference_dtype") not in (None, summary["dtype"])


def write_run(out_dir: Path, rows: list[dict], run_summary: dict, per_sequence: dict | None = None) -> None:
    """heads.csv, per_sequence.npz (if given: the probe's per-sequence arrays by name, e.g.
    ``targets`` [n, layers, heads, 7] and ``sink_importance`` [n, layers, heads]), then summary.json."""
    if per_sequence is not None:
        atomic_write_bytes(out_dir / PER_SEQUENCE_FILE,
                           npz_bytes(**{name: a.astype(np.float32) for name, a in per_sequence.items()}))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=HEAD_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(out_dir / HEADS_FILE, buf.getvalue())
    atomic_write_text(out_dir / SUMMARY_FILE, json.dumps(run_summary, indent=2, allow_nan=True) + "\n")


def discard_partial(out_dir: Path) -> None:
    """Remove the result files of a run that did not finish (no summary.json written)."""
    if not (out_dir / SUMMARY_FILE).exists():
        for name in (HEADS_FILE, PER_SEQUENCE_FILE, "classes.png"):
            (out_dir / name).unlink(missing_ok=True)


def read_json(path: Path):
    """A JSON file; a broken one is a ValueError that names the file."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err}): it was cut short or edited; "
                         "rewrite it (rerun its job) or remove it") from None


def read_summary(run_dir: Path) -> dict:
    return read_json(run_dir / SUMMARY_FILE)


def is_done(run_dir: Path, config_digest: str) -> bool:
    """A complete run of the same configuration is already in ``run_dir`` (a broken summary is not one)."""
    try:
        return (run_dir / SUMMARY_FILE).exists() and read_summary(run_dir).get("config_digest") == config_digest
    except ValueError:
        return False


def read_run(run_dir: Path) -> tuple[dict, list[dict]]:
    """(summary, head rows with numbers and booleans parsed) of a complete run directory."""
    run_summary = read_summary(run_dir)
    with open(run_dir / HEADS_FILE, newline="") as f:
        rows = [_parse_row(r) for r in csv.DictReader(f)]
    return run_summary, rows


def _parse_row(row: dict) -> dict:
    out = {}
    for key, value in row.items():
        if key in ("layer", "head"):
            out[key] = int(value)
        elif value in ("True", "False"):
            out[key] = value == "True"
        elif key in ("best_class", "class"):
            out[key] = value
        else:
            out[key] = float(value)
    return out
