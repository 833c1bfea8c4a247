"""One run, start to end: build everything from the config, then train.

Linear on purpose (cf. lightning-hydra-template's src/train.py): `train`
reads top to bottom; each helper below hands one config group to the module
that owns it. This is the only module that knows every other one.
"""

import contextlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from tfdistx.cluster.placement import Placement
from tfdistx.config import compute, strategies
from tfdistx.config.schema import PIPELINE_KEYS
from tfdistx.config.validate import objective_problems

log = logging.getLogger(__name__)

# Keys of the task group that are tfdistx's, not the task class's.
TASK_KEYS = ("name", "objective")


# Input pipelines of runs whose process ends without tearing them down (see `train`).
_KEPT_UNTIL_EXIT = []


def train(cfg: DictConfig, run_dir: str, placement: Optional[Placement] = None, process_ends_after: bool = False) -> Optional[float]:
    """Train as `cfg` says, writing into `run_dir`; returns the objective.

    `placement` is this process's task in a cluster (None: a single
    process). Only the chief writes the run directory's files.
    `process_ends_after`: the caller ends the process as soon as this
    returns, so the input pipelines are left standing (their teardown can
    wait minutes on tf.data's autotune thread: 77 s measured after a
    mirrored 1x4 run).
    """
    started = time.time()
    placement = placement or Placement("single")
    if not cfg.checkpoint.restore and placement.is_chief:
        from tfdistx.rundir import set_aside_previous_run

        for kept in set_aside_previous_run(run_dir, cfg.checkpoint.dir or str(Path(run_dir) / "checkpoints")):
            log.warning("checkpoint.restore=false: the previous run's files are kept as %s", kept)
    run = build_run(cfg, run_dir, placement)
    if run is None:
        return None  # a parameter-server cluster's ps or worker task: served until stopped
    from tfdistx.engine import loggers
    from tfdistx.config.errors import ConfigError
    from tfdistx.engine.loop import Loop, Schedule
    from tfdistx.engine.preemption import PreemptionWatcher, lost_peer_in_one_line
    from tfdistx.data.files import input_errors_in_one_line

    with reproducible(cfg.trainer), contextlib.closing(run.checkpointer):
        restored = run.checkpointer.restore_latest() if cfg.checkpoint.restore else None
        if run.checkpointer.only_damaged:
            start_over_beside_damaged_run(run)
        start_step = int(run.step_counter.numpy())
        if start_step > run.total_steps:  # nothing to train, and a summary of nothing would replace the run's
            raise ConfigError.one("trainer.steps", run.total_steps, f"the run in this directory is already at step {start_step} "
                                  f"({os.path.basename(restored)}): ask for {start_step} steps or more, or use another hydra.run.dir")
        if restored and start_step == run.total_steps:
            return already_finished(run, cfg, restored)
        if restored:
            log.info("resuming from step %d (%s)", start_step, restored)
        runner = make_runner(run, cfg, skip_steps=start_step)
        schedule = Schedule(run.total_steps, cfg.trainer.steps_per_loop, cfg.trainer.log_every, cfg.trainer.eval_every,
                            checkpoint_every=cfg.checkpoint.every_steps)
        log.info("%s: %s, global batch %d, %d steps, task %s", run.strategy_name, run.replicas_text, run.global_batch,
                 run.total_steps, run.task.name)
        if run.placement.is_chief:
            log.info("run dir: %s", run.dir.resolve())
        # A SIGTERM checkpoints and exits 42 (parameter servers: the coordinator
        # saves alone; TF's handler refuses clusters with ps tasks).
        in_cluster = run.placement.source != "single"
        synchronous_cluster = in_cluster and not run.facts.asynchronous
        with lost_peer_in_one_line(synchronous_cluster, parameter_servers=in_cluster and run.facts.asynchronous), \
                input_errors_in_one_line(run.source), \
                PreemptionWatcher(run.strategy, run.checkpointer, synchronous_cluster) as preemption, \
                loggers.for_run(run.dir, OmegaConf.to_container(cfg.logger), run.total_steps, start_step, enabled=run.placement.is_chief,
                                config=OmegaConf.to_container(cfg, resolve=True)) as sinks:
            result = Loop(runner, schedule, run.step_counter, learning_rate_at=run.learning_rate.at,
                          checkpointer=run.checkpointer, preemption=preemption, loggers=sinks).run()
        final_checkpoint = run.checkpointer.latest

    digest = weights_digest(run.model)
    log.info("task %s: final weights sha256 %s", run.placement.task_name, digest)
    summary = {
        "step": result.step, "train": result.train, "eval": result.eval, "examples_per_sec": result.examples_per_sec,
        "task": run.task.name, "replicas": run.replicas, "workers": cfg.cluster.workers, "ps": cfg.cluster.ps,
        "strategy": run.strategy_name, "strategy_class": type(run.strategy).__name__,
        "global_batch": run.global_batch, "per_replica_batch": run.per_replica_batch,
        "accumulate_steps": cfg.trainer.accumulate_steps, "precision": cfg.trainer.precision, "jit_compile": run.jit_compile,
        "learning_rate": run.peak_lr, "resumed": bool(restored), "resumed_from_step": start_step if restored else None,
        "train_wall_time_sec": result.wall_time_sec, "wall_time_sec": time.time() - started,
        "process": run.placement.task_name, "weights_sha256": digest, "variable_devices": variable_devices(run.model),
    }
    if run.placement.is_chief:
        loggers.write_json(run.dir / "summary.json", summary)
        if cfg.checkpoint.export and final_checkpoint:
            export_checkpoint(cfg, run.task, run.source, final_checkpoint, str(run.dir / "export"))
        log.info("done at step %d: %s", result.step, run.dir.resolve())
    if process_ends_after:
        _KEPT_UNTIL_EXIT.append(runner)
    return objective(cfg.trainer.objective, summary)


