"""A checkpoint's state at a loop boundary, held in host memory: all that a
save makes the loop wait for (checkpoint_writer.py writes it, in the
background for the periodic saves). Orbax's design: the steps wait for the
device-to-host copy, never for the file system.

Every variable the checkpoint holds is copied into a variable of its own in
its host's memory (`HostCopies`: made at the first snapshot, written over by
one call at each one after, so that a save allocates nothing), and the
writer writes the copies while the steps change the variables:

- on a CPU (one device, mirrored replicas on CPUs, a multi-worker task):
  a copy in the same memory, a memcpy the loop waits for;
- on a GPU: a copy to the host's memory;
- under parameter servers: a copy in the memory of the ps task that holds
  the variable (its host), where its shard of the checkpoint is written
  from, as TensorFlow writes a ps's variables; the coordinator waits for
  one request a ps task.

The run holds one more copy of its checkpointed state, as TensorFlow's own
asynchronous checkpoint does. (Reading the variables without a copy, and
letting TensorFlow copy a buffer as the next update writes it, made the
steps after every save allocate the whole state afresh: 2-4x slower steps
under XLA, measured on a 884 MB checkpoint.) A save the steps wait for
anyway (the end's, a preemption's) reads the variables as they are.

Python state (the callbacks', the running record's) is serialized now. A
checkpoint that holds anything else with values of its own (a lookup
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


class HostCopies:
    """A variable of its own, in its host's memory, for each variable a
    checkpoint holds: made at the first snapshot, written over by one call
    at each one after (no allocation: the memory is the copies'; under
    parameter servers, one request a ps task)."""

    def __init__(self):
        self._pairs: List[Tuple[object, tf.Variable]] = []  # (a checkpointed variable, its copy)
        self._copy_all = None

    def take(self, variables: List[object]) -> List[tf.Variable]:
        """The copies of `variables`, holding their values now (until the next take)."""
        if [id(variable) for variable, _ in self._pairs] != [id(variable) for variable in variables]:
            self._pairs = []
            for variable in variables:
                value = _tf_variable(variable)
                with tf.device(host_of(value.device)):
                    self._pairs.append((variable, tf.Variable(value.read_value(), trainable=False, name="host_copy")))
            self._copy_all = tf.function(self._copy, autograph=False)
        else:
            self._copy_all()
        return [copy for _, copy in self._pairs]

    def _copy(self) -> None:
        for variable, copy in self._pairs:
            copy.assign(_tf_variable(variable).read_value())


def take(checkpoint: tf.train.Checkpoint, step: int, copies: Optional[HostCopies] = None) -> Snapshot:
    """The values `checkpoint` would write now (blocker() is None): copied
    into `copies` (a save in the background), or the variables read as they
    are (a save the steps wait for)."""
    started = time.perf_counter()
    found = tf.train.TrackableView(checkpoint).descendants()
    variables = [trackable for trackable in found if _kind(trackable) == "variable"]
    if copies is not None:
        written_from = copies.take(variables)  # the copies themselves: a checkpoint writes a variable's value
    else:
        written_from = [
            internals.values_in_place({internals.VARIABLE_VALUE: _tf_variable(variable).read_value()})
            for variable in variables
        ]
    stand_ins = list(zip(variables, written_from))
    stand_ins += [(state, _Serialized(state.serialize())) for state in found if _kind(state) == "state"]
    return Snapshot(step, stand_ins, time.perf_counter() - started)


def _tf_variable(variable):
    return variable.value if isinstance(variable, keras.Variable) else variable


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
