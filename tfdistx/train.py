"""One run, start to end: build everything from the config, then train.

Linear on purpose (cf. lightning-hydra-template's src/train.py): each line
hands a config group to the module that owns it.
"""

import hashlib
import json
import logging
import os
import shutil
import socket
import tempfile
import time
import warnings
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig, OmegaConf

from tfdistx import loggers as loggers_lib
from tfdistx.cluster import Placement

log = logging.getLogger(__name__)

# Keys of the data group that shape the input pipeline, not the source.
PIPELINE_KEYS = ("batch_size", "cache", "shuffle_buffer")


def train(cfg: DictConfig, run_dir: str, placement: Optional[Placement] = None) -> Optional[float]:
    """Train as `cfg` says, writing into `run_dir`; returns the objective.

    `placement` is this process's task in a cluster (None: a single
    process). Only the chief writes the run directory's files.
    """
    started = time.time()
    placement = placement or Placement("single")
    in_cluster = placement.source != "single"
    if in_cluster:
        os.environ["TF_CONFIG"] = placement.tf_config()  # what TensorFlow's resolvers read
    name = cfg.strategy.name
    from tfdistx.strategy import configure_devices, get_strategy, resolve, serve_forever

    configure_devices(cfg.cluster.devices_per_worker, multi_worker=in_cluster)  # before TF starts

    if name == "parameter_server" and placement.task_type in ("ps", "worker"):
        serve_forever()  # the chief drives training; this task lends its devices
        return None

    import keras
    import tensorflow as tf

    from tfdistx import input as input_lib
    from tfdistx.build import build
    from tfdistx.checkpointing import Checkpointer
    from tfdistx.data import DataSource
    from tfdistx.engine import Schedule, Trainer
    from tfdistx.errors import ConfigError
    from tfdistx.optim import build_optimizer, effective_lr
    from tfdistx.preemption import PreemptionWatcher

    _quiet_known_noise()
    keras.utils.set_random_seed(cfg.trainer.seed)
    if cfg.trainer.deterministic:
        tf.config.experimental.enable_op_determinism()

    strategy_name = resolve(name, cfg.cluster.devices_per_worker, in_cluster)  # `auto` made concrete
    options = {k: v for k, v in cfg.strategy.items() if k != "name"}
    strategy = get_strategy(strategy_name, devices_per_worker=cfg.cluster.devices_per_worker, in_cluster=in_cluster, **options)
    coordinator = None
    if name == "parameter_server":
        coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    replicas = strategy.num_replicas_in_sync
    global_batch = cfg.data.batch_size
    per_replica = input_lib.per_replica_batch(global_batch, replicas)

    source = build("data", cfg.data, expect=DataSource, exclude=PIPELINE_KEYS)
    total_steps = _total_steps(cfg.trainer, source.train_examples, global_batch)

    with strategy.scope():
        model = build("model", cfg.model, expect=keras.Model, input_shape=source.input_shape, num_classes=source.num_classes)
        try:
            optimizer = build_optimizer(OmegaConf.to_container(cfg.optimizer), replicas, total_steps)
        except (TypeError, ValueError) as error:  # Keras' answer to an unknown or bad keyword
            raise ConfigError.one("optimizer", cfg.optimizer.name, f"bad option: {error}") from None
        optimizer.build(model.trainable_variables)
        step_counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")

    _check_model_takes_data(model, source, cfg)
    run = Path(run_dir)
    checkpoint_dir = cfg.checkpoint.dir or str(run / "checkpoints")
    # Every worker of a synchronous cluster must save (saving is collective),
    # but only the chief writes the run's checkpoints: the others save into
    # a temporary directory that is removed at the end.
    scratch = None if placement.is_chief else tempfile.mkdtemp(prefix=f"tfdistx-{placement.task_type}{placement.task_index}-")
    checkpointer = Checkpointer(
        scratch or checkpoint_dir,
        restore_from=checkpoint_dir,
        every_steps=cfg.checkpoint.every_steps,
        max_to_keep=cfg.checkpoint.max_to_keep,
        model=model,
        optimizer=optimizer,
        rng=rng_states(model),
        step=step_counter,
    )
    try:
        restored = checkpointer.restore_latest() if cfg.checkpoint.restore else None
        start_step = int(step_counter.numpy())
        if restored:
            log.info("resuming from step %d (%s)", start_step, restored)

        train_data = input_lib.train_dataset(
            strategy, source, global_batch,
            seed=cfg.trainer.seed,
            shuffle_buffer=cfg.data.get("shuffle_buffer", 10_000),
            cache=cfg.data.get("cache", False),
            skip_steps=start_step,
        )
        eval_steps, cache = cfg.trainer.eval_steps, cfg.data.get("cache", False)
        if coordinator is None:
            eval_data = input_lib.eval_dataset(strategy, source.eval, global_batch, steps=eval_steps, cache=cache)
        else:  # evaluated inline on the coordinator, reading the variables from the ps tasks
            eval_data = input_lib.local_eval_dataset(source.eval, global_batch, steps=eval_steps, cache=cache)

        # A SIGTERM checkpoints and exits 42 (parameter servers: the coordinator
        # saves alone; TF's handler refuses clusters with ps tasks).
        preemption = PreemptionWatcher(strategy, checkpointer, synchronous_cluster=in_cluster and coordinator is None)
        sinks = _loggers(cfg, run, total_steps, start_step) if placement.is_chief else []
        trainer = Trainer(
            strategy, model, optimizer, train_data, global_batch,
            Schedule(total_steps, cfg.trainer.steps_per_loop, cfg.trainer.log_every, cfg.trainer.eval_every),
            eval_data=eval_data,
            checkpointer=checkpointer,
            loggers=sinks,
            coordinator=coordinator,
            workers=cfg.cluster.workers,
            preemption=preemption,
            step_counter=step_counter,
        )
        log.info("%s: %d replica(s), global batch %d (%d per replica), %d steps", type(strategy).__name__, replicas, global_batch, per_replica, total_steps)
        try:
            result = trainer.fit()
        finally:
            for sink in sinks:
                getattr(sink, "close", lambda: None)()
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)

    digest = weights_digest(model)
    log.info("task %s: final weights sha256 %s", placement.task_name, digest)
    workers = cfg.cluster.workers  # checked against TF_CONFIG / Slurm by cluster.detect
    summary = {
        "step": result.step,
        "train": result.train,
        "eval": result.eval,
        "examples_per_sec": result.examples_per_sec,
        "replicas": replicas * (workers if coordinator else 1),
        "workers": workers,
        "ps": cfg.cluster.ps,
        "strategy": strategy_name,
        "strategy_class": type(strategy).__name__,
        "global_batch": global_batch,
        "per_replica_batch": per_replica,
        "learning_rate": effective_lr(cfg.optimizer, replicas),
        "resumed": bool(restored),
        "resumed_from_step": start_step if restored else None,
        "train_wall_time_sec": result.wall_time_sec,
        "wall_time_sec": time.time() - started,
        "host": socket.gethostname(),
        "task": placement.task_name,
        "weights_sha256": digest,
        "variable_devices": variable_devices(model),
    }
    if placement.is_chief:
        _write_json(run / "summary.json", summary)
    return objective(cfg.trainer.objective, summary)


