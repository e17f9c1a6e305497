"""The exact Gram matrices of a series' updates, streamed block by block of rows.

Every window's Gram matrix G[a, b] = <delta_a, delta_b> (float64) is a sum over the coordinates, so it
is accumulated one block of one parameter at a time: the block's rows are read from each checkpoint
(``tensor_files``), their consecutive differences taken in float64 (exact for float16 and bfloat16
values), and their inner products added to every scope the block's cells belong to (``scopes.Cell``).
Only the products a window can use are kept: ``BandGram`` holds, per scope, each update's inner
product with itself and the ``width`` - 1 updates before it (width: the largest W).

Memory is the read buffers (``BUFFER_SETS`` sets, each one block per checkpoint: the one being reduced
and those a reader thread fills ahead), bounded by ``memory_bytes`` whatever the model's size, plus float64 copies
of one chunk of about ``CHUNK_ELEMENTS`` per checkpoint.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from emergence.spectral_edge.scopes import Cell, Layout
from emergence.spectral_edge.tensor_files import Reader, StoredTensor

# Elements per checkpoint converted to float64 and reduced at once: small enough to stay in the CPU's
# caches (16 checkpoints x 32k x 8 bytes = 4 MiB), large enough that Python's per-call cost is noise.
CHUNK_ELEMENTS = 2**15

# Sets of read buffers: the one being reduced and those the reader thread fills ahead (a cold disk's reads
# and the reduction then overlap even where one block reads slower than the one before reduces)
BUFFER_SETS = 4

SWITCH_INTERVAL = 1e-4  # seconds: how soon a thread waiting for the GIL gets it while the block is reduced

# one checkpoint's tensors by parameter name
Checkpoint = dict[str, StoredTensor]


@dataclass
class BandGram:
    """values[s, i, j] = <delta_i, delta_(i-j)> of scope s, for 0 <= j < width and j <= i (else 0)."""

    scopes: list[str]
    values: np.ndarray  # [scopes, updates, width] float64

    @property
    def width(self) -> int:
        return self.values.shape[2]

    def window(self, scope: int, first: int, length: int) -> np.ndarray:
        """The [length, length] Gram matrix of updates first .. first + length - 1 (length <= width)."""
        i = np.arange(first, first + length)
        a, b = np.maximum.outer(i, i), np.abs(np.subtract.outer(i, i))
        return self.values[scope, a, b]


@functools.lru_cache(maxsize=64)
def chunk_plan(updates: int, width: int) -> tuple[tuple[int, int, int], ...]:
    """(c0, c1, lo) per product to take: rows c0..c1-1 of the updates with rows lo..c1-1. One product of
    all with all where that is at most twice the band's work (a few large products beat many small ones);
    else one per chunk of ``width`` rows, which covers every pair within ``width`` of each other."""
    if updates <= 2 * width:
        return ((0, updates, 0),)
    return tuple((c0, min(updates, c0 + width), max(0, c0 - width + 1)) for c0 in range(0, updates, width))


def extract_band(chunks: list[torch.Tensor], plan: tuple[tuple[int, int, int], ...], width: int) -> np.ndarray:
    """[updates, width] band values from the products of ``plan``."""
    updates = plan[-1][1]
    out = np.zeros((updates, width))
    for (c0, c1, lo), chunk in zip(plan, chunks):
        g = chunk.numpy()
        for i in range(c0, c1):
            reach = min(width, i - lo + 1)
            out[i, :reach] = g[i - c0, i - lo - np.arange(reach)]
    return out


def cell_products(raw: torch.Tensor, cell: Cell, rows: tuple[int, int], width: int, last_only: bool) -> np.ndarray:
    """[updates, width] band products of ``cell``'s part of one block: ``raw`` [checkpoints, block rows, cols]
    (stored dtype) holds matrix rows ``rows``; only the last update's row where ``last_only``."""
    r0 = max(cell.row0, rows[0]) - rows[0]
    r1 = min(cell.row1, rows[1]) - rows[0]
    part = raw[:, r0:r1, cell.col0 : cell.col1]
    checkpoints, n_rows, n_cols = part.shape
    updates = checkpoints - 1
    step = max(1, CHUNK_ELEMENTS // max(1, n_cols))  # rows per chunk
    plan = ((updates - 1, updates, 0),) if last_only else chunk_plan(updates, width)
    sums = [torch.zeros(c1 - c0, c1 - lo, dtype=torch.float64) for c0, c1, lo in plan]
    # one chunk's values and updates, float64, allocated once per call (the chunks' copies land in them)
    x = torch.empty(checkpoints, min(step, n_rows), n_cols, dtype=torch.float64)
    d = torch.empty(updates, min(step, n_rows) * n_cols, dtype=torch.float64)
    for at in range(0, n_rows, step):
        n = min(step, n_rows - at)
        xs = x[:, :n]
        xs.copy_(part[:, at : at + n])
        flat = xs.reshape(checkpoints, -1)
        ds = d[:, : n * n_cols]
        torch.sub(flat[1:], flat[:-1], out=ds)  # exact in float64 for 16-bit values
        for (c0, c1, lo), acc in zip(plan, sums):
            acc.addmm_(ds[c0:c1], ds[lo:c1].T)
    if last_only:
        out = np.zeros((updates, width))
        g = sums[0].numpy()[0]
        reach = min(width, updates)
        out[updates - 1, :reach] = g[updates - 1 - np.arange(reach)]
        return out
    return extract_band(sums, plan, width)


@dataclass(frozen=True)
class Block:
    """Matrix rows [row0, row1) of one parameter: what is read from each checkpoint at once."""

    name: str
    row0: int
    row1: int


def blocks_of(layout: Layout, stored: Checkpoint, rows_budget_bytes: int) -> list[Block]:
    """Every parameter cut into blocks of rows of at most ``rows_budget_bytes`` as stored (one row at
    least), in the file's order so that reads go forward."""
    out = []
    for name in sorted(layout.cells, key=lambda n: (str(stored[n].path), stored[n].offset)):
        rows, cols = layout.matrices[name]
        per_block = max(1, rows_budget_bytes // (cols * stored[name].itemsize))
        out += [Block(name, r, min(rows, r + per_block)) for r in range(0, rows, per_block)]
    return out


def split_rows(cells: list[Cell], block: Block, shares: int) -> list[list[Cell]]:
    """The cells' parts within ``block``, cut by rows into ``shares`` lists of about equal size."""
    parts = []
    for cell in cells:
        lo, hi = max(cell.row0, block.row0), min(cell.row1, block.row1)
        if lo < hi:
            parts.append(dataclasses.replace(cell, row0=lo, row1=hi))
    total = sum(p.numel for p in parts)
    out: list[list[Cell]] = [[] for _ in range(shares)]
    at = 0  # elements handed out so far
    for part in parts:
        per_row = part.col1 - part.col0
        row = part.row0
        while row < part.row1:
            share = min(shares - 1, at * shares // max(1, total))
            room = (share + 1) * total // shares - at  # elements until the next share starts
            rows = max(1, min(part.row1 - row, -(-room // per_row)))
            out[share].append(dataclasses.replace(part, row0=row, row1=row + rows))
            row += rows
            at += rows * per_row
    return out


def stream_gram(
    checkpoints: Sequence[Checkpoint],
    layout: Layout,
    width: int,
    memory_bytes: int,
    last_only: bool = False,
    progress: Callable[[int], None] | None = None,
) -> BandGram:
    """The band Gram matrices of every scope over the updates between consecutive ``checkpoints``, each
    file's tensors read once, in blocks; ``last_only``: only the last update's products (the others 0).
    ``progress`` is told the bytes of each block as it is reduced."""
    updates = len(checkpoints) - 1
    values = np.zeros((len(layout.scopes), updates, width))
    per_checkpoint = max(1, memory_bytes // (BUFFER_SETS * len(checkpoints)))
    blocks = blocks_of(layout, checkpoints[0], per_checkpoint)
    # per checkpoint, the largest block as stored: the budget, or one row where a row is wider than it
    largest = max(
        ((b.row1 - b.row0) * layout.matrices[b.name][1] * checkpoints[0][b.name].itemsize for b in blocks), default=0
    )
    buffers = [bytearray(largest * len(checkpoints)) for _ in range(BUFFER_SETS)]
    reader = Reader()

    def read(k: int) -> torch.Tensor:
        """Block k from every checkpoint, [checkpoints, rows, cols] in its stored dtype (float64 where the
        checkpoints store it in different dtypes)."""
        block = blocks[k]
        rows, cols = layout.matrices[block.name]
        count = (block.row1 - block.row0) * cols
        stored = [c[block.name] for c in checkpoints]
        shape = (len(checkpoints), block.row1 - block.row0, cols)
        if len({t.dtype for t in stored}) > 1:
            out = torch.empty(shape, dtype=torch.float64)
            for i, t in enumerate(stored):
                one = bytearray(count * t.itemsize)
                reader.read(t, block.row0 * cols, count, memoryview(one))
                out[i] = torch.frombuffer(one, dtype=t.dtype).reshape(shape[1:])
            return out
        size = count * stored[0].itemsize
        view = memoryview(buffers[k % BUFFER_SETS])
        for i, t in enumerate(stored):
            reader.read(t, block.row0 * cols, count, view[i * size : (i + 1) * size])
        return torch.frombuffer(view[: len(stored) * size], dtype=stored[0].dtype).reshape(shape)

    # the reduction runs on as many threads as torch would use, each single-threaded on its own share of
    # every block's rows (tiny matrix products parallelise badly inside one op), each into its own sums
    workers = max(1, torch.get_num_threads())
    sums = [np.zeros_like(values) for _ in range(workers)]

    def reduce(raw: torch.Tensor, share: list[Cell], block: Block, into: np.ndarray) -> None:
        for cell in share:
            into[list(cell.scopes)] += cell_products(raw, cell, (block.row0, block.row1), width, last_only)

    threads, switch = torch.get_num_threads(), sys.getswitchinterval()
    torch.set_num_threads(1)
    # the reader takes the GIL back after each read; at Python's default 5 ms the reduction's threads
    # would make a cold disk wait that long between two reads
    sys.setswitchinterval(SWITCH_INTERVAL)
    try:
        with (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="edge-read") as reading,
            ThreadPoolExecutor(max_workers=workers, thread_name_prefix="edge-reduce") as reducing,
        ):
            # the next blocks are read into the other buffer sets while this one is reduced
            ahead = deque(reading.submit(read, k) for k in range(min(len(blocks), BUFFER_SETS - 1)))
            for k, block in enumerate(blocks):
                raw = ahead.popleft().result()
                if k + BUFFER_SETS - 1 < len(blocks):
                    ahead.append(reading.submit(read, k + BUFFER_SETS - 1))
                shares = split_rows(layout.cells[block.name], block, workers)
                for done in [reducing.submit(reduce, raw, share, block, sums[w]) for w, share in enumerate(shares)]:
                    done.result()
                if progress is not None:
                    progress(raw[0].numel() * raw.element_size())
    finally:
        torch.set_num_threads(threads)
        sys.setswitchinterval(switch)
        reader.close()
    for part in sums:
        values += part
    return BandGram(list(layout.scopes), values)
