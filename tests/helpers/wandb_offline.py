"""What an offline W&B run logged, read back from its ``run-<id>.wandb`` file.

wandb (0.2x on) keeps no Python reader of that file; its format is a LevelDB log of protobuf
``Record`` messages: a 7-byte header (":W&B", magic 0xBEE1, version 0), then 32 KiB blocks of chunks,
each behind a 7-byte header (crc32 of the type byte and the payload, length, type: 1 a whole record,
2/3/4 its first/middle/last part); a block's tail too short for a header is zeros. A finished run's
file ends with its ``exit`` record. Every chunk's checksum is checked and the file must end on a chunk's
end: a misread, or a file still being written, is an error that says which, never fewer rows.
"""

import json
import struct
import time
import zlib
from pathlib import Path

HEADER = struct.Struct("<4sHB")
CHUNK = struct.Struct("<IHB")
BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert HEADER.unpack(data[: HEADER.size]) == (b":W&B", 0xBEE1, 0), f"{path} is no W&B run file"
    found, pending, pos = [], b"", HEADER.size
    while pos + CHUNK.size <= len(data):
        if BLOCK - pos % BLOCK < CHUNK.size:  # a block's tail too short for a chunk header is padding
            pos += BLOCK - pos % BLOCK
            continue
        crc, length, kind = CHUNK.unpack(data[pos : pos + CHUNK.size])
        chunk = data[pos + CHUNK.size : pos + CHUNK.size + length]
        if len(chunk) < length:
            raise ValueError(f"{path} ends inside the chunk at byte {pos}: the file is still being written")
        if crc != zlib.crc32(bytes([kind]) + chunk):
            raise ValueError(f"{path}: the chunk at byte {pos} fails its checksum: misread, or written over")
        pos += CHUNK.size + length
        if kind == FULL:
            found.append(chunk)
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            found.append(pending + chunk)
    if any(data[pos:]):  # fewer bytes than a chunk's header left, and not the zeros of a block's tail
        raise ValueError(f"{path} ends inside the chunk header at byte {pos}: the file is still being written")
    return found


def run_file(run_dir: Path) -> Path:
    (path,) = Path(run_dir).glob("run-*.wandb")
    return path


def parsed(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2

    out = []
    for raw in records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        out.append(record)
    return out


def finished_records(run_dir: Path, timeout: float = 60.0) -> list:
    """The offline run's records once its file ends with its ``exit`` record. ``wandb.finish()`` returns
    when the run has ended, and the file's last block can reach the disk after it: read too soon, the
    file ends inside a chunk or before the exit record (the last few dozen rows missing), so it is read
    again until it is whole."""
    path, deadline = run_file(run_dir), time.monotonic() + timeout
    while True:
        try:
            found = parsed(path)
            if found and found[-1].WhichOneof("record_type") == "exit":
                return found
            why = f"its last record is {found[-1].WhichOneof('record_type') if found else 'none'}, not exit"
        except ValueError as err:
            why = str(err)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} is not whole {timeout:.0f} s after the run finished: {why}")
        time.sleep(0.2)


def history(run_dir: Path) -> list[dict]:
    """Every ``run.log`` call of the finished offline run in ``run_dir`` (``wandb/offline-run-*``), in
    order, as {key: value} (a table or image: its keys, e.g. ``emergence/heads/_type``)."""
    rows = []
    for record in finished_records(run_dir):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            )
    return rows
