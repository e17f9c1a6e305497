"""A checkpoint as one vector per scope, from which the updates' Gram matrices are computed.

* ``Exact``: the scope's values themselves, float64 [numel]: a delta is a difference of two, and the
  Gram matrix is exact. Memory: W + 2 such vectors per scope (``Exact.bytes_needed``).
* ``RandomProjection``: Phi x, with Phi a Gaussian [dim, numel] matrix scaled by 1/sqrt(dim)
  (Johnson-Lindenstrauss: inner products kept within a few per cent at dim = 10 W; Xu 2026 measures the
  ratios within 7.4%). Phi is linear, so a delta's projection is the difference of two checkpoints'
  projections: each checkpoint is read once and only ``dim`` numbers per scope are kept. Phi is never
  stored: its columns for a block of a parameter's rows are drawn from a generator seeded by
  (``edge.seed``, parameter name, block index), so every checkpoint meets the same Phi and a run is
  reproducible. A sub-scope (a layer, a head) uses Phi's columns of its own coordinates: a Gaussian matrix
  restricted to some columns is again one, so every scope's projection is a JL projection of its own.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import torch

from emergence.edge.scopes.scopes import Piece
from emergence.recipe.head_weights import ParameterSlice

# Phi's entries drawn at once for one block of a parameter's rows, at most: 64 MiB of float32, so that the
# projection's own memory stays far below the 1 GB the streaming promises beside the checkpoint.
BLOCK_FLOATS = 2**24


class Exact:
    """Each scope's values, float64."""

    def __init__(self, scopes: dict[str, list[Piece]]):
        self.scopes = scopes

    def vectors(self, params: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
        """{scope: [numel] float64} of one checkpoint's parameters."""
        with torch.no_grad():
            return {
                scope: torch.cat([p.of(params[p.name]).double() for p in pieces]).numpy()
                for scope, pieces in self.scopes.items()
            }

    def bytes_needed(self, shapes: dict[str, torch.Size], window: int) -> int:
        """The window's W deltas, the previous checkpoint's vectors and the current one's, in float64."""
        numel = sum(p.numel(shapes) for pieces in self.scopes.values() for p in pieces)
        return (window + 2) * numel * 8


def block_seed(seed: int, name: str, block: int) -> int:
    """The generator seed of Phi's columns for one block of one parameter (stable across runs and machines)."""
    digest = hashlib.sha256(f"{seed}/{name}/{block}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def as_rows(weight: torch.Tensor) -> torch.Tensor:
    """A parameter as [rows, cols] (a vector as one column), the layout Phi's blocks follow."""
    return weight.reshape(weight.shape[0], -1) if weight.dim() >= 2 else weight.reshape(-1, 1)


def row_blocks(rows: int, cols: int, dim: int) -> list[tuple[int, int]]:
    """[start, stop) of each block of rows whose slab of Phi [dim, block rows, cols] fits BLOCK_FLOATS."""
    per_block = max(1, BLOCK_FLOATS // (dim * cols))
    return [(r, min(rows, r + per_block)) for r in range(0, rows, per_block)]


def phi_block(seed: int, name: str, block: int, dim: int, rows: int, cols: int) -> torch.Tensor:
    """Phi's columns for one block of a parameter: [dim, rows, cols] float32, N(0, 1/dim)."""
    generator = torch.Generator().manual_seed(block_seed(seed, name, block))
    return torch.randn(dim, rows, cols, generator=generator) / math.sqrt(dim)


class RandomProjection:
    """Each scope's values projected to ``dim`` numbers (float64 sums of float32 block products)."""

    def __init__(self, scopes: dict[str, list[Piece]], dim: int, seed: int):
        self.scopes, self.dim, self.seed = scopes, dim, seed
        # per parameter: the scopes that hold it whole, and the head blocks cut from it
        self.whole: dict[str, list[str]] = {}
        self.parts: dict[str, list[tuple[str, ParameterSlice]]] = {}
        for scope, pieces in scopes.items():
            for p in pieces:
                if p.part is None:
                    self.whole.setdefault(p.name, []).append(scope)
                else:
                    self.parts.setdefault(p.name, []).append((scope, p.part))

    def vectors(self, params: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
        """{scope: [dim] float64} of one checkpoint's parameters."""
        out = {scope: np.zeros(self.dim) for scope in self.scopes}
        with torch.no_grad():
            for name in dict.fromkeys([*self.whole, *self.parts]):
                self._project(name, as_rows(params[name]), out)
        return out

    def _project(self, name: str, x: torch.Tensor, out: dict[str, np.ndarray]) -> None:
        rows, cols = x.shape
        whole, parts = self.whole.get(name, []), self.parts.get(name, [])
        for block, (r0, r1) in enumerate(row_blocks(rows, cols, self.dim)):
            phi = phi_block(self.seed, name, block, self.dim, r1 - r0, cols)
            xb = x[r0:r1].float()
            if whole:
                v = (phi.reshape(self.dim, -1) @ xb.reshape(-1)).double().numpy()
                for scope in whole:
                    out[scope] += v
            for scope, part in parts:  # a head's rows (dim 0) or columns (dim 1) within this block
                if part.dim == 0:
                    lo, hi = max(part.start, r0), min(part.stop, r1)
                    if lo >= hi:
                        continue
                    sub, xs = phi[:, lo - r0 : hi - r0], xb[lo - r0 : hi - r0]
                else:
                    sub, xs = phi[:, :, part.start : part.stop], xb[:, part.start : part.stop]
                out[scope] += torch.einsum("drc,rc->d", sub, xs).double().numpy()