def _check_model_takes_data(model, source, cfg: DictConfig) -> None:
    """One forward pass on two examples, so that a model and data that do
    not fit together (shapes, dtypes: model=wide_deep on images) are refused
    as a config error, not as a traceback from deep inside the first step."""
    from tfdistx.errors import ConfigError

    features, _ = next(iter(source.train(None).batch(2)))
    try:
        logits = model(features, training=False)
        if tuple(logits.shape[1:]) != (source.num_classes,):
            raise ValueError(f"it outputs shape {tuple(logits.shape[1:])} per example, not {source.num_classes} class logits")
    except Exception as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ConfigError.one("model", cfg.model._target_,
                              f"does not fit data={cfg.data._target_} (features {tuple(features.shape[1:])} "
                              f"{features.dtype.name}): {reason[:300]}") from None


def rng_states(model) -> list:
    """The states of the model's Keras SeedGenerators (dropout masks and the
    like). tf.train.Checkpoint cannot reach them through the layers (a
    SeedGenerator is not a TF trackable), so a resumed run would replay the
    first masks again: they are checkpointed explicitly, for exact resume."""
    return [v for v in model.non_trainable_variables if v.path.endswith("seed_generator_state")]


def weights_digest(model) -> str:
    """A fingerprint of the weights: equal on every worker of a synchronous
    cluster, and equal across runs that should end bitwise identical."""
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
    # tf.data warns whenever a distributed dataset is iterated inside a
    # tf.function; absl logs every input-sharding callback, and tf.distribute
    # every collective it traces, at INFO level: nothing a user can act on.
    warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data options")
    for name in ("absl", "tensorflow"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _total_steps(trainer: DictConfig, train_examples, global_batch: int) -> int:
    from tfdistx.errors import ConfigError

    if trainer.steps is not None:
        return trainer.steps
    if not train_examples:
        raise ConfigError.one("trainer.epochs", trainer.epochs, "the dataset does not say how many examples it has: set trainer.steps")
    return trainer.epochs * max(train_examples // global_batch, 1)


def _loggers(cfg: DictConfig, run: Path, total_steps: int, start_step: int) -> list:
    sinks = [loggers_lib.JsonlLogger(str(run / "metrics.jsonl"), resume_step=start_step)]
    if cfg.logger.get("console", True):
        sinks.append(loggers_lib.ConsoleProgress(total_steps))
    if cfg.logger.get("tensorboard", True):
        sinks.append(loggers_lib.TensorBoardLogger(str(run / "tensorboard")))
    wandb_cfg = cfg.logger.get("wandb") or {}
    if wandb_cfg.get("enabled"):
        options = {k: v for k, v in OmegaConf.to_container(wandb_cfg).items() if k != "enabled"}
        sinks.append(loggers_lib.WandbLogger(str(run), OmegaConf.to_container(cfg, resolve=True), **options))
    return sinks


def objective(name: str, summary: dict) -> float:
    """`eval/accuracy` -> summary['eval']['eval/accuracy']; `loss` -> summary['train']['loss']."""
    for section in ("eval", "train"):
        if name in summary[section]:
            return float(summary[section][name])
    return float("nan")


def _write_json(path: Path, payload: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=float) + "\n")
    os.replace(tmp, path)
