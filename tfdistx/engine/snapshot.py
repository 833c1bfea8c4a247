"""A checkpoint's state at a loop boundary, held in host memory: all that a
save makes the loop wait for (checkpoint_writer.py writes it, in the
background for the periodic saves). Orbax's design: the steps wait for the
device-to-host copy, never for the file system.

Every variable the checkpoint holds is read where it lives, and its value
kept on that host's CPU:

- on a CPU (one device, mirrored replicas on CPUs, a multi-worker task):
  the value shares the variable's buffer, and TensorFlow copies that buffer
  before the next update writes into it (a tensor is a value: a variable
  whose buffer another tensor still holds is copied, not changed in place).
  Taking the snapshot costs the loop next to nothing at the boundary; the
  copy is paid by the first update of each variable after it (not at all
  under XLA, whose step writes new buffers anyway), and the memory of one
  more copy of the state is held until the write is done.
- on a GPU: a copy to the host's memory.
- under parameter servers: the value stays in the memory of the ps task
  that holds the variable (its host), where its shard of the checkpoint is
  written from, as TensorFlow writes a ps's variables.

Python state (the callbacks', the running record's) is serialized now.
A checkpoint that holds anything else with values of its own (a lookup
table, a variable strategy.partitioner split) cannot be snapshot: `blocker`
names it, and such a run writes its checkpoints synchronously.
"""

import time
from dataclasses import dataclass
from typing import List, Optional, Tuple

import keras
import tensorflow as tf

from tfdistx.internals import tensorflow as internals


@dataclass
class Snapshot:
    """What a checkpoint writes, as it was at `step`: (trackable, stand-in) pairs."""

    step: int
    stand_ins: List[Tuple[object, object]]
    seconds: float  # what taking it cost the loop


def blocker(checkpoint: tf.train.Checkpoint) -> Optional[str]:
    """What in `checkpoint` has values a snapshot cannot hold (its type's
    name), or None when every such object is a variable or a Python state."""
    for trackable in tf.train.TrackableView(checkpoint).descendants():
        if internals.saves_values(trackable) and _kind(trackable) is None:
            return f"{type(trackable).__module__}.{type(trackable).__qualname__}"
    return None


def take(checkpoint: tf.train.Checkpoint, step: int) -> Snapshot:
    """The values `checkpoint` would write now (blocker() is None)."""
    started = time.perf_counter()
    stand_ins = []
    for trackable in tf.train.TrackableView(checkpoint).descendants():
        kind = _kind(trackable)
        if kind == "state":
            stand_ins.append((trackable, _Serialized(trackable.serialize())))
        elif kind == "variable":
            stand_ins.append((trackable, internals.values_in_place({internals.VARIABLE_VALUE: host_value(trackable)})))
    return Snapshot(step, stand_ins, time.perf_counter() - started)


def host_value(variable) -> tf.Tensor:
    """`variable`'s value now, in its host's memory (see the module's doc):
    it does not change when the variable does."""
    tf_variable = variable.value if isinstance(variable, keras.Variable) else variable
    with tf.device(host_of(tf_variable.device)):
        return tf.identity(tf_variable.read_value())


def host_of(device: str) -> str:
    """The CPU of the task that holds `device` ('' for a variable placed by default)."""
    if not device:
        return ""
    return tf.DeviceSpec.from_string(device).replace(device_type="CPU", device_index=0).to_string()


def _kind(trackable) -> Optional[str]:
    if isinstance(trackable, tf.train.experimental.PythonState):
        return "state"
    if isinstance(trackable, (tf.Variable, keras.Variable)) and not internals.is_sharded_variable(
        getattr(trackable, "value", None)
    ):
        return "variable"
    return None


class _Serialized(tf.train.experimental.PythonState):
    """A Python state as it serialized when the snapshot was taken: the
    checkpoint writes it as its own (under the same name)."""

    def __init__(self, serialized: str):
        self.serialized = serialized

    def serialize(self) -> str:
        return self.serialized

    def deserialize(self, string) -> None:  # never restored into: a stand-in only writes
        raise NotImplementedError
