"""Check a composed config before any TensorFlow work starts.

Every check runs and every problem is reported together (like torchtune's
config/_validate.py), so a user fixes a command line in one go. Nothing here
imports TensorFlow: a bad run is refused in well under a second.
"""

import dataclasses
import math
import os
import tempfile
from typing import Optional

from omegaconf import DictConfig, OmegaConf

from tfdistx import rundir
from tfdistx.config import loggers, run_files, sources, tasks, topology
from tfdistx.core import (
    agent,
    callbacks,
    compute,
    data_service,
    elastic,
    mpi,
    optimizers,
    priority,
    static_targets,
    strategies,
    threads,
    warm_start,
)
from tfdistx.core.errors import MAX_RETRYABLE_EXIT_OFFSET, NOTICE_SIGNALS, ConfigError, Problem
from tfdistx.core.launch_mode import LaunchMode
from tfdistx.core.objective import objective_problems, unevaluated_problems
from tfdistx.config.schema import OPTIMIZER_KEYS, PIPELINE_DEFAULTS, TASK_FACTS, TASK_KEYS, Config
from tfdistx.core import paths
from tfdistx.core.targets import current
from tfdistx.core.values import is_number, is_whole

FLOAT32_MAX = 3.4028234663852886e38  # the learning rate lives in a float32 variable
MAX_STEPS = 2**62  # the step counter is an int64; a count past this cannot be saved with the checkpoint


def validate(cfg: DictConfig, run_dir: Optional[str] = None) -> None:
    """Raise ConfigError listing every problem found in `cfg`."""
    problems = _top_level(cfg)
    problems += _strategy_and_cluster(cfg.strategy, cfg.cluster)
    strategy = cfg.strategy.get("name")
    elastic_problems = elastic.problems(cfg.cluster, strategy, cfg.data, cfg.optimizer)
    problems += agent.problems(cfg.cluster, strategy)
    problems += elastic_problems
    data_problems = _data(cfg.data, planned_replicas(cfg))
    if any(
        problem.key == "data.batch_size" for problem in elastic_problems
    ):  # one line: the multiple every round needs, not MAX's alone
        data_problems = [problem for problem in data_problems if problem.key != "data.batch_size"]
    problems += data_problems
    problems += _optimizer(cfg.optimizer)
    problems += _trainer(cfg.trainer)
    problems += _compute(cfg)
    task_problems = tasks.problems(cfg.task)
    problems += task_problems or _objective(
        cfg.trainer.objective, cfg.task
    )  # the objective is checked against known metrics
    problems += _task_and_data(cfg.task, cfg.data) + _evaluated(cfg)
    problems += _checkpoint(cfg.checkpoint, run_dir)
    problems += _targets(cfg) + callbacks.problems(cfg.get("callbacks"))
    problems += loggers.problems(cfg.logger)
    problems += run_files.problems(cfg, run_dir)
    if run_dir is not None:
        problems += writable("hydra.run.dir", run_dir) or _not_a_runs(
            run_dir, cfg.checkpoint.dir, run_files.names(cfg, run_dir)
        )
    if cfg.checkpoint.dir:
        problems += writable("checkpoint.dir", cfg.checkpoint.dir)
    if problems:
        raise ConfigError(problems)


def planned_replicas(cfg: DictConfig) -> Optional[int]:
    """Replicas the config asks for, when that is known without TensorFlow.

    None when it depends on the devices TensorFlow will find (GPUs); the
    engine checks again once the strategy exists.
    """
    strategy, cluster = _strategy_row(cfg), cfg.cluster
    return strategy.planned_replicas(cluster.workers, cluster.devices_per_worker) if strategy else None


def _strategy_row(cfg: DictConfig) -> Optional[strategies.StrategyRow]:
    """The configured strategy's row of the table; None for a name the strategy check refuses."""
    name, cluster = cfg.strategy.get("name"), cfg.cluster
    return strategies.get(name, cluster.workers, cluster.devices_per_worker) if name in strategies.NAMES else None


