"""A composed config, resolved once into the run spec (core/run_spec.py).

The config side (Hydra, OmegaConf, validation) ends here: interpolations
are resolved, every key a group may leave out gets its default (from the
schema's dataclasses and the defaults beside them in schema.py, and the
built-in loggers' in their classes' signatures, tfdistx/loggers/: the one place each is set), and
the groups become typed, frozen data. The engine is handed the RunSpec
and never sees a DictConfig.
"""

import dataclasses
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Optional

from omegaconf import DictConfig, OmegaConf

from tfdistx import loggers as builtin_loggers
from tfdistx.core import checkpoint_size, data_service, optimizers, strategies, warm_start
from tfdistx.core import elastic as elastic_spec
from tfdistx.config.compose import saved_config
from tfdistx.core import paths
from tfdistx.core.errors import ConfigError
from tfdistx.core.launch_mode import LaunchMode
from tfdistx.config.schema import (
    OPTIMIZER_DEFAULTS,
    OPTIMIZER_KEYS,
    PIPELINE_DEFAULTS,
    TASK_FACTS,
    TASK_KEYS,
    AgentConfig,
    CheckpointConfig,
    ClusterConfig,
    EarlyStoppingConfig,
    ElasticConfig,
    TrainerConfig,
)
from tfdistx.core.run_spec import (
    Agent,
    Bounds,
    Checkpoint,
    Cluster,
    DataService,
    EarlyStopping,
    Elastic,
    InitFrom,
    Layout,
    Logger,
    Optimizer,
    Pipeline,
    RunSpec,
    Strategy,
    Trainer,
)
from tfdistx.core.targets import Target, current


def resolve(cfg: DictConfig, run_dir: str = ".", follow_init_from: bool = True) -> RunSpec:
    """The run spec of a composed, validated config, for a run in `run_dir`
    (a command that writes no run, such as `data write`, leaves it out).
    `follow_init_from=False`: checkpoint.init_from is left unresolved (a
    warm start's source run is not asked where its own weights came from)."""
    plain = _plain(cfg, [key for key in cfg if key != "hydra"])
    _named_by_the_job(plain["logger"], run_dir)
    # Defaults for keys a saved config of a run from before them (a warm start's source, `tfdistx export`) lacks.
    trainer = _with_defaults(plain["trainer"], TrainerConfig)
    ckpt = _with_defaults(plain["checkpoint"], CheckpointConfig)
    data = plain["data"]
    checkpoint_dir = paths.checkpoint_dir(ckpt["dir"], run_dir)
    profile = trainer["profile_steps"]
    layout = _layout(plain, checkpoint_dir, run_dir)
    return RunSpec(
        run_dir=Path(run_dir),
        trainer=Trainer(
            **{
                **trainer,
                "early_stopping": EarlyStopping(**_with_defaults(trainer["early_stopping"], EarlyStoppingConfig)),
                "profile_steps": tuple(profile) if profile is not None else None,
            }
        ),
        checkpoint=Checkpoint(
            dir=checkpoint_dir,
            every_steps=ckpt["every_steps"],
            background=bool(ckpt["background"]),
            max_to_keep=ckpt["max_to_keep"],
            restore=ckpt["restore"],
            export=ckpt["export"],
            keep_best=bool(ckpt["keep_best"]),
            init_from=_init_from(ckpt["init_from"], warm_start.resumes(checkpoint_dir, ckpt["restore"]))
            if follow_init_from
            else None,
            init_skip=tuple(ckpt["init_skip"] or ()),
        ),
        cluster=layout.cluster,
        strategy=layout.strategy,
        pipeline=_pipeline(data),
        task=Target.of("task", plain["task"], exclude=TASK_KEYS + TASK_FACTS),
        data=Target.of("data", data, exclude=tuple(PIPELINE_DEFAULTS)),
        model=Target.of("model", plain["model"]),
        optimizer=_optimizer(plain["optimizer"]),
        logger=_logger(plain["logger"]),
        config=_frozen(plain),
        callbacks=_frozen(
            {name: Target.of(f"callbacks.{name}", keys) for name, keys in (plain.get("callbacks") or {}).items()}
        ),
    )


def layout_of(cfg: DictConfig) -> Layout:
    """The part of the run spec that says where the processes go (strategy,
    cluster, data.service): all that placement and a launcher read, resolved
    without the rest (a process that only launches, or a manifest, needs
    no warm-start source or model)."""
    return _layout(_plain(cfg, ["strategy", "cluster", "data", "model", "optimizer"]))


def _plain(cfg: DictConfig, keys) -> dict:
    """Each group resolved in place (interpolations see the whole config).
    Never the hydra node: outside a Hydra job its runtime keys (hydra.job.num) have no value."""
    return {
        key: OmegaConf.to_container(cfg[key], resolve=True) if OmegaConf.is_config(cfg[key]) else cfg[key]
        for key in keys
    }


