"""What an offline W&B run logged, read back from its ``run-<id>.wandb`` file.

wandb (0.2x on) keeps no Python reader of that file; its format is a LevelDB log of protobuf
``Record`` messages: a 7-byte header (":W&B", magic 0xBEE1, version 0), then 32 KiB blocks of chunks,
each behind a 7-byte header (crc32, length, type: 1 a whole record, 2/3/4 its first/middle/last part).
"""

import json
import struct
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
        _, length, kind = CHUNK.unpack(data[pos : pos + CHUNK.size])
        chunk = data[pos + CHUNK.size : pos + CHUNK.size + length]
        pos += CHUNK.size + length
        if kind == FULL:
            found.append(chunk)
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            found.append(pending + chunk)
    return found


def history(run_dir: Path) -> list[dict]:
    """Every ``run.log`` call of the offline run in ``run_dir`` (``wandb/offline-run-*``), in order, as
    {key: value} (a table or image: its keys, e.g. ``emergence/heads/_type``)."""
    from wandb.proto import wandb_internal_pb2

    (path,) = Path(run_dir).glob("run-*.wandb")
    rows = []
    for raw in records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            )
    return rows