def _strategy_and_cluster(strategy: DictConfig, cluster: DictConfig) -> list:
    problems = []
    name = strategy.get("name")
    if name not in strategies.NAMES:
        return [Problem("strategy", name, f"allowed: {', '.join(strategies.NAMES)}")]
    if cluster.workers < 1:
        problems.append(Problem("cluster.workers", cluster.workers, "must be at least 1"))
    if cluster.devices_per_worker is not None and cluster.devices_per_worker < 1:
        problems.append(
            Problem(
                "cluster.devices_per_worker",
                cluster.devices_per_worker,
                "must be at least 1 (or null: all GPUs, else one CPU)",
            )
        )
    if cluster.max_restarts < 0:
        problems.append(Problem("cluster.max_restarts", cluster.max_restarts, "must be 0 or more"))
    for key in ("startup_timeout", "stopped_task_timeout", "peer_timeout", "preemption_grace"):
        if key == "preemption_grace" and cluster[key] is None:  # derived from the checkpoint's save (resolve.py)
            continue
        if not 0 < cluster[key] < math.inf:
            problems.append(Problem(f"cluster.{key}", cluster[key], "seconds, more than 0"))
    if not 1024 <= cluster.base_port <= 65535 - 64 * 500:  # Slurm jobs add up to 64 x 499 (cluster.py)
        problems.append(Problem("cluster.base_port", cluster.base_port, f"a TCP port from 1024 to {65535 - 64 * 500}"))
    if cluster.ps < 0:
        problems.append(Problem("cluster.ps", cluster.ps, "must be 0 or more"))
    if not 0 <= cluster.retryable_exit_offset <= MAX_RETRYABLE_EXIT_OFFSET:
        problems.append(
            Problem(
                "cluster.retryable_exit_offset",
                cluster.retryable_exit_offset,
                f"from 0 to {MAX_RETRYABLE_EXIT_OFFSET} (exit codes stop at 255); "
                "128 for Kubernetes' restartPolicy ExitCode",
            )
        )
    if topology.is_parameter_server_name(cluster.name) and cluster.ps < 1:
        problems.append(
            Problem(
                "cluster",
                cluster.name,
                "a psPwW cluster needs at least one parameter server (P >= 1): "
                "use e.g. ps1w2, or cluster=2x1 for workers only",
            )
        )
    if threads_problem := threads.problem(cluster.get("task_threads", threads.AUTO)):
        problems.append(threads_problem)
    if cluster.launch not in set(LaunchMode):
        problems.append(Problem("cluster.launch", cluster.launch, f"allowed: {', '.join(LaunchMode)}"))
    for notice in cluster.get("notice_signals", ()):
        if notice not in NOTICE_SIGNALS:  # SIGTERM always is one; INT and HUP stop a run (sigterm.py)
            problems.append(
                Problem(
                    "cluster.notice_signals",
                    notice,
                    f"a signal name as Slurm's --signal writes it, one of "
                    f"{', '.join(NOTICE_SIGNALS)} (SIGTERM always is a notice; [] for none besides it)",
                )
            )
    if problems:
        return problems

    chosen = strategies.get(name, cluster.workers, cluster.devices_per_worker)
    problems += chosen.topology_problems(name, cluster.workers, cluster.devices_per_worker, cluster.ps, cluster.name)
    if (
        cluster.get("evaluator") and not chosen.multi_process
    ):  # a sidecar of one process would only evaluate what it evaluates itself
        shown = name if name == chosen.name else f"{name} (here {chosen.name})"
        problems.append(
            Problem(
                "cluster.evaluator",
                True,
                f"a sidecar evaluator is a task beside a multi-process cluster, and "
                f"strategy={shown} trains in one process, which evaluates itself (trainer.eval_every): "
                "use strategy=multiworker or strategy=parameter_server, or leave cluster.evaluator=false",
            )
        )
    problems += priority.problems(cluster.get("nice", 0), chosen.multi_process, cluster.launch, name)
    for key, value in strategy.items():
        if key == "name":
            continue
        if key not in chosen.options:
            takes = ", ".join(f"strategy.{k}" for k in chosen.options) or "no options"
            others = strategies.taking(key)
            elsewhere = f" (strategy.{key} is for strategy={', '.join(others)})" if others else ""
            problems.append(
                Problem(f"strategy.{key}", _shown(value), f"strategy={chosen.name} takes {takes}{elsewhere}")
            )
        elif chosen.options[key].allowed is not None and value not in chosen.options[key].allowed and value is not None:
            problems.append(Problem(f"strategy.{key}", value, f"allowed: {', '.join(chosen.options[key].allowed)}"))
    if "partitioner" in chosen.options:
        problems += strategies.partitioner_problems(strategy.get("partitioner"))
    if mpi.chosen(strategy):
        problems += mpi.problems(
            cluster.launch, cluster.devices_per_worker, strategy.get("all_reduce_dtype"), elastic.is_elastic(cluster)
        )
    pack = strategy.get("bytes_per_pack")
    if pack is not None and (not is_whole(pack) or pack < 0):
        problems.append(
            Problem("strategy.bytes_per_pack", pack, "must be a whole number of bytes, 0 or more (0: one pack)")
        )
    return problems


