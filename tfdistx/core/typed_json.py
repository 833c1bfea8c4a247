"""A typed hand-off as JSON, one function each way: a frozen dataclass (a
RunSpec a task is handed, a LaunchSpec) written by `dumps` and read back by
`loads`, each field as its annotation says, so that no reader looks a
value up by a string key.

Written here, not with pydantic's TypeAdapter (which reads stdlib
dataclasses): pydantic is no dependency of tfdistx (W&B installs it), a
strategy's row must travel as its name (the table is the one place its
facts live: `strategies.get`), and a frozen mapping must come back frozen
(MappingProxyType), each of which would need a serializer of pydantic's on
the types of core/. What the annotations here use is few: dataclasses,
Optional and Union of them, tuples, mappings, Path, enums, plain values.

No TensorFlow, no Hydra here.
"""

import collections.abc
import dataclasses
import enum
import json
import typing
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Type, TypeVar

from tfdistx.core import strategies

T = TypeVar("T")


def dumps(value: Any) -> str:
    """`value` (a dataclass) as JSON: its fields by name, a strategy's row by its name."""
    return json.dumps(_plain(value))


def loads(kind: Type[T], text: str) -> T:
    """What `dumps` wrote of a `kind`, typed again."""
    return _typed(kind, json.loads(text))


def _plain(value: Any) -> Any:
    if isinstance(value, strategies.StrategyRow):
        return value.name
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _typed(kind: Any, value: Any) -> Any:
    """`value` (plain JSON) as the annotation `kind` says."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any or value is None:
        return value
    if origin is typing.Union:  # Optional[X]; Union[str, Target]: a mapping is the dataclass, else the plain value
        members = [arg for arg in args if arg is not type(None)]
        dataclass = next((arg for arg in members if dataclasses.is_dataclass(arg)), None)
        if len(members) == 1:
            return _typed(members[0], value)
        return _typed(dataclass, value) if dataclass is not None and isinstance(value, dict) else value
    if kind is strategies.StrategyRow:
        return strategies.get(value)
    if dataclasses.is_dataclass(kind):
        hints = typing.get_type_hints(kind)
        return kind(
            **{f.name: _typed(hints[f.name], value[f.name]) for f in dataclasses.fields(kind) if f.name in value}
        )
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return kind(value)
    if kind is Path:
        return Path(value)
    if origin is tuple:  # Tuple[X, ...] or Tuple[X, Y]
        kinds = [args[0]] * len(value) if len(args) == 2 and args[1] is Ellipsis else args
        return tuple(_typed(item_kind, item) for item_kind, item in zip(kinds, value))
    if origin in (dict, collections.abc.Mapping):  # frozen, as the spec holds its mappings
        return MappingProxyType({key: _typed(args[1] if args else Any, item) for key, item in value.items()})
    if origin is list:
        return [_typed(args[0] if args else Any, item) for item in value]
    return value
