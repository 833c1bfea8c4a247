"""One resolved run spec: the composed config, turned once into typed,
frozen objects that the engine reads.

The config side (Hydra, OmegaConf, validation) ends here. The engine is
handed a RunSpec and never sees a DictConfig, so it imports neither Hydra
nor OmegaConf; every default it relies on is resolved here, once (the
schema's dataclasses and PIPELINE_DEFAULTS). The user's own code (model,
data source, task) is a Target: its `_target_` and keys, built by Hydra's
`instantiate` when the engine asks (config/targets.py).
"""

from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Optional, Tuple, Union

from omegaconf import DictConfig, OmegaConf

from tfdistx.config import strategies, warm_start
from tfdistx.config.compose import saved_config
from tfdistx.config.errors import ConfigError
from tfdistx.config.schema import PIPELINE_DEFAULTS, TASK_KEYS, ClusterConfig
from tfdistx.config.targets import Target


@dataclass(frozen=True)
class EarlyStopping:
    patience: Optional[int] = None  # evaluations (of a train objective: logged steps) without an improvement; None: off
    min_delta: float = 0.0


@dataclass(frozen=True)
class Trainer:
    steps: Optional[int]
    epochs: Optional[int]
    steps_per_loop: int
    log_every: int
    eval_every: int  # 0: at the end only
    eval_steps: Optional[int]  # None: the whole eval split
    seed: int
    deterministic: bool
    objective: str
    jit_compile: Union[bool, str]  # True, False or "auto" (config/compute.py decides)
    precision: str
    accumulate_steps: int
    early_stopping: EarlyStopping = field(default_factory=EarlyStopping)
    profile_steps: Optional[Tuple[int, int]] = None  # (START, END): the profiler traces the steps between; None: no trace
    steps_per_xla_call: Union[int, str] = "auto"  # N or "auto" (config/compute.py decides)


@dataclass(frozen=True)
class Checkpoint:
    dir: str  # resolved: checkpoint.dir, or <run dir>/checkpoints
    every_steps: int
    max_to_keep: int
    restore: bool
    export: bool
    keep_best: bool = False
    init_from: Optional["InitFrom"] = None
    init_skip: Tuple[str, ...] = ()


@dataclass(frozen=True)
class InitFrom:
    """A warm start's source (config/warm_start.py)."""

    path: str  # as given (summary.json says it)
    kind: Optional[str]  # warm_start.RUN, CHECKPOINT, KERAS or WEIGHTS; None: not looked at (the run resumes)
    # The source run's own resolved spec, when the path is a run or a checkpoint inside one: its model is
    # rebuilt as that run built it. None: a bare checkpoint or a Keras file, read with this run's spec.
    spec: Optional["RunSpec"] = None


@dataclass(frozen=True)
class Cluster:
    name: str
    workers: int
    ps: int
    devices_per_worker: Optional[int]
    startup_timeout: float
    peer_timeout: float  # seconds before a task that stopped answering counts as lost
    preemption_grace: float  # seconds from SIGTERM to SIGKILL
    retryable_exit_offset: int  # added to the exit codes a restart cures (config/errors.py)


@dataclass(frozen=True)
class Strategy:
    name: str  # as configured ("auto" is made concrete by the engine, which sees the devices)
    options: Mapping[str, Any]  # the strategy group's other keys
    facts: strategies.Strategy  # the configured strategy's row


@dataclass(frozen=True)
class Pipeline:
    """The input pipeline's keys of the data group (the rest go to the source)."""

    batch_size: int  # the global batch of one micro-step
    cache: bool
    shuffle_buffer: int
    service: Optional[Mapping[str, Any]] = None  # data.service: {workers, mode} (config/data_service.py)


