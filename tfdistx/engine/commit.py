"""The last loop boundary's state, kept in host memory, so that a lost peer
costs at most one loop of steps (Horovod Elastic's commit).

A synchronous worker whose peer is lost mid-call cannot simply save what it
holds: the failed call may have run part of a step (the optimizer's
iteration count increments before the gradients' all-reduce, which is where
the call fails; a call with several all-reduces can leave some variables
updated and others not: benchmarks/lost_peer_state.py). So before each call
of the steps, the `Commit` action copies every variable the run's
checkpoint holds (the model, the optimizer's slots and iterations, the step
counter, the random states, the objective's and callbacks' states) to host
memory; when the call fails for a lost peer, `restore` puts that copy back
and the chief saves it as an ordinary checkpoint of that step. The next
round (or the restart) resumes from it exactly as from any checkpoint.
A launched chief marks that it holds such a copy, and when it saves it
(boundary_marks.py): its supervisor, which sees the peer's end first, then
lets it save before it stops the round.

What it costs: one device-to-host copy of the checkpoint's variables per
call of `trainer.steps_per_loop` steps (docs/performance.md); nothing is
written unless a peer is lost. A chief that is itself lost saves nothing:
the run resumes from its newest checkpoint, as before.
"""

import logging
from typing import List, Optional

import keras
import numpy as np
import tensorflow as tf

from tfdistx import boundary_marks
from tfdistx.engine.loop import Action

log = logging.getLogger(__name__)


class Commit(Action):
    """A loop action: at `before_steps(step)` (nothing at a record), the state of `step` in host
    memory (first among the actions, before any other's before_steps may
    change it); `restore()` puts the last such copy back."""

    def __init__(self, checkpoint: tf.train.Checkpoint):
        # Each variable once, however many paths reach it (TrackableView walks the same graph a save does): Keras'
        # own (a keras.Variable is not a tf.Variable: it holds one, which is not reached twice) and TensorFlow's.
        self.variables = [
            v for v in tf.train.TrackableView(checkpoint).descendants() if isinstance(v, (tf.Variable, keras.Variable))
        ]
        self.values: Optional[List[np.ndarray]] = None
        self.step: Optional[int] = None
        # Reading a variable synchronized on read (a sum or mean over the replicas) is an all-reduce over every
        # worker: the chief alone, which takes the copy, would wait on the others. None of tfdistx's or Keras'
        # built-in layers' is; a model with one keeps no copy, and a lost peer costs the steps since the newest checkpoint.
        on_read = [v.name for v in self.variables if _synchronized_on_read(v)]
        if on_read:
            log.info("no in-memory copy of the last loop boundary: %s is synchronized on read", on_read[0])
            self.variables = []

    def before_steps(self, step: int) -> None:
        if self.variables:
            self.values = [v.numpy() for v in self.variables]
            if self.step is None:  # the first copy: its launcher gives it the time to save one (boundary_marks.py)
                boundary_marks.mark(boundary_marks.HOLDS)
            self.step = step

    def restore(self) -> Optional[int]:
        """The committed state put back; its step, or None when none was taken."""
        if self.values is None:
            return None
        for variable, value in zip(self.variables, self.values):
            variable.assign(value)
        return self.step


def _synchronized_on_read(variable) -> bool:
    """tf.Variable's synchronization is an enum, keras.Variable's a string."""
    synchronization = getattr(variable, "synchronization", None)
    return synchronization in (tf.VariableSynchronization.ON_READ, "on_read")
