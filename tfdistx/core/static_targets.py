"""A `_target_` checked from its source, without importing it: that it
exists, is a class or a function, and takes the keys given.

The config side must not import TensorFlow, and a user's module (like
Keras' own) imports it at its top: importing the target to look at it
would cost the seconds the config check is there to save (and, on a
cluster, the pods' scheduling). So the module's file is found as the
import system would find it (the top-level package by
importlib.util.find_spec, which does not import it; then its
directories), parsed with `ast`, and the name followed through
`from X import Y as Y` re-exports (Keras' public modules are such files)
to its `class` or `def`. A class's keywords are its `__init__`'s, and,
where that passes `**kwargs` to `super().__init__`, those of its bases.

griffe (mkdocstrings' static loader) does this too, but it loads whole
packages to follow a re-export: keras.callbacks.EarlyStopping took it
3.1 s, where `--plan` takes 0.3 s; this reads the few files on the way.

Only a certain answer refuses. Where the source does not say for sure (a
compiled module, a star import, a module `__getattr__`, attributes set at
run time, a decorator that may change a signature, a base class chosen at
import time, `**kwargs` used otherwise than passed up), the answer is
"unknown", and the engine's check when it builds the target
(core/targets.build) has the last word, as it always does.
"""

import ast
import importlib.machinery
import importlib.util
import os
from dataclasses import dataclass
from functools import lru_cache

from tfdistx.core.errors import Problem
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

# Decorators known to leave a class's or function's signature as written (Keras' and TensorFlow's export marks).
_KEEP_SIGNATURE = {"keras_export", "keras_core_export", "tf_export", "register_keras_serializable"}
_DEPTH = 25  # re-exports and base classes followed, at most (a cycle ends here, unknown)


@dataclass(frozen=True)
class Missing:
    """Certainly not there: why, in the engine's words."""

    why: str


@dataclass(frozen=True)
class Found:
    """A class or a function; `takes`: the keywords it accepts (None: not known for sure)."""

    kind: str  # "class" or "function"
    takes: Optional[Tuple[str, ...]]  # in the order the source gives them


Answer = Union[Missing, Found, None]  # None: the source does not say for sure


def look_up(path: str) -> Answer:
    """What the dotted `path` names, as far as its source says for sure."""
    parts = path.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):  # a module in sys.modules without a spec, a broken finder
        return None
    if spec is None:
        return Missing(f"no module named {parts[0]!r} is importable")
    module = _Module.of_spec(parts[0], spec)
    if module is None:
        return None
    depth = 1
    while depth < len(parts):  # the longest importable module first, as the engine's locate does
        inner = module.submodule(parts[depth])
        if inner is _UNKNOWN:
            return None
        if inner is None:
            break
        module, depth = inner, depth + 1
    return _answer_in(module, parts[depth:])


def problems(key: str, path: str, keys: Mapping[str, Any], runtime: Sequence[str] = ()) -> List[Problem]:
    """Why the `_target_` at `key` (callbacks.csv, model ...) cannot be
    called with `keys` (and the `runtime` keywords tfdistx passes where it
    takes them), as far as its source says for sure; [] otherwise. In the
    engine's words (targets.build)."""
    found = look_up(path)
    if isinstance(found, Missing):
        return [Problem(f"{key}._target_", path, found.why)]
    if found is None or found.takes is None:
        return []
    unknown = [name for name in keys if name not in found.takes and name not in runtime]
    taken = [name for name in found.takes if name not in runtime]
    return [
        Problem(
            f"{key}.{name}",
            keys[name],
            f"{path} takes no such argument; it takes: {', '.join(taken) or 'none'} "
            f"(tfdistx passes {', '.join(sorted(runtime)) or 'nothing'} itself)",
        )
        for name in unknown
    ]


_UNKNOWN = object()


