"""Checkpoints with tf.train.Checkpoint.

Model, optimizer slots, the loop's step counter, the RNG states, the
objective's best value so far and the running record are saved and
restored as one. Every worker of a synchronous cluster saves at the same
step (reading a variable synchronized on read is collective), but only the
chief writes the run's checkpoints: the others save into a scratch
directory of their own, removed when the run ends. With
`checkpoint.keep_best`, the best checkpoint is also kept in `<dir>/best/`,
which the latest ones' max_to_keep never rotates away.

A save takes a snapshot of the state (snapshot.py) and writes it whole
(checkpoint_writer.py): the periodic saves in the background, so that the
steps wait only for the snapshot; the final save, the preemption's and a
failure's now, after any save in flight.
"""

import contextlib
import hashlib
import json
import logging
import math
import os
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np

import tensorflow as tf

from tfdistx.core import checkpoint_size
from tfdistx.core.errors import EXIT_NOT_RETRYABLE, ConfigError, RunFault
from tfdistx.engine import resplit as resplit_lib
from tfdistx.engine import snapshot as snapshot_lib
from tfdistx.engine import topology as topology_lib
from tfdistx.engine.checkpoint_writer import STAGING, Kept, Writer, Written, remove_staging
from tfdistx.engine.loop import RunningRecord
from tfdistx.internals import tensorflow as internals
from tfdistx.checkpoint_files import BEST, SCRATCH_ENV, find, on_disk  # noqa: F401 (find: the engine asks it here)
from tfdistx.rundir import cannot_write, keep_aside

log = logging.getLogger(__name__)


