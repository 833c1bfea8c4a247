"""Build the parts of a run from its spec: strategy, task, data, model,
optimizer and checkpointer, in that order (cf. Model Garden's
train_lib/base_task: build first, then fit). The second of a run's phases
(engine/fit.py); the process has joined its cluster first (engine/join.py).

Bad input met while building (a model that does not take the data, labels
outside the task's range, a batch larger than the data) is refused here as
a ConfigError, before the first step.
"""

import logging
import re
from dataclasses import dataclass
from typing import List, Optional

import keras
import tensorflow as tf

from tfdistx import machine
from tfdistx.cluster.placement import Placement
from tfdistx.config import compute, strategies
from tfdistx.config.errors import ConfigError
from tfdistx.config.objective import objective_problems, unevaluated_problems
from tfdistx.config.spec import RunSpec
from tfdistx.config.strategies import Strategy
from tfdistx.data import input as input_lib
from tfdistx.data.files import input_errors_in_one_line
from tfdistx.data.sources import DataSource, single_examples
from tfdistx.engine import process, resplit, sharding, topology, xla
from tfdistx.engine import strategy as strategy_lib
from tfdistx.engine.callbacks import CallbackStates
from tfdistx.engine.checkpointing import Checkpointer, ObjectiveState
from tfdistx.engine.optim import LearningRateAtStep, build_optimizer, schedule
from tfdistx.internals import tensorflow as internals
from tfdistx.tasks import Task, float32

log = logging.getLogger(__name__)


@dataclass
class Run:
    """Everything a run builds before its first step."""

    spec: RunSpec
    placement: Placement
    facts: Strategy  # the concrete strategy's row
    strategy_name: str  # the concrete strategy (`auto` made concrete)
    strategy: tf.distribute.Strategy
    coordinator: Optional[tf.distribute.experimental.coordinator.ClusterCoordinator]  # parameter servers only
    task: Task
    source: DataSource
    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    learning_rate: LearningRateAtStep
    step_counter: tf.Variable  # steps completed, as the loop counts them; saved with the checkpoint
    checkpointer: Checkpointer
    objective_state: ObjectiveState  # the objective's best so far and early stopping's count
    global_batch: int
    per_replica_batch: int
    total_steps: int
    peak_lr: float
    jit_compile: bool
    steps_per_xla_call: int  # consecutive steps in one XLA computation (update.py)
    sample: tuple  # (labels, model outputs) of two training examples, to build the metrics with
    topology: dict  # what it runs on (engine/topology.py), recorded with each checkpoint
    train_variables: Optional[List[tf.Variable]] = None  # what the optimizer updates, when not the model's trainable ones (sharding.py)
    callback_states: Optional[CallbackStates] = None  # the callbacks' own state, saved with the checkpoint (callbacks.py)

    @property
    def dir(self):
        return self.spec.run_dir

    @property
    def replicas(self) -> int:
        """Replicas training at once: asynchronous workers count one each."""
        return self.workers if self.facts.asynchronous else self.strategy.num_replicas_in_sync

    @property
    def workers(self) -> int:
        return worker_count(self.placement)

    @property
    def replicas_text(self) -> str:
        if self.facts.asynchronous:
            return f"{self.replicas} asynchronous worker{'s' if self.replicas != 1 else ''}, one whole batch a step"
        return f"{self.replicas} replica{'s' if self.replicas != 1 else ''} ({self.per_replica_batch} examples each)"


def worker_count(placement: Placement) -> int:
    """The worker tasks of the cluster (1 for a single process)."""
    return len(placement.spec.get("worker", [])) or 1


