"""Writing a snapshot (snapshot.py) as a checkpoint, whole or not at all,
in the background or now; and which checkpoints a directory keeps.

A save writes its files into a staging directory beside the checkpoints
(`.writing-ckpt-N/`), then moves them into place, the index last: a
checkpoint is found by its index (checkpoint_files.on_disk), so it appears
only once every file is whole. Only then does it become the newest:
`Kept.add` names it in the directory's `checkpoint` state file (what
tf.train.latest_checkpoint and the sidecar evaluator read) and deletes the
oldest beyond `checkpoint.max_to_keep`, as CheckpointManager would after a
save that returned. A process killed mid-write leaves the staging
directory, which no reader looks into and the next run removes
(`remove_staging`), and the previous checkpoint stays the newest.

At most one save is in flight: `Writer.start` first waits for the one
before it. Waiting, not skipping, so that every checkpoint the schedule
asks for is written (`checkpoint.every_steps` and `max_to_keep` keep their
meaning, and the best checkpoint of `checkpoint.keep_best` is never lost);
the wait is measured, and a run whose saves come faster than they are
written is told so once (checkpointing.py).

Why not CheckpointManager: it writes a checkpoint's files straight into the
directory (a kill while it writes the index leaves one that reads as
damaged) and can only record checkpoints it wrote itself.
"""

import glob
import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional

import tensorflow as tf

from tfdistx import whole_files
from tfdistx.engine.snapshot import Snapshot
from tfdistx.internals import tensorflow as internals

log = logging.getLogger(__name__)

STAGING = ".writing-"  # <dir>/.writing-ckpt-N/: a save's files before they are whole
STATE_FILE = "checkpoint"  # CheckpointManager's name for it, which tf.train.latest_checkpoint reads


class Kept:
    """The checkpoints of one directory that a run keeps, oldest first, and
    the `checkpoint` state file that names them (CheckpointManager's, whose
    format it writes). Knows those the state file named when first used
    and those added since: those are the ones it may delete."""

    def __init__(self, directory: str, max_to_keep: int, on_add: Optional[Callable[[int], None]] = None):
        self.directory, self.max_to_keep, self.on_add = directory, max_to_keep, on_add
        self._paths: Optional[List[str]] = None
        self._times: List[float] = []

    @property
    def latest(self) -> Optional[str]:
        paths = self._known()
        return paths[-1] if paths else None

    def add(self, step: int) -> str:
        """ckpt-`step`, whole on disk, is the newest: named, the oldest beyond max_to_keep deleted."""
        paths, path = self._known(), os.path.join(self.directory, f"ckpt-{step}")
        if path in paths:  # saved again (a run resumed from an older one): it moves to the end
            del self._times[paths.index(path)]
            paths.remove(path)
        paths.append(path)
        self._times.append(time.time())
        self._write_state()  # named first: a kill while deleting still finds it
        while len(paths) > self.max_to_keep:
            _delete(paths.pop(0))
            self._times.pop(0)
        self._write_state()
        if self.on_add:
            self.on_add(step)
        return path

    def _known(self) -> List[str]:
        if self._paths is None:
            self._paths, self._times = [], []
            try:
                state = tf.train.get_checkpoint_state(self.directory)
            except Exception:  # damaged: checkpointing.py set it aside when the run started
                state = None
            if state:
                times = list(state.all_model_checkpoint_timestamps)
                for i, named in enumerate(state.all_model_checkpoint_paths):
                    path = os.path.join(self.directory, os.path.basename(named))
                    if os.path.exists(path + ".index") and path not in self._paths:
                        self._paths.append(path)
                        self._times.append(times[i] if i < len(times) else time.time())
        return self._paths

    def _write_state(self) -> None:
        """CheckpointManager's state file (a CheckpointState in protobuf text format), relative names."""
        names = [os.path.basename(path) for path in self._paths]
        lines = [f"model_checkpoint_path: {_quoted(names[-1])}"] if names else []
        lines += [f"all_model_checkpoint_paths: {_quoted(name)}" for name in names]
        lines += [f"all_model_checkpoint_timestamps: {stamp!r}" for stamp in self._times]
        if self._times:
            lines.append(f"last_preserved_timestamp: {min(self._times)!r}")
        whole_files.write_whole(Path(self.directory) / STATE_FILE, "\n".join(lines) + "\n")


def _quoted(name: str) -> str:
    """A protobuf text-format string: a checkpoint's own name (ckpt-N), escaped as the format escapes."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _delete(path: str) -> None:
    """A checkpoint's files, its index first (what finds it), as CheckpointManager deletes them."""
    for name in [path + ".index", *glob.glob(glob.escape(path) + ".data-*")]:
        try:
            os.remove(name)
        except FileNotFoundError:
            pass


