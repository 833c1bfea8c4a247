"""Instantiate a user-replaceable `_target_` from its config group.

Hydra's `instantiate` passes every key of the group to the target. A key
the target cannot take is refused here with the target's own parameters
(a misspelt `model.hiden_units` would otherwise fail deep inside the call,
or, with a default, train silently without it) — the one thing Hydra does
not do for us. The default group's keys do not reach a user's target that
the command line names (compose.only_given_keys_for_user_targets); the
runtime arguments tfdistx passes (input_shape, num_outputs, ...) are given
only where the target takes them.
"""

import importlib
import inspect
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from hydra.utils import get_method, instantiate

from tfdistx.config import sources
from tfdistx.config.errors import ConfigError, Problem


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
        return cls(group, sources.current(keys["_target_"]), MappingProxyType(kwargs))

    def build(self, expect: type, **runtime: Any) -> Any:
        """Call the target with the group's keys and `runtime` kwargs; the
        result must be an `expect`."""
        return build(self.group, self.path, dict(self.kwargs), expect, **runtime)


def build(group: str, target: str, kwargs: dict, expect: type, **runtime: Any) -> Any:
    """Call `target` with `kwargs` and `runtime`; the result must be an `expect`."""
    try:
        fn = get_method(target)
    except Exception as error:
        raise ConfigError.one(f"{group}._target_", target, _why_not_found(target, error)) from None
    kwargs = {**kwargs, **runtime}
    try:
        accepted = _accepted(fn, kwargs)
    except (TypeError, ValueError):  # a builtin (builtins.int) or a non-callable: no signature to read
        raise ConfigError.one(f"{group}._target_", target, f"has no signature to call with the {group} keys: "
                              f"name a function or class (see the README's 'Your own model, data or task')") from None
    unknown = sorted(set(kwargs) - set(accepted) - set(runtime))
    if unknown:  # a misspelt key would otherwise train with the target's default in its place
        takes = [name for name in _parameters(fn) if name not in runtime]
        raise ConfigError([Problem(f"{group}.{key}", kwargs[key], f"{target} takes no such argument; it takes: "
                                   f"{', '.join(takes) or 'none'} (tfdistx passes {', '.join(sorted(runtime)) or 'nothing'} itself)")
                           for key in unknown])
    try:
        built = instantiate({"_target_": target, **accepted}, _convert_="all")
    except Exception as error:
        cause = error.__cause__ or error
        if isinstance(cause, ConfigError):
            raise cause from None
        raise ConfigError.one(f"{group}._target_", target, f"failed: {type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}") from error
    if not isinstance(built, expect):
        raise ConfigError.one(f"{group}._target_", target, f"returned a {type(built).__name__}; it must return a {expect.__module__}.{expect.__name__}")
    return built


def _parameters(fn) -> list:
    return [p.name for p in inspect.signature(fn).parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


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
        offered = sorted(name for name, value in vars(module).items()
                         if callable(value) and not name.startswith("_") and getattr(value, "__module__", None) == module.__name__)
        return f"module {module_name!r} has no attribute {attribute!r}" + (f" (it has: {', '.join(offered)})" if offered else "")
    return f"cannot be imported: {str(error).strip().splitlines()[0]}"