class Checkpointer:
    def __init__(
        self,
        directory: str,
        *,
        max_to_keep: int,
        is_chief: bool = True,
        task_name: str = "main",
        optional: Sequence[str] = (),
        topology: Optional[dict] = None,
        resplit=None,
        grace: Optional[float] = None,
        background: bool = True,
        **trackables,
    ):
        """Restores from `directory`; saves there on the chief, elsewhere on the
        others. `optional`: names among `trackables` that a checkpoint written
        before tfdistx saved them lacks (restored without them: they keep their
        initial values). `topology`: recorded beside each checkpoint the chief
        saves (engine/topology.py). `resplit`: a resplit.Resplit, for a model
        whose tables a checkpoint may hold in another number of shards.
        `grace`: the seconds a preemption gives the run to save
        (cluster.preemption_grace): a save that takes longer is said once.
        `background`: the periodic saves are written while the steps go on
        (checkpoint.background), where the state can be snapshot."""
        self.directory = directory
        self.topology, self.resplit, self.grace = topology, resplit, grace
        self.resplit_from: Optional[int] = None  # the restored checkpoint's shards, when they were re-split
        self.is_chief, self.task_name = is_chief, task_name
        self.scratch: Optional[str] = (
            None  # a non-chief's own directory, made at its first save (a process that only reads makes none)
        )
        if is_chief:
            _set_aside_bad_state_file(directory)  # it would name ghosts, or hide what is on disk
            for place in (directory, os.path.join(directory, BEST)):
                remove_staging(place)  # a save a kill cut short: never a checkpoint
        self.trackables, self.optional = trackables, tuple(optional)
        self.checkpoint = tf.train.Checkpoint(**trackables)
        # What writes: the same objects, a checkpoint of its own, whose saver writes a snapshot's values in their
        # place (snapshot.py). Its save counter is in every checkpoint, as CheckpointManager's saves have it.
        self._writing = tf.train.Checkpoint(**trackables)
        self._writing.save_counter  # noqa: B018 (made now: a checkpoint's restore expects it)
        self.writer = Writer(self._writing, self._written)
        self.background = background
        self._copies = snapshot_lib.HostCopies()  # what a save in the background is written from
        self._snapshots: Optional[bool] = None  # whether the state can be snapshot: decided at the first save
        self.stats = SaveStats()
        self.max_to_keep = max_to_keep
        self._warned_slow = self._warned_waiting = False
        self.start_over()
        self.only_damaged = False  # set by restore_latest: checkpoints were there, none could be read

    def start_over(self) -> None:
        """Knowing no earlier checkpoint (the oldest beyond max_to_keep are
        deleted among those known): for a directory whose damaged
        checkpoints were moved aside."""
        self._kept: Optional[Kept] = None  # made at the first use, from the state file then
        self._best_kept: Optional[Kept] = None
        self.last_saved: Optional[int] = None  # the newest save asked for: written, or being written
        self._best_due: Optional[int] = None  # keep_best: the step whose state is the best, saved with the next save

    @property
    def kept(self) -> Kept:
        if self._kept is None:
            record = self.topology and self.is_chief
            self._kept = Kept(
                self._save_directory(),
                self.max_to_keep,
                # what a resume on another topology checks against (topology.py), once the checkpoint is whole
                on_add=(lambda step: topology_lib.record(self.directory, step, self.topology)) if record else None,
            )
        return self._kept

    def _save_directory(self) -> str:
        """Where this process saves: the run's directory (the chief), else its scratch directory."""
        if self.is_chief:
            return self.directory
        if self.scratch is None:
            self.scratch = _scratch_dir(self.directory, self.task_name)
        return self.scratch

    def restore_latest(self) -> Optional[str]:
        """Restore the newest intact checkpoint; its path, or None.

        A checkpoint cut short (a kill during save, a full disk) or damaged
        later fails to restore: the next older one is tried, and the log says
        which was skipped and which was used. A checkpoint that reads whole
        but does not fit this run (another model or optimizer) is not
        damaged: the run is refused (ConfigError), so that it cannot train
        from scratch and overwrite the run that is there.
        """
        started = time.perf_counter()
        candidates = list(reversed(on_disk(self.directory)))
        for path in candidates:
            try:
                self.restore(path)
            except Damaged as damage:
                log.warning("checkpoint %s is damaged (%s); trying an older one", path, damage)
                continue
            if path != candidates[0]:
                log.warning("restored %s, the newest intact checkpoint", path)
            if (
                "step" in self.trackables
            ):  # what the run resumes from is saved: a save at this step (a preemption) adds nothing
                self.last_saved = int(self.trackables["step"].numpy())
            self.stats.restore_seconds = time.perf_counter() - started
            return path
        self.only_damaged = bool(candidates)
        return None

    def restore(self, path: str) -> None:
        """Restore `path` whole. A checkpoint of another model or optimizer
        is a ConfigError (never half-restored: a model left partly at its
        initial values would train or evaluate as if nothing were wrong);
        one that cannot be read is Damaged. One whose tables are in another
        number of shards (another number of ps) is re-split (resplit.py)."""
        checkpoint = self.checkpoint
        lacking = self._optional_lacking_in(path)
        if lacking:  # written before tfdistx saved these: restored whole without them
            checkpoint = tf.train.Checkpoint(**{k: v for k, v in self.trackables.items() if k not in lacking})
        try:
            status = checkpoint.restore(path)
            status.assert_existing_objects_matched()
            status.assert_consumed()  # adam's slots left over in an sgd run, say
        except Exception as error:  # damage shows as DataLossError, IndexError, ValueError, ...
            readable = _readable(path)
            saved_shards = self.resplit.saved_shards(path) if readable and self.resplit else None
            if saved_shards:  # its tables are in another number of shards (another number of ps): re-split them
                return self._restore_resplit(path, saved_shards, lacking)
            raise _refusal(path, checkpoint, error, readable) from None

    def _restore_resplit(self, path: str, saved_shards: int, lacking: list) -> None:
        """Restore `path` with its tables re-split into this model's shards
        (resplit.py); the rest of it (step, objective, random states) as it is."""
        shards = resplit_lib.tables(self.trackables["model"])[0].shards
        parts = {k: v for k, v in self.trackables.items() if k in ("model", "optimizer")}
        rest = {k: v for k, v in self.trackables.items() if k not in parts and k not in lacking}
        with tempfile.TemporaryDirectory(prefix="tfdistx-resplit-") as scratch:
            try:
                converted = self.resplit.convert(path, saved_shards, scratch)
                status = tf.train.Checkpoint(**parts).read(converted)
                status.assert_existing_objects_matched()
                status.assert_consumed()
                status = tf.train.Checkpoint(**rest).read(path)
                status.assert_existing_objects_matched()
                status.expect_partial()  # the model and optimizer, restored above
            except Exception as error:
                raise _refusal(path, self.checkpoint, error, _readable(path)) from None
        log.info(
            "%s: its embedding tables were saved in %d shard(s) and are re-split into %d (model.shards)",
            os.path.basename(path),
            saved_shards,
            shards,
        )
        self.resplit_from = saved_shards

    def _optional_lacking_in(self, path: str) -> list:
        if not self.optional:
            return []
        try:
            saved = tf.train.load_checkpoint(path).get_variable_to_shape_map()
        except Exception:  # unreadable: the restore says so (Damaged)
            return []
        return [name for name in self.optional if not any(key.startswith(f"{name}/") for key in saved)]

    def save(self, step: int) -> None:
        """The state at `step` written whole before it returns (after any
        save in flight): the final save, a preemption's, a failure's."""
        started = time.perf_counter()
        self.wait()
        destinations = self._due(step)
        if destinations:
            self.writer.write(snapshot_lib.take(self._writing, step), destinations)  # the variables, as they are
        self.stats.synchronous_seconds = time.perf_counter() - started

    def save_in_background(self, step: int, latest: bool = True) -> None:
        """A periodic save (`latest`), and the best checkpoint if one is due
        at this step: the loop waits for the snapshot (and for a save still in
        flight: one at a time), the files are written by the writer's thread."""
        if not ((latest and step != self.last_saved) or self._best_due == step):
            return  # nothing to save here: a save in flight goes on
        started = time.perf_counter()
        previous = self.writer.in_flight
        self.wait()
        waited = time.perf_counter() - started
        destinations = self._due(step, latest)
        if self.background and self._can_snapshot():
            self.writer.start(snapshot_lib.take(self._writing, step, self._copies), destinations)
        else:
            self.writer.write(snapshot_lib.take(self._writing, step), destinations)
        self.stats.stalls.append(time.perf_counter() - started)
        if previous is not None and waited >= WAITING_WORTH_SAYING and not self._warned_waiting and self.is_chief:
            self._warned_waiting = True
            log.warning(
                "step %d: the steps waited %.1fs for the checkpoint of step %d to be written: saves come faster than "
                "they are written (one at a time); a larger checkpoint.every_steps lets the steps go on",
                step,
                waited,
                previous,
            )

    def wait(self) -> Optional[Written]:
        """Until no save is in flight (what it wrote); a failed background write raises here."""
        return self.writer.wait()

    def _due(self, step: int, latest: bool = True) -> List[Kept]:
        """Where the save of `step` goes: the latest checkpoints (unless saved
        at this step already), and best/ when this step's state is the best."""
        destinations = []
        if latest and step != self.last_saved:
            destinations.append(self.kept)
            self.last_saved = step
        if self._best_due == step:
            destinations.append(self._best())
        self._best_due = None
        return destinations

    def _can_snapshot(self) -> bool:
        if self._snapshots is None:
            blocker = snapshot_lib.blocker(self._writing)
            self._snapshots = blocker is None
            if blocker and self.is_chief and self.background:
                log.info(
                    "checkpoints are written while the steps wait: the checkpoint holds a %s, whose values a "
                    "snapshot cannot hold",
                    blocker,
                )
        return self._snapshots

    def _written(self, written: Written) -> None:
        """A save is whole (on the loop's thread): counted, its size said at the first periodic one, and a save
        longer than the grace said once."""
        self.stats.add(written)
        if written.background and self.stats.background == 1 and self.is_chief:
            log.info(
                "checkpoints of %s: ckpt-%d written in %.1fs while the steps went on",
                _size(written.bytes),
                written.step,
                written.seconds,
            )
        if self.grace and written.seconds > self.grace and self.is_chief and not self._warned_slow:
            self._warned_slow = True
            log.warning(
                "the checkpoint of step %d took %.0fs to write (%s), longer than the %gs a preemption gives the run "
                "to save (cluster.preemption_grace; under Slurm, export slurm --notice): a preempted run would lose "
                "its steps since the checkpoint before. Set cluster.preemption_grace (and --notice) to at least %d "
                "(docs/preemption.md: the grace period)",
                written.step,
                written.seconds,
                _size(written.bytes),
                self.grace,
                checkpoint_size.grace_for(written.seconds),
            )

    def save_best(self, step: int) -> None:
        """The state at `step` is the best: it goes into best/ (one
        checkpoint, replacing the earlier best) with the save the loop
        makes at this step (SaveCheckpoints: every worker of a synchronous
        cluster at once; non-chiefs into their scratch directory), so that
        a step that is both saved and the best is snapshot and written once."""
        self._best_due = step

    def _best(self) -> Kept:
        if self._best_kept is None:
            self._best_kept = Kept(os.path.join(self._save_directory(), BEST), 1)
        return self._best_kept

    @property
    def best(self) -> Optional[str]:
        """The best checkpoint in the run's best/ (saved by this run or, resumed, an earlier part of it)."""
        kept = on_disk(os.path.join(self.directory, BEST))
        return kept[-1] if kept else None

    @property
    def latest(self) -> Optional[str]:
        """The newest checkpoint this process saved (or, before any, the newest its directory's state file names)."""
        self.wait()
        return self.kept.latest

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, kind, error, trace) -> None:
        """A save in flight is waited for (its checkpoint kept), except
        after Ctrl-C, which leaves at once: the one being written is then
        not a checkpoint, and the one before stays the newest."""
        try:
            if kind is None:
                self.wait()
            elif not issubclass(kind, KeyboardInterrupt):
                try:
                    self.wait()
                except Exception as failure:  # the run's own error is the one said
                    log.info("the checkpoint being written when the run stopped was not: %s", failure)
        finally:
            self.close()

    def close(self) -> None:
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)


