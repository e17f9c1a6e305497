"""A count sketch of each scope: the edge of a model while it trains, where no past checkpoint is kept.

Each coordinate x_c of a scope goes to one of ``dim`` buckets, h(c), with a random sign s(c): the
scope's sketch is y_b = sum over c with h(c) = b of s(c) x_c (Charikar, Chen & Farach-Colton 2002;
as a Johnson-Lindenstrauss embedding: Kane & Nelson 2014). It is linear, so an update's sketch is the
difference of two checkpoints' sketches, and it preserves inner products in expectation with a relative
error of about sqrt(2 / dim): the Gram matrices, hence the ratios, of the updates are nearly kept. Its
cost is one random integer per parameter (the Gaussian projection it replaces drew ``dim``).

h and s are never stored: for each block of a parameter's rows they are drawn from a generator seeded by
(``edge.seed``, the parameter's name, the block's index), so every call meets the same sketch and a run is
reproducible on one kind of device (CUDA's generator draws other numbers than the CPU's). A sub-scope (a
layer, a head) is its cells' own sketch: a count sketch restricted to some coordinates is again one.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from emergence.spectral_edge.scopes import Layout

BLOCK_ELEMENTS = 2**22  # h and s drawn at once for a block of about this many elements (32 MiB of int64)


def block_seed(seed: int, name: str, block: int) -> int:
    """The generator seed of one block of one parameter (stable across runs and machines)."""
    digest = hashlib.sha256(f"{seed}/{name}/{block}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def sketch(params: dict[str, torch.Tensor], layout: Layout, dim: int, seed: int) -> np.ndarray:
    """[scopes, dim] float64: every scope's sketch of one checkpoint's parameters (``params`` by name, on
    any device)."""
    out = np.zeros((len(layout.scopes), dim))
    with torch.no_grad():
        for name, cells in layout.cells.items():
            rows, cols = layout.matrices[name]
            x = params[name].detach().reshape(rows, cols)
            generator = torch.Generator(device=x.device)
            per_block = max(1, BLOCK_ELEMENTS // cols)
            for block, r0 in enumerate(range(0, rows, per_block)):
                r1 = min(rows, r0 + per_block)
                generator.manual_seed(block_seed(seed, name, block))
                code = torch.randint(
                    0, 2 * dim, (r1 - r0, cols), generator=generator, device=x.device, dtype=torch.int32
                )
                # s(c) = +1 or -1 from the code's low bit, h(c) from the rest
                signed = (code & 1).to(torch.float64).mul_(-2).add_(1).mul_(x[r0:r1])
                bucket = code >> 1
                for cell in cells:
                    lo, hi = max(cell.row0, r0), min(cell.row1, r1)
                    if lo >= hi:
                        continue
                    part = (slice(lo - r0, hi - r0), slice(cell.col0, cell.col1))
                    y = torch.zeros(dim, dtype=torch.float64, device=x.device)
                    y.index_add_(0, bucket[part].reshape(-1), signed[part].reshape(-1))
                    out[list(cell.scopes)] += y.cpu().numpy()
    return out
