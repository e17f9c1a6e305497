"""Threshold sensitivity: F1-F4 over a dense log-spaced grid of (class, circuit) thresholds,
recomputed from the stored per-head selectivities (no model is run), and where each
conclusion flips.

The grid is evaluated at once with numpy broadcasting over thresholds (``dense``), with the
definitions of ``findings.model_findings`` (the tests check them cell by cell against it):
a 32 x 32 grid over a 30-checkpoint panel takes well under a second.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from emergence.panel.findings import ABRUPT_SHARE, BOS, INDUCTION, ONSET_HEADS, RECALL_MILESTONES, at_level
from emergence.panel.records import Conclusion
from emergence.panel.runs import Trajectory

GRID_POINTS = 32  # per axis: 32 x 32 = 1,024 (class, circuit) settings per model
GRID_RANGE = (2.0, 200.0)  # x baseline, both axes
GRID = np.geomspace(*GRID_RANGE, GRID_POINTS)
GAP_CONCLUSION = 10.0  # "induction onset precedes BOS-50% by >= 10x"

# What each finding concludes at one setting (the boolean columns of sensitivity.csv), in words.
CONCLUSIONS = {
    "layers_0_1_bos_free": "layers 0 and 1 never hold a BOS head",
    "gap_at_least_10x": "induction onset precedes BOS-50% by >= 10x",
    "recall_67_before_bos_50": "2/3 of the final circuit is present before BOS-50%",
    "abrupt": "BOS emergence is abrupt (largest jump >= half the rise)",
}


@dataclass(frozen=True)
class Grid:
    """One model's findings over ``class_grid`` x ``circuit_grid``; arrays [classes, circuits]
    (a quantity of one axis only is broadcast). Revision indices are -1 where never reached."""

    model: str
    class_grid: np.ndarray
    circuit_grid: np.ndarray
    tokens: np.ndarray  # [revisions]
    revisions: list[str]
    zero_bos_layers: np.ndarray  # [classes, layers] bool
    jump_index: np.ndarray  # [classes]: largest adjacent BOS rise between revisions i and i+1 (-1: none)
    jump_share: np.ndarray  # [classes] NaN without a rise
    final_bos_fraction: np.ndarray  # [classes]
    onset: np.ndarray  # [circuits] first revision with >= 3 induction heads
    bos_50: np.ndarray  # [classes]
    recall_67: np.ndarray  # [classes, circuits]
    circuit_size: np.ndarray  # [circuits]

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.class_grid), len(self.circuit_grid)

    def _tokens_at(self, index: np.ndarray) -> np.ndarray:
        return np.where(index >= 0, self.tokens[np.maximum(index, 0)], np.nan)

    def gap_ratio(self) -> np.ndarray:
        """tokens(BOS-50%) / tokens(onset); NaN where either is missing."""
        return self._tokens_at(self.bos_50)[:, None] / self._tokens_at(self.onset)[None, :]

    def gap_lower_bound(self) -> np.ndarray:
        """Where BOS-50% is never reached but the onset is: last tokens / onset tokens (censored gap)."""
        censored = (self.bos_50 < 0)[:, None] & (self.onset >= 0)[None, :]
        return np.where(censored, self.tokens[-1] / self._tokens_at(self.onset)[None, :], np.nan)

    def conclusions(self) -> dict[str, np.ndarray]:
        """[classes, circuits] bool per entry of ``CONCLUSIONS``."""
        gap = np.where(np.isnan(self.gap_ratio()), self.gap_lower_bound(), self.gap_ratio())
        bos_50 = self._tokens_at(self.bos_50)[:, None]
        recall = self._tokens_at(self.recall_67)
        full = np.ones(self.shape, dtype=bool)
        return {
            "layers_0_1_bos_free": full & np.asarray(self.zero_bos_layers[:, :2].all(axis=1))[:, None],
            "gap_at_least_10x": np.nan_to_num(gap, nan=0.0) >= GAP_CONCLUSION,
            # BOS-50% never reached (censored): it comes after the last revision, if ever.
            "recall_67_before_bos_50": (self.recall_67 >= 0) & (np.isnan(bos_50) | (recall < bos_50)),
            "abrupt": full & (np.nan_to_num(self.jump_share, nan=0.0) >= ABRUPT_SHARE)[:, None],
        }


def _first(mask: np.ndarray, axis: int) -> np.ndarray:
    """Index of the first True along ``axis``, -1 where there is none."""
    return np.where(mask.any(axis=axis), mask.argmax(axis=axis), -1)


def dense(traj: Trajectory, class_grid: ArrayLike = GRID, circuit_grid: ArrayLike = GRID) -> Grid:
    """F1-F4 of ``traj`` at every (class, circuit) threshold pair, vectorised over both axes."""
    sel = traj.sel  # [revisions, layers, heads, 6]
    first, ind = sel[..., BOS], sel[..., INDUCTION]
    c = np.asarray(class_grid, dtype=float)
    k = np.asarray(circuit_grid, dtype=float)
    bos_members = first[None] >= c[:, None, None, None]  # [classes, revisions, layers, heads]
    bos = bos_members.mean(axis=(2, 3))  # [classes, revisions]
    jumps = np.diff(bos, axis=1)
    rise = bos[:, -1]
    has_rise = (rise > 0) & (jumps.shape[1] > 0)
    jump_index = np.where(has_rise, jumps.argmax(axis=1) if jumps.shape[1] else 0, -1)
    largest = (
        np.take_along_axis(jumps, np.maximum(jump_index, 0)[:, None], axis=1)[:, 0]
        if jumps.shape[1]
        else np.zeros(len(c))
    )
    n_ind = (ind[None] >= k[:, None, None, None]).sum(axis=(2, 3))  # [circuits, revisions]
    final = ind[-1].ravel()
    circuit = final[None, :] >= k[:, None]  # [circuits, heads]
    size = circuit.sum(axis=1)
    member = (ind.reshape(len(ind), -1)[:, None, :] >= c[None, :, None]).astype(np.int64)  # [revisions, classes, heads]
    hits = member @ circuit.T.astype(np.int64)  # [revisions, classes, circuits]: final-circuit heads >= class
    level = RECALL_MILESTONES["recall_67"]
    reached = (hits * level.denominator >= level.numerator * size) & (size > 0)  # exact, as the Fractions
    return Grid(
        model=traj.model,
        class_grid=c,
        circuit_grid=k,
        tokens=traj.tokens,
        revisions=[cp.revision for cp in traj.checkpoints],
        zero_bos_layers=np.asarray(~bos_members.any(axis=(1, 3))),
        jump_index=jump_index,
        jump_share=np.where(has_rise, largest / np.where(has_rise, rise, 1.0), np.nan),
        final_bos_fraction=rise,
        onset=_first(n_ind >= ONSET_HEADS, axis=1),
        bos_50=_first(at_level(bos, 50), axis=1),
        recall_67=_first(reached, axis=0),
        circuit_size=size,
    )


def rows(grids: list[Grid]) -> list[dict]:
    """sensitivity.csv: one row per (model, class threshold, circuit threshold), with what each
    finding gives and concludes there."""
    out = []
    for g in grids:
        gap, lower = g.gap_ratio(), g.gap_lower_bound()
        held = g.conclusions()
        onset, bos_50, recall = g._tokens_at(g.onset), g._tokens_at(g.bos_50), g._tokens_at(g.recall_67)
        for i, ct in enumerate(g.class_grid):
            zero = " ".join(str(l) for l in np.flatnonzero(g.zero_bos_layers[i]))
            jump = g.jump_index[i]
            shape = None if jump < 0 else ("abrupt" if g.jump_share[i] >= ABRUPT_SHARE else "gradual")
            for j, cc in enumerate(g.circuit_grid):
                out.append(
                    {
                        "model": g.model,
                        "class_threshold": round(float(ct), 4),
                        "circuit_threshold": round(float(cc), 4),
                        "zero_bos_layers": zero,
                        "shape": shape,
                        "jump_share": _num(g.jump_share[i]),
                        "largest_jump": None if jump < 0 else f"{g.revisions[jump]} -> {g.revisions[jump + 1]}",
                        "final_bos_fraction": float(g.final_bos_fraction[i]),
                        "onset_tokens": _num(onset[j]),
                        "bos_50_tokens": _num(bos_50[i]),
                        "gap_ratio": _num(gap[i, j]),
                        "gap_lower_bound": _num(lower[i, j]),
                        "recall_67_tokens": _num(recall[i, j]),
                        "circuit_size": int(g.circuit_size[j]),
                        **{name: bool(v[i, j]) for name, v in held.items()},
                    }
                )
    return out


def _num(x) -> float | None:
    return None if np.isnan(x) else float(x)


def conclusions(
    trajectories: dict[str, Trajectory], grids: list[Grid], class_threshold: float, circuit_threshold: float
) -> list[Conclusion]:
    """Per model and conclusion: whether it holds at the report's thresholds, the share of the
    grid where it holds, and where it flips along each axis through the report's thresholds."""
    out = []
    for g in grids:
        traj = trajectories[g.model]
        here = dense(traj, [class_threshold], [circuit_threshold]).conclusions()
        along_class = dense(traj, g.class_grid, [circuit_threshold]).conclusions()
        along_circuit = dense(traj, [class_threshold], g.circuit_grid).conclusions()
        for name, held in g.conclusions().items():
            where = [f"class {a:.3g}x -> {b:.3g}x" for a, b in _flips(along_class[name][:, 0], g.class_grid)]
            where += [f"circuit {a:.3g}x -> {b:.3g}x" for a, b in _flips(along_circuit[name][0], g.circuit_grid)]
            out.append(
                Conclusion(
                    model=g.model,
                    conclusion=CONCLUSIONS[name],
                    key=name,
                    holds_at_report_thresholds=bool(here[name][0, 0]),
                    share=float(held.mean()),
                    holds_everywhere=bool(held.all()),
                    flips="; ".join(where) or "none",
                )
            )
    return out


def _flips(held: np.ndarray, grid: np.ndarray) -> list[tuple[float, float]]:
    """Adjacent grid thresholds between which ``held`` changes."""
    return [(grid[i], grid[i + 1]) for i in np.flatnonzero(held[1:] != held[:-1])]
