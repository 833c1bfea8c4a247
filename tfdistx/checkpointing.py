"""Checkpoints with tf.train.Checkpoint and CheckpointManager.

Model, optimizer slots, the loop's step counter and the RNG states are saved
and restored as one. Every worker of a synchronous cluster must save (saving
is collective), but only the chief writes the run's checkpoints: the others
save into a scratch directory of their own, removed when the run ends.
"""

import logging
import shutil
import tempfile
from typing import Optional

import tensorflow as tf

log = logging.getLogger(__name__)


class Checkpointer:
    def __init__(self, directory: str, *, max_to_keep: int, is_chief: bool = True, task_name: str = "main", **trackables):
        """Restores from `directory`; saves there on the chief, elsewhere on the others."""
        self.directory = directory
        self.scratch = None if is_chief else tempfile.mkdtemp(prefix=f"tfdistx-{task_name.replace(':', '')}-")
        self.checkpoint = tf.train.Checkpoint(**trackables)
        self.manager = tf.train.CheckpointManager(self.checkpoint, self.scratch or directory, max_to_keep=max_to_keep, checkpoint_name="ckpt")
        self.last_saved: Optional[int] = None

    def restore_latest(self) -> Optional[str]:
        """Restore the newest intact checkpoint; its path, or None.

        A checkpoint cut short (a kill during save, a full disk) or damaged
        later fails to restore: the next older one is tried, and the log says
        which was skipped and which was used.
        """
        state = tf.train.get_checkpoint_state(self.directory)
        candidates = list(reversed(state.all_model_checkpoint_paths)) if state else []
        for path in candidates:
            try:
                self.checkpoint.restore(path).assert_existing_objects_matched()
            except Exception as error:  # damage shows as DataLossError, IndexError, ValueError, ...
                log.warning("checkpoint %s is damaged (%s); trying an older one", path, str(error).splitlines()[0][:200])
                continue
            if path != candidates[0]:
                log.warning("restored %s, the newest intact checkpoint", path)
            return path
        if candidates:
            log.warning("no intact checkpoint in %s: starting from scratch", self.directory)
        return None

    def save(self, step: int) -> None:
        if step != self.last_saved:
            self.manager.save(checkpoint_number=step)
            self.last_saved = step

    @property
    def latest(self) -> Optional[str]:
        """The newest checkpoint this process saved."""
        return self.manager.latest_checkpoint

    def close(self) -> None:
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)


def find(directory: str, step: Optional[int] = None) -> Optional[str]:
    """The newest checkpoint in `directory`, or the one saved at `step`."""
    state = tf.train.get_checkpoint_state(directory)
    paths = list(state.all_model_checkpoint_paths) if state else []
    if step is None:
        return paths[-1] if paths else None
    return next((p for p in paths if p.endswith(f"ckpt-{step}")), None)
