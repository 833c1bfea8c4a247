"""Checkpoints with tf.train.Checkpoint and CheckpointManager.

The step is the optimizer's own iteration counter, so model, optimizer
slots, step and learning-rate schedule are saved and restored as one.
"""

import logging
from typing import Optional

import tensorflow as tf

log = logging.getLogger(__name__)


class Checkpointer:
    def __init__(self, directory: str, *, every_steps: int, max_to_keep: int, restore_from: Optional[str] = None, **trackables):
        """Saves into `directory`; restores from `restore_from` (default: the same).

        They differ on a non-chief worker, which saves into a scratch
        directory but restores what the chief saved.
        """
        self.every_steps = every_steps
        self.restore_from = restore_from or directory
        self.checkpoint = tf.train.Checkpoint(**trackables)
        self.manager = tf.train.CheckpointManager(self.checkpoint, directory, max_to_keep=max_to_keep, checkpoint_name="ckpt")
        self.last_saved: Optional[int] = None

    def restore_latest(self) -> Optional[str]:
        """Restore the newest intact checkpoint; its path, or None.

        A checkpoint cut short (a kill during save, a full disk) or damaged
        later fails to restore: the next older one is tried, and the log says
        which was skipped and which was used.
        """
        state = tf.train.get_checkpoint_state(self.restore_from)
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
            log.warning("no intact checkpoint in %s: starting from scratch", self.restore_from)
        return None

    def due(self, step: int) -> bool:
        return bool(self.every_steps) and step % self.every_steps == 0

    def save(self, step: int) -> None:
        if step != self.last_saved:
            self.manager.save(checkpoint_number=step)
            self.last_saved = step
