"""Check a composed config before any TensorFlow work starts.

Every check runs and every problem is reported together (like torchtune's
config/_validate.py), so a user fixes a command line in one go. Nothing here
imports TensorFlow: a bad run is refused in well under a second.
"""

import importlib.util
import os
from typing import Optional

from omegaconf import DictConfig

from tfdistx.cluster import LAUNCH_MODES
from tfdistx.errors import ConfigError, Problem

STRATEGIES = ("auto", "one_device", "mirrored", "central_storage", "multiworker", "parameter_server", "tpu")
OPTIMIZERS = ("adam", "sgd", "adamw")
SCHEDULES = ("constant", "cosine", "warmup_cosine")
CROSS_DEVICE_OPS = ("auto", "nccl", "hierarchical_copy", "reduction_to_one")
COMMUNICATIONS = ("auto", "ring", "nccl")


def validate(cfg: DictConfig, run_dir: Optional[str] = None) -> None:
    """Raise ConfigError listing every problem found in `cfg`."""
    problems = []
    problems += _strategy_and_cluster(cfg.strategy, cfg.cluster)
    problems += _data(cfg.data, planned_replicas(cfg))
    problems += _optimizer(cfg.optimizer)
    problems += _trainer(cfg.trainer)
    problems += _checkpoint(cfg.checkpoint)
    problems += _targets(cfg)
    if run_dir is not None:
        problems += _writable("hydra.run.dir", run_dir)
    if cfg.checkpoint.dir:
        problems += _writable("checkpoint.dir", cfg.checkpoint.dir)
    if problems:
        raise ConfigError(problems)


def planned_replicas(cfg: DictConfig) -> Optional[int]:
    """Replicas the config asks for, when that is known without TensorFlow.

    None when it depends on the devices TensorFlow will find (GPUs); the
    engine checks again once the strategy exists.
    """
    name, cluster = cfg.strategy.get("name"), cfg.cluster
    devices = cluster.devices_per_worker
    if name == "one_device":
        return 1
    if name in ("mirrored", "central_storage") or (name == "auto" and cluster.workers == 1):
        return devices
    if name == "parameter_server":
        return 1  # each worker takes whole global batches, one replica each
    if name == "multiworker" or name == "auto":
        # At least one replica per worker (exactly one without GPUs); the
        # engine checks again once it knows each worker's GPUs.
        return cluster.workers
    return None


def _strategy_and_cluster(strategy: DictConfig, cluster: DictConfig) -> list:
    problems = []
    name = strategy.get("name")
    if name not in STRATEGIES:
        return [Problem("strategy", name, f"allowed: {', '.join(STRATEGIES)}")]
    if cluster.workers < 1:
        problems.append(Problem("cluster.workers", cluster.workers, "must be at least 1"))
    if cluster.devices_per_worker is not None and cluster.devices_per_worker < 1:
        problems.append(Problem("cluster.devices_per_worker", cluster.devices_per_worker, "must be at least 1 (or null: all GPUs, else one CPU)"))
    if cluster.max_restarts < 0:
        problems.append(Problem("cluster.max_restarts", cluster.max_restarts, "must be 0 or more"))
    if cluster.ps < 0:
        problems.append(Problem("cluster.ps", cluster.ps, "must be 0 or more"))
    if problems:
        return problems

    topology = f"cluster={cluster.name} ({cluster.workers} worker(s), {cluster.ps} ps)"
    if name == "parameter_server" and cluster.ps < 1:
        problems.append(Problem("strategy", name, f"needs parameter servers; {topology} has none: use e.g. cluster=ps1w2"))
    if name != "parameter_server" and cluster.ps > 0:
        problems.append(Problem("strategy", name, f"{topology} has parameter servers: use strategy=parameter_server"))
    if name in ("one_device", "mirrored", "central_storage", "tpu") and cluster.workers > 1:
        problems.append(Problem("strategy", name, f"runs on one machine but {topology} has several workers: use strategy=multiworker"))
    if name == "one_device" and (cluster.devices_per_worker or 1) > 1:
        problems.append(Problem("strategy", name, f"runs one replica but cluster={cluster.name} asks for {cluster.devices_per_worker} devices: use strategy=mirrored"))
    if name == "mirrored" and strategy.get("cross_device_ops", "auto") not in CROSS_DEVICE_OPS:
        problems.append(Problem("strategy.cross_device_ops", strategy.cross_device_ops, f"allowed: {', '.join(CROSS_DEVICE_OPS)}"))
    if cluster.launch not in LAUNCH_MODES:
        problems.append(Problem("cluster.launch", cluster.launch, f"allowed: {', '.join(LAUNCH_MODES)}"))
    if name == "multiworker" and strategy.get("communication", "auto") not in COMMUNICATIONS:
        problems.append(Problem("strategy.communication", strategy.communication, f"allowed: {', '.join(COMMUNICATIONS)}"))
    return problems