def remove_staging(directory: str) -> None:
    """What a save killed mid-write left in `directory`: never a checkpoint (nothing reads it)."""
    for left in Path(directory).glob(STAGING + "ckpt-*"):
        if left.is_dir() and not left.is_symlink():
            shutil.rmtree(left, ignore_errors=True)


@dataclass
class Written:
    """A save, once whole: where it went and what it took."""

    step: int
    paths: List[str]
    seconds: float  # from the snapshot to the last file in place
    bytes: int
    background: bool


@dataclass
class _Job:
    snapshot: Snapshot
    destinations: List[Kept]
    started: float
    done: threading.Event = field(default_factory=threading.Event)
    written: Optional[Written] = None
    failure: Optional[BaseException] = None


class Writer:
    """Writes snapshots of `checkpoint` (a tf.train.Checkpoint of the run's
    trackables, used for nothing else) into `Kept` directories: now, or in
    a thread of its own, one at a time."""

    def __init__(self, checkpoint: tf.train.Checkpoint, on_written: Callable[[Written], None]):
        self.checkpoint, self.on_written = checkpoint, on_written
        self._job: Optional[_Job] = None
        # Placement, as the loop's thread has it: a new thread's default device is the local host's
        # ("/job:localhost"), which a task of a cluster is not.
        self._device = tf.constant(0).device

    @property
    def in_flight(self) -> Optional[int]:
        """The step of the save being written, or None."""
        job = self._job
        return job.snapshot.step if job is not None and not job.done.is_set() else None

    def write(self, snapshot: Snapshot, destinations: List[Kept]) -> Written:
        """Written whole before it returns (after any save in flight)."""
        self.wait()
        job = _Job(snapshot, destinations, time.perf_counter() - snapshot.seconds)
        self._run(job)
        return self._finished(job)

    def start(self, snapshot: Snapshot, destinations: List[Kept]) -> None:
        """Written by a thread of its own; the caller waited for any save in flight first (`wait`)."""
        assert self.in_flight is None, "one save at a time: wait() first"
        self._job = _Job(snapshot, destinations, time.perf_counter() - snapshot.seconds)
        threading.Thread(target=self._run, args=(self._job, True), name="tfdistx-checkpoint", daemon=True).start()

    def wait(self) -> Optional[Written]:
        """Until no save is in flight; what the last one wrote. Its failure, if it failed, is raised here."""
        job, self._job = self._job, None
        if job is None:
            return None
        job.done.wait()
        return self._finished(job)

    def _finished(self, job: _Job) -> Written:
        if job.failure is not None:
            raise job.failure
        self.on_written(job.written)
        return job.written

    def _run(self, job: _Job, background: bool = False) -> None:
        staging = None
        try:
            step, first = job.snapshot.step, job.destinations[0].directory
            staging = os.path.join(first, f"{STAGING}ckpt-{step}")
            shutil.rmtree(staging, ignore_errors=True)  # a kill's leftover of the same step
            os.makedirs(staging)
            with tf.device(self._device):
                internals.write_in_place_of(
                    self.checkpoint, job.snapshot.stand_ins, os.path.join(staging, f"ckpt-{step}")
                )
            files = sorted(os.listdir(staging), key=lambda name: name.endswith(".index"))  # the index last
            size = sum(os.path.getsize(os.path.join(staging, name)) for name in files)
            paths = []
            for kept in job.destinations:
                os.makedirs(kept.directory, exist_ok=True)
                for name in files:
                    source, target = os.path.join(staging, name), os.path.join(kept.directory, name)
                    if kept is job.destinations[-1]:
                        os.replace(source, target)
                    else:
                        _link_or_copy(source, target)
                paths.append(kept.add(step))
            shutil.rmtree(staging, ignore_errors=True)
            job.written = Written(step, paths, time.perf_counter() - job.started, size, background)
        except BaseException as error:  # kept for the loop's thread, which raises it (a full disk is its line there)
            job.failure = error
            if staging:
                shutil.rmtree(staging, ignore_errors=True)
        finally:
            job.snapshot.stand_ins = []  # the values, copied as the steps went on: memory of its own, given back now
            job.done.set()


def _link_or_copy(source: str, target: str) -> None:
    """`target` holds `source`'s bytes, appearing whole: a hard link (no copy), else a copy renamed into place."""
    temporary = target + ".linking"
    try:
        os.link(source, temporary)
    except OSError:
        shutil.copyfile(source, temporary)
    os.replace(temporary, target)
