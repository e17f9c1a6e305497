"""``edge.png``: the whole model's sigma_1/sigma_2, sigma_2/sigma_3 and drift speed against training."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

from emergence.core.atomic import atomic_write_bytes  # noqa: E402
from emergence.spectral_edge.records import FIGURE_FILE, MODEL_SCOPE, Edge  # noqa: E402
from emergence.spectral_edge.spectrum import COLLAPSE_RATIO  # noqa: E402


def series(values: list) -> np.ndarray:
    """Numbers to plot, a gap (nan) where a value is None (a ratio over a zero singular value)."""
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def plot_edge(edge: Edge, directory: Path) -> Path:
    """Each window at its last checkpoint's tokens (its steps where the series states no tokens)."""
    spectra = edge.first
    windows = spectra.scopes[MODEL_SCOPE]
    by_tokens = all(w.last_tokens is not None for w in windows)
    x = series([w.last_tokens if by_tokens else w.last_step for w in windows])
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(x, series([w.r12 for w in windows]), ".-", label="σ1/σ2")
    ax.plot(x, series([w.r23 for w in windows]), ".-", label="σ2/σ3")
    ax.axhline(COLLAPSE_RATIO, color="gray", ls="--", lw=1, label=f"collapse ({COLLAPSE_RATIO})")
    found = spectra.collapse[MODEL_SCOPE]
    if found.collapse is not None:
        ax.axvline(x[found.collapse], color="red", ls=":", lw=1, label="σ2/σ3 collapse")
    ax.set_xlabel("tokens (window end)" if by_tokens else "step (window end)")
    ax.set_ylabel("singular value ratio")
    speed = ax.twinx()
    speed.plot(x, series([w.drift_speed for w in windows]), color="black", alpha=0.4, lw=1, label="drift speed")
    speed.set_ylabel("drift speed (|mean update|)")
    lines = ax.get_legend_handles_labels()
    more = speed.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8)
    ax.set_title(
        f"spectral edge, whole model (W={spectra.window}, {edge.projection}" + (f", d={edge.dim})" if edge.dim else ")")
    )
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    path = Path(directory) / FIGURE_FILE
    atomic_write_bytes(path, buf.getvalue())
    return path
