"""Build the parts of a run from its spec: strategy, task, data, model,
optimizer and checkpointer, in that order (cf. Model Garden's
train_lib/base_task: build first, then fit). The second of a run's phases
(engine/fit.py); the process has joined its cluster first (engine/join.py).
Each part is made in parts.py, which a warm start, the export and the
commands use without this phase.

Bad input met while building (a model that does not take the data, labels
outside the task's range, a batch larger than the data) is refused here as
a ConfigError, before the first step.
"""

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import keras
import tensorflow as tf

from tfdistx import machine, whole_files
from tfdistx.cluster.placement import Placement
from tfdistx.core import compute, strategies
from tfdistx.core import mpi as mpi_facts
from tfdistx.core.errors import ConfigError
from tfdistx.core.objective import objective_problems, unevaluated_problems
from tfdistx.core.run_spec import RunSpec, Trainer
from tfdistx.core.strategies import StrategyRow
from tfdistx.data import input as input_lib
from tfdistx.data.files import input_errors_in_one_line
from tfdistx.data.sources import DataSource
from tfdistx.engine import mpi, process_wide, topology, xla
from tfdistx.engine import strategy as strategy_lib
from tfdistx.engine.callbacks import CallbackStates, StopRecord
from tfdistx.engine.checkpointing import Checkpointer, ObjectiveState, RunningRecordState
from tfdistx.engine.mpi import MpiSum
from tfdistx.engine.optim import LearningRateAtStep, schedule
from tfdistx.engine.parts import (
    PREPROCESSING,
    build_model,
    build_source,
    build_task,
    check_model_takes_data,
    optimizer_for_checkpoint,
    data_facts,
    resplit_for,
    rng_states,
)
from tfdistx.tasks import Task

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class Run:
    """Everything a run builds before its first step. Made by keyword only:
    with 24 fields, most of them ints and models, a positional call could
    swap two and nothing would complain."""

    spec: RunSpec
    placement: Placement
    row: StrategyRow  # the concrete strategy's row
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
    train_variables: Optional[List[tf.Variable]] = (
        None  # what the optimizer updates, when not the model's trainable ones (sharding.py)
    )
    callback_states: Optional[CallbackStates] = (
        None  # the callbacks' own state, saved with the checkpoint (callbacks.py)
    )
    stop_record: Optional[StopRecord] = None  # which callback stopped the run, saved with the checkpoint (callbacks.py)
    gradient_sum: Optional[MpiSum] = (
        None  # the gradients summed through MPI, not the strategy (strategy.communication=mpi)
    )
    running: Optional[RunningRecordState] = None  # the loop's running record, saved with the checkpoint

    @property
    def dir(self):
        return self.spec.run_dir

    @property
    def replicas(self) -> int:
        """Replicas training at once: asynchronous workers count one each."""
        return self.workers if self.row.asynchronous else self.strategy.num_replicas_in_sync

    @property
    def workers(self) -> int:
        return worker_count(self.placement)

    @property
    def replicas_text(self) -> str:
        if self.row.asynchronous:
            return f"{self.replicas} asynchronous worker{'s' if self.replicas != 1 else ''}, one whole batch a step"
        return f"{self.replicas} replica{'s' if self.replicas != 1 else ''} ({self.per_replica_batch} examples each)"


def worker_count(placement: Placement) -> int:
    """The worker tasks of the cluster (1 for a single process)."""
    return len(placement.cluster_spec.get("worker", [])) or 1