def build_run(spec: RunSpec, placement: Placement) -> Run:
    """The run's parts, for a process that has joined its cluster (join.py)."""
    trainer, cluster = spec.trainer, spec.cluster
    name = strategy_lib.concrete_name(spec.strategy.name, cluster.workers, cluster.devices_per_worker)
    facts = strategies.STRATEGIES[name]
    strategy = strategy_lib.build(name, spec.strategy.options, cluster.devices_per_worker, peer_timeout=cluster.peer_timeout)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy) if facts.asynchronous else None
    replicas = strategy.num_replicas_in_sync
    # A step trains on accumulate_steps batches of data.batch_size (update.py).
    global_batch = spec.pipeline.batch_size * trainer.accumulate_steps
    per_replica = input_lib.per_replica_batch(global_batch, replicas)
    task, source = _task_and_source(spec, global_batch)
    total_steps = _total_steps(spec, source.train_examples, global_batch)
    feature_spec, label_spec = source.element_spec
    num_outputs = task.num_outputs(label_spec, source.num_classes)
    learning_rate = schedule(spec.optimizer, replicas, total_steps)
    gpus = _gpus(trainer.precision, placement)
    with strategy.scope(), process.precision(trainer.precision):
        model = build_model(spec, feature_spec, num_outputs)
        # Variables split across the ps tasks (strategy.partitioner): the optimizer
        # updates each shard, and the checkpoint holds the optimizer as an unsplit run's, which restores
        # onto any number of ps tasks (sharding.py).
        optimizer, saved_optimizer, train_variables = optimizer_for_checkpoint(spec, model, learning_rate)
        # Steps completed, as the loop counts them, saved with the checkpoint.
        # Not optimizer.iterations: parameter-server workers increment that
        # concurrently and lose increments (measured: 319 after 400 steps).
        step_counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        # What a callback's setting of the rate multiplies the schedule by (optim.py): 1 until it does.
        learning_rate.scale = tf.Variable(1.0, dtype=tf.float32, trainable=False, name="learning_rate_scale")
        learning_rate.steps_done = step_counter
        objective_state = ObjectiveState()  # beside the step: a variable of every worker, restored with it
    with input_errors_in_one_line(source):  # its first examples come through a shuffle window: a bad record may be in it
        sample = _check_model_takes_data(model, task, source, spec, num_outputs)
    task.check_labels(source.num_classes)
    jit, per_call = xla.decide(trainer, spec.checkpoint, facts, gpus, model, feature_spec)  # and says so in the log

    workers = worker_count(placement)
    run_topology = topology.describe(  # recorded with each checkpoint; a resume on another topology is checked against it
        strategy=name, cluster=cluster.name, workers=workers, ps=cluster.ps, replicas=workers if facts.asynchronous else replicas,
        input_pipelines=workers, global_batch=global_batch, per_replica_batch=per_replica,
        learning_rate=learning_rate.peak)
    callback_states = CallbackStates()
    checkpointer = Checkpointer(
        spec.checkpoint.dir, max_to_keep=spec.checkpoint.max_to_keep, is_chief=placement.is_chief, task_name=placement.task_name,
        model=model, optimizer=saved_optimizer, rng=rng_states(model), step=step_counter, objective=objective_state,
        learning_rate_scale=learning_rate.scale, callbacks=callback_states,
        optional=["objective", "learning_rate_scale", "callbacks"],  # checkpoints written before they were saved restore without them
        topology=run_topology, resplit=_resplit(spec, model, feature_spec, num_outputs))
    return Run(spec, placement, facts, name, strategy, coordinator, task, source, model, optimizer, learning_rate, step_counter,
               checkpointer, objective_state, global_batch, per_replica, total_steps, learning_rate.peak,
               jit, per_call, sample, run_topology, train_variables, callback_states=callback_states)


def _task_and_source(spec: RunSpec, global_batch: int):
    """The task and the data source, checked against each other and the run."""
    task, source = build_task(spec), build_source(spec)
    if source.train_examples and global_batch > source.train_examples:  # a step could never fill its batch
        raise ConfigError.one("data.batch_size", spec.pipeline.batch_size, f"a step's {global_batch} examples are more than the "
                              f"{source.train_examples} training examples of data={spec.data.path}")
    trainer = spec.trainer
    problems = objective_problems(trainer.objective, task.name, task.metrics())
    if source.eval is None:  # a user's source without eval data: known only now (a built-in one's config says so: validate.py)
        problems += unevaluated_problems(trainer.objective, spec.checkpoint.keep_best, trainer.early_stopping.patience,
                                         f"data={spec.data.path} has no eval split (its DataSource's eval is None)", "give it an eval pipeline")
    if problems:
        raise ConfigError(problems)
    return task, source


def _gpus(precision: str, placement: Placement) -> bool:
    """Whether TensorFlow sees GPUs; what it does not see, or a precision for other hardware, is said once."""
    gpus = bool(tf.config.list_logical_devices("GPU"))
    unseen = machine.unseen_gpus(gpus, tf.test.is_built_with_cuda())
    if unseen and placement.is_chief:
        log.warning(unseen)
    if compute.precision_warning(precision, gpus):
        log.warning(compute.precision_warning(precision, gpus))
    return gpus


