"""TensorFlow's and Keras' private APIs, each behind a named function (see
tfdistx/internals/__init__.py). Imports TensorFlow; never Hydra.

Every internal here was checked on TensorFlow 2.21.0 and Keras 3.15.1
(pyproject.toml's pins) unless its comment says otherwise. Nothing private
is touched when this module loads: `probe()` looks, the functions use.
"""

import functools
from typing import Iterable, List, Mapping

import keras
import numpy as np
import tensorflow as tf

from tfdistx import internals
from tfdistx.internals import Internal

# What tfdistx uses several of the internals below for (the end of "... which tfdistx uses ...").
_CHECKPOINTS_SPLIT_OPTIMIZER = "to checkpoint an optimizer of split variables as an unsplit run's"
_RESPLITS_TABLES = "to re-split embedding tables for another number of ps tasks"
_SETS_PEER_TIMEOUT = "to set the coordination service's heartbeat timeout (cluster.peer_timeout)"
_KEEPS_DETERMINISM_TO_ITS_RUN = "to keep trainer.deterministic to one run of a sweep"

# --- Variables that strategy.partitioner split (engine/sharding.py) -----------

# What ParameterServerStrategy makes of a variable its `variable_partitioner`
# splits. TensorFlow exports the class only in tf.__internal__ (its API for
# Keras); tfdistx must tell such variables apart and build one from shards.
_SHARDED_VARIABLE = Internal(
    "tensorflow",
    "tensorflow.__internal__.distribute",
    "ShardedVariable",
    "to train and checkpoint the variables strategy.partitioner splits",
)
# How a ShardedVariable saves itself: one tensor, each shard a slice of it.
# TensorFlow's saver asks a trackable for it before `_serialize_to_tensors`
# (what a Keras variable defines), when its class defines it nearer in the MRO.
_GATHER_SAVEABLES = Internal(
    "tensorflow",
    "tensorflow.__internal__.distribute.ShardedVariable",
    "_gather_saveables_for_checkpoint",
    "to save a split variable as one tensor, restorable onto any number of ps tasks",
)


def is_sharded_variable(value) -> bool:
    """A TensorFlow variable that the partitioner split into shards."""
    return isinstance(value, _SHARDED_VARIABLE.get())


def sharded_variable(shards: list):
    """One ShardedVariable of these variables (its shards, in order)."""
    return _SHARDED_VARIABLE.get()(shards)


def save_as_slices(variable) -> None:
    """Make the Keras variable `variable`, whose value is a ShardedVariable,
    save as TensorFlow saves a ShardedVariable: one tensor of its full shape,
    each shard a slice of it. Keras would hand TensorFlow the ShardedVariable
    as one tensor, which fails ("no attribute 'device'"). There is no public
    way to change how a variable saves, so the object becomes an instance of
    a subclass of its own class that defines TensorFlow's hook: the same
    object, nothing else changed."""
    _GATHER_SAVEABLES.get()
    variable.__class__ = _saved_as_slices(type(variable))


@functools.lru_cache(maxsize=None)
def _saved_as_slices(cls):
    if "_gather_saveables_for_checkpoint" in cls.__dict__:
        return cls

    def _gather_saveables_for_checkpoint(self):
        return self.value._gather_saveables_for_checkpoint()

    return type(
        cls.__name__,
        (cls,),
        {"_gather_saveables_for_checkpoint": _gather_saveables_for_checkpoint, "__module__": __name__},
    )


# --- Checkpoints: what an object saves, and under which names ------------------

# The one method a trackable object has that lists what a checkpoint saves of
# it (TensorFlow's Trackable); no public method lists an object's checkpoint
# dependencies, nor lets an object choose them.
_TRACKABLE_CHILDREN = Internal("tensorflow", "tensorflow.Module", "_trackable_children", _CHECKPOINTS_SPLIT_OPTIMIZER)
_OPTIMIZER_CHILDREN = Internal(
    "keras", "keras.optimizers.Optimizer", "_trackable_children", _CHECKPOINTS_SPLIT_OPTIMIZER
)
# What TensorFlow's tracking makes of a plain list or dict set on a trackable
# (ListWrapper, _DictWrapper ...), and the function that makes one: tf.__internal__ only.
_DATA_STRUCTURE = Internal(
    "tensorflow", "tensorflow.__internal__.tracking", "TrackableDataStructure", _CHECKPOINTS_SPLIT_OPTIMIZER
)
_WRAP = Internal("tensorflow", "tensorflow.__internal__.tracking", "wrap", _CHECKPOINTS_SPLIT_OPTIMIZER)


