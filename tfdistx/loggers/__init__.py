"""The loggers tfdistx ships, each a class in a module of this package that
says its own facts (a subclass of BuiltInLogger), with its YAML in
conf/logger/. The checks before TensorFlow starts (config/loggers.py), the
run spec (config/resolve.py), --plan's loggers line, the run dir's files
(config/run_files.py), Hydra's overrides (config/compose.py) and the
engine's `for_run` (engine/loggers.py) all find them here, so a new built-in
logger is one class and one YAML file (docs/development.md).

A built-in logger is built as a user's `logger.NAME._target_` is: by its
dotted path (its `for_run` where it has one, else the class), with its keys
and what its signature takes of the run's RUNTIME values
(engine/loggers.for_run). Its keys and their defaults are that signature's:
a logger that takes none is a switch (`logger.csv=true`), one that takes
some a block turned on by `logger.NAME.enabled`. metrics.jsonl is not one:
every chief writes it, and no key turns it off. Plain Python: no
TensorFlow (TensorBoard's is imported when its logger opens), no Hydra.
"""

import functools
import importlib
import inspect
import pkgutil
from typing import Any, Callable, ClassVar, Mapping, Optional, Tuple

# What the run passes a logger whose signature takes it, beside its keys.
RUNTIME = ("run_dir", "config", "total_steps", "start_step")


class BuiltInLogger:
    """A logger tfdistx ships. A subclass sets `name` and says what else
    is not the default below; its constructor gives each key a default."""

    name: ClassVar[str] = ""  # its key in the logger group: logger.NAME
    on: ClassVar[bool] = False  # a switch's default (a block is off until logger.NAME.enabled=true)
    seconds: ClassVar[Tuple[str, ...]] = ()  # those of its keys that are a timeout in seconds (more than 0)
    files: ClassVar[Tuple[str, ...]] = ()  # what it writes in the run dir (first names), for the run dir's checks
    # Its keys whose null the run's job fills as the config is resolved (config/resolve.py): key -> a fact of the
    # job, "sweep" (a multirun's sweep directory; a single run: none) or "run" (a multirun job's overrides, else the
    # run directory's name). Written into the resolved config, so that every task of a cluster reads the same.
    from_job: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def shown(cls, keys: Mapping[str, Any]) -> str:
        """Its name on --plan's loggers line, from its keys."""
        return cls.name

    @classmethod
    def maker(cls) -> Callable:
        """What the engine builds it with: its `for_run` (a classmethod taking
        what it needs of the run), else the class."""
        return getattr(cls, "for_run", cls)

    @classmethod
    def target(cls) -> str:
        make = cls.maker()
        return f"{cls.__module__}.{cls.__qualname__}" + ("" if make is cls else f".{make.__name__}")

    @classmethod
    def keys(cls) -> Optional[Mapping[str, Any]]:
        """Its keys and their defaults, from its signature; None: a switch."""
        taken = {
            name: parameter.default
            for name, parameter in inspect.signature(cls.maker()).parameters.items()
            if name not in RUNTIME and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
        }
        return taken or None

    @classmethod
    def settings(cls, group: Mapping[str, Any]) -> Optional[dict]:
        """The keys it is built with, as the logger group (plain data) sets
        them, with its defaults; None when it is off."""
        defaults = cls.keys()
        if defaults is None:
            return {} if bool(group.get(cls.name, cls.on)) else None
        keys = dict(group.get(cls.name) or {})
        if not keys.pop("enabled", False):
            return None
        return {**defaults, **{key: value for key, value in keys.items() if key in defaults}}


@functools.lru_cache(maxsize=None)
def built_in() -> Tuple[type, ...]:
    """Every BuiltInLogger with a name in this package's modules, found by
    importing them (no list to keep beside the classes): those on by default
    first, then by name. That is --plan's order and the order the engine
    opens them in."""
    found = {}
    for module in pkgutil.iter_modules(__path__, f"{__name__}."):
        for value in vars(importlib.import_module(module.name)).values():
            if (
                isinstance(value, type)
                and issubclass(value, BuiltInLogger)
                and value.name
                and value.__module__ == module.name
            ):
                found[value.name] = value
    return tuple(sorted(found.values(), key=lambda logger: (not logger.on, logger.name)))


def named(name: str) -> Optional[type]:
    return next((logger for logger in built_in() if logger.name == name), None)


def switches() -> Tuple[type, ...]:
    """The built-in loggers turned on and off by `logger.NAME=true|false`."""
    return tuple(logger for logger in built_in() if logger.keys() is None)


def blocks() -> Tuple[type, ...]:
    """The built-in loggers with keys of their own, turned on by `logger.NAME.enabled`."""
    return tuple(logger for logger in built_in() if logger.keys() is not None)