def build_task(spec: RunSpec) -> Task:
    return spec.task.build(expect=Task)


def build_source(spec: RunSpec) -> DataSource:
    source = spec.data.build(expect=DataSource)
    return source if spec.data.path.startswith("tfdistx.") else single_examples(source, spec.data.path)  # the built-in ones do not batch


def build_model(spec: RunSpec, feature_spec, num_outputs: int, **given) -> keras.Model:
    """The model, with its weights made. `given`: arguments in place of the
    config's (resplit's `shards`).

    A model whose weights exist when it is constructed (a functional model,
    a `Sequential` with a `keras.Input`) is returned as it is. A subclassed
    model, or a `Sequential` without an `Input`, makes its weights at its
    first call, as Keras' `fit` has it do on the first batch: it is called
    here once, on a batch of zeros of the data's shapes, so that the
    optimizer and the checkpoint are made for the weights it trains (Keras'
    optimizer refuses variables it was not built with). Called in the
    caller's strategy scope: the weights are made where the strategy puts
    them."""
    shape = tuple(feature_spec.shape) if isinstance(feature_spec, tf.TensorSpec) else None
    model = spec.model.build(expect=keras.Model, input_shape=shape, feature_spec=feature_spec,
                             num_outputs=num_outputs, num_classes=num_outputs, **given)
    if not model.built:
        try:
            model(zeros_like_examples(feature_spec), training=False)
        except Exception as error:
            raise ConfigError.one("model", spec.model.path, f"does not fit data={spec.data.path} (features "
                                  f"{_describe_features(feature_spec)}): its first call failed: {_first_line(error)}") from None
    return model


def zeros_like_examples(feature_spec, batch: int = 2):
    """A batch of `batch` zero (or empty-string) examples of `feature_spec`
    (a TensorSpec or a dict of them, one example's shape): what a model is
    first called on to make its weights. Dimensions the data leaves open are 1."""
    def zeros(spec):
        shape = [batch, *(1 if size is None else size for size in spec.shape)]
        return tf.fill(shape, "") if spec.dtype == tf.string else tf.zeros(shape, spec.dtype)
    return tf.nest.map_structure(zeros, feature_spec)


def model_from_checkpoint(spec: RunSpec, checkpoint_path: str):
    """The spec's model, rebuilt outside any strategy and with a checkpoint of
    its run restored into it: (model, task, feature_spec, restore status).
    The same for a model whose variables lived on parameter servers or were
    mirrored across workers. Used by the export and by a warm start."""
    task, source = build_task(spec), build_source(spec)
    feature_spec, label_spec = source.element_spec
    num_outputs = task.num_outputs(label_spec, source.num_classes)
    # The weights are float32 under every precision (Keras keeps float32 master
    # weights): the rebuilt model is float32, whatever training computed in.
    with process.precision("float32"):
        model = build_model(spec, feature_spec, num_outputs)
    # Restored with the optimizer too, as training saved it: a weight that a
    # layer keeps in a plain list (wide_deep's table shards) is reachable in
    # the checkpoint only through the optimizer's variables, and a restore of
    # the model alone would silently leave it at its initial value.
    _, saved_optimizer, _ = optimizer_for_checkpoint(spec, model, LearningRateAtStep(0.0))  # the checkpoint's structure
    status = resplit.restore({"model": model, "optimizer": saved_optimizer}, checkpoint_path,
                             _resplit(spec, model, feature_spec, num_outputs))  # a checkpoint of another number of ps
    return model, task, feature_spec, status


def _resplit(spec: RunSpec, model, feature_spec, num_outputs: int) -> Optional[resplit.Resplit]:
    """What re-splits the model's tables from a checkpoint of another number
    of shards (resplit.py); None for a model without such tables."""
    def rebuild(shards):  # the model and optimizer outside any strategy, its tables in `shards` pieces
        with process.precision(spec.trainer.precision):
            plain = build_model(spec, feature_spec, num_outputs, **({} if shards is None else {"shards": shards}))
        return plain, build_optimizer_for(spec, plain, LearningRateAtStep(0.0))

    return resplit.Resplit(model, rebuild) if resplit.tables(model) else None