def start_over_beside_damaged_run(run: "Run") -> None:
    """No checkpoint in the run dir can be read: the run starts at step 0,
    and the chief first keeps the old run's files aside (as
    checkpoint.restore=false does) instead of writing over them."""
    from tfdistx.rundir import set_aside_previous_run

    log.warning("no checkpoint in %s can be read: starting from scratch", run.checkpointer.directory)
    if run.placement.is_chief:
        for kept in set_aside_previous_run(str(run.dir), run.checkpointer.directory):
            log.warning("the previous run's files are kept as %s", kept)
    run.checkpointer.start_over()


def already_finished(run: "Run", cfg: DictConfig, restored: str) -> Optional[float]:
    """A rerun of a run that reached trainer.steps trains nothing and keeps
    what the run wrote: its summary, metrics and export stay as they are.
    Every task evaluates the final checkpoint (the same collective steps
    on each, so none waits for another), and that is the answer: logged,
    appended to evaluations.jsonl, and the objective returned (a sweep's
    rerun reports the same value)."""
    from tfdistx.engine import loggers

    log.info("the run in this directory finished at step %d (%s): nothing to train; its summary, checkpoints and export "
             "are kept. Ask for more trainer.steps to train on.", run.total_steps, os.path.basename(restored))
    metrics = make_runner(run, cfg, train=False).evaluate()
    log.info("evaluated the final checkpoint: %s", ", ".join(f"{k} {v:.6g}" for k, v in metrics.items()))
    if not run.placement.is_chief:
        return None
    loggers.append_jsonl(run.dir / "evaluations.jsonl", {"checkpoint": os.path.basename(restored), "step": run.total_steps,
                                                         "strategy": run.strategy_name, "replicas": run.replicas, **metrics})
    summary_path = run.dir / "summary.json"
    if summary_path.is_file():
        return objective(cfg.trainer.objective, json.loads(summary_path.read_text()))
    return objective(cfg.trainer.objective, {"eval": metrics, "train": {}})


