"""The loggers tfdistx ships, in one table: a row each. The checks before
TensorFlow starts (config/loggers.py), the run spec (config/resolve.py),
--plan's loggers line, the run dir's files (config/run_files.py), Hydra's
overrides (config/compose.py) and the engine's `for_run`
(engine/loggers.py) all read it, so a new built-in logger is its class,
a row here and its keys in conf/logger/ (docs/development.md).

A row names its class by dotted path (`target`), as a user's
`logger.NAME._target_` does, and the engine builds it by that path: with
the row's keys, and what its signature takes of the run's run_dir,
config, total_steps and start_step (engine/loggers.for_run). metrics.jsonl is not a row: every chief writes it, and no
key turns it off. No TensorFlow, no Hydra here.
"""

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping, Optional, Tuple

@dataclass(frozen=True)
class BuiltInLogger:
    """One built-in logger. `keys`: None for a switch (`logger.NAME=true|false`,
    on by `on`); else its keys with their defaults, and it is a block turned
    on by `logger.NAME.enabled`."""

    name: str  # its key in the logger group: logger.NAME
    target: str  # the callable the engine builds it with: its class, or a classmethod of it
    shown: Callable[[Mapping[str, Any]], str]  # its name on --plan's loggers line, from its keys
    on: bool = False  # a switch's default
    keys: Optional[Mapping[str, Any]] = None  # a block's keys (less `enabled`) and their defaults
    seconds: Tuple[str, ...] = ()  # those of its keys that are a timeout in seconds (more than 0)
    files: Tuple[str, ...] = ()  # what it writes in the run dir (first names), for the run dir's checks

    @property
    def switch(self) -> str:
        """The key that turns it on: `csv`, or `wandb.enabled`."""
        return self.name if self.keys is None else f"{self.name}.enabled"


def _mlflow_shown(keys: Mapping[str, Any]) -> str:
    return f"mlflow ({keys['tracking_uri'] or 'MLFLOW_TRACKING_URI, else <run dir>/mlflow.db'})"


# In --plan's order, which is also the order the engine opens them in.
BUILT_IN: Tuple[BuiltInLogger, ...] = (
    BuiltInLogger("console", "tfdistx.engine.progress.ConsoleProgress", lambda keys: "terminal", on=True),
    BuiltInLogger("tensorboard", "tfdistx.engine.sinks.TensorBoardLogger.for_run", lambda keys: "tensorboard", on=True),
    BuiltInLogger("csv", "tfdistx.engine.sinks.CsvLogger.for_run", lambda keys: "metrics.csv", files=("metrics.csv",)),
    BuiltInLogger("wandb", "tfdistx.engine.sinks.WandbLogger", lambda keys: "wandb",
                  keys=MappingProxyType({"project": "tfdistx", "entity": None, "mode": None, "tags": [], "init_timeout": 30.0}),
                  seconds=("init_timeout",), files=("wandb",)),
    BuiltInLogger("mlflow", "tfdistx.engine.mlflow_logger.MlflowLogger.for_run", _mlflow_shown,
                  keys=MappingProxyType({"experiment": "tfdistx", "tracking_uri": None, "run_name": None, "timeout": 30.0}),
                  seconds=("timeout",), files=("mlflow.json", "mlflow.db", "mlartifacts")),
)


def switches() -> Tuple[BuiltInLogger, ...]:
    """The built-in loggers turned on and off by `logger.NAME=true|false`."""
    return tuple(row for row in BUILT_IN if row.keys is None)


def blocks() -> Tuple[BuiltInLogger, ...]:
    """The built-in loggers with keys of their own, turned on by `logger.NAME.enabled`."""
    return tuple(row for row in BUILT_IN if row.keys is not None)


def named(name: str) -> Optional[BuiltInLogger]:
    return next((row for row in BUILT_IN if row.name == name), None)


def settings(row: BuiltInLogger, group: Mapping[str, Any]) -> Optional[dict]:
    """The keys a built-in logger is built with, as the logger group (plain
    data) sets them, with its defaults; None when it is off."""
    if row.keys is None:
        return {} if bool(group.get(row.name, row.on)) else None
    keys = dict(group.get(row.name) or {})
    if not keys.pop("enabled", False):
        return None
    return {**row.keys, **{key: value for key, value in keys.items() if key in row.keys}}
