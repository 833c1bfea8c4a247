"""Checkpoints with tf.train.Checkpoint and CheckpointManager.

Model, optimizer slots, the loop's step counter, the RNG states and the
objective's best value so far are saved and restored as one. Every worker
of a synchronous cluster must save (saving is collective), but only the
chief writes the run's checkpoints: the others save into a scratch
directory of their own, removed when the run ends. With
`checkpoint.keep_best`, the best checkpoint is also kept in `<dir>/best/`,
by a manager of its own (the latest ones' max_to_keep never rotates it away).
"""

import contextlib
import hashlib
import logging
import math
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Optional, Sequence

import tensorflow as tf

from tfdistx.spec.errors import EXIT_NOT_RETRYABLE, ConfigError, RunFault
from tfdistx.engine import resplit as resplit_lib
from tfdistx.engine import topology as topology_lib
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
        **trackables,
    ):
        """Restores from `directory`; saves there on the chief, elsewhere on the
        others. `optional`: names among `trackables` that a checkpoint written
        before tfdistx saved them lacks (restored without them: they keep their
        initial values). `topology`: recorded beside each checkpoint the chief
        saves (engine/topology.py). `resplit`: a resplit.Resplit, for a model
        whose tables a checkpoint may hold in another number of shards."""
        self.directory = directory
        self.topology, self.resplit = topology, resplit
        self.resplit_from: Optional[int] = None  # the restored checkpoint's shards, when they were re-split
        self.is_chief, self.task_name = is_chief, task_name
        self.scratch: Optional[str] = (
            None  # a non-chief's own directory, made at its first save (a process that only reads makes none)
        )
        if is_chief:
            _set_aside_bad_state_file(directory)  # CheckpointManager would fail on it, or manage ghosts
        self.trackables, self.optional = trackables, tuple(optional)
        self.checkpoint = tf.train.Checkpoint(**trackables)
        self.max_to_keep = max_to_keep
        self.start_over()
        self.only_damaged = False  # set by restore_latest: checkpoints were there, none could be read

    def start_over(self) -> None:
        """A manager that knows no earlier checkpoint (CheckpointManager
        deletes those it knows of to keep max_to_keep): for a directory
        whose damaged checkpoints were moved aside."""
        self._manager = None  # made at the first use
        self.last_saved: Optional[int] = None
        self.best_manager = (
            None  # made at the first save_best: it deletes the best/ checkpoint it finds when it saves a better one
        )

    @property
    def manager(self) -> tf.train.CheckpointManager:
        if self._manager is None:
            self._manager = tf.train.CheckpointManager(
                self.checkpoint, self._save_directory(), max_to_keep=self.max_to_keep, checkpoint_name="ckpt"
            )
        return self._manager

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
        if step != self.last_saved:
            self.manager.save(checkpoint_number=step)
            self.last_saved = step
            if self.topology and self.is_chief:  # what a resume on another topology checks against (topology.py)
                topology_lib.record(self.directory, step, self.topology)

    def save_best(self, step: int) -> str:
        """Save the checkpoint at `step` into best/ as the one best checkpoint,
        replacing the earlier best (every worker of a synchronous cluster calls
        it at the same step: non-chiefs save into their scratch directory)."""
        if self.best_manager is None:
            self.best_manager = tf.train.CheckpointManager(
                self.checkpoint, os.path.join(self._save_directory(), BEST), max_to_keep=1, checkpoint_name="ckpt"
            )
        return self.best_manager.save(checkpoint_number=step)

    @property
    def best(self) -> Optional[str]:
        """The best checkpoint in the run's best/ (saved by this run or, resumed, an earlier part of it)."""
        kept = on_disk(os.path.join(self.directory, BEST))
        return kept[-1] if kept else None

    @property
    def latest(self) -> Optional[str]:
        """The newest checkpoint this process saved."""
        return self.manager.latest_checkpoint

    def close(self) -> None:
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)


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
        return ConfigError.one("checkpoint", path, _mismatch(path, checkpoint, error))
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
        f"was saved by another model or optimizer than this run's ({what}). A run is resumed or evaluated only with the "
        "model and optimizer it was trained with (its .hydra/overrides.yaml): drop the overrides that change them, or use "
        "another hydra.run.dir for this config"
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
    restarts. The partial checkpoint it left (CheckpointManager's
    `ckpt-N_temp/`, temp files) is removed; the checkpoints before it stay,
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
            for partial in [*place.glob("*_temp"), *place.glob("*.tempstate*"), *place.glob("checkpoint.tmp*")]:
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