def evaluate(cfg: DictConfig, run_dir: str, placement: Optional[Placement] = None, step: Optional[int] = None) -> Optional[dict]:
    """Evaluate a kept checkpoint (the newest, or the one at `step`) on the
    configured eval data; the chief appends the metrics to evaluations.jsonl."""
    from tfdistx.engine import checkpointing, loggers
    from tfdistx.config.errors import ConfigError

    path = checkpointing.find(cfg.checkpoint.dir or str(Path(run_dir) / "checkpoints"), step)  # before building anything
    run = build_run(cfg, run_dir, placement or Placement("single"))
    if run is None:
        return None
    with contextlib.closing(run.checkpointer):
        try:
            run.checkpointer.restore(path)  # whole, or refused: never a model left partly at its initial weights
        except checkpointing.Damaged as damage:
            raise ConfigError.one("checkpoint", path, f"cannot be read: {damage}") from None
        metrics = make_runner(run, cfg, train=False).evaluate()
    record = {"checkpoint": os.path.basename(path), "step": int(run.step_counter.numpy()), "strategy": run.strategy_name,
              "replicas": run.replicas, **metrics}
    if run.placement.is_chief:
        loggers.append_jsonl(run.dir / "evaluations.jsonl", record)
    return record


# -- building the parts ------------------------------------------------------


@dataclass
class Run:
    """Everything a run builds before its first step."""

    dir: Path
    placement: Placement
    facts: strategies.Strategy
    strategy_name: str
    strategy: Any
    coordinator: Any
    task: Any
    source: Any
    model: Any
    optimizer: Any
    learning_rate: Any
    step_counter: Any
    checkpointer: Any
    global_batch: int
    per_replica_batch: int
    total_steps: int
    peak_lr: float
    jit_compile: bool
    sample: tuple  # (labels, model outputs) of two training examples, to build the metrics with

    @property
    def replicas(self) -> int:
        """Replicas training at once: asynchronous workers count one each."""
        return self.workers if self.facts.asynchronous else self.strategy.num_replicas_in_sync

    @property
    def workers(self) -> int:
        return len(self.placement.spec.get("worker", [])) or 1

    @property
    def replicas_text(self) -> str:
        if self.facts.asynchronous:
            return f"{self.replicas} asynchronous worker{'s' if self.replicas != 1 else ''}, one whole batch a step"
        return f"{self.replicas} replica{'s' if self.replicas != 1 else ''} ({self.per_replica_batch} examples each)"