class FixedChildren(tf.Module):
    """A trackable whose checkpoint holds exactly `children` (name ->
    trackable), under those names: a split run's optimizer saved in the
    layout of an unsplit run's (engine/sharding.OptimizerState). Made once:
    a checkpoint knows its objects by identity."""

    def __init__(self, children: Mapping):
        super().__init__()
        self._fixed_children = dict(children)

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        return dict(self._fixed_children)


def checkpoint_children(trackable) -> dict:
    """What a checkpoint saves of `trackable` (an optimizer), by name,
    leaving out its tracked lists and dicts (Adam's momentums ...)."""
    data_structure = _DATA_STRUCTURE.get()
    children = _OPTIMIZER_CHILDREN.of(trackable)("checkpoint")
    return {name: child for name, child in children.items() if not isinstance(child, data_structure)}


def tracked(value):
    """A list or dict as TensorFlow's tracking holds one: a checkpoint saves its items by position or key."""
    return _WRAP.get()(value)


# The names a Keras optimizer's checkpoint gives its lists of variables: the
# model's variables it updates, and its own (iterations, slots ...), each by
# position. They are the optimizer's private attributes, which Keras
# checkpoints under their own names.
OPTIMIZER_TRAINABLE_VARIABLES = "_trainable_variables"
OPTIMIZER_VARIABLES = "_variables"
_TRAINABLE_VARIABLES = Internal(
    "keras", "keras.optimizers.Optimizer", OPTIMIZER_TRAINABLE_VARIABLES, _RESPLITS_TABLES, instance=True
)
_OWN_VARIABLES = Internal("keras", "keras.optimizers.Optimizer", OPTIMIZER_VARIABLES, _RESPLITS_TABLES, instance=True)


def saved_trainable_variable_key(index: int, optimizer: str = "optimizer") -> str:
    """The key under which tf.train.Checkpoint(optimizer=...) saves the
    `index`th model variable of a Keras optimizer: TensorFlow's object-graph
    key (children by name, then `.ATTRIBUTES/VARIABLE_VALUE`), which no
    public function composes."""
    return f"{optimizer}/{OPTIMIZER_TRAINABLE_VARIABLES}/{index}/.ATTRIBUTES/VARIABLE_VALUE"


# --- A checkpoint written from a loop boundary's values (engine/snapshot.py) --------

# tf.train.Checkpoint writes, for each trackable of its object graph, what the
# trackable's `_serialize_to_tensors` gives when the write runs, and its saver
# writes another object's in a trackable's place when its object map holds one:
# the mechanism of TensorFlow's own asynchronous checkpoint
# (CheckpointOptions(enable_async=True)), which cannot be used as it is: with
# Keras 3.15 variables, its first save writes no `model/` entry and its second
# raises (Keras' `_copy_trackable_to_cpu` makes a tf.Variable inside a
# tf.function: "tf.function only supports singleton tf.Variables"). No public
# API writes a checkpoint of values taken earlier under an object graph's names.
_WRITES_A_SNAPSHOT = "to write a checkpoint in the background from the values of a loop boundary"
_SERIALIZE_TO_TENSORS = Internal(
    "tensorflow", "tensorflow.__internal__.tracking.Trackable", "_serialize_to_tensors", _WRITES_A_SNAPSHOT
)
_LEGACY_SAVEABLES = Internal(
    "tensorflow", "tensorflow.__internal__.tracking.Trackable", "_gather_saveables_for_checkpoint", _WRITES_A_SNAPSHOT
)
_CHECKPOINT_SAVER = Internal("tensorflow", "tensorflow.train.Checkpoint", "_saver", _WRITES_A_SNAPSHOT, instance=True)
_SAVER_OBJECT_MAP = Internal(
    "tensorflow", "tensorflow.train.Checkpoint._saver", "_object_map", _WRITES_A_SNAPSHOT, instance=True
)
# The name a checkpoint gives a variable's value (`<path>/.ATTRIBUTES/VARIABLE_VALUE`): TensorFlow's
# trackable.VARIABLE_VALUE_KEY, what every variable (Keras', mirrored, on a ps) serializes its value under.
VARIABLE_VALUE = "VARIABLE_VALUE"


def saves_values(trackable) -> bool:
    """Whether a checkpoint holds values of `trackable` itself (a variable,
    a Python state, a table), not only of its children (a layer, a model)."""
    base = tf.__internal__.tracking.Trackable
    cls = type(trackable)
    return any(
        getattr(cls, hook.attribute, None) is not getattr(base, hook.attribute)
        for hook in (_SERIALIZE_TO_TENSORS, _LEGACY_SAVEABLES)
    )


