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
        """Restore the newest checkpoint; its path, or None."""
        path = tf.train.latest_checkpoint(self.restore_from)
        if path:
            self.checkpoint.restore(path).assert_existing_objects_matched()
            log.info("restored %s", path)
        return path

    def due(self, step: int) -> bool:
        return bool(self.every_steps) and step % self.every_steps == 0

    def save(self, step: int) -> None:
        if step != self.last_saved:
            self.manager.save(checkpoint_number=step)
            self.last_saved = step
