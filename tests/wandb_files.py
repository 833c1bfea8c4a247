"""W&B's offline runs read back from their `.wandb` files, as W&B records them:
a LevelDB log (a 7-byte header `:W&B`, then 32 KiB blocks of chunks, each
a 7-byte header: checksum, length, type) of `wandb_internal_pb2.Record`
protobufs, W&B's own message types. Written for the tests apart from the
logger's own reading (tfdistx/loggers/wandb_logger.py), so that neither
vouches for the other."""

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List

from wandb.proto import wandb_internal_pb2

FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_records(path: Path) -> list:
    data = Path(path).read_bytes()
    ident, _, _ = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B", path
    out, pending, position = [], b"", 7
    while position + 7 <= len(data):
        room = 32768 - position % 32768
        if room < 7:
            position += room
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if kind == 0:
            position += room
            continue
        body = data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind == FULL:
            out.append(body)
        elif kind == FIRST:
            pending = body
        elif kind == MIDDLE:
            pending += body
        elif kind == LAST:
            out.append(pending + body)
    records = []
    for raw in out:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        records.append(record)
    return records


@dataclass
class Attempt:
    """What one `.wandb` file holds of its run."""

    path: Path
    run_id: str = ""
    name: str = ""
    group: str = ""
    job_type: str = ""
    notes: str = ""
    history: List[dict] = field(default_factory=list)
    summary: Dict[str, object] = field(default_factory=dict)
    artifacts: List[object] = field(default_factory=list)


def attempt(path: Path) -> Attempt:
    found = Attempt(Path(path))
    for record in read_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            found.run_id, found.name = record.run.run_id, record.run.display_name
            found.group, found.job_type, found.notes = record.run.run_group, record.run.job_type, record.run.notes
        elif kind == "history":
            found.history.append(
                {"/".join(item.nested_key) or item.key: json.loads(item.value_json) for item in record.history.item}
            )
        elif kind == "summary":
            for item in record.summary.update:
                found.summary["/".join(item.nested_key) or item.key] = json.loads(item.value_json)
        elif kind == "artifact":
            found.artifacts.append(record.artifact)
    return found


def attempts(run_dir: Path) -> List[Attempt]:
    """Every W&B file of a run dir, oldest first (W&B names each attempt's folder by its start time)."""
    return [attempt(path) for path in sorted(Path(run_dir, "wandb").glob("*run-*/*.wandb"))]


def steps(found: List[Attempt], keys=("loss",)) -> List[dict]:
    """The history rows of all attempts, in order: {"step": ..., key: value} as metrics.jsonl has them."""
    return [
        {"step": row["_step"], **{key: row[key] for key in keys if key in row}} for one in found for row in one.history
    ]