# A wait for the save before that is said (once) from this long: shorter ones are the write's own jitter.
WAITING_WORTH_SAYING = 1.0


@dataclass
class SaveStats:
    """What this process's saves took (summary.json's `checkpoint`)."""

    saves: int = 0  # checkpoints written whole
    background: int = 0  # of them, written while the steps went on
    seconds: List[float] = field(default_factory=list)  # each save, from its snapshot to its last file in place
    stalls: List[float] = field(default_factory=list)  # the steps' wait at each periodic save
    synchronous_seconds: Optional[float] = None  # the last save the loop waited for whole (the final save)
    restore_seconds: Optional[float] = None
    bytes: int = 0  # the last checkpoint's files

    def add(self, written: Written) -> None:
        self.saves += 1
        self.background += int(written.background)
        self.seconds.append(written.seconds)
        self.bytes = written.bytes

    def summary(self) -> dict:
        return {
            "bytes": self.bytes,
            "saves": self.saves,
            "background_saves": self.background,
            "save_sec": self.seconds[-1] if self.seconds else None,
            "save_sec_max": max(self.seconds) if self.seconds else None,
            "save_sec_min": min(self.seconds) if self.seconds else None,  # a save the least hindered: the write rate
            "stall_sec": sum(self.stalls),
            "stall_sec_per_save": sum(self.stalls) / len(self.stalls) if self.stalls else None,
            "final_save_sec": self.synchronous_seconds,
            "restore_sec": self.restore_seconds,
        }


