"""Threshold sensitivity: F1-F4 recomputed over a grid of thresholds from the stored
per-head selectivities (no model is run), and which conclusions hold across the grid."""

from __future__ import annotations

import numpy as np

from emergence.report.findings import model_findings
from emergence.report.panel import Trajectory

CLASS_GRID = (10.0, 20.0, 30.0, 50.0, 75.0, 100.0)  # BOS / class thresholds (x baseline)
CIRCUIT_GRID = (20.0, 30.0, 50.0, 100.0, 150.0, 200.0)  # induction-circuit thresholds


def _tokens(milestone):
    return None if milestone is None else milestone["tokens"]


def grid(trajectories: dict[str, Trajectory], class_grid=CLASS_GRID, circuit_grid=CIRCUIT_GRID) -> list[dict]:
    """One row per (model, class threshold, circuit threshold)."""
    rows = []
    for model, traj in trajectories.items():
        for ct in class_grid:
            for cc in circuit_grid:
                f = model_findings(traj, ct, cc)
                onset, bos_50 = _tokens(f["f3"]["induction_onset"]), _tokens(f["f3"]["bos_50"])
                rows.append({
                    "model": model, "class_threshold": ct, "circuit_threshold": cc,
                    "zero_bos_layers": f["f1"]["zero_bos_layers"],
                    "shape": f["f2"]["shape"], "jump_share": f["f2"]["jump_share"],
                    "largest_jump": f["f2"]["largest_jump"],
                    "final_bos_fraction": f["f2"]["final_bos_fraction"],
                    "onset_tokens": _tokens(f["f3"]["induction_onset"]),
                    "bos_50_tokens": _tokens(f["f3"]["bos_50"]),
                    "gap_ratio": f["f3"]["gap_ratio"],
                    # BOS-50% never reached: the gap is at least last tokens / onset tokens (censored).
                    "gap_lower_bound": (traj.checkpoints[-1].tokens / onset
                                        if onset is not None and bos_50 is None else None),
                    "recall_67_tokens": _tokens(f["f4"]["recall_67"]),
                    "circuit_size": len(f["f4"]["final_circuit"]),
                })
    return rows


def conclusions(rows: list[dict]) -> list[dict]:
    """Per model, whether each conclusion holds in every grid cell (with the range seen)."""
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        shapes = sorted({str(r["shape"]) for r in mine})
        out.append({"model": model, "conclusion": "BOS shape is the same everywhere",
                    "holds": len(shapes) == 1, "detail": "shapes seen: " + ", ".join(shapes)})
        gaps = [r["gap_ratio"] if r["gap_ratio"] is not None else r["gap_lower_bound"] for r in mine]
        known = [g for g in gaps if g is not None]
        censored = sum(r["gap_lower_bound"] is not None for r in mine)
        no_onset = sum(r["onset_tokens"] is None for r in mine)
        detail = f"gap {min(known):.1f}x .. {max(known):.1f}x" if known else "no gap"
        if censored:
            detail += f"; BOS-50% never reached in {censored} cells (gap >= last/onset there)"
        if no_onset:
            detail += f"; no induction onset in {no_onset} cells"
        out.append({"model": model, "conclusion": "induction onset precedes BOS-50% by >= 10x",
                    "holds": not no_onset and bool(known) and min(known) >= 10, "detail": detail})
        # Censored cells count as holding: BOS-50% comes after the last revision, if ever.
        early = [r["recall_67_tokens"] is not None
                 and (r["bos_50_tokens"] is None or r["recall_67_tokens"] < r["bos_50_tokens"]) for r in mine]
        out.append({"model": model, "conclusion": "2/3 of the final circuit is present before BOS-50%",
                    "holds": all(early), "detail": f"{sum(early)}/{len(early)} cells"})
        floor = [0 in r["zero_bos_layers"] and 1 in r["zero_bos_layers"] for r in mine]
        out.append({"model": model, "conclusion": "layers 0 and 1 never hold a BOS head",
                    "holds": all(floor), "detail": f"{sum(floor)}/{len(floor)} cells"})
    return out


def gap_matrix(rows: list[dict], model: str, class_grid=CLASS_GRID, circuit_grid=CIRCUIT_GRID) -> np.ndarray:
    """[class thresholds, circuit thresholds] gap ratios (NaN where undefined)."""
    m = np.full((len(class_grid), len(circuit_grid)), np.nan)
    for r in rows:
        if r["model"] == model and r["gap_ratio"] is not None:
            m[class_grid.index(r["class_threshold"]), circuit_grid.index(r["circuit_threshold"])] = r["gap_ratio"]
    return m