class _Values(tf.__internal__.tracking.Trackable):
    """What a checkpoint writes in a trackable's place: values taken before."""

    def __init__(self, values: Mapping):
        self._taken = dict(values)

    def _serialize_to_tensors(self):
        return dict(self._taken)


def values_in_place(values: Mapping):
    """A stand-in whose checkpoint entries are `values` (name -> tensor)."""
    return _Values(values)


class _ByIdentity:
    """The saver's object map: stand-ins by their trackable's identity (a
    tf.Variable cannot be a dict's key)."""

    def __init__(self, pairs):
        self._pairs = {id(trackable): stand_in for trackable, stand_in in pairs}
        self._kept = [trackable for trackable, _ in pairs]  # alive while the map is: ids stay theirs

    def get(self, trackable, default=None):
        return self._pairs.get(id(trackable), default)

    def __contains__(self, trackable) -> bool:
        return id(trackable) in self._pairs

    def __getitem__(self, trackable):
        return self._pairs[id(trackable)]


def write_in_place_of(checkpoint: tf.train.Checkpoint, stand_ins: list, prefix: str) -> str:
    """`checkpoint.write(prefix)`, each (trackable, stand-in) of `stand_ins`
    written from its stand-in, under the trackable's names."""
    saver = _CHECKPOINT_SAVER.of(checkpoint)
    _SAVER_OBJECT_MAP.check(saver)
    _SERIALIZE_TO_TENSORS.check(tf.__internal__.tracking.Trackable)
    saver._object_map = _ByIdentity(stand_ins)
    try:
        return checkpoint.write(prefix)
    finally:
        saver._object_map = None


# --- A Keras optimizer's slots --------------------------------------------------


# Keras names a slot `<its variable's path, / as _>_<slot>` (add_variable_from_reference:
# adam/dense_kernel_momentum); no public map from a variable to its slots exists.
def slot_name_prefix(variable) -> str:
    """The start of the name of each slot a Keras optimizer makes for `variable`."""
    return variable.path.replace("/", "_") + "_"


# The position of a model variable in the optimizer's lists of slots (Adam's
# _momentums, _velocities ...): Keras' own lookup, private.
_VARIABLE_INDEX = Internal("keras", "keras.optimizers.Optimizer", "_get_variable_index", _RESPLITS_TABLES)


def slot_index(optimizer, variable) -> int:
    return _VARIABLE_INDEX.of(optimizer)(variable)


def trainable_variables_of(optimizer) -> list:
    """The model variables the optimizer updates, in its order (no public property lists them)."""
    return list(_TRAINABLE_VARIABLES.of(optimizer))


def own_variables_of(optimizer) -> list:
    """The optimizer's own variables (iterations, slots ...), without a wrapped
    optimizer's: `variables` of a LossScaleOptimizer adds its inner one's."""
    return list(_OWN_VARIABLES.of(optimizer))


def slot_lists(optimizer) -> dict:
    """The optimizer's lists of one slot per trainable variable, by
    attribute name (Adam's _momentums and _velocities): Keras keeps them in
    private attributes of each optimizer class, and nothing public lists them."""
    count = len(trainable_variables_of(optimizer))
    return {
        name: value
        for name, value in vars(optimizer).items()
        if name not in (OPTIMIZER_VARIABLES, OPTIMIZER_TRAINABLE_VARIABLES)
        and isinstance(value, list)
        and len(value) == count
        and count
        and all(isinstance(v, keras.Variable) for v in value)
    }


# --- Gradients summed before the optimizer (engine/optim.py, update.py) ---------

# Keras' TensorFlow optimizer sums the gradients over replicas inside its
# update, after clipping them, in this private method
# (keras/src/backend/tensorflow/optimizer.py); tfdistx sums them before
# (update.py says why), so the optimizer must not sum them again. No option
# turns the sum off.
_ALL_REDUCE_SUM = Internal(
    "keras",
    "keras.optimizers.Optimizer",
    "_all_reduce_sum_gradients",
    "to keep the optimizer from summing gradients tfdistx has already summed over replicas",
)


class _GradientsArriveSummed:
    def _all_reduce_sum_gradients(self, grads_and_vars):
        return list(grads_and_vars)


def gradients_arrive_summed(cls):
    """A subclass of the Keras optimizer class `cls` that takes its
    gradients as already summed over replicas."""
    _ALL_REDUCE_SUM.check(cls)
    return type(cls.__name__, (_GradientsArriveSummed, cls), {})


# --- A Keras layer's sublayers -------------------------------------------------------

