"""Tensors read from safetensors files by offset, a block of rows at a time.

A safetensors file is an 8-byte little-endian header length, a JSON header naming each tensor's dtype,
shape and byte range, then the data (https://huggingface.co/docs/safetensors: "the format"). Reading a
block of a tensor's rows is one ``preadv`` at its offset into a buffer the caller owns: nothing is
memory-mapped, so no page of a file stays mapped into the process beyond the buffer in use, and a whole
checkpoint is never held. ``read_into`` is the one place bytes are read (a test counts them there).
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

# safetensors' dtype names -> torch's; integer tensors are no trained parameters
DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64}


@dataclass(frozen=True)
class StoredTensor:
    """Where one tensor's data lies: its file, the absolute byte offset of its first element, its dtype
    and shape as stored."""

    path: Path
    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def read_header(path: Path) -> dict[str, StoredTensor]:
    """Every floating-point tensor of one safetensors file, by name (the header only is read)."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    start = 8 + length
    found = {}
    for name, entry in header.items():
        if name == "__metadata__" or entry["dtype"] not in DTYPES:
            continue
        begin, _ = entry["data_offsets"]
        found[name] = StoredTensor(Path(path), start + begin, DTYPES[entry["dtype"]], tuple(entry["shape"]))
    return found


def read_into(fd: int, buffer: memoryview, offset: int) -> None:
    """Fill ``buffer`` with the file's bytes from ``offset`` (a short read is read on; the end of the file
    before the buffer is full is an error: the file is truncated)."""
    done = 0
    while done < len(buffer):
        got = os.preadv(fd, [buffer[done:]], offset + done)
        if got == 0:
            raise OSError(f"unexpected end of file at byte {offset + done}: the file is truncated")
        done += got


class Reader:
    """Open files, read a block of a stored tensor's elements into a caller's buffer."""

    def __init__(self) -> None:
        self.fds: dict[Path, int] = {}

    def read(self, tensor: StoredTensor, first: int, count: int, target: memoryview) -> None:
        """Elements [first, first + count) of ``tensor`` (row-major) into ``target``'s first bytes."""
        fd = self.fds.get(tensor.path)
        if fd is None:
            fd = self.fds[tensor.path] = os.open(tensor.path, os.O_RDONLY)
        read_into(fd, target[: count * tensor.itemsize], tensor.offset + first * tensor.itemsize)

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()