def build_run(cfg: DictConfig, run_dir: str, placement: Placement) -> Optional[Run]:
    """Strategy, task, data, model, optimizer and checkpointer, in that order."""
    in_cluster = placement.source != "single"
    if in_cluster:
        os.environ["TF_CONFIG"] = placement.tf_config()  # what TensorFlow's resolvers read
    from tfdistx.engine import strategy as strategy_lib

    strategy_lib.configure_devices(cfg.cluster.devices_per_worker, multi_worker=in_cluster)  # before TF starts
    facts = strategies.get(cfg.strategy.name, cfg.cluster.workers, cfg.cluster.devices_per_worker)
    if in_cluster:  # TensorFlow would wait for a missing task forever (rendezvous.py)
        from tfdistx.cluster.rendezvous import meet_peers

        meet_peers(placement, cfg.cluster.startup_timeout, wait=placement.task_type not in facts.serving_jobs)
    if placement.task_type in facts.serving_jobs:
        strategy_lib.serve_forever()  # the coordinator drives training; this task lends its devices
        return None

    import keras
    import tensorflow as tf

    from tfdistx.data import input as input_lib
    from tfdistx.engine.checkpointing import Checkpointer
    from tfdistx.config.errors import ConfigError
    from tfdistx.engine.optim import LearningRateAtStep, build_optimizer, effective_lr, schedule

    _quiet_known_noise()
    keras.utils.set_random_seed(cfg.trainer.seed)
    name = strategy_lib.concrete_name(cfg.strategy.name, cfg.cluster.workers, cfg.cluster.devices_per_worker)
    facts = strategies.STRATEGIES[name]
    options = {k: v for k, v in cfg.strategy.items() if k != "name"}
    strategy = strategy_lib.build(name, options, cfg.cluster.devices_per_worker)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy) if facts.asynchronous else None
    replicas = strategy.num_replicas_in_sync
    # A step trains on accumulate_steps batches of data.batch_size (update.py).
    global_batch = cfg.data.batch_size * cfg.trainer.accumulate_steps
    per_replica = input_lib.per_replica_batch(global_batch, replicas)

    task, source = build_task_and_data(cfg)
    if source.train_examples and global_batch > source.train_examples:  # a step could never fill its batch
        raise ConfigError.one("data.batch_size", cfg.data.batch_size, f"a step's {global_batch} examples are more than the "
                              f"{source.train_examples} training examples of data={cfg.data._target_}")
    problems = objective_problems(cfg.trainer.objective, task.name, task.metrics())
    if problems:
        raise ConfigError(problems)
    total_steps = _total_steps(cfg.trainer, source.train_examples, global_batch)
    feature_spec, label_spec = source.element_spec
    num_outputs = task.num_outputs(label_spec, source.num_classes)
    learning_rate = LearningRateAtStep(schedule(cfg.optimizer, replicas, total_steps))
    gpus = bool(tf.config.list_logical_devices("GPU"))
    jit, why = compute.jit_compile(cfg, gpus=gpus)
    log.info("precision %s; XLA %s", cfg.trainer.precision, why)
    if compute.precision_warning(cfg.trainer.precision, gpus):
        log.warning(compute.precision_warning(cfg.trainer.precision, gpus))
    keras.mixed_precision.set_global_policy(cfg.trainer.precision)  # every run sets it: a sweep's earlier job may have changed it
    with strategy.scope():
        model = build_model(cfg, feature_spec, num_outputs)
        try:
            optimizer = build_optimizer(OmegaConf.to_container(cfg.optimizer), learning_rate,
                                        loss_scaling=cfg.trainer.precision == "mixed_float16")
        except (TypeError, ValueError) as error:  # Keras' answer to an unknown or bad keyword
            raise ConfigError.one("optimizer", cfg.optimizer.name, f"bad option: {error}") from None
        optimizer.build(model.trainable_variables)
        # Steps completed, as the loop counts them, saved with the checkpoint.
        # Not optimizer.iterations: parameter-server workers increment that
        # concurrently and lose increments (measured: 319 after 400 steps).
        step_counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
    from tfdistx.data.files import input_errors_in_one_line

    with input_errors_in_one_line(source):  # its first examples come through a shuffle window: a bad record may be in it
        sample = _check_model_takes_data(model, task, source, cfg, num_outputs)
    task.check_labels(source.num_classes)

    checkpointer = Checkpointer(
        cfg.checkpoint.dir or str(Path(run_dir) / "checkpoints"), max_to_keep=cfg.checkpoint.max_to_keep,
        is_chief=placement.is_chief, task_name=placement.task_name,
        model=model, optimizer=optimizer, rng=rng_states(model), step=step_counter)
    return Run(Path(run_dir), placement, facts, name, strategy, coordinator, task, source, model, optimizer, learning_rate,
               step_counter, checkpointer, global_batch, per_replica, total_steps, effective_lr(cfg.optimizer, replicas),
               jit, sample)


def build_task_and_data(cfg: DictConfig):
    from tfdistx.config.targets import build
    from tfdistx.data.sources import DataSource
    from tfdistx.tasks import Task

    task = build("task", cfg.task, expect=Task, exclude=TASK_KEYS)
    source = build("data", cfg.data, expect=DataSource, exclude=PIPELINE_KEYS)
    return task, source