@dataclass(frozen=True)
class RunSpec:
    run_dir: Path
    trainer: Trainer
    checkpoint: Checkpoint
    cluster: Cluster
    strategy: Strategy
    pipeline: Pipeline
    task: Target
    data: Target
    model: Target
    optimizer: Mapping[str, Any]
    logger: Mapping[str, Any]
    config: Mapping[str, Any]  # the whole resolved config, as the loggers record it


def resolve(cfg: DictConfig, run_dir: str = ".", follow_init_from: bool = True) -> RunSpec:
    """The run spec of a composed, validated config, for a run in `run_dir`
    (a command that writes no run, such as `data write`, leaves it out).
    `follow_init_from=False`: checkpoint.init_from is left unresolved (a
    warm start's source run is not asked where its own weights came from)."""
    # Each group resolved in place (interpolations see the whole config), the hydra node left out:
    # outside a Hydra job its runtime keys (hydra.job.num) have no value.
    plain = {key: OmegaConf.to_container(cfg[key], resolve=True) if OmegaConf.is_config(cfg[key]) else cfg[key]
             for key in cfg if key != "hydra"}
    trainer, ckpt, cluster, data = dict(plain["trainer"]), plain["checkpoint"], plain["cluster"], plain["data"]
    checkpoint_dir = ckpt["dir"] or str(Path(run_dir) / "checkpoints")
    # .get: the saved config of a run from before these keys (a warm start's source, `tfdistx export`) lacks them
    stopping = EarlyStopping(**(trainer.pop("early_stopping", None) or {}))
    profile = trainer.pop("profile_steps", None)
    strategy = dict(plain["strategy"])
    name = strategy.pop("name")
    return RunSpec(
        run_dir=Path(run_dir),
        trainer=Trainer(**trainer, early_stopping=stopping, profile_steps=tuple(profile) if profile is not None else None),
        checkpoint=Checkpoint(dir=checkpoint_dir, every_steps=ckpt["every_steps"],
                              max_to_keep=ckpt["max_to_keep"], restore=ckpt["restore"], export=ckpt["export"],
                              keep_best=bool(ckpt.get("keep_best", False)),
                              init_from=_init_from(ckpt.get("init_from"), warm_start.resumes(checkpoint_dir, ckpt["restore"]))
                              if follow_init_from else None,
                              init_skip=tuple(ckpt.get("init_skip") or ())),
        cluster=Cluster(**{key: cluster.get(key, getattr(ClusterConfig, key)) for key in Cluster.__dataclass_fields__}),
        strategy=Strategy(name, _frozen(strategy), strategies.get(name, cluster["workers"], cluster["devices_per_worker"])),
        pipeline=Pipeline(**{key: data.get(key, default) for key, default in PIPELINE_DEFAULTS.items()}),
        task=Target.of("task", plain["task"], exclude=TASK_KEYS),
        data=Target.of("data", data, exclude=tuple(PIPELINE_DEFAULTS)),
        model=Target.of("model", plain["model"]),
        optimizer=_frozen(plain["optimizer"]),
        logger=_frozen(plain["logger"]),
        config=_frozen(plain),
    )


def _init_from(path: Optional[str], resumes: bool) -> Optional[InitFrom]:
    """The warm start's source, its run's spec resolved from that run's saved
    config (validate.py has checked the path; it is looked at again here,
    where a config that was composed earlier is resolved). A run that
    resumes does not apply it: a source deleted or changed since is left
    unresolved rather than stopping the resume."""
    if path is None:
        return None
    try:
        kind, why = warm_start.kind(path)
        if why:
            raise ConfigError.one("checkpoint.init_from", path, why)
        source_run = warm_start.run_dir_of(path, kind)
        source = resolve(saved_config(str(source_run)), str(source_run), follow_init_from=False) if source_run else None
    except ConfigError:
        if resumes:
            return InitFrom(path=str(path), kind=None)
        raise
    return InitFrom(path=str(path), kind=kind, spec=source)


def _frozen(mapping: dict) -> Mapping[str, Any]:
    return MappingProxyType(mapping)