def _data(data: DictConfig, replicas: Optional[int]) -> list:
    batch = data.get("batch_size")
    if not _is_int(batch) or batch < 1:
        return [Problem("data.batch_size", batch, "must be a positive integer (the global batch, split across replicas)")]
    if replicas and batch % replicas:
        return [Problem("data.batch_size", batch, f"the global batch must divide across {replicas} replicas: use a multiple of {replicas}")]
    return []


def _optimizer(opt: DictConfig) -> list:
    problems = []
    name = opt.get("name")
    if name not in OPTIMIZERS:
        problems.append(Problem("optimizer.name", name, f"allowed: {', '.join(OPTIMIZERS)}"))
    lr = opt.get("lr")
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or lr <= 0:
        problems.append(Problem("optimizer.lr", lr, "must be a positive number"))
    if opt.get("schedule", "constant") not in SCHEDULES:
        problems.append(Problem("optimizer.schedule", opt.schedule, f"allowed: {', '.join(SCHEDULES)}"))
    warmup = opt.get("warmup_steps", 0)
    if not _is_int(warmup) or warmup < 0:
        problems.append(Problem("optimizer.warmup_steps", warmup, "must be a whole number, 0 or more"))
    return problems


def _trainer(trainer: DictConfig) -> list:
    problems = []
    if trainer.steps is None and trainer.epochs is None:
        problems.append(Problem("trainer.steps", None, "set trainer.steps or trainer.epochs"))
    for key in ("steps", "epochs", "eval_steps"):
        value = trainer[key]
        if value is not None and value < 1:
            problems.append(Problem(f"trainer.{key}", value, "must be at least 1 (or null)"))
    for key in ("steps_per_loop", "log_every"):
        if trainer[key] < 1:
            problems.append(Problem(f"trainer.{key}", trainer[key], "must be at least 1"))
    if trainer.eval_every < 0:
        problems.append(Problem("trainer.eval_every", trainer.eval_every, "must be 0 (only at the end) or more"))
    return problems


def _checkpoint(ckpt: DictConfig) -> list:
    problems = []
    if ckpt.every_steps < 0:
        problems.append(Problem("checkpoint.every_steps", ckpt.every_steps, "must be 0 (only at the end) or more"))
    if ckpt.max_to_keep < 1:
        problems.append(Problem("checkpoint.max_to_keep", ckpt.max_to_keep, "must be at least 1"))
    return problems


def _targets(cfg: DictConfig) -> list:
    """A user's `_target_` must at least name an importable top-level module.

    Only the top-level package is looked up: importing the module itself may
    import TensorFlow, which must wait until the config is known to be good.
    """
    problems = []
    for group in ("model", "data"):
        target = cfg[group].get("_target_")
        if not isinstance(target, str) or "." not in target:
            problems.append(Problem(f"{group}._target_", target, "must be a dotted path to a function, e.g. mypkg.models.build"))
        elif importlib.util.find_spec(target.split(".")[0]) is None:
            problems.append(Problem(f"{group}._target_", target, f"no module named {target.split('.')[0]!r} is importable"))
    return problems


def _writable(key: str, path: str) -> list:
    """The nearest existing ancestor of `path` must be a writable directory."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe) or not os.access(probe, os.W_OK):
        reason = "is not a directory" if not os.path.isdir(probe) else "is not writable"
        return [Problem(key, path, f"cannot create the directory here: {probe} {reason}")]
    return []


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
