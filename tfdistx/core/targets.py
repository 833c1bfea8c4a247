"""Build a user-replaceable `_target_` of a config group: plain data.

A Target is the dotted path of a callable and the group's keys, resolved
on the config side (config/resolve.py); the engine builds it when it needs
the object. It is built as Hydra's `instantiate` would (the keys as
keyword arguments; a value that is itself a mapping with a `_target_`
built first), but here, by importlib, for two reasons: the engine must not
load Hydra, and a key the target cannot take is refused with the target's
own parameters (a misspelt `model.hiden_units` would otherwise fail deep
inside the call, or, with a default, train silently without it), which
Hydra does not do. The default group's keys do not reach a user's target
that the command line names (compose.only_given_keys_for_user_targets);
the runtime arguments tfdistx passes (input_shape, num_outputs, ...) are
given only where the target takes them. No Hydra, no TensorFlow here.
"""

import functools
import importlib
import inspect
import sys
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping, Optional

from tfdistx.core.errors import ConfigError, Problem, RunFault

# Targets that runs written by earlier versions name in their .hydra/config.yaml.
RENAMED = {"tfdistx.records.tfrecord": "tfdistx.data.tfrecord", "tfdistx.records.csv": "tfdistx.data.csv"}


def current(target) -> str:
    """A target as this version names it."""
    return RENAMED.get(str(target), str(target))


@dataclass(frozen=True)
class Target:
    """A user-replaceable `_target_` of one config group, with its keys."""

    group: str
    path: str
    kwargs: Mapping[str, Any]

    @classmethod
    def of(cls, group: str, keys: Mapping[str, Any], exclude: Iterable[str] = ()) -> "Target":
        """The group's resolved keys, less `exclude` (tfdistx's own keys of the group)."""
        kwargs = {k: v for k, v in keys.items() if k not in set(exclude) and k != "_target_"}
        return cls(group, current(keys["_target_"]), MappingProxyType(kwargs))

    def names(self, parameter: str) -> bool:
        """Whether the target's signature names `parameter` (not only takes any keyword, **kwargs): what tfdistx
        passes a target only where it asks for it by name (a source's state_dir, a task's labels), so that a
        user's wrapper `load(**kwargs)` forwarding to one that does not take it is not handed it."""
        try:
            return parameter in _parameters(locate(self.path))
        except Exception:  # not found, or no signature: building it says so
            return False

    def build(
        self,
        expect: type,
        *,
        takes: Optional[Callable[[Any], Iterable[str]]] = None,
        wrap: Optional[Callable] = None,
        **runtime: Any,
    ) -> Any:
        """Call the target with the group's keys and `runtime` kwargs; the
        result must be an `expect` (`takes`, `wrap`: as build's)."""
        return build(self.group, self.path, dict(self.kwargs), expect, takes=takes, wrap=wrap, **runtime)


def build(
    group: str,
    target: str,
    kwargs: dict,
    expect: type,
    *,
    takes: Optional[Callable[[Any], Iterable[str]]] = None,
    wrap: Optional[Callable] = None,
    **runtime: Any,
) -> Any:
    """Call `target` with `kwargs` and `runtime`; the result must be an
    `expect`. `takes(fn)`: the keyword names what the path names accepts,
    where its signature ends in **kwargs that a base class checks (a Keras
    optimizer's); read from its signature otherwise. `wrap`: applied to
    what the path names before the call (it may refuse it with a ConfigError)."""
    try:
        fn = locate(target)
    except Exception as error:
        raise ConfigError.for_key(f"{group}._target_", target, _why_not_found(target, error)) from None
    kwargs = {**kwargs, **runtime}
    try:
        names = None if takes is None else list(takes(fn))
        accepted = (
            _accepted(fn, kwargs) if names is None else {k: v for k, v in kwargs.items() if k in names or k in runtime}
        )
    except (TypeError, ValueError):  # a builtin (builtins.int) or a non-callable: no signature to read
        raise ConfigError.for_key(
            f"{group}._target_",
            target,
            f"has no signature to call with the {group} keys: name a function or class (see docs/own-project.md)",
        ) from None
    unknown = sorted(set(kwargs) - set(accepted) - set(runtime))
    if unknown:  # a misspelt key would otherwise train with the target's default in its place
        taken = [name for name in (names if names is not None else _parameters(fn)) if name not in runtime]
        raise ConfigError(
            [
                Problem(
                    f"{group}.{key}",
                    kwargs[key],
                    f"{target} takes no such argument; it takes: "
                    f"{', '.join(taken) or 'none'} (tfdistx passes {', '.join(sorted(runtime)) or 'nothing'} itself)",
                )
                for key in unknown
            ]
        )
    try:
        built = (wrap(fn) if wrap else fn)(**{key: _built(group, key, value) for key, value in accepted.items()})
    except (ConfigError, RunFault):  # the target's own one line (a dataset offline: data/sources.py)
        raise
    except Exception as error:
        raise ConfigError.for_key(
            f"{group}._target_",
            target,
            f"failed: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}",
        ) from error
    if not isinstance(built, expect):
        raise ConfigError.for_key(
            f"{group}._target_", target, f"returned a {type(built).__name__}; it must return a {public_name(expect)}"
        )
    return built