def _size(count: int) -> str:
    return f"{count / 1e9:.2f} GB" if count >= 1e9 else f"{count / 1e6:.0f} MB"


class RunningRecordState(tf.train.experimental.PythonState):
    """The loop's running record (loop.RunningRecord: the training metrics'
    sums since the last log and since the last record), saved with every
    checkpoint as one JSON string, so that a record that spans a resume
    holds the steps before it too: what an uninterrupted run reports. The
    sums are float64, written as JSON writes a float (exactly)."""

    def __init__(self):
        self.record = RunningRecord()

    def serialize(self) -> str:
        record = self.record

        def plain(sums):
            return None if sums is None else [float(value) for value in sums]

        return json.dumps(
            {"window": plain(record.window), "window_time": record.window_time, "epoch": plain(record.epoch)}
        )

    def deserialize(self, string) -> None:
        saved = json.loads(string.numpy() if hasattr(string, "numpy") else string)

        def sums(values):
            return None if values is None else np.asarray(values, np.float64)

        self.record.window, self.record.window_time = sums(saved["window"]), float(saved["window_time"])
        self.record.epoch = sums(saved["epoch"])


class ObjectiveState(tf.Module):
    """What TrackObjective (loop.py) knows of trainer.objective, saved with
    every checkpoint, so that a resumed run neither takes its first
    evaluation for the best (and overwrites a better best/ checkpoint) nor
    forgets how long it has waited for an improvement (a rerun of an
    early-stopped run sees its patience spent). NaN and -1: nothing yet."""

    def __init__(self):
        super().__init__(name="objective")
        self.best = tf.Variable(float("nan"), dtype=tf.float64, trainable=False, name="best")
        self.best_step = tf.Variable(-1, dtype=tf.int64, trainable=False, name="best_step")
        self.reference = tf.Variable(
            float("nan"), dtype=tf.float64, trainable=False, name="reference"
        )  # early stopping's best
        self.waited = tf.Variable(0, dtype=tf.int64, trainable=False, name="waited")  # evaluations since it improved

    def read(self) -> dict:
        best, reference, best_step = (
            float(self.best.numpy()),
            float(self.reference.numpy()),
            int(self.best_step.numpy()),
        )
        return {
            "best": None if math.isnan(best) else best,
            "best_step": None if best_step < 0 else best_step,
            "reference": None if math.isnan(reference) else reference,
            "waited": int(self.waited.numpy()),
        }

    def write(self, state: dict) -> None:
        nan = float("nan")
        self.best.assign(nan if state["best"] is None else state["best"])
        self.best_step.assign(-1 if state["best_step"] is None else state["best_step"])
        self.reference.assign(nan if state["reference"] is None else state["reference"])
        self.waited.assign(state["waited"])