def _data(data: DictConfig, replicas: Optional[int]) -> list:
    problems = sources.of(data).checks(data)  # the source's own keys
    problems += data_service.problems(data)
    batch = data.get("batch_size")
    if not is_whole(batch) or batch < 1:
        return problems + [
            Problem("data.batch_size", batch, "must be a positive integer (the global batch, split across replicas)")
        ]
    if replicas and batch % replicas:
        problems.append(
            Problem(
                "data.batch_size",
                batch,
                f"the global batch must divide across {replicas} replicas: use a multiple of {replicas}",
            )
        )
    return problems


def _top_level(cfg: DictConfig) -> list:
    """`+foo=1` or `+trainer.foo=1` would be composed and then ignored:
    refused, with the keys there are."""
    known = {f.name for f in dataclasses.fields(Config)} | {"hydra"}
    problems = [
        Problem(
            key,
            _shown(cfg[key]),
            f"not a tfdistx key: the config has {', '.join(f.name for f in dataclasses.fields(Config))}",
        )
        for key in cfg.keys()
        if key not in known
    ]
    for group in dataclasses.fields(Config):
        problems += _unknown_keys(group.name, group.default_factory, cfg.get(group.name))
    return problems


def _unknown_keys(path: str, schema, node) -> list:
    """Keys of `node` its dataclass `schema` does not have, at every depth
    (trainer.early_stopping.foo as well as trainer.foo)."""
    if not dataclasses.is_dataclass(schema) or not OmegaConf.is_dict(node):
        return []
    fields = {f.name: f.default_factory for f in dataclasses.fields(schema)}
    problems = [
        Problem(f"{path}.{key}", _shown(node[key]), f"{path} has no such key; its keys: {', '.join(fields)}")
        for key in node.keys()
        if key not in fields
    ]
    for key, inner in fields.items():
        if key in node:
            problems += _unknown_keys(f"{path}.{key}", inner, node[key])
    return problems


def _shown(value):
    return "{...}" if OmegaConf.is_config(value) else value


def _optimizer(opt: DictConfig) -> list:
    problems = []
    name, target = opt.get("name"), opt.get("_target_")
    if target is not None and name is not None:
        problems.append(
            Problem(
                "optimizer.name", name, f"set with optimizer._target_={target}: name the class once, by one of them"
            )
        )
    elif target is not None and not (isinstance(target, str) and target):
        problems.append(
            Problem("optimizer._target_", target, "the dotted path of an optimizer class, e.g. keras.optimizers.Lion")
        )
    elif target in optimizers.REFUSED:
        problems.append(
            Problem("optimizer._target_", target, f"not an optimizer tfdistx builds: {optimizers.REFUSED[target]}")
        )
    elif target is None and name not in optimizers.CLASSES:
        problems.append(
            Problem(
                "optimizer.name",
                name,
                f"allowed: {', '.join(optimizers.CLASSES)}; or any class by optimizer._target_ (docs/own-project.md)",
            )
        )
    lr = opt.get("lr")
    if not is_number(lr) or not 0 < lr <= FLOAT32_MAX:
        problems.append(Problem("optimizer.lr", lr, "must be a positive, finite number (a float32: at most 3.4e38)"))
    schedule = opt.get("schedule", "constant")
    if OmegaConf.is_dict(schedule) and not isinstance(schedule.get("_target_"), str):
        problems.append(
            Problem(
                "optimizer.schedule._target_",
                schedule.get("_target_"),
                "the dotted path of a learning-rate schedule, e.g. keras.optimizers.schedules.PiecewiseConstantDecay",
            )
        )
    elif not OmegaConf.is_dict(schedule) and schedule not in optimizers.SCHEDULES:
        problems.append(
            Problem(
                "optimizer.schedule",
                schedule,
                f"allowed: {', '.join(optimizers.SCHEDULES)}, or a mapping with the _target_ of a LearningRateSchedule",
            )
        )
    warmup = opt.get("warmup_steps", 0)
    if not is_whole(warmup) or warmup < 0:
        problems.append(Problem("optimizer.warmup_steps", warmup, "must be a whole number, 0 or more"))
    problems += [
        Problem(f"optimizer.{key}", opt[key], allowed)
        for key, allowed, ok in (
            ("beta_1", "a decay rate: at least 0, below 1", lambda v: is_number(v) and 0 <= v < 1),
            ("beta_2", "a decay rate: at least 0, below 1", lambda v: is_number(v) and 0 <= v < 1),
            ("epsilon", "must be a positive, finite number", lambda v: is_number(v) and v > 0),
            ("weight_decay", "must be a finite number, 0 or more", lambda v: is_number(v) and v >= 0),
            ("momentum", "at least 0, below 1", lambda v: is_number(v) and 0 <= v < 1),
            ("min_lr_ratio", "a fraction of optimizer.lr: from 0 to 1", lambda v: is_number(v) and 0 <= v <= 1),
            ("nesterov", "allowed: true, false", lambda v: isinstance(v, bool)),
            ("scale_lr_with_replicas", "allowed: true, false", lambda v: isinstance(v, bool)),
        )
        if key in opt and not ok(opt[key])
    ]
    for key in ("clip_norm", "global_clip_norm"):
        value = opt.get(key)
        if value is not None and not (is_number(value) and value > 0):
            problems.append(
                Problem(f"optimizer.{key}", value, "must be a positive, finite number (or null: no clipping)")
            )
    problems += [
        Problem(f"optimizer.{key}", opt[key], f"tfdistx sets it: set {instead}")
        for key, instead in optimizers.SET_BY_TFDISTX.items()
        if key in opt
    ]
    if opt.get("clip_norm") is not None and opt.get("global_clip_norm") is not None:
        problems.append(
            Problem(
                "optimizer.global_clip_norm",
                opt.global_clip_norm,
                f"set with optimizer.clip_norm={opt.clip_norm}: clip each gradient or all together, not both",
            )
        )
    return problems


