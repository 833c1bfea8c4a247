"""The topology a checkpoint was written under, and what a run resumed on
another topology keeps.

The chief records, beside the checkpoints, the strategy, cluster, replicas,
input pipelines and global batch of each checkpoint it saves
(`checkpoints/topology.json`: one entry per checkpoint still on disk,
replaced whole and atomically, so a kill mid-write leaves the old file).
A resumed run reads the entry of the checkpoint it restored:

- another topology is said in one log line and in summary.json
  (`resumed_from_topology`); the steps go on from the checkpoint's;
- the global batch (data.batch_size x trainer.accumulate_steps, split
  across whatever replicas there are) must be the checkpoint's: a step
  then means the same examples, and the data goes on at the same example
  of its order. A different one is refused (exit 2) with the way out;
- under optimizer.scale_lr_with_replicas, other replicas would change the
  learning rate mid-run: refused, with the flags that keep it.

A checkpoint without an entry (written before tfdistx recorded it)
resumes as before, unchecked. Knows nothing of TensorFlow.
"""

import json
import logging
import os
from pathlib import Path
from typing import Optional

from tfdistx.core.errors import ConfigError
from tfdistx import whole_files
from tfdistx.rundir import keep_aside

log = logging.getLogger(__name__)

FILE = "topology.json"
_SAME = ("strategy", "workers", "ps", "replicas")  # what makes two topologies the same


def describe(
    *,
    strategy: str,
    cluster: str,
    workers: int,
    ps: int,
    replicas: int,
    input_pipelines: int,
    global_batch: int,
    per_replica_batch: int,
    learning_rate: float,
) -> dict:
    """A run's topology as the record and the summary hold it."""
    return {
        "strategy": strategy,
        "cluster": cluster,
        "workers": workers,
        "ps": ps,
        "replicas": replicas,
        "input_pipelines": input_pipelines,
        "global_batch": global_batch,
        "per_replica_batch": per_replica_batch,
        "learning_rate": learning_rate,
    }


def text(topology: dict) -> str:
    """'multiworker 2x1 (2 replicas)', 'parameter_server ps1w2 (2 workers, 1 ps)', 'one_device (1 replica)'."""
    cluster = "" if topology.get("cluster") in (None, "local") else f" {topology['cluster']}"
    if topology.get("ps"):
        count = f"{topology['workers']} worker{'s' if topology['workers'] != 1 else ''}, {topology['ps']} ps"
    else:
        count = f"{topology['replicas']} replica{'s' if topology['replicas'] != 1 else ''}"
    return f"{topology['strategy']}{cluster} ({count})"


def same(a: dict, b: dict) -> bool:
    return all(a.get(key) == b.get(key) for key in _SAME)


def record(checkpoint_dir: str, step: int, topology: dict) -> None:
    """Add the entry of ckpt-`step`, dropping those of checkpoints no longer
    on disk (checkpoint.max_to_keep rotated them out). The chief alone writes."""
    directory = Path(checkpoint_dir)
    entries = {
        name: entry
        for name, entry in _read(directory, keep_damaged_aside=True).items()
        if (directory / f"{name}.index").exists()
    }
    entries[f"ckpt-{step}"] = topology
    whole_files.write_json(directory / FILE, entries)  # whole or not at all


def written_under(checkpoint_path: str) -> Optional[dict]:
    """The topology the checkpoint at `checkpoint_path` (…/ckpt-N) was written under; None when not recorded."""
    path = Path(checkpoint_path)
    return _read(path.parent).get(path.name)


def _read(directory: Path, keep_damaged_aside: bool = False) -> dict:
    """The entries; {} when there is no record or it cannot be read. Only the
    chief, about to write a new record, keeps a damaged one aside (every task
    reads it)."""
    path = directory / FILE
    if not path.is_file():
        return {}
    try:
        entries = json.loads(path.read_text())
        if isinstance(entries, dict):
            return entries
    except (OSError, ValueError):
        pass
    if keep_damaged_aside:  # never written over; its checkpoints resume unchecked
        log.warning("%s cannot be read: kept as %s", path, os.path.basename(keep_aside(path)))
    return {}


def on_resume(
    before: Optional[dict],
    now: dict,
    *,
    batch_size: int,
    accumulate_steps: int,
    scale_lr_with_replicas: bool,
    checkpoint: str,
    run_dir,
    start_step: int,
    in_memory: bool,
    log_it: bool,
) -> Optional[dict]:
    """Check a resume from a checkpoint written under `before` (None: not
    recorded) on the topology `now`; say it when they differ. `in_memory`:
    the data's order is the same under any topology (order.ArrayExamples).
    Returns `before` when the topology changed, else None (summary.json's
    `resumed_from_topology`)."""
    if before is None:
        return None
    name = os.path.basename(checkpoint)
    if before.get("global_batch") not in (None, now["global_batch"]):
        was = before["global_batch"]
        fix = (
            f"set data.batch_size={was // accumulate_steps}"
            if was % accumulate_steps == 0
            else f"set data.batch_size and trainer.accumulate_steps so that their product is {was}"
        )
        raise ConfigError.for_key(
            "data.batch_size",
            batch_size,
            (
                f"the run in this directory was checkpointed ({name}) with a global batch of {was} examples a step, "
                f"and this run has {now['global_batch']} (data.batch_size x "
                f"trainer.accumulate_steps={accumulate_steps}); a resumed run keeps its global batch, whatever the "
                f"topology (data.batch_size is the global batch, split across the replicas): {fix}, or start a new "
                f"run from this one with checkpoint.init_from={run_dir} and another hydra.run.dir"
            ),
        )
    lr_before = before.get("learning_rate")
    if scale_lr_with_replicas and not same(before, now) and lr_before is not None and lr_before != now["learning_rate"]:
        raise ConfigError.for_key(
            "optimizer.scale_lr_with_replicas",
            True,
            (
                f"the run in this directory was checkpointed ({name}) on {text(before)} at a peak learning rate of "
                f"{lr_before:g}, and {text(now)} would change it mid-run to {now['learning_rate']:g}: keep it with "
                f"optimizer.scale_lr_with_replicas=false optimizer.lr={lr_before:g}"
            ),
        )
    if same(before, now):
        return None
    if log_it:
        was, per_replica = before.get("per_replica_batch"), now["per_replica_batch"]
        log.info(
            "resuming on another topology: %s -> %s, from step %d (%s); the global batch stays %d%s",
            text(before),
            text(now),
            start_step,
            name,
            now["global_batch"],
            f" ({was} -> {per_replica} per replica)" if was != per_replica else "",
        )
        note = _order_note(before, now, in_memory)
        if note:
            log.warning(
                "the data goes on after the first %d examples (%d steps x %d), but not with exactly the examples "
                "the run would have trained next: %s",
                start_step * now["global_batch"],
                start_step,
                now["global_batch"],
                note,
            )
    return before


def _order_note(before: dict, now: dict, in_memory: bool) -> Optional[str]:
    """Why the examples after the resume are not exactly a whole run's; None when they are."""
    if "parameter_server" in (before.get("strategy"), now["strategy"]):
        return (
            "parameter servers give a step to whichever worker is free, so a worker's share of the data is kept only "
            "in expectation"
        )
    if not in_memory and before.get("input_pipelines") != now["input_pipelines"]:
        return (
            "this data is split per input pipeline (by file, by its own pipeline function, or by the tf.data "
            f"service), and there are {now['input_pipelines']} now, {before.get('input_pipelines')} before (in-memory "
            "data read by the run itself keeps its order exactly)"
        )
    return None