class Damaged(Exception):
    """A checkpoint whose values cannot all be read."""


def _refusal(path: str, checkpoint: tf.train.Checkpoint, error: Exception, readable: bool) -> Exception:
    """Why `path` was not restored: another model or optimizer's (a
    ConfigError) when it reads whole, else Damaged."""
    if readable:
        return ConfigError.for_key("checkpoint", path, _mismatch(path, checkpoint, error))
    return Damaged(str(error).splitlines()[0][:200] if str(error) else type(error).__name__)


def _readable(path: str) -> bool:
    """Whether every value of the checkpoint reads back."""
    try:
        reader = tf.train.load_checkpoint(path)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
        return True
    except Exception:
        return False


def _mismatch(path: str, checkpoint: tf.train.Checkpoint, error: Exception) -> str:
    """What differs between a readable checkpoint and this run, and what to do."""
    saved = tf.train.load_checkpoint(path).get_variable_to_shape_map()
    trainable = sorted(
        (int(k.split("/")[2]), tuple(v)) for k, v in saved.items() if k.startswith("optimizer/_trainable_variables/")
    )
    here = [tuple(v.shape) for v in checkpoint.model.trainable_variables] if hasattr(checkpoint, "model") else []
    there = [shape for _, shape in trainable]
    if not trainable and hasattr(
        checkpoint, "model"
    ):  # a subclassed model's weights are reached through its attributes, by name
        there = sorted(tuple(v) for k, v in saved.items() if k.startswith("model/"))
        here = sorted(tuple(v.shape) for v in checkpoint.model.variables if not internals.is_seed_generator_state(v))
    if there != here:
        differ = [f"#{i}: {a} there, {b} here" for i, (a, b) in enumerate(zip(there, here)) if a != b][:3]
        what = f"the model's weights differ: {len(there)} trainable variables there, {len(here)} here" + (
            f"; {'; '.join(differ)}" if differ else ""
        )
    else:
        slots = sum(1 for k in saved if k.startswith("optimizer/_variables/"))
        mine = len(checkpoint.optimizer.variables) - 1 if hasattr(checkpoint, "optimizer") else 0  # less `iterations`
        what = (
            f"the optimizer differs: {slots} optimizer values there, {mine} here (another optimizer, e.g. adam and sgd)"
            if slots != mine
            else str(error).strip().splitlines()[0][:200]
        )
    return (
        f"was saved by another model or optimizer than this run's ({what}). A run is resumed or evaluated only "
        "with the model and optimizer it was trained with (its .hydra/overrides.yaml): drop the overrides that "
        "change them, or use another hydra.run.dir for this config"
    )