def build_model(cfg: DictConfig, feature_spec, num_outputs: int):
    import keras
    import tensorflow as tf

    from tfdistx.config.targets import build

    shape = tuple(feature_spec.shape) if isinstance(feature_spec, tf.TensorSpec) else None
    return build("model", cfg.model, expect=keras.Model, input_shape=shape, feature_spec=feature_spec,
                 num_outputs=num_outputs, num_classes=num_outputs)


def make_runner(run: Run, cfg: DictConfig, skip_steps: int = 0, train: bool = True):
    """The step runner for the run's strategy, with its datasets and metrics."""
    from tfdistx.data import input as input_lib
    from tfdistx.engine.metrics import MetricSet
    from tfdistx.engine import strategy as strategy_lib
    from tfdistx.engine.runner import CoordinatorRunner, SyncRunner
    from tfdistx.engine.update import Update

    metrics = MetricSet(run.task.metrics())
    metrics.build(*run.task.metric_inputs(*run.sample))
    workers = run.workers
    train_data = input_lib.train_dataset(
        run.strategy, run.source, run.global_batch, seed=cfg.trainer.seed,
        shuffle_buffer=cfg.data.get("shuffle_buffer", 10_000), cache=cfg.data.get("cache", False),
        skip_steps=skip_steps, ps_workers=workers if run.facts.asynchronous else 0) if train else None
    eval_steps, cache = cfg.trainer.eval_steps, cfg.data.get("cache", False)
    update = Update(run.task, run.model, run.optimizer, run.global_batch, cfg.trainer.accumulate_steps, jit_compile=run.jit_compile,
                    all_reduce_options=strategy_lib.all_reduce_options(run.strategy_name, cfg.strategy))
    common = dict(learning_rate=run.learning_rate)
    parts = (run.strategy, run.task, run.model, update, metrics)
    eval_batch = cfg.data.batch_size  # not the accumulated batch: what fits in memory
    if run.coordinator is None:
        eval_data = input_lib.eval_dataset(run.strategy, run.source.eval, eval_batch, steps=eval_steps, cache=cache)
        return SyncRunner(*parts, train_data=train_data, eval_data=eval_data, **common)
    # evaluated inline on the coordinator, reading the variables from the ps tasks
    eval_data = input_lib.local_eval_dataset(run.source.eval, eval_batch, steps=eval_steps, cache=cache)
    return CoordinatorRunner(*parts, coordinator=run.coordinator, workers=workers, train_data=train_data, eval_data=eval_data, **common)


def export_checkpoint(cfg: DictConfig, task, source, checkpoint_path: str, directory: str, protected=()) -> str:
    """Rebuild the model outside any strategy, load a checkpoint into it and
    write the SavedModel (export.py): the same for a model whose variables
    lived on parameter servers or were mirrored across workers."""
    import tensorflow as tf

    from tfdistx.engine.export import export_saved_model
    from tfdistx.engine.optim import LearningRateAtStep, build_optimizer

    import keras

    feature_spec, label_spec = source.element_spec
    # The weights are float32 under every precision (Keras keeps float32 master
    # weights): the exported model serves in float32, whatever training computed in.
    keras.mixed_precision.set_global_policy("float32")
    model = build_model(cfg, feature_spec, task.num_outputs(label_spec, source.num_classes))
    # Restored with the optimizer too, as training saved it: a weight that a
    # layer keeps in a plain list (wide_deep's table shards) is reachable in
    # the checkpoint only through the optimizer's variables, and a restore of
    # the model alone would silently leave it at its initial value.
    optimizer = build_optimizer(OmegaConf.to_container(cfg.optimizer, resolve=True), LearningRateAtStep(0.0),
                                loss_scaling=cfg.trainer.precision == "mixed_float16")  # the checkpoint's structure
    optimizer.build(model.trainable_variables)
    tf.train.Checkpoint(model=model, optimizer=optimizer).restore(checkpoint_path).expect_partial()
    export_saved_model(model, task, feature_spec, directory, protected)
    log.info("exported %s to %s", os.path.basename(checkpoint_path), directory)
    return directory


# -- small pieces ------------------------------------------------------------