def _compute(cfg: DictConfig) -> list:
    """The strategy, precision and XLA keys together (core/compute.py says what cannot work)."""
    trainer = cfg.trainer
    return compute.problems(
        _strategy_row(cfg), trainer.jit_compile, trainer.get("steps_per_xla_call", "auto"), trainer.precision
    )


def _trainer(trainer: DictConfig) -> list:
    problems = []
    if trainer.steps is None and trainer.epochs is None:
        problems.append(Problem("trainer.steps", None, "set trainer.steps or trainer.epochs"))
    for key in ("steps", "epochs", "eval_steps"):
        value = trainer[key]
        if value is not None and not 1 <= value <= MAX_STEPS:
            problems.append(Problem(f"trainer.{key}", value, f"must be at least 1 and at most {MAX_STEPS} (or null)"))
    if not 0 <= trainer.seed < 2**32:
        problems.append(Problem("trainer.seed", trainer.seed, "must be a whole number from 0 to 4294967295"))
    for key in ("steps_per_loop", "log_every"):
        if trainer[key] < 1:
            problems.append(Problem(f"trainer.{key}", trainer[key], "must be at least 1"))
    if trainer.eval_every < 0:
        problems.append(Problem("trainer.eval_every", trainer.eval_every, "must be 0 (only at the end) or more"))
    if trainer.jit_compile not in compute.JIT_COMPILE or is_whole(trainer.jit_compile):
        problems.append(Problem("trainer.jit_compile", trainer.jit_compile, "allowed: true, false, auto"))
    per_call = trainer.get("steps_per_xla_call", "auto")
    if per_call != "auto" and not (is_whole(per_call) and per_call >= 1):
        problems.append(
            Problem("trainer.steps_per_xla_call", per_call, "allowed: auto, or a whole number of steps, at least 1")
        )
    if trainer.precision not in compute.PRECISIONS:
        problems.append(Problem("trainer.precision", trainer.precision, f"allowed: {', '.join(compute.PRECISIONS)}"))
    if trainer.accumulate_steps < 1:
        problems.append(
            Problem("trainer.accumulate_steps", trainer.accumulate_steps, "must be at least 1 (1: no accumulation)")
        )
    return problems + _early_stopping(trainer) + _profile_steps(trainer)