def build_run(spec: RunSpec, placement: Placement) -> Run:
    """The run's parts, for a process that has joined its cluster (join.py)."""
    trainer, cluster = spec.trainer, spec.cluster
    name = strategy_lib.concrete_name(spec.strategy.name, cluster.workers, cluster.devices_per_worker)
    row = strategies.STRATEGIES[name]
    strategy = strategy_lib.build(
        name, spec.strategy.options, cluster.devices_per_worker, peer_timeout=cluster.peer_timeout
    )
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy) if row.asynchronous else None
    # strategy.communication=mpi: the tasks join MPI now, before any variable's first value crosses the cluster
    # (engine/mpi.py)
    gradient_sum = mpi.join(strategy) if name == "multiworker" and mpi_facts.chosen(spec.strategy.options) else None
    replicas = strategy.num_replicas_in_sync
    # A step trains on accumulate_steps batches of data.batch_size (update.py).
    global_batch = spec.pipeline.batch_size * trainer.accumulate_steps
    per_replica = input_lib.per_replica_batch(global_batch, replicas)
    task, source = _task_and_source(spec, global_batch)
    if placement.is_chief:
        keep_preprocessing(spec.run_dir, source)
    total_steps = _total_steps(trainer, source.train_examples, global_batch)
    feature_spec, label_spec = source.element_spec
    num_outputs = task.num_outputs(label_spec, source.num_classes)
    learning_rate = schedule(spec.optimizer, replicas, total_steps)
    gpus = _gpus(trainer.precision, placement)
    with strategy.scope(), process_wide.precision(trainer.precision):
        model = build_model(spec.model, spec.data, feature_spec, num_outputs, **data_facts(spec.model, source))
        # Variables split across the ps tasks (strategy.partitioner): the optimizer
        # updates each shard, and the checkpoint holds the optimizer as an unsplit run's, which restores
        # onto any number of ps tasks (sharding.py).
        optimizer, saved_optimizer, train_variables = optimizer_for_checkpoint(
            spec.optimizer, trainer.precision, model, learning_rate
        )
        # Steps completed, as the loop counts them, saved with the checkpoint.
        # Not optimizer.iterations: parameter-server workers increment that
        # concurrently and lose increments (measured: 319 after 400 steps).
        step_counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        # What a callback's setting of the rate multiplies the schedule by (optim.py): 1 until it does.
        learning_rate.scale = tf.Variable(1.0, dtype=tf.float32, trainable=False, name="learning_rate_scale")
        learning_rate.steps_done = step_counter
        objective_state = ObjectiveState()  # beside the step: a variable of every worker, restored with it
    with input_errors_in_one_line(
        source
    ):  # its first examples come through a shuffle window: a bad record may be in it
        sample = check_model_takes_data(model, task, source, spec.model, spec.data, num_outputs)
    task.check_labels(source.num_classes)
    jit, per_call = xla.decide(trainer, spec.checkpoint, row, gpus, model, feature_spec)  # and says so in the log

    workers = worker_count(placement)
    run_topology = (
        topology.describe(  # recorded with each checkpoint; a resume on another topology is checked against it
            strategy=name,
            cluster=cluster.name,
            workers=workers,
            ps=cluster.ps,
            replicas=workers if row.asynchronous else replicas,
            input_pipelines=workers,
            global_batch=global_batch,
            per_replica_batch=per_replica,
            learning_rate=learning_rate.peak,
        )
    )
    callback_states, stop_record = CallbackStates(), StopRecord()
    running = RunningRecordState()
    checkpointer = Checkpointer(
        spec.checkpoint.dir,
        max_to_keep=spec.checkpoint.max_to_keep,
        is_chief=placement.is_chief,
        task_name=placement.task_name,
        model=model,
        optimizer=saved_optimizer,
        rng=rng_states(model),
        step=step_counter,
        objective=objective_state,
        learning_rate_scale=learning_rate.scale,
        callbacks=callback_states,
        stopped=stop_record,
        record=running,
        optional=[
            "objective",
            "learning_rate_scale",
            "callbacks",
            "stopped",
            "record",
        ],  # checkpoints written before they were saved restore without them
        topology=run_topology,
        resplit=resplit_for(spec, model, feature_spec, num_outputs, source),
        grace=cluster.preemption_grace,
        background=spec.checkpoint.background,
    )
    return Run(
        spec=spec,
        placement=placement,
        row=row,
        strategy_name=name,
        strategy=strategy,
        coordinator=coordinator,
        task=task,
        source=source,
        model=model,
        optimizer=optimizer,
        learning_rate=learning_rate,
        step_counter=step_counter,
        checkpointer=checkpointer,
        objective_state=objective_state,
        global_batch=global_batch,
        per_replica_batch=per_replica,
        total_steps=total_steps,
        peak_lr=learning_rate.peak,
        jit_compile=jit,
        steps_per_xla_call=per_call,
        sample=sample,
        topology=run_topology,
        train_variables=train_variables,
        callback_states=callback_states,
        stop_record=stop_record,
        gradient_sum=gradient_sum,
        running=running,
    )


def keep_preprocessing(run_dir: Path, source: DataSource) -> None:
    """What the source's preprocessing learnt from the data (a text's vocabulary), written by the chief into
    <run dir>/preprocessing as the run starts: the run's later processes (a resume, `tfdistx export`, `predict`)
    read it back there, and train and serve with the same token ids. A file already there is the run's own: kept."""
    if source.served is None or not source.served.state:
        return
    folder = Path(run_dir) / PREPROCESSING
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in source.served.state.items():
        if not (folder / name).exists():
            whole_files.write_whole(folder / name, text)


def _task_and_source(spec: RunSpec, global_batch: int):
    """The task and the data source, checked against each other and the run."""
    source = build_source(spec.data, spec.run_dir)
    task = build_task(spec.task, source)
    if source.train_examples and global_batch > source.train_examples:  # a step could never fill its batch
        raise ConfigError.for_key(
            "data.batch_size",
            spec.pipeline.batch_size,
            f"a step's {global_batch} examples are more than the "
            f"{source.train_examples} training examples of data={spec.data.path}",
        )
    trainer = spec.trainer
    problems = objective_problems(trainer.objective, task.name, task.metrics())
    if (
        source.eval is None
    ):  # a user's source without eval data: known only now (a built-in one's config says so: validate.py)
        problems += unevaluated_problems(
            trainer.objective,
            spec.checkpoint.keep_best,
            trainer.early_stopping.patience,
            f"data={spec.data.path} has no eval split (its DataSource's eval is None)",
            "give it an eval pipeline",
        )
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


def _total_steps(trainer: Trainer, train_examples, global_batch: int) -> int:
    if trainer.steps is not None:
        return trainer.steps
    if not train_examples:
        raise ConfigError.for_key(
            "trainer.epochs",
            trainer.epochs,
            "the dataset does not say how many examples it has: set trainer.steps",
        )
    return trainer.epochs * max(train_examples // global_batch, 1)
