"""Tensors read from safetensors files by offset, a block of rows at a time.

A safetensors file is an 8-byte little-endian header length, a JSON header naming each tensor's dtype,
shape and byte range, then the data (https://huggingface.co/docs/safetensors: "the format"). Reading a
block of a tensor's rows is one ``preadv`` at its offset: nothing is memory-mapped, so no page of a file
stays mapped into the process beyond the buffer in use, and a whole checkpoint is never held.
``read_into`` is the one place bytes are read (a test counts them there).

Where the file system allows it the files are opened with ``O_DIRECT``: the disk writes into the
reader's own page-aligned buffer, so the kernel neither copies every byte out of its page cache (about
half a core at a disk's speed, taken from the arithmetic the reads overlap) nor fills that cache with a
series read once. Direct reads cover whole pages; the page a block ends in is kept for the block that
starts in it, so each page of a file is still read once. Elsewhere (tmpfs, some network file systems)
the reads are buffered.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

# safetensors' dtype names -> torch's; integer tensors are no trained parameters
DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64}

# direct reads' alignment of offsets, lengths and buffers: a page, a multiple of every disk's logical block
PAGE = mmap.PAGESIZE


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


def read_into(fd: int, buffer: memoryview, offset: int, needed: int | None = None) -> int:
    """Fill ``buffer`` with the file's bytes from ``offset``; a short read is read on. The end of the file
    before ``needed`` bytes (default: the whole buffer) is an error: the file is truncated. Returns the
    bytes read."""
    needed = len(buffer) if needed is None else needed
    done = 0
    while done < len(buffer):
        got = os.preadv(fd, [buffer[done:]], offset + done)
        if got == 0:
            if done >= needed:
                break
            raise OSError(f"unexpected end of file at byte {offset + done}: the file is truncated")
        done += got
    return done


@dataclass
class OpenFile:
    """A file open for reading; for a direct one, the last page read (its offset, its bytes) for the block
    that starts in it."""

    fd: int
    direct: bool
    last_page: tuple[int, bytes] | None = None


def open_for_reading(path: Path) -> OpenFile:
    """``path`` opened with ``O_DIRECT`` where its file system takes that, else buffered."""
    direct = getattr(os, "O_DIRECT", 0)
    if direct:
        try:
            return OpenFile(os.open(path, os.O_RDONLY | direct), direct=True)
        except OSError:  # EINVAL: a file system without direct I/O
            pass
    return OpenFile(os.open(path, os.O_RDONLY), direct=False)


class Reader:
    """Open files, read a block of a stored tensor's elements into a caller's buffer."""

    def __init__(self) -> None:
        self.files: dict[Path, OpenFile] = {}
        self.aligned = mmap.mmap(-1, PAGE)  # direct reads land here (page-aligned), grown to the largest block

    def read(self, tensor: StoredTensor, first: int, count: int, target: memoryview) -> None:
        """Elements [first, first + count) of ``tensor`` (row-major) into ``target``'s first bytes."""
        file = self.files.get(tensor.path)
        if file is None:
            file = self.files[tensor.path] = open_for_reading(tensor.path)
        start = tensor.offset + first * tensor.itemsize
        size = count * tensor.itemsize
        if file.direct:
            try:
                self.read_direct(file, start, size, target)
                return
            except OSError as err:  # EINVAL: a file system that opens O_DIRECT but refuses its reads
                if err.errno != errno.EINVAL:
                    raise
                os.close(file.fd)
                file = self.files[tensor.path] = OpenFile(os.open(tensor.path, os.O_RDONLY), direct=False)
        read_into(file.fd, target[:size], start)

    def read_direct(self, file: OpenFile, start: int, size: int, target: memoryview) -> None:
        """Bytes [start, start + size) of a file open with O_DIRECT into ``target``, through whole pages."""
        lo, hi = start // PAGE * PAGE, -(-(start + size) // PAGE) * PAGE
        if len(self.aligned) < hi - lo:
            self.aligned.close()
            self.aligned = mmap.mmap(-1, hi - lo)
        with memoryview(self.aligned) as view:
            at = lo  # the first byte still to read from the disk
            if file.last_page is not None and file.last_page[0] == lo:
                kept = file.last_page[1]  # shorter than a page where the file ends in it
                view[: len(kept)] = kept
                at += PAGE
            if at < hi:
                end = at + read_into(file.fd, view[at - lo : hi - lo], at, needed=start + size - at)
                file.last_page = (hi - PAGE, bytes(view[hi - PAGE - lo : end - lo]))  # the file may end in it
            target[:size] = view[start - lo : start - lo + size]

    def close(self) -> None:
        for file in self.files.values():
            os.close(file.fd)
        self.files.clear()
        self.aligned.close()
