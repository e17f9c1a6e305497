"""``edge.json``'s records: a series' windows per window length W and per scope, and where each scope's
sigma_2/sigma_3 peaks and collapses. The panel report reads them for F6 (``panel/edge_findings.py``).

Schema 2 holds one ``WindowSpectra`` per W of ``edge.window`` (a list); schema 1 (one W, its scopes and
collapses at the top level) still reads, as an ``Edge`` of one ``WindowSpectra``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from emergence.core.atomic import atomic_write_text
from emergence.core.config import PanelEntry
from emergence.core.record import Record
from emergence.spectral_edge.spectrum import Spectrum, collapse

EDGE_FILE = "edge.json"
FIGURE_FILE = "edge.png"
EDGE_SCHEMA = 2
MODEL_SCOPE = "model"  # every trained parameter; the others: "L<i>", "L<i>.attn|mlp|norm", "L<i>H<j>", "embed", ...


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
    k95: int | None  # None: read from a schema-1 edge.json, which did not hold it
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
class WindowSpectra(Record):
    """Every window of length ``window`` (W updates) of every scope, in order, and each scope's collapse."""

    window: int
    scopes: dict[str, list[EdgeWindow]]
    collapse: dict[str, Collapse]

    @classmethod
    def of(cls, window: int, scopes: dict[str, list[EdgeWindow]]) -> WindowSpectra:
        return cls(window, scopes, {scope: Collapse.of(w) for scope, w in scopes.items()})


@dataclass(frozen=True)
class Edge(Record):
    """``edge.json``: the edge of one model's checkpoint series, for each W of ``edge.window``."""

    model: str  # the model's key (``model=...``): the panel report places its edge on this model's axis
    projection: str  # exact | sketch (jl: a schema-1 file made with a dense Gaussian projection)
    dim: int | None  # sketch: its dimension d per scope; exact: None
    spectra: list[WindowSpectra]  # one per W, in edge.window's order: the first is the one F6 places
    schema: int = EDGE_SCHEMA

    @property
    def first(self) -> WindowSpectra:
        """The windows of the first W of ``edge.window``: what F6 and edge.png read."""
        return self.spectra[0]

    def save(self, directory: Path, name: str = EDGE_FILE) -> Path:
        path = Path(directory) / name
        atomic_write_text(path, json.dumps(self.to_json(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, directory: Path, name: str = EDGE_FILE) -> Edge:
        data = json.loads((Path(directory) / name).read_text())
        if data.get("schema", 1) == 1:  # one W: {"window", "projection", "dim", "scopes", "collapse"}
            spectra = {"window": data["window"], "scopes": data["scopes"], "collapse": data["collapse"]}
            for windows in spectra["scopes"].values():
                for w in windows:
                    w.setdefault("k95", None)
            data = {"model": data["model"], "projection": data["projection"], "dim": data["dim"], "spectra": [spectra]}
        return cls.from_json(data)
