"""The panel report's figures (PNG, matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from emergence.report.sensitivity import CIRCUIT_GRID, CLASS_GRID, gap_matrix  # noqa: E402


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _tokens_axis(ax, findings: dict):
    """Log tokens; symlog when a revision has no tokens yet (step 0), so that it stays on the axis."""
    tokens = [r["tokens"] for f in findings["models"].values() for r in f["revisions"]]
    positive = [t for t in tokens if t > 0]
    if positive and len(positive) < len(tokens):
        ax.set_xscale("symlog", linthresh=min(positive))
    elif positive:
        ax.set_xscale("log")
    ax.set_xlabel("training tokens")


def _line_with_band(ax, revs: list[dict], key: str, label: str, scale: float = 1.0) -> None:
    """``key`` per revision against tokens; its bootstrap interval (``<key>_ci``) as a band when present."""
    tokens = [r["tokens"] for r in revs]
    line, = ax.plot(tokens, [scale * r[key] for r in revs], "o-", label=label)
    if revs and all(f"{key}_ci" in r for r in revs):
        low, high = np.array([r[f"{key}_ci"] for r in revs]).T * scale
        ax.fill_between(tokens, low, high, color=line.get_color(), alpha=0.2, linewidth=0)


def bos_vs_tokens(findings: dict, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    for model, f in findings["models"].items():
        _line_with_band(ax, f["revisions"], "bos_fraction", model, scale=100)
    _tokens_axis(ax, findings)
    ax.set_ylabel("BOS (first-token) heads, % of all heads (band: CI)")
    ax.set_title(f"BOS fraction (first-token selectivity >= {findings['thresholds']['class']:g}x)")
    ax.legend()
    return _save(fig, out / "bos_fraction_vs_tokens.png")


def bos_heatmap(model: str, f: dict, out: Path) -> Path:
    counts = np.array([r["bos_per_layer"] for r in f["revisions"]]).T  # [layers, revisions]
    fig, ax = plt.subplots(figsize=(1 + 0.7 * counts.shape[1], 1 + 0.3 * counts.shape[0]))
    im = ax.imshow(counts, aspect="auto", cmap="viridis", origin="lower")
    for (l, r), v in np.ndenumerate(counts):
        ax.text(r, l, str(v), ha="center", va="center", fontsize=7, color="w" if v < counts.max() / 2 else "k")
    ax.set_xticks(range(counts.shape[1]), [r["revision"] for r in f["revisions"]], rotation=60, ha="right",
                  fontsize=7)
    ax.set_ylabel("layer")
    ax.set_title(f"{model}: BOS heads per layer")
    fig.colorbar(im, ax=ax)
    return _save(fig, out / f"bos_per_layer_{model}.png")


def head_trajectories(model: str, f: dict, out: Path) -> Path | None:
    heads = f["f5"]["heads"]
    if not heads:
        return None
    tokens = [r["tokens"] for r in f["revisions"]]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6, 6), sharex=True)
    for name, h in heads.items():
        top.plot(tokens, np.maximum(h["selectivity"], 1e-3), "o-", label=name)
        if "pr" in h:
            bottom.plot(tokens, h["pr"], "o-", label=name)
    top.set_yscale("log")
    top.set_ylabel("induction selectivity (x baseline)")
    top.set_title(f"{model}: final induction circuit")
    top.legend(fontsize=7)
    bottom.set_ylabel(f["f5"]["pr_estimator"] or "PR")
    _tokens_axis(bottom, {"models": {model: f}})
    return _save(fig, out / f"induction_heads_{model}.png")


def recall_vs_tokens(findings: dict, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    for model, f in findings["models"].items():
        revs = [r for r in f["revisions"] if r["induction_recall"] is not None]
        ax.plot([r["tokens"] for r in revs], [r["induction_recall"] for r in revs], "o-", label=f"{model} recall")
        ax.plot([r["tokens"] for r in revs], [r["topk_recall"] for r in revs], "x:", label=f"{model} top-k")
    ax.axhline(2 / 3, color="0.6", lw=0.8)
    _tokens_axis(ax, findings)
    ax.set_ylabel("share of the final induction circuit")
    ax.legend(fontsize=7)
    return _save(fig, out / "recall_vs_tokens.png")


def trajectories(findings: dict, out: Path) -> Path:
    """Per revision: induction heads, BOS fraction and (toy models) the in-context score."""
    panels = [("n_induction", f"induction heads (>= {findings['thresholds']['circuit']:g}x)"),
              ("bos_fraction", "BOS fraction")]
    if any("icl_score" in r for f in findings["models"].values() for r in f["revisions"]):
        panels.append(("icl_score", "in-context score (nats)"))
    fig, axes = plt.subplots(len(panels), 1, figsize=(6, 2.4 * len(panels)), sharex=True)
    for ax, (key, label) in zip(axes, panels):
        for model, f in findings["models"].items():
            _line_with_band(ax, [r for r in f["revisions"] if key in r], key, model)
        ax.set_ylabel(label)
    _tokens_axis(axes[-1], findings)
    axes[0].legend(fontsize=7)
    return _save(fig, out / "trajectories.png")


def sensitivity(rows: list[dict], models: list[str], out: Path) -> Path:
    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.8), squeeze=False)
    for ax, model in zip(axes[0], models):
        m = gap_matrix(rows, model)
        im = ax.imshow(np.log10(m), cmap="magma", origin="lower", aspect="auto")
        for (i, j), v in np.ndenumerate(m):
            ax.text(j, i, "-" if np.isnan(v) else f"{v:.0f}", ha="center", va="center", fontsize=7, color="c")
        ax.set_xticks(range(len(CIRCUIT_GRID)), [f"{c:g}" for c in CIRCUIT_GRID])
        ax.set_yticks(range(len(CLASS_GRID)), [f"{c:g}" for c in CLASS_GRID])
        ax.set_xlabel("circuit threshold")
        ax.set_ylabel("BOS / class threshold")
        ax.set_title(f"{model}: gap BOS-50% / onset")
        fig.colorbar(im, ax=ax, label="log10 gap")
    return _save(fig, out / "sensitivity_gap.png")