def _profile_steps(trainer: DictConfig) -> list:
    """[START, END] in the loop's steps (steps done, as the step lines count
    them). END is checked against trainer.steps when that is set; a run of
    epochs learns its steps from the data, and the engine says so if it ends
    before END (the trace then stops with the run)."""
    value = trainer.get("profile_steps")
    if value is None:
        return []
    shown = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    steps = trainer.steps if is_whole(trainer.steps) else None
    end = f"END <= trainer.steps={steps}" if steps is not None else "END"
    allowed = (
        f"[START, END]: two whole steps, 0 <= START < {end} (the trace covers the steps between), or null: no trace"
    )
    if not OmegaConf.is_list(value) or len(value) != 2 or not all(is_whole(v) for v in value):
        return [Problem("trainer.profile_steps", shown, allowed)]
    start, stop = value
    if not 0 <= start < stop or (steps is not None and stop > steps):
        return [Problem("trainer.profile_steps", shown, allowed)]
    return []


def _early_stopping(trainer: DictConfig) -> list:
    stopping = trainer.early_stopping
    if stopping.patience is not None and stopping.patience < 1:
        return [
            Problem(
                "trainer.early_stopping.patience",
                stopping.patience,
                "evaluations without an improvement: at least 1 (or null: never stop early)",
            )
        ]
    if not is_number(stopping.min_delta) or stopping.min_delta < 0:
        return [Problem("trainer.early_stopping.min_delta", stopping.min_delta, "must be a finite number, 0 or more")]
    if stopping.min_delta and stopping.patience is None:  # a key that would do nothing
        return [
            Problem(
                "trainer.early_stopping.min_delta",
                stopping.min_delta,
                "applies only with trainer.early_stopping.patience, "
                "which is null (never stop early): set the patience too, or leave min_delta out",
            )
        ]
    # eval_every=0 evaluates once, at the end: patience would count nothing (keep_best only warns: its best is the last)
    if stopping.patience is not None and trainer.eval_every == 0 and str(trainer.objective).startswith("eval/"):
        return [
            Problem(
                "trainer.early_stopping.patience",
                stopping.patience,
                f"counts evaluations of trainer.objective={trainer.objective}, and trainer.eval_every=0 "
                "evaluates only at the end: set trainer.eval_every, or a training metric as the objective "
                "(e.g. trainer.objective=loss)",
            )
        ]
    return []


def _objective(objective, task: DictConfig) -> list:
    # A task whose yaml says what it offers reports its metrics; a user's
    # task is checked once it is built (engine/build.py).
    if task.get("offers") is None or task.get("metrics") is None:
        return []
    return objective_problems(objective, task.get("name", task.get("_target_")), task.metrics)


def _task_and_data(task: DictConfig, data: DictConfig) -> list:
    """A task on a built-in source's labels it cannot learn from (binary on
    real values would train with AUC and accuracy 0). Class labels are
    checked once the source is built (Task.check_labels)."""
    return tasks.real_values_problems(task, sources.of(data).labels, current(data._target_))


def _evaluated(cfg: DictConfig) -> list:
    """keep_best and early stopping by an eval/ objective need an eval split;
    a built-in source's config says whether it has one (a user's source is
    checked once built: engine/build.py)."""
    key = sources.no_eval_split(cfg.data)
    if key is None:
        return []
    no_eval = f"data={current(cfg.data._target_)} has no eval split ({key}={cfg.data.get(key.partition('.')[2])})"
    return unevaluated_problems(
        cfg.trainer.objective, cfg.checkpoint.keep_best, cfg.trainer.early_stopping.patience, no_eval, f"give {key}"
    )


def _checkpoint(ckpt: DictConfig, run_dir: Optional[str] = None) -> list:
    problems = []
    if ckpt.every_steps < 0:
        problems.append(Problem("checkpoint.every_steps", ckpt.every_steps, "must be 0 (only at the end) or more"))
    if ckpt.max_to_keep < 1:
        problems.append(Problem("checkpoint.max_to_keep", ckpt.max_to_keep, "must be at least 1"))
    checkpoint_dir = paths.checkpoint_dir(ckpt.dir, run_dir) if ckpt.dir or run_dir else None
    set_aside = (
        (run_dir, checkpoint_dir) if run_dir and not ckpt.restore else ()
    )  # what fit.train keeps aside before it starts
    return problems + warm_start.problems(
        ckpt.init_from, ckpt.init_skip, warm_start.resumes(checkpoint_dir, ckpt.restore), set_aside
    )


# The keywords tfdistx passes a group's target itself, where it takes them (engine/parts.py, callbacks.py,
# loggers.py, optim.py).
RUNTIME = {
    "model": ("input_shape", "feature_spec", "num_outputs", "num_classes"),
    "optimizer": ("learning_rate", "clipnorm", "global_clipnorm"),
    "callbacks": ("run_dir",),
    "logger": ("run_dir", "config"),
}