def _layout(plain: Mapping[str, Any], checkpoint_dir: Optional[str] = None, run_dir: Optional[str] = None) -> Layout:
    cluster = _with_defaults(plain["cluster"], ClusterConfig)
    if cluster["preemption_grace"] is None:  # the user's, else what the checkpoint's expected save needs
        found = checkpoint_size.estimate(plain, checkpoint_dir, run_dir)
        cluster = {**cluster, "preemption_grace": float(checkpoint_size.grace_seconds(found))}
    elastic = cluster["elastic"]
    elastic = (
        dataclasses.asdict(elastic) if dataclasses.is_dataclass(elastic) else _with_defaults(elastic, ElasticConfig)
    )
    agent = cluster["agent"]
    agent = dataclasses.asdict(agent) if dataclasses.is_dataclass(agent) else _with_defaults(agent, AgentConfig)
    in_rounds = elastic["min_workers"] is not None
    strategy = dict(plain["strategy"])
    name = strategy.pop("name")
    return Layout(
        strategy=Strategy(
            name, _frozen(strategy), strategies.get(name, cluster["workers"], cluster["devices_per_worker"])
        ),
        cluster=Cluster(
            **{
                **{key: cluster[key] for key in _names(Cluster) if key != "rounds"},
                "notice_signals": tuple(cluster["notice_signals"]),
                "launch": LaunchMode(cluster["launch"]),
                "elastic": Elastic(**{key: elastic[key] for key in _names(Elastic)}) if in_rounds else None,
                "agent": Agent(**agent) if cluster["launch"] == LaunchMode.AGENT else None,
                "rounds": _rounds(cluster, elastic),
            }
        ),
        service=_service_of(plain["data"]),
    )


def _with_defaults(given: Optional[Mapping[str, Any]], schema) -> dict:
    """`given` with every field of the schema's dataclass it lacks at its default."""
    defaults = {
        f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        for f in dataclasses.fields(schema)
    }
    return {**defaults, **(given or {})}


def _rounds(cluster: Mapping[str, Any], elastic: Mapping[str, Any]) -> Optional[Bounds]:
    """The bounds of a run in rounds: an elastic run's, or a fixed run's agents' (MIN = MAX, cluster.workers);
    None for a fixed set of tasks."""
    if elastic["min_workers"] is None and cluster["launch"] != LaunchMode.AGENT:
        return None
    low = elastic["min_workers"] if elastic["min_workers"] is not None else cluster["workers"]
    timeouts = {key: elastic[key] for key in elastic_spec.TIMEOUT_KEYS}
    return Bounds(min=low, max=cluster["workers"], **timeouts)


def _names(spec_class) -> list:
    return [f.name for f in dataclasses.fields(spec_class)]


def _pipeline(data: Mapping[str, Any]) -> Pipeline:
    keys = {key: data.get(key, default) for key, default in PIPELINE_DEFAULTS.items()}
    return Pipeline(**{**keys, "service": _service_of(data)})


def _service_of(data: Mapping[str, Any]) -> Optional[DataService]:
    on = data_service.settings(data)  # None: off
    return DataService(**on) if on else None


def _optimizer(group: Mapping[str, Any]) -> Optimizer:
    keys = {**OPTIMIZER_DEFAULTS, **group}
    schedule = keys["schedule"]
    return Optimizer(
        **{key: keys[key] for key in OPTIMIZER_KEYS if key not in ("name", "schedule")},
        name=optimizers.shown_name(group),
        target=current(optimizers.target_of(group)),
        schedule=Target.of("optimizer.schedule", schedule) if isinstance(schedule, Mapping) else schedule,
        options=_frozen({key: value for key, value in group.items() if key not in (*OPTIMIZER_KEYS, "_target_")}),
    )


def _logger(group: Mapping[str, Any]) -> Logger:
    """The built-in loggers that are on (tfdistx/loggers/: each a Target of
    its class, with its keys), and the user's own."""
    on = {
        row.name: Target(f"logger.{row.name}", row.target(), _frozen(keys))
        for row in builtin_loggers.built_in()
        if (keys := row.settings(group)) is not None
    }
    return Logger(
        on=_frozen(on),
        own=_frozen({name: Target.of(f"logger.{name}", keys) for name, keys in group.items() if _own_logger(keys)}),
    )


def _named_by_the_job(group: dict, run_dir: str) -> None:
    """The built-in loggers' keys left null that the job names (BuiltInLogger.from_job: W&B's group and name),
    filled in the logger group: the resolved config a cluster's tasks read says the same."""
    names = job_names(run_dir)
    for row in builtin_loggers.built_in():
        if not row.from_job or row.settings(group) is None:
            continue
        keys = group.setdefault(row.name, {})
        for key, fact in row.from_job.items():
            if keys.get(key) is None and names.get(fact) is not None:
                keys[key] = names[fact]


def job_names(run_dir: str) -> dict:
    """What names this job: `sweep`, the multirun's sweep directory (as given: relative to where it started, or
    absolute; its last 128 characters, W&B's limit), None for a single run; `run`, a multirun job's overrides
    (hydra.job.override_dirname), else the run directory's name. Hydra's runtime says it only inside the job that
    made the run dir (a local cluster's tasks read it from the resolved config)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    names = {"sweep": None, "run": Path(run_dir).resolve().name}
    if not HydraConfig.initialized():
        return names
    job = HydraConfig.get()
    if job.mode != RunMode.MULTIRUN or Path(job.runtime.output_dir).resolve() != Path(run_dir).resolve():
        return names
    sweep, separator = str(job.sweep.dir), job.job.config.override_dirname.item_sep
    # Without the `++` that tfdistx puts before a key of its own groups (compose.keys_for_own_targets): as typed.
    run = separator.join(item.removeprefix("++") for item in job.job.override_dirname.split(separator))
    return {"sweep": sweep[-128:], "run": run or names["run"]}


def _own_logger(keys) -> bool:
    """A logger group's entry that is a user's logger: a mapping with a `_target_`."""
    return isinstance(keys, Mapping) and "_target_" in keys


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
            raise ConfigError.for_key("checkpoint.init_from", path, why)
        source_run = warm_start.run_dir_of(path, kind)
        source = resolve(saved_config(str(source_run)), str(source_run), follow_init_from=False) if source_run else None
    except ConfigError:
        if resumes:
            return InitFrom(path=str(path), kind=None)
        raise
    return InitFrom(path=str(path), kind=kind, spec=source)


def _frozen(mapping: dict) -> Mapping[str, Any]:
    return MappingProxyType(mapping)
