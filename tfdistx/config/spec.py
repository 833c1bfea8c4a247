"""One resolved run spec: the composed config, turned once into typed,
frozen objects that the engine reads.

The config side (Hydra, OmegaConf, validation) ends here. The engine is
handed a RunSpec and never sees a DictConfig, so it imports neither Hydra
nor OmegaConf; every default it relies on is resolved here, once (the
schema's dataclasses and PIPELINE_DEFAULTS). The user's own code (model,
data source, task) is a Target: its `_target_` and keys, built by Hydra's
`instantiate` when the engine asks (config/targets.py).
"""

from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Optional, Union

from omegaconf import DictConfig, OmegaConf

from tfdistx.config import strategies
from tfdistx.config.schema import PIPELINE_DEFAULTS, TASK_KEYS
from tfdistx.config.targets import Target


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


@dataclass(frozen=True)
class Checkpoint:
    dir: str  # resolved: checkpoint.dir, or <run dir>/checkpoints
    every_steps: int
    max_to_keep: int
    restore: bool
    export: bool


@dataclass(frozen=True)
class Cluster:
    name: str
    workers: int
    ps: int
    devices_per_worker: Optional[int]
    startup_timeout: float


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


def resolve(cfg: DictConfig, run_dir: str = ".") -> RunSpec:
    """The run spec of a composed, validated config, for a run in `run_dir`
    (a command that writes no run, such as `data write`, leaves it out)."""
    # Each group resolved in place (interpolations see the whole config), the hydra node left out:
    # outside a Hydra job its runtime keys (hydra.job.num) have no value.
    plain = {key: OmegaConf.to_container(cfg[key], resolve=True) if OmegaConf.is_config(cfg[key]) else cfg[key]
             for key in cfg if key != "hydra"}
    trainer, ckpt, cluster, data = plain["trainer"], plain["checkpoint"], plain["cluster"], plain["data"]
    strategy = dict(plain["strategy"])
    name = strategy.pop("name")
    return RunSpec(
        run_dir=Path(run_dir),
        trainer=Trainer(**trainer),
        checkpoint=Checkpoint(dir=ckpt["dir"] or str(Path(run_dir) / "checkpoints"), every_steps=ckpt["every_steps"],
                              max_to_keep=ckpt["max_to_keep"], restore=ckpt["restore"], export=ckpt["export"]),
        cluster=Cluster(name=cluster["name"], workers=cluster["workers"], ps=cluster["ps"],
                        devices_per_worker=cluster["devices_per_worker"], startup_timeout=cluster["startup_timeout"]),
        strategy=Strategy(name, _frozen(strategy), strategies.get(name, cluster["workers"], cluster["devices_per_worker"])),
        pipeline=Pipeline(**{key: data.get(key, default) for key, default in PIPELINE_DEFAULTS.items()}),
        task=Target.of("task", plain["task"], exclude=TASK_KEYS),
        data=Target.of("data", data, exclude=tuple(PIPELINE_DEFAULTS)),
        model=Target.of("model", plain["model"]),
        optimizer=_frozen(plain["optimizer"]),
        logger=_frozen(plain["logger"]),
        config=_frozen(plain),
    )


def _frozen(mapping: dict) -> Mapping[str, Any]:
    return MappingProxyType(mapping)
