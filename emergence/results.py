"""A run's files: ``heads.csv`` (one row per head) and ``summary.json``.

Both are written atomically (temporary file in the same directory, then rename), and
``summary.json`` last: a run directory with a summary is a complete run.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from emergence.screen import BASELINE, CLASSES, Screen

HEADS_FILE = "heads.csv"
SUMMARY_FILE = "summary.json"


def member_column(cls: str) -> str:
    return "bos_member" if cls == "first_token" else f"{cls}_member"


HEAD_COLUMNS = (
    ["layer", "head"]
    + [f"sel_{c}" for c in CLASSES]
    + ["best_class", "class"]
    + [member_column(c) for c in CLASSES]
    + ["induction_circuit", "pr", "pr_entropy_rank"]
    + [f"attn_{c}" for c in CLASSES] + ["attn_baseline"]
)


def head_rows(scr: Screen, mean_attention: np.ndarray, pr: np.ndarray, entropy_rank: np.ndarray) -> list[dict]:
    """One dict per head, keys ``HEAD_COLUMNS``; ``mean_attention`` is [layers, heads, 7]."""
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
            rows.append(row)
    return rows


def atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_run(out_dir: Path, rows: list[dict], summary: dict) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=HEAD_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(out_dir / HEADS_FILE, buf.getvalue())
    atomic_write_text(out_dir / SUMMARY_FILE, json.dumps(summary, indent=2, allow_nan=True) + "\n")


def is_done(run_dir: Path, config_digest: str) -> bool:
    """A complete run of the same configuration is already in ``run_dir``."""
    path = run_dir / SUMMARY_FILE
    return path.exists() and json.loads(path.read_text()).get("config_digest") == config_digest


def read_run(run_dir: Path) -> tuple[dict, list[dict]]:
    """(summary, head rows with numbers and booleans parsed) of a complete run directory."""
    summary = json.loads((run_dir / SUMMARY_FILE).read_text())
    with open(run_dir / HEADS_FILE, newline="") as f:
        rows = [_parse_row(r) for r in csv.DictReader(f)]
    return summary, rows


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