class _Module:
    """A module's source file (None: a namespace package) and the directories of its submodules."""

    def __init__(self, name: str, file: Optional[str], search: List[str]):
        self.name, self.file, self.search = name, file, search

    @classmethod
    def of_spec(cls, name: str, spec) -> Optional["_Module"]:
        origin, search = spec.origin, list(spec.submodule_search_locations or [])
        if origin and origin.endswith(".py"):
            return cls(name, origin, search)
        if origin in (None, "namespace") and search:
            return cls(name, None, search)
        return None  # built in, frozen or compiled: no source to read

    @property
    def package(self) -> str:
        return self.name if self.search else self.name.rpartition(".")[0]

    def submodule(self, part: str):
        """The submodule `part` (None: there is none; _UNKNOWN: one the source cannot be read of)."""
        namespace = []
        for directory in self.search:
            base = os.path.join(directory, part)
            if os.path.isfile(os.path.join(base, "__init__.py")):
                return _Module(f"{self.name}.{part}", os.path.join(base, "__init__.py"), [base])
            if any(
                os.path.isfile(base + suffix) for suffix in importlib.machinery.EXTENSION_SUFFIXES
            ) or os.path.isfile(base + ".pyc"):
                return _UNKNOWN
            if os.path.isfile(base + ".py"):
                return _Module(f"{self.name}.{part}", base + ".py", [])
            if os.path.isdir(base):
                namespace.append(base)
        return _Module(f"{self.name}.{part}", None, namespace) if namespace else None

    def module_named(self, dotted: str) -> Optional["_Module"]:
        """Another module by its absolute name (None: not found, or not readable)."""
        parts = dotted.split(".")
        try:
            spec = importlib.util.find_spec(parts[0])
        except (ImportError, ValueError):
            return None
        module = _Module.of_spec(parts[0], spec) if spec else None
        for part in parts[1:]:
            module = module.submodule(part) if module is not None else None
            if module is _UNKNOWN:
                return None
        return module


@dataclass(frozen=True)
class _Definition:
    node: ast.AST  # ClassDef, FunctionDef, AsyncFunctionDef or Lambda
    module: _Module


def _answer_in(module: _Module, rest: List[str]) -> Answer:
    """The attributes `rest` of `module`, in turn."""
    if not rest:
        return Missing("is a module, not a class or function: name one of its classes or functions")
    found = _resolve_name(module, rest[0], 0)
    if isinstance(found, _Module):
        return _answer_in(found, rest[1:])
    if isinstance(found, Missing) or found is None:
        return found
    if len(rest) > 1:  # a class's attribute (Class.from_config): not followed
        return None
    return _described(found)


def _described(found) -> Answer:
    if isinstance(found, _Alternatives):  # defined one way or another at import time: known if each is
        each = [_described(definition) for definition in found.definitions]
        if any(f is None for f in each) or len({f.kind for f in each}) != 1:
            return None
        takes = [f.takes for f in each]
        return Found(each[0].kind, None if None in takes else _joined(*takes))
    if not isinstance(found, _Definition):
        return None
    if isinstance(found.node, ast.ClassDef):
        return Found("class", _class_takes(found, 0))
    return Found("function", _function_takes(found.node))