# Keras 3 lists the sublayers of any layer (a custom layer's too, where
# `.layers` is only a Model's) and the layer itself only by this method,
# which trainer.jit_compile=auto reads to find which layer holds each weight.
_FLATTEN_LAYERS = Internal(
    "keras",
    "keras.layers.Layer",
    "_flatten_layers",
    "to tell which layer holds each of a model's weights (trainer.jit_compile=auto)",
)


def sublayers(layer, include_self: bool, recursive: bool) -> list:
    return list(_FLATTEN_LAYERS.of(layer)(include_self=include_self, recursive=recursive))


# --- Names Keras gives variables --------------------------------------------------

# A Keras SeedGenerator's state (dropout's masks ...): tf.train.Checkpoint
# cannot reach a SeedGenerator through the layers (it is not a trackable) and
# no public property of a model lists them, so their states are found by the
# name Keras gives them (keras/src/random/seed_generator.py).
SEED_GENERATOR_STATE = "seed_generator_state"


def is_seed_generator_state(variable) -> bool:
    return variable.path.endswith(SEED_GENERATOR_STATE)


# The names of keras.metrics.AUC's four counts (per threshold, and label),
# which its `variables` hold in no documented order.
_AUC_COUNTS = ("true_positives", "false_positives", "false_negatives", "true_negatives")


def auc_counts(metric, state: Iterable) -> List[np.ndarray]:
    """`state` (values of `metric.variables`, in order) as the AUC's counts:
    true positives, false positives, false negatives, true negatives (float64)."""
    values = {v.name: np.asarray(s, np.float64) for v, s in zip(metric.variables, state)}
    return [values[name] for name in _AUC_COUNTS]


# --- Determinism, strategies, the coordination service ------------------------

# tf.config.experimental exports enable_op_determinism alone: a later job of a
# multirun in the same process can only be given its own setting back through
# these two, in tensorflow.python.
_DETERMINISM_ENABLED = Internal(
    "tensorflow", "tensorflow.python.framework.config", "is_op_determinism_enabled", _KEEPS_DETERMINISM_TO_ITS_RUN
)
_DISABLE_DETERMINISM = Internal(
    "tensorflow", "tensorflow.python.framework.config", "disable_op_determinism", _KEEPS_DETERMINISM_TO_ITS_RUN
)


def op_determinism_enabled() -> bool:
    return bool(_DETERMINISM_ENABLED.get()())


def disable_op_determinism() -> None:
    _DISABLE_DETERMINISM.get()()


# TF numbers a MirroredStrategy's collective groups from this class
# attribute, and its runtime remembers each group's size for the life of the
# process; no option of the strategy moves it (TF's own tests set it too).
_COLLECTIVE_KEY_BASE = Internal(
    "tensorflow",
    "tensorflow.distribute.MirroredStrategy",
    "_collective_key_base",
    "to give each MirroredStrategy of a process its own collective groups",
)


def number_mirrored_collectives_from(base: int) -> None:
    """The next MirroredStrategy built numbers its collective groups from `base`."""
    strategy = tf.distribute.MirroredStrategy
    _COLLECTIVE_KEY_BASE.check(strategy)
    strategy._collective_key_base = base


# The coordination service MultiWorkerMirroredStrategy starts can only be
# configured (its heartbeat timeout) through TensorFlow's eager context, with
# the leader named as the strategy names it and the jobs as protos: none of
# them is exported.
_CONFIGURE_COORDINATION = Internal(
    "tensorflow", "tensorflow.python.eager.context.Context", "configure_coordination_service", _SETS_PEER_TIMEOUT
)
_CONTEXT = Internal("tensorflow", "tensorflow.python.eager.context", "context", _SETS_PEER_TIMEOUT)
_COORDINATION_LEADER = Internal(
    "tensorflow", "tensorflow.python.distribute.multi_worker_util", "coordination_leader", _SETS_PEER_TIMEOUT
)
_COORDINATED_JOB = Internal(
    "tensorflow", "tensorflow.compiler.xla.tsl.protobuf.coordination_config_pb2", "CoordinatedJob", _SETS_PEER_TIMEOUT
)


def configure_coordination_service(cluster_spec, jobs: Mapping[str, int], heartbeat_timeout_ms: int) -> None:
    """The coordination service the strategy would start, for these jobs
    (name -> tasks), with this heartbeat timeout; before the strategy is built."""
    coordinated_job = _COORDINATED_JOB.get()
    _CONTEXT.get()().configure_coordination_service(
        service_type="standalone",
        service_leader=_COORDINATION_LEADER.get()(cluster_spec),
        coordinated_jobs=[coordinated_job(name=name, num_tasks=tasks) for name, tasks in jobs.items()],
        heartbeat_timeout_in_ms=heartbeat_timeout_ms,
    )