@contextlib.contextmanager
def reproducible(trainer: DictConfig):
    """Op determinism for this run only: a later job of a multirun in the
    same process starts without it unless it asks."""
    import tensorflow as tf
    from tensorflow.python.framework import config as tf_config  # disable_op_determinism is not exported

    was = tf_config.is_op_determinism_enabled()
    if trainer.deterministic:
        tf.config.experimental.enable_op_determinism()
    try:
        yield
    finally:
        if not was:
            tf_config.disable_op_determinism()


def _check_model_takes_data(model, task, source, cfg: DictConfig, num_outputs: int) -> tuple:
    """One forward pass on two examples, so that a model and data that do
    not fit together (shapes, dtypes: model=wide_deep on images), or a model
    whose output the task cannot use, are refused as a config error, not as
    a traceback from deep inside the first step. Returns (labels, outputs)."""
    from tfdistx.config.errors import ConfigError
    from tfdistx.tasks import float32

    features, labels = next(iter(source.train(None).batch(2)))
    try:
        outputs = float32(model(features, training=False))
        if tuple(outputs.shape[1:]) != (num_outputs,):
            raise ValueError(f"it outputs shape {tuple(outputs.shape[1:])} per example; task={task.name} needs {num_outputs}")
        task.loss(labels, outputs)
        return labels, outputs
    except Exception as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ConfigError.one("model", cfg.model._target_,
                              f"does not fit data={cfg.data._target_} (features {_describe_features(features)}, "
                              f"labels {tuple(labels.shape[1:])} {labels.dtype.name}): {reason[:300]}") from None


def _describe_features(features) -> str:
    if isinstance(features, dict):
        return "{" + ", ".join(f"{k}: {tuple(v.shape[1:])} {v.dtype.name}" for k, v in features.items()) + "}"
    return f"{tuple(features.shape[1:])} {features.dtype.name}"


def rng_states(model) -> list:
    """The states of the model's Keras SeedGenerators (dropout masks and the
    like). tf.train.Checkpoint cannot reach them through the layers (a
    SeedGenerator is not a TF trackable), so a resumed run would replay the
    first masks again: they are checkpointed explicitly, for exact resume."""
    return [v for v in model.non_trainable_variables if v.path.endswith("seed_generator_state")]


def weights_digest(model) -> str:
    """A fingerprint of the weights: equal on every worker of a synchronous
    cluster, and equal across runs that should end bitwise identical."""
    import hashlib

    digest = hashlib.sha256()
    for variable in model.weights:
        digest.update(variable.numpy().tobytes())
    return digest.hexdigest()


def variable_devices(model) -> list:
    """Where the model's variables live (shards of partitioned ones included)."""
    devices = set()
    for variable in model.weights:
        value = variable.value  # Keras 3: the TF variable behind a keras.Variable
        for part in getattr(value, "variables", [value]):  # a ShardedVariable's shards
            devices.add(part.device)
    return sorted(devices)


def _quiet_known_noise() -> None:
    import warnings

    # tf.data warns whenever a distributed dataset is iterated inside a
    # tf.function; absl logs every input-sharding callback, and tf.distribute
    # every collective it traces, at INFO level: nothing a user can act on.
    warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data options")
    for name in ("absl", "tensorflow"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _total_steps(trainer: DictConfig, train_examples, global_batch: int) -> int:
    from tfdistx.config.errors import ConfigError

    if trainer.steps is not None:
        return trainer.steps
    if not train_examples:
        raise ConfigError.one("trainer.epochs", trainer.epochs, "the dataset does not say how many examples it has: set trainer.steps")
    return trainer.epochs * max(train_examples // global_batch, 1)


def objective(name: str, summary: dict) -> float:
    """`eval/accuracy` -> summary['eval']['eval/accuracy']; `loss` -> summary['train']['loss']."""
    for section in ("eval", "train"):
        if name in summary[section]:
            return float(summary[section][name])
    return float("nan")