def _scratch_dir(directory: str, task_name: str) -> str:
    """A non-chief task's own checkpoint directory, on local disk.

    Made by mkdtemp (mode 0700, a random name, never an existing path), so
    that nothing another local user plants at a guessable name (a symlink)
    can take it over. Named after the run's checkpoints and the task, so
    that one a SIGKILL left behind is found and removed when the task
    starts again: only real directories of ours, never a link.

    Inside the place its launcher gave it (SCRATCH_ENV: the local
    launcher's, which removes it when the task ends, even by SIGKILL), else
    in the system's temp directory."""
    key = hashlib.sha1(os.path.abspath(directory).encode()).hexdigest()[:12]
    prefix = f"tfdistx-{key}-{task_name.replace(':', '')}-"
    root = os.environ.get(SCRATCH_ENV) or tempfile.gettempdir()
    os.makedirs(root, mode=0o700, exist_ok=True)
    for left in Path(root).glob(prefix + "*"):
        info = left.lstat()
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
            shutil.rmtree(left, ignore_errors=True)
    return tempfile.mkdtemp(prefix=prefix, dir=root)


@contextlib.contextmanager
def stops_cleanly_when_unwritable(checkpoint_dir: str, evaluating: bool = False):
    """A full, over-quota or read-only disk ends the run with one line (exit
    3: a restart would fail the same way) instead of a traceback and
    restarts. The partial checkpoint it left (its staging directory
    `.writing-ckpt-N/`, TensorFlow's `ckpt-N_temp/`, temp files) is removed; the checkpoints before it stay,
    and the line names the newest, from which a rerun resumes.
    `evaluating`: `tfdistx evaluate`, which writes no checkpoint, and leaves
    evaluations.jsonl as it was (whole_files.append_jsonl)."""
    try:
        yield
    except Exception as error:
        cause = cannot_write(error)
        if cause is None:
            raise
        if evaluating:
            raise RunFault(
                f"cannot write the run ({cause}): the evaluation stopped; evaluations.jsonl is as it was. "
                "Free some space and run the command again.",
                EXIT_NOT_RETRYABLE,
            ) from None
        directory = Path(checkpoint_dir)
        for place in (directory, directory / BEST):
            for partial in [
                *place.glob("*_temp"),
                *place.glob("*.tempstate*"),
                *place.glob("checkpoint.tmp*"),
                *place.glob(STAGING + "ckpt-*"),
                *place.glob("*.linking"),
            ]:
                shutil.rmtree(partial, ignore_errors=True) if partial.is_dir() else partial.unlink(missing_ok=True)
        kept = on_disk(checkpoint_dir)
        kept = (
            f"the newest checkpoint is {os.path.basename(kept[-1])} in {directory}"
            if kept
            else "no checkpoint was written"
        )
        raise RunFault(
            f"cannot write the run ({cause}): training stopped; {kept}. "
            "Free some space and rerun the same command to resume.",
            EXIT_NOT_RETRYABLE,
        ) from None


def _set_aside_bad_state_file(directory: str) -> None:
    state_file = Path(directory) / "checkpoint"
    if not state_file.exists():
        return
    try:
        state = tf.train.get_checkpoint_state(directory)
        paths = list(state.all_model_checkpoint_paths) if state else []
        bad = [p for p in paths if not tf.io.gfile.exists(p + ".index")]
        reason = f"it names missing checkpoints ({', '.join(os.path.basename(p) for p in bad[:3])})" if bad else None
    except Exception as error:  # random bytes: a parse or decode error
        reason = f"it cannot be read ({type(error).__name__})"
    if reason:
        kept = keep_aside(state_file)
        log.warning("%s: %s; kept as %s, the checkpoints on disk are used", state_file, reason, os.path.basename(kept))