@lru_cache(maxsize=256)
def _parsed(file: str) -> Optional[Tuple[Dict[str, list], bool]]:
    """(name -> what binds it at module level, whether names may also be made at run time); None: unreadable."""
    try:
        with open(file, "rb") as source:
            tree = ast.parse(source.read(), filename=file)
    except (OSError, SyntaxError, ValueError):
        return None
    bindings: Dict[str, list] = {}
    dynamic = False

    def visit(statements):
        nonlocal dynamic
        for statement in statements:
            if isinstance(statement, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                bindings.setdefault(statement.name, []).append(statement)
                dynamic |= statement.name == "__getattr__"
            elif isinstance(statement, ast.ImportFrom):
                for alias in statement.names:
                    if alias.name == "*":
                        dynamic = True
                    else:
                        bindings.setdefault(alias.asname or alias.name, []).append((statement, alias))
            elif isinstance(statement, ast.Import):
                for alias in statement.names:
                    bindings.setdefault(alias.asname or alias.name.split(".")[0], []).append((statement, alias))
            elif isinstance(statement, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                for target in targets:  # `X = ...` binds X; `X.__doc__ = ...` and `d[k] = ...` bind nothing
                    if isinstance(target, ast.Name):
                        bindings.setdefault(target.id, []).append(statement)
                    elif isinstance(target, (ast.Tuple, ast.List)):
                        for name in ast.walk(target):
                            if isinstance(name, ast.Name):
                                bindings.setdefault(name.id, []).append(None)  # unpacked: its value unknown
            elif isinstance(statement, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
                for block in ("body", "orelse", "finalbody"):
                    visit(getattr(statement, block, []))
                for handler in getattr(statement, "handlers", []):
                    visit(handler.body)

    visit(tree.body)
    # globals()[...] = ..., setattr(sys.modules[__name__], ...), exec(...): names the source does not bind.
    # setattr(self, ...) in a method sets an attribute of an instance, not of the module.
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("globals", "setattr", "exec", "vars")
        ):
            on_instance = (
                node.func.id == "setattr"
                and node.args
                and isinstance(node.args[0], ast.Name)
                and node.args[0].id in ("self", "cls")
            )
            dynamic |= not on_instance
    return bindings, dynamic


def _resolve_name(module: _Module, name: str, depth: int):
    """What `name` is in `module`: a _Definition, a _Module, Missing, or None (not known for sure)."""
    if depth > _DEPTH:
        return None
    inner = module.submodule(name) if module.search else None
    if inner is _UNKNOWN:
        return None
    if inner is not None:
        return inner
    if module.file is None:  # a namespace package: only its submodules
        return Missing(f"module {module.name!r} has no attribute {name!r}")
    parsed = _parsed(module.file)
    if parsed is None:
        return None
    bindings, dynamic = parsed
    if name not in bindings:
        if dynamic:
            return None
        offered = sorted(
            n
            for n, found in bindings.items()
            if not n.startswith("_")
            and all(isinstance(f, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) for f in found)
        )
        return Missing(
            f"module {module.name!r} has no attribute {name!r}"
            + (f" (it has: {', '.join(offered)})" if offered else "")
        )
    found = [_binding(module, binding, depth) for binding in bindings[name]]
    if len(found) == 1:
        return found[0]
    # bound in several places (if/else, try/except): known only if
    # every binding is a class or function; their keywords joined
    if all(isinstance(f, _Definition) for f in found):
        return _Alternatives(tuple(found))
    return None


@dataclass(frozen=True)
class _Alternatives:
    """A name bound by one of several definitions, chosen at import
    time: as a base class, it takes what any of them takes."""

    definitions: Tuple[_Definition, ...]


def _binding(module: _Module, binding, depth: int):
    if binding is None:
        return None
    if isinstance(binding, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        return _Definition(binding, module)
    if isinstance(binding, tuple):
        statement, alias = binding
        if isinstance(statement, ast.Import):
            named = alias.name if alias.asname else alias.name.split(".")[0]
            return module.module_named(named)
        source = _absolute(module, statement.module, statement.level)
        origin = module.module_named(source) if source else None
        if origin is None:
            return None
        return _resolve_name(origin, alias.name, depth + 1)
    value = getattr(binding, "value", None)
    if isinstance(value, ast.Lambda):
        return _Definition(value, module)
    if isinstance(value, (ast.Name, ast.Attribute)):
        return _resolve_expression(module, value, depth + 1)
    if isinstance(binding, ast.Assign) and isinstance(
        value, (ast.Constant, ast.List, ast.Tuple, ast.Dict, ast.Set, ast.JoinedStr)
    ):
        kind = (
            "str"
            if isinstance(value, ast.JoinedStr)
            else type(value.value).__name__
            if isinstance(value, ast.Constant)
            else type(value).__name__.lower()
        )
        return Missing(f"is a {kind}, not a class or function")
    return None


def _absolute(module: _Module, name: Optional[str], level: int) -> Optional[str]:
    if level == 0:
        return name
    base = module.package.split(".")
    if level - 1 > len(base) - 1:
        return None
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _resolve_expression(module: _Module, node: ast.AST, depth: int):
    """A name or a dotted attribute (`layers.Dense`, `tf.keras.Model`) in `module`."""
    if depth > _DEPTH:
        return None
    if isinstance(node, ast.Name):
        if node.id == "object":
            return _OBJECT
        return _resolve_name(module, node.id, depth)
    if isinstance(node, ast.Attribute):
        owner = _resolve_expression(module, node.value, depth + 1)
        if isinstance(owner, _Module):
            found = _resolve_name(owner, node.attr, depth + 1)
            return None if isinstance(found, Missing) else found  # not ours to refuse: the owner's source
    return None


_OBJECT = object()  # the builtin `object` as a base: it takes no keywords


def _joined(*names) -> Tuple[str, ...]:
    return tuple(dict.fromkeys(name for group in names for name in group))


def _function_takes(node) -> Optional[Tuple[str, ...]]:
    if getattr(node, "decorator_list", None) and not _keeps_signature(node.decorator_list):
        return None
    arguments = node.args
    if arguments.kwarg is not None:
        return None
    return tuple(a.arg for a in arguments.args + arguments.kwonlyargs)


def _keeps_signature(decorators) -> bool:
    def name(node):
        node = node.func if isinstance(node, ast.Call) else node
        return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)

    return all(name(d) in _KEEP_SIGNATURE for d in decorators)


def _class_takes(definition: _Definition, depth: int) -> Optional[Tuple[str, ...]]:
    """The keywords a class's constructor accepts; None: not known for sure."""
    node, module = definition.node, definition.module
    if depth > _DEPTH or not _keeps_signature(node.decorator_list) or node.keywords:  # @dataclass, a metaclass ...
        return None
    methods = {s.name: s for s in node.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if (
        "__new__" in methods
        or "__signature__" in methods
        or any(
            isinstance(s, ast.Assign)
            and any(getattr(t, "id", None) in ("__init__", "__new__", "__signature__") for t in s.targets)
            for s in node.body
        )
    ):
        return None
    init = methods.get("__init__")
    if init is None:
        return _bases_take(node, module, depth)
    if init.decorator_list:
        return None
    arguments = init.args
    own = tuple(a.arg for a in (arguments.args[1:] + arguments.kwonlyargs))
    if arguments.kwarg is None:
        return own
    use = _kwargs_use(init, arguments.kwarg.arg)
    if use is None:
        return None
    literals, passed_up = use
    if not passed_up:
        return _joined(own, literals)
    bases = _bases_take(node, module, depth)
    return None if bases is None else _joined(own, literals, bases)


def _bases_take(node: ast.ClassDef, module: _Module, depth: int) -> Optional[Tuple[str, ...]]:
    """What the bases' constructors take, joined (a superset of what
    the MRO's next one takes: it never refuses a key that works)."""
    taken: Tuple[str, ...] = ()
    for base in node.bases:
        found = _resolve_expression(module, base, depth + 1)
        options = found.definitions if isinstance(found, _Alternatives) else (found,)
        for option in options:
            if option is _OBJECT:
                continue
            if not (isinstance(option, _Definition) and isinstance(option.node, ast.ClassDef)):
                return None
            more = _class_takes(option, depth + 1)
            if more is None:
                return None
            taken = _joined(taken, more)
    return taken


def _kwargs_use(function, name: str) -> Optional[Tuple[Tuple[str, ...], bool]]:
    """How `function` uses its `**name`: (the keys it reads by name, whether it passes them to a base's __init__);
    None: some other use (stored, passed elsewhere), which the source cannot follow."""
    parents = {}
    for parent in ast.walk(function):
        for child in ast.iter_child_nodes(parent):
            parents[child] = parent
    literals, passed_up = [], False
    for node in ast.walk(function):
        if not (isinstance(node, ast.Name) and node.id == name) or node is function:
            continue
        parent = parents.get(node)
        if isinstance(parent, ast.keyword) and parent.arg is None:  # f(**kwargs)
            call = parents.get(parent)
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "__init__":
                passed_up = True
                continue
            return None
        if isinstance(parent, ast.Attribute) and parent.attr in ("pop", "get"):
            call = parents.get(parent)
            if (
                isinstance(call, ast.Call)
                and call.args
                and isinstance(call.args[0], ast.Constant)
                and isinstance(call.args[0].value, str)
            ):
                literals.append(call.args[0].value)
                continue
            return None
        if (
            isinstance(
                parent, (ast.If, ast.UnaryOp, ast.BoolOp, ast.FormattedValue, ast.Compare, ast.IfExp, ast.Assert)
            )
            or isinstance(parent, ast.Call)
            and getattr(parent.func, "id", None) in ("len", "list", "sorted", "repr", "str")
        ):
            continue  # read, not passed on: `if kwargs: raise ...`
        return None
    return tuple(literals), passed_up