# A synchronous task whose peer's process is gone may wait in a collective until the coordination service's
# heartbeat timeout (cluster.peer_timeout) aborts it: measured, a third of the losses of a killed worker of a local
# 2x1 were noticed only then. The task that sees the peer gone aborts its collectives itself, as TensorFlow's own
# multi-worker health check did ("intended to be used when a peer failure is detected"): the eager context's method
# is not exported.
_ABORT_COLLECTIVES = Internal(
    "tensorflow",
    "tensorflow.python.eager.context.Context",
    "abort_collective_ops",
    "to end a synchronous task's collectives at once when a peer's process is gone",
)


def abort_collectives(message: str) -> None:
    """Every collective of this process, under way and to come, fails with `message` (tf.errors.UnavailableError)."""
    _CONTEXT.get()().abort_collective_ops(tf.errors.UNAVAILABLE, message)


# --- Thread pools that sleep when idle (a local cluster's tasks, core/threads.py) ---

# TensorFlow's pools spin before they sleep unless the session config's
# experimental.disable_thread_spinning is set, and TF2 takes that config
# only from its eager context's own, before the runtime starts (and passes
# it on to the server a multi-worker strategy starts): no public setter.
_CONTEXT_CONFIG = Internal(
    "tensorflow",
    "tensorflow.python.eager.context.Context",
    "_config",
    "to keep a local cluster's tasks from spinning on the cores they share",
    instance=True,
)


def disable_thread_spinning() -> None:
    """TensorFlow's thread pools in this process sleep when idle instead of
    spinning first. Before TensorFlow starts its runtime (its devices)."""
    context = _CONTEXT.get()()
    config = tf.compat.v1.ConfigProto()
    if _CONTEXT_CONFIG.of(context) is not None:
        config.CopyFrom(_CONTEXT_CONFIG.of(context))
    config.experimental.disable_thread_spinning = True
    setattr(context, _CONTEXT_CONFIG.attribute, config)


# --- A Keras ModelCheckpoint's count of batches (engine/keras_callbacks.py) ------

# With an integer save_freq, ModelCheckpoint saves every so many batches,
# counted in two attributes it keeps to itself: saved with a run's
# checkpoint, so that a resumed run saves at the batches an uninterrupted
# one does. Set in its __init__: checked on the object.
_CHECKPOINT_BATCHES_SEEN = Internal(
    "keras",
    "keras.callbacks.ModelCheckpoint",
    "_batches_seen_since_last_saving",
    "to resume a ModelCheckpoint callback's count of batches",
    instance=True,
)
_CHECKPOINT_LAST_BATCH = Internal(
    "keras",
    "keras.callbacks.ModelCheckpoint",
    "_last_batch_seen",
    "to resume a ModelCheckpoint callback's count of batches",
    instance=True,
)


def model_checkpoint_batches(callback) -> list:
    """[batches seen since its last save, the last batch it saw] of a Keras ModelCheckpoint."""
    return [_CHECKPOINT_BATCHES_SEEN.of(callback), _CHECKPOINT_LAST_BATCH.of(callback)]


def set_model_checkpoint_batches(callback, batches: list) -> None:
    _CHECKPOINT_BATCHES_SEEN.check(callback)
    _CHECKPOINT_LAST_BATCH.check(callback)
    setattr(callback, _CHECKPOINT_BATCHES_SEEN.attribute, batches[0])
    setattr(callback, _CHECKPOINT_LAST_BATCH.attribute, batches[1])


PROBES = (
    _SHARDED_VARIABLE,
    _GATHER_SAVEABLES,
    _SERIALIZE_TO_TENSORS,
    _LEGACY_SAVEABLES,
    _TRACKABLE_CHILDREN,
    _OPTIMIZER_CHILDREN,
    _DATA_STRUCTURE,
    _WRAP,
    _TRAINABLE_VARIABLES,
    _OWN_VARIABLES,
    _VARIABLE_INDEX,
    _ALL_REDUCE_SUM,
    _DETERMINISM_ENABLED,
    _DISABLE_DETERMINISM,
    _COLLECTIVE_KEY_BASE,
    _CONFIGURE_COORDINATION,
    _CONTEXT,
    _ABORT_COLLECTIVES,
    _COORDINATION_LEADER,
    _COORDINATED_JOB,
    _FLATTEN_LAYERS,
    _CHECKPOINT_BATCHES_SEEN,
    _CHECKPOINT_LAST_BATCH,
)  # _CONTEXT_CONFIG: an instance's, checked where it is used


def probe() -> None:
    """Every internal above that can be looked for without building anything (Gone: the first missing)."""
    internals.probe(PROBES)