def public_name(cls: type) -> str:
    """The dotted path a user would write for `cls`: Keras defines its classes
    in keras.src (keras.src.optimizers.schedules.learning_rate_schedule) and
    exports them from a public module (keras.optimizers.schedules), which is
    found by leaving out `src` and the module's last parts until one holds
    the class. Its own module's path otherwise."""
    parts = [part for part in cls.__module__.split(".") if part != "src"]
    for end in range(len(parts), 0, -1):
        module = sys.modules.get(".".join(parts[:end]))  # only what is loaded: the class's own package is
        if module is not None and getattr(module, cls.__name__, None) is cls:
            return f"{module.__name__}.{cls.__name__}"
    return f"{cls.__module__}.{cls.__name__}"


def locate(path: str) -> Callable:
    """The object a dotted path names: the longest importable module, then
    attributes (`pkg.mod.Class.method` too)."""
    parts = path.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError as error:
            if error.name and not ".".join(parts[:split]).startswith(error.name):
                raise  # a module that exists failed to import one of its own
            continue
        for attribute in parts[split:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(f"no module named {parts[0]!r}", name=parts[0])


def _built(group: str, key: str, value: Any) -> Any:
    """A key's value as the target gets it: a mapping with a `_target_` (as
    Hydra's instantiate builds nested ones) is built first, with its keys;
    with `_partial_: true`, it is the function itself with those keys bound,
    for the target to call (Hydra's `_partial_`: LambdaCallback's functions)."""
    if isinstance(value, Mapping) and "_target_" in value:
        nested = {k: v for k, v in value.items() if k not in ("_target_", "_partial_")}
        if value.get("_partial_"):
            try:
                return functools.partial(locate(current(value["_target_"])), **nested)
            except Exception as error:
                raise ConfigError.for_key(
                    f"{group}.{key}._target_", value["_target_"], _why_not_found(value["_target_"], error)
                ) from None
        return build(f"{group}.{key}", current(value["_target_"]), nested, object)
    if isinstance(value, Mapping):
        return {k: _built(group, f"{key}.{k}", v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_built(group, f"{key}[{i}]", v) for i, v in enumerate(value)]
    return value


def _parameters(fn) -> list:
    return [
        p.name for p in inspect.signature(fn).parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]


def _accepted(fn, kwargs: dict) -> dict:
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return kwargs
    names = {p.name for p in params}
    return {k: v for k, v in kwargs.items() if k in names}


def _why_not_found(target: str, error: Exception) -> str:
    """A missing attribute of a module that imports is named, with what the
    module does offer; Hydra's own message is several lines about both."""
    module_name, _, attribute = target.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except Exception as import_error:
        return f"cannot be imported: {type(import_error).__name__}: {str(import_error).splitlines()[0]}"
    if not hasattr(module, attribute):
        offered = sorted(
            name
            for name, value in vars(module).items()
            if callable(value) and not name.startswith("_") and getattr(value, "__module__", None) == module.__name__
        )
        return f"module {module_name!r} has no attribute {attribute!r}" + (
            f" (it has: {', '.join(offered)})" if offered else ""
        )
    return f"cannot be imported: {str(error).strip().splitlines()[0]}"