def _targets(cfg: DictConfig) -> list:
    """Every `_target_` (task, model, data, optimizer, its schedule, callbacks,
    loggers, and the mappings with a `_target_` inside their keys) must name
    a class or function that exists and takes the keys given: read from its
    source (static_targets.py), without importing it, which may import
    TensorFlow. What the source does not say for sure is left to the
    engine, which checks again when it builds the target."""
    callbacks = cfg.get("callbacks")
    callbacks = {} if callbacks is None else callbacks  # callbacks=none: a file of comments only
    if not OmegaConf.is_dict(callbacks) and not isinstance(callbacks, dict):
        return [
            Problem(
                "callbacks",
                _shown(callbacks),
                "a mapping of NAME: {_target_: ..., its keys}, or a list of "
                "options: callbacks=[terminate_on_nan,csv_logger]",
            )
        ]
    targets = [
        ("task", cfg.task, TASK_KEYS + TASK_FACTS, ()),
        ("data", cfg.data, tuple(PIPELINE_DEFAULTS), ()),
        ("model", cfg.model, (), RUNTIME["model"]),
    ]
    target = optimizers.target_of(cfg.optimizer)
    if target and target not in optimizers.REFUSED:  # else refused by _optimizer
        targets.append(
            ("optimizer", {**cfg.optimizer, "_target_": target}, (*OPTIMIZER_KEYS, "name"), RUNTIME["optimizer"])
        )
    if OmegaConf.is_dict(cfg.optimizer.get("schedule")) and isinstance(cfg.optimizer.schedule.get("_target_"), str):
        targets.append(("optimizer.schedule", cfg.optimizer.schedule, (), ()))
    targets += [(f"callbacks.{name}", callback, (), RUNTIME["callbacks"]) for name, callback in callbacks.items()]
    targets += [
        (f"logger.{name}", own, (), RUNTIME["logger"])
        for name, own in cfg.logger.items()
        if OmegaConf.is_dict(own) and "_target_" in own
    ]  # the user's own loggers
    problems = []
    for key, group, exclude, runtime in targets:
        problems += _target(key, group, exclude, runtime)
    return problems


def _target(key: str, group, exclude: tuple = (), runtime: tuple = ()) -> list:
    """One target's problems, and those of the targets inside its keys (LambdaCallback's functions)."""
    target = group.get("_target_") if OmegaConf.is_dict(group) or isinstance(group, dict) else group
    if not isinstance(target, str) or "." not in target:
        return [
            Problem(
                f"{key}._target_",
                _shown(target),
                "must be a dotted path to a function or class, e.g. mypkg.models.build",
            )
        ]
    keys = {name: _shown(group[name]) for name in group if name not in ("_target_", "_partial_", *exclude)}
    problems = static_targets.problems(key, current(target), keys, runtime)
    for name in keys:
        inner = group[name]
        if OmegaConf.is_dict(inner) and "_target_" in inner:
            problems += _target(f"{key}.{name}", inner)
    return problems


def writable(key: str, path: str) -> list:
    """`path` must be given, and its nearest existing ancestor a writable directory."""
    if path is None or not str(path).strip():  # os.path.abspath("") is the current directory
        return [
            Problem(key, path, "must name a directory: an empty one would write the run into the current directory")
        ]
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        return [Problem(key, path, f"cannot create the directory here: {probe} is not a directory")]
    try:  # tried, not os.access: root passes that on a read-only mount or /proc
        tempfile.TemporaryFile(dir=probe).close()
    except OSError as error:
        return [Problem(key, path, f"cannot create the directory here: {probe} is not writable ({error.strerror})")]
    return []


def _not_a_runs(run_dir: str, checkpoint_dir: Optional[str], also=()) -> list:
    """A directory tfdistx did not make, holding names a run writes: the run
    would write over them (metrics, summary) or into them (checkpoints).
    `also`: what the run's loggers and callbacks write there."""
    found = rundir.in_the_way(run_dir, checkpoint_dir, also)
    if not found:
        return []
    return [
        Problem(
            "hydra.run.dir",
            run_dir,
            f"holds {', '.join(found)}, which a run writes, and tfdistx did not make it "
            f"(no {rundir.LOCK_NAME}): name a new directory, or move them (nothing was changed)",
        )
    ]