def optimizer_for_checkpoint(spec: RunSpec, model, learning_rate: LearningRateAtStep):
    """(optimizer, what the checkpoint holds for it, the variables it updates
    or None: the model's trainable ones)."""
    sharding.own_shards(model)
    if not sharding.split(model):
        optimizer = build_optimizer_for(spec, model, learning_rate)
        return optimizer, optimizer, None
    model_groups = sharding.groups(model)
    variables = sharding.train_variables(model_groups)
    optimizer = build_optimizer_for(spec, model, learning_rate, variables)
    try:
        return optimizer, sharding.OptimizerState(optimizer, model_groups), variables
    except ValueError as error:  # a loss-scaled (mixed_float16) optimizer keeps its slots in an inner one
        raise ConfigError.one("trainer.precision", spec.trainer.precision, f"not with variables split across ps tasks: {error}") from None


def build_optimizer_for(spec: RunSpec, model, learning_rate: LearningRateAtStep, variables=None):
    """The configured optimizer, built for the model's trainable variables (or `variables`)."""
    try:
        optimizer = build_optimizer(spec.optimizer, learning_rate, loss_scaling=spec.trainer.precision == "mixed_float16")
    except (TypeError, ValueError) as error:  # Keras' answer to an unknown or bad keyword
        raise ConfigError.one("optimizer", spec.optimizer.name, f"bad option: {error}") from None
    optimizer.build(model.trainable_variables if variables is None else variables)
    return optimizer


def _check_model_takes_data(model, task, source, spec: RunSpec, num_outputs: int) -> tuple:
    """One forward pass on two examples, so that a model and data that do
    not fit together (shapes, dtypes: model=wide_deep on images), or a model
    whose output the task cannot use, are refused as a config error, not as
    a traceback from deep inside the first step. Returns (labels, outputs)."""
    features, labels = next(iter(source.train(None).batch(2)))
    try:
        outputs = float32(model(features, training=False))
        if tuple(outputs.shape[1:]) != (num_outputs,):
            raise ValueError(f"it outputs shape {tuple(outputs.shape[1:])} per example; task={task.name} needs {num_outputs}")
        task.loss(labels, outputs)
        return labels, outputs
    except Exception as error:
        raise ConfigError.one("model", spec.model.path,
                              f"does not fit data={spec.data.path} (features {_describe_features(features, batched=True)}, "
                              f"labels {tuple(labels.shape[1:])} {labels.dtype.name}): {_first_line(error)}") from None


def _first_line(error: Exception) -> str:
    """The line of an error that says what went wrong. Keras wraps an error
    raised in a layer's call in a header (`Exception encountered when
    calling X.call().`) with the cause below it, in bold: the cause is given."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in str(error).splitlines()]
    lines = [line for line in lines if line]
    if len(lines) > 1 and lines[0].startswith("Exception encountered when calling"):
        return f"{_no_values(lines[1])} (in {lines[0].split('calling ', 1)[1].rstrip('.')})"
    return _no_values(lines[0]) if lines else type(error).__name__


def _no_values(line: str) -> str:
    """A reason without the tensors' values Keras prints after it."""
    return line.split(" Inputs received:")[0].split("<tf.Tensor")[0].rstrip(" :[(")[:300]


def _describe_features(features, batched: bool = False) -> str:
    """Features (tensors of a batch, or one example's specs) as shapes and dtypes of one example."""
    one = lambda shape: tuple(shape[1:] if batched else shape)  # noqa: E731
    if isinstance(features, dict):
        return "{" + ", ".join(f"{k}: {one(v.shape)} {v.dtype.name}" for k, v in features.items()) + "}"
    return f"{one(features.shape)} {features.dtype.name}"


def rng_states(model) -> list:
    """The states of the model's Keras SeedGenerators (dropout masks and the
    like). tf.train.Checkpoint cannot reach them through the layers (a
    SeedGenerator is not a TF trackable), so a resumed run would replay the
    first masks again: they are checkpointed explicitly, for exact resume."""
    return [v for v in model.non_trainable_variables if internals.is_seed_generator_state(v)]


def _total_steps(spec: RunSpec, train_examples, global_batch: int) -> int:
    if spec.trainer.steps is not None:
        return spec.trainer.steps
    if not train_examples:
        raise ConfigError.one("trainer.epochs", spec.trainer.epochs, "the dataset does not say how many examples it has: set trainer.steps")
    return spec.trainer.epochs * max(train_examples // global_batch, 1)
