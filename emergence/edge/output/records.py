"""``edge.json``: ``{"window", "projection", "dim", "scopes": {scope: [window, ...]}, "collapse": {scope: ...}}``."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from emergence.core.atomic import atomic_write_text
from emergence.core.config import PanelEntry
from emergence.core.record import Record
from emergence.edge.spectrum.window import Spectrum, collapse

EDGE_FILE = "edge.json"
FIGURE_FILE = "edge.png"


@dataclass(frozen=True)
class EdgeWindow(Record):
    """One window of one scope: its W updates run from checkpoint ``first_step`` to ``last_step`` =
    first_step + W x spacing; the rest is its ``Spectrum``."""

    first_step: int
    last_step: int
    first_tokens: int | None  # None: the series states no tokens (nor model.tokens_per_step)
    last_tokens: int | None
    spacing: int  # steps between two consecutive checkpoints of the window
    singular_values: list[float]
    r12: float | None
    r23: float | None
    k_star: int
    pc1_share: float
    pc2_share: float
    drift_speed: float

    @classmethod
    def of(cls, first: PanelEntry, last: PanelEntry, spacing: int, spectrum: Spectrum) -> EdgeWindow:
        return cls(first.step, last.step, first.tokens, last.tokens, spacing, **dataclasses.asdict(spectrum))


@dataclass(frozen=True)
class Collapse(Record):
    """Where a scope's sigma_2/sigma_3 peaks, and its first window after the peak below the paper's 1.20:
    indices into the scope's windows (None: no ratio / no collapse)."""

    peak: int | None
    collapse: int | None

    @classmethod
    def of(cls, windows: list[EdgeWindow]) -> Collapse:
        return cls(*collapse([w.r23 for w in windows]))


@dataclass(frozen=True)
class Edge(Record):
    window: int  # W
    projection: str  # jl | exact
    dim: int | None  # jl: the projection's dimension; exact: None
    scopes: dict[str, list[EdgeWindow]]  # "model", "L<i>", "L<i>H<j>"
    collapse: dict[str, Collapse]

    def save(self, directory: Path) -> Path:
        path = Path(directory) / EDGE_FILE
        atomic_write_text(path, json.dumps(self.to_json(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, directory: Path) -> Edge:
        return cls.from_json(json.loads((Path(directory) / EDGE_FILE).read_text()))
