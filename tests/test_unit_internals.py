"""The one room for the internals (tfdistx/internals): no module outside it
uses a private API of TensorFlow, Keras, Hydra or Python; every probe passes
on the installed versions and, when an internal is gone, stops in one line
(exit 8) naming the package, its version and the internal; and every
internal does what tfdistx takes it to do, on real TensorFlow and Keras
objects. Run this file first when moving a pinned version (docs/development.md: Moving
the pinned versions)."""

import ast
import importlib
import inspect
import sys
import tomllib
from pathlib import Path

import engine_helpers  # noqa: F401  (four logical CPUs, set before TensorFlow starts, as for every engine unit test)
import keras
import numpy as np
import pytest
import tensorflow as tf
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

import tfdistx
from tfdistx import internals
from tfdistx.core.errors import EXIT_UNSUPPORTED_VERSION
from tfdistx.internals import Gone, hydra as hydra_internals, python as python_internals, tensorflow as tf_internals

pytestmark = pytest.mark.unit

PACKAGE = Path(tfdistx.__file__).resolve().parent
ROOM = PACKAGE / "internals"
MODULES = (tf_internals, hydra_internals, python_internals)
PROBES = [internal for module in MODULES for internal in module.PROBES]


# -- the scan: no private API outside the room -------------------------------------

# Packages whose private names only the room may use, and their modules that are private as a whole
# (TensorFlow's and Keras' public API is tf.* and keras.*; tensorflow.python, keras.src are their insides).
WATCHED = {"tensorflow", "keras", "hydra", "omegaconf", "atexit"}
PRIVATE_SUBPACKAGES = {"tensorflow": {"python", "compiler", "core", "tsl", "lite"}, "keras": {"src"}}
# Names with a leading underscore that are public: os._exit (documented), Hydra's `_target_` key; and the
# dunders of a watched package that are (a module's __version__ ...). On other objects a dunder is Python's own
# (__cause__, __dataclass_fields__), except TensorFlow's private API for Keras, whatever it is reached through.
PUBLIC_UNDERSCORED = {"_exit", "_target_"}
PUBLIC_DUNDERS = {"__version__", "__name__", "__qualname__", "__module__", "__doc__", "__file__", "__path__"}
PRIVATE_DUNDERS = {"__internal__"}


def private_name(name: str) -> bool:
    """Private to the package that defines it: a leading underscore, not a public exception."""
    return name.startswith("_") and name not in PUBLIC_UNDERSCORED and name not in PUBLIC_DUNDERS


def foreign_private(name: str, own: set) -> bool:
    """A private name of some other object than a watched package's module: its single-underscored
    names that tfdistx does not define itself, and TensorFlow's __internal__."""
    return name in PRIVATE_DUNDERS or (private_name(name) and not name.startswith("__") and name not in own)


def private_module(dotted: str) -> bool:
    parts = dotted.split(".")
    return parts[0] in WATCHED and (
        any(p.startswith("_") for p in parts[1:])
        or (len(parts) > 1 and parts[1] in PRIVATE_SUBPACKAGES.get(parts[0], ()))
    )


def package_files(root: Path) -> list:
    return sorted(p for p in root.rglob("*.py") if ROOM.name not in p.relative_to(root).parts[:1])


def tfdistx_modules() -> list:
    names = []
    for path in package_files(PACKAGE):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] != "__main__":
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def foreign_private_names() -> set:
    """The underscored names of every class of TensorFlow, Keras and Hydra
    loaded once tfdistx's modules are: their hooks and private methods."""
    for name in tfdistx_modules():
        importlib.import_module(name)
    names = set()
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] in WATCHED and module is not None:
            for value in list(vars(module).values()):
                if inspect.isclass(value) and value.__module__ == name:
                    names |= {
                        attribute
                        for attribute in vars(value)
                        if private_name(attribute) and not attribute.startswith("__")
                    }
    return names


def hooks(tree, foreign: set) -> list:
    """(node, name) of each private method of TensorFlow, Keras or Hydra
    that a class here defines to be called by them: a method of a class
    derived from one of theirs (or the room's), or of a class that type(...)
    makes a base, or a key of the namespace given to type(...), named as one
    of theirs."""
    theirs = bound_to_watched(tree) | {
        a.asname or a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("tfdistx.internals")
        for a in n.names
    }
    made = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "type" and len(n.args) == 3
    ]
    mixins = {
        e.id
        for call in made
        if isinstance(call.args[1], ast.Tuple)
        for e in call.args[1].elts
        if isinstance(e, ast.Name)
    }
    derived = {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and any(isinstance(root, ast.Name) and root.id in theirs for root in (unchain(base)[0] for base in node.bases))
    }
    found = [
        (item, item.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and node.name in derived | mixins
        for item in node.body
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name in foreign
    ]
    return found + [
        (key, key.value)
        for call in made
        if isinstance(call.args[2], ast.Dict)
        for key in call.args[2].keys
        if isinstance(key, ast.Constant) and key.value in foreign
    ]


def own_private_names(trees, foreign: set) -> set:
    """Underscored names tfdistx defines itself (outside the room): its
    functions, classes, module and class constants, and `self._x` attributes;
    not the hooks it defines for TensorFlow, Keras or Hydra to call."""
    own, theirs = set(), set()
    for tree in trees:
        theirs |= {name for _, name in hooks(tree, foreign)}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    for leaf in ast.walk(target):
                        if isinstance(leaf, ast.Name):
                            own.add(leaf.id)
                        elif (
                            isinstance(leaf, ast.Attribute)
                            and isinstance(leaf.value, ast.Name)
                            and leaf.value.id in ("self", "cls")
                        ):
                            own.add(leaf.attr)
            elif isinstance(node, ast.alias) and node.asname:
                own.add(node.asname)
    return {name for name in own if name.startswith("_")} - theirs


def bound_to_watched(tree) -> set:
    """Names an import binds to a watched package or anything in it (tf, keras, ConfigSource ...)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] in WATCHED}
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in WATCHED:
            names |= {a.asname or a.name for a in node.names}
    return names


def unchain(node):
    """`a.b().c.d` -> (the node `a.b()`, ["c", "d"])."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.insert(0, node.attr)
        node = node.value
    return node, attrs


def private_uses(path: Path, tree, own: set, foreign: set) -> list:
    """`file:line: what` for each private use of a watched package in `tree`, in line order."""
    found, watched = [], bound_to_watched(tree)
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute)}

    def hit(node, what):
        found.append((node.lineno, node.col_offset, f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {what}"))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if private_module(alias.name):
                    hit(node, f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and not node.level:
            module = node.module or ""
            for alias in node.names:
                if (
                    private_module(module)
                    or (module.split(".")[0] in WATCHED and private_name(alias.name))
                    or private_module(f"{module}.{alias.name}")
                ):
                    hit(node, f"from {module} import {alias.name}")
        elif isinstance(node, ast.Attribute):
            if node.attr == "__class__" and isinstance(node.ctx, ast.Store):
                hit(node, "__class__ assigned")
            if id(node) in inner:
                continue  # a chain is judged once, whole, at its outermost attribute
            root, attrs = unchain(node)
            if isinstance(root, ast.Name) and root.id in watched:
                if any(private_name(a) for a in attrs):
                    hit(node, f"{root.id}.{'.'.join(attrs)}")
                continue
            others = [a for a in attrs if foreign_private(a, own)]
            if others:
                hit(node, f".{others[0]} (a name tfdistx does not define)")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr", "delattr")
        ):
            if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                name = node.args[1].value
                if foreign_private(name, own):
                    hit(node, f"{node.func.id}(..., {name!r})")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, (ast.Name, ast.Attribute))
            and (node.func.id if isinstance(node.func, ast.Name) else node.func.attr) == "import_module"
        ):
            if node.args and isinstance(node.args[0], ast.Constant) and private_module(str(node.args[0].value)):
                hit(node, f"import_module({node.args[0].value!r})")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and ".ATTRIBUTES/" in node.value:
            hit(node, f"a TensorFlow checkpoint key {node.value!r}")
    for node, name in hooks(tree, foreign):
        hit(node, f"defines {name}, a private method of TensorFlow, Keras or Hydra")
    return [line for _, _, line in sorted(found)]


def scan(root: Path, foreign: set) -> list:
    trees = {path: ast.parse(path.read_text(), str(path)) for path in package_files(root)}
    own = own_private_names(trees.values(), foreign)
    return [line for path, tree in trees.items() for line in private_uses(path, tree, own, foreign)]


def test_no_module_outside_the_room_uses_a_private_api():
    """tf.__internal__, tensorflow.python, keras.src, hydra._internal, an
    underscored attribute that tfdistx does not define (a Keras optimizer's
    _trainable_variables, ConfigSource._get_header_dict, atexit._run_exitfuncs),
    a __class__ assigned, a TensorFlow checkpoint key: none outside
    tfdistx/internals."""
    assert scan(PACKAGE, foreign_private_names()) == []


STAND_IN = """\
import atexit
import tensorflow as tf
from hydra._internal.utils import get_args_parser
from tensorflow.python.framework import config
from hydra.plugins.config_source import ConfigSource


class Mine:
    def __init__(self):
        self._mine = 1

    def _stop(self):  # tfdistx's own, though some TensorFlow class has a _stop too
        return self._mine


class State(tf.Module):
    def _trackable_children(self, save_type="checkpoint", **kwargs):
        return {}


class _Summed:
    def _all_reduce_sum_gradients(self, grads_and_vars):
        return grads_and_vars


def f(optimizer, variable, cfg, cls):
    a = tf.__internal__.distribute.ShardedVariable
    b = optimizer._trainable_variables
    variable.__class__ = Mine
    c = ConfigSource._get_header_dict("")
    atexit._run_exitfuncs()
    d = "optimizer/_trainable_variables/0/.ATTRIBUTES/VARIABLE_VALUE"
    e = getattr(optimizer, "_variables")
    g = optimizer._trackable_children("checkpoint")
    h = type("Adam", (_Summed, cls), {}), hasattr(cls, "_all_reduce_sum_gradients")

    def _gather_saveables_for_checkpoint(self):
        return self.value._gather_saveables_for_checkpoint()

    i = type(cls.__name__, (cls,), {"_gather_saveables_for_checkpoint": _gather_saveables_for_checkpoint})
    return Mine()._stop(), cfg.model._target_, tf.distribute.MirroredStrategy._collective_key_base
"""


def test_the_scan_finds_each_kind_of_private_use():
    """The scan itself, on a module that does each thing the room exists for
    (and tfdistx's own privates, which it must leave alone)."""
    tree, foreign = ast.parse(STAND_IN), foreign_private_names()
    found = [
        line.split(": ", 1)[1]
        for line in private_uses(PACKAGE / "mod.py", tree, own_private_names([tree], foreign), foreign)
    ]
    assert found == [
        "from hydra._internal.utils import get_args_parser",
        "from tensorflow.python.framework import config",
        "defines _trackable_children, a private method of TensorFlow, Keras or Hydra",
        "defines _all_reduce_sum_gradients, a private method of TensorFlow, Keras or Hydra",
        "tf.__internal__.distribute.ShardedVariable",
        "._trainable_variables (a name tfdistx does not define)",
        "__class__ assigned",
        "ConfigSource._get_header_dict",
        "atexit._run_exitfuncs",
        "a TensorFlow checkpoint key 'optimizer/_trainable_variables/0/.ATTRIBUTES/VARIABLE_VALUE'",
        "getattr(..., '_variables')",
        "._trackable_children (a name tfdistx does not define)",
        "hasattr(..., '_all_reduce_sum_gradients')",
        "._gather_saveables_for_checkpoint (a name tfdistx does not define)",
        "defines _gather_saveables_for_checkpoint, a private method of TensorFlow, Keras or Hydra",
        "tf.distribute.MirroredStrategy._collective_key_base",
    ]


# -- the probes ---------------------------------------------------------------------


def test_every_probe_passes_on_the_installed_versions():
    for module in MODULES:
        module.probe()
    for internal in PROBES:
        if not internal.instance:
            internal.get()


@pytest.mark.parametrize("internal", PROBES, ids=lambda internal: internal.name)
def test_a_missing_internal_is_one_line_naming_the_package_its_version_and_the_internal(internal):
    """Each probe, on an object without the attribute (as a release that
    dropped it): one line, exit code 8, the version installed and the pin."""

    class WithoutIt:
        pass

    with pytest.raises(Gone) as gone:
        internal.check(WithoutIt)
    (line,) = gone.value.lines()
    name, version = {
        "tensorflow": ("TensorFlow", tf.__version__),
        "keras": ("Keras", keras.__version__),
        "hydra-core": ("Hydra", internals.installed_version("hydra-core")),
        "python": ("Python", ".".join(map(str, sys.version_info[:3]))),
    }[internal.distribution]
    assert line == (
        f"tfdistx: this {name} ({version}) has no {internal.name}, which tfdistx uses {internal.use}: "
        f"install {internals.PINS[internal.distribution]} (docs/development.md: Moving the pinned versions)"
    )
    assert gone.value.code == EXIT_UNSUPPORTED_VERSION == 8


def test_a_missing_module_is_named_too():
    gone_module = internals.Internal("tensorflow", "tensorflow.python.no_such_module", "anything", "to test")
    with pytest.raises(Gone, match=r"has no tensorflow\.python\.no_such_module, which tfdistx uses to test"):
        gone_module.check()


def test_a_command_stops_in_one_line_with_exit_8_when_hydra_lacks_an_internal(monkeypatch, capsys, tmp_path):
    """As with a Hydra release without ConfigSource._get_header_dict: the
    run is refused before anything is composed or written."""
    from hydra.plugins.config_source import ConfigSource

    from tfdistx.cli import main

    monkeypatch.delattr(ConfigSource, "_get_header_dict")
    with pytest.raises(SystemExit) as leaving:
        main([f"hydra.run.dir={tmp_path / 'run'}", "trainer.steps=1"])
    assert leaving.value.code == 8
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(
        f"tfdistx: this Hydra ({internals.installed_version('hydra-core')}) has no "
        "hydra.plugins.config_source.ConfigSource._get_header_dict, which tfdistx uses"
    )
    assert not (tmp_path / "run").exists()


def test_a_command_stops_in_one_line_with_exit_8_when_keras_lacks_an_internal(monkeypatch, capsys, tmp_path):
    """As with a Keras release without Optimizer._get_variable_index: the
    probe at TensorFlow's import (every command that starts it) refuses
    before anything is written."""
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    from tfdistx.cli import main

    monkeypatch.delattr(BaseOptimizer, "_get_variable_index")
    with pytest.raises(SystemExit) as leaving:
        main(["data", "write", "data=synthetic", "--out", str(tmp_path / "out")])
    assert leaving.value.code == 8
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"tfdistx: this Keras ({keras.__version__}) has no keras.optimizers.Optimizer._get_variable_index, which "
        "tfdistx uses to re-split embedding tables for another number of ps tasks: install keras>=3.15,<3.16 "
        "(docs/development.md: Moving the pinned versions)"
    )
    assert not (tmp_path / "out").exists()


def test_the_pins_are_pyprojects():
    """What a probe tells to install is what pyproject.toml requires."""
    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]
    required = {Requirement(line).name: Requirement(line).specifier for line in project["dependencies"]}
    for distribution, pin in internals.PINS.items():
        if distribution == "python":
            assert SpecifierSet(pin.removeprefix("CPython")) == SpecifierSet(project["requires-python"])
        else:
            assert Requirement(pin).specifier == required[distribution], distribution
            assert internals.installed_version(distribution) in required[distribution], distribution


# -- each internal on real objects (what the start-up probe cannot look at) ----------


def adam_on_a_model():
    model = keras.Sequential(
        [
            keras.Input((3,)),
            keras.layers.Dense(4, name="hidden"),
            keras.layers.Dropout(0.5, seed=1),
            keras.layers.Dense(2, name="out"),
        ]
    )
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
    return model, optimizer


def test_a_keras_optimizers_lists_indices_and_slot_names():
    model, optimizer = adam_on_a_model()
    variables = model.trainable_variables
    assert [id(v) for v in tf_internals.trainable_variables_of(optimizer)] == [id(v) for v in variables]
    assert [id(v) for v in tf_internals.own_variables_of(optimizer)] == [id(v) for v in optimizer.variables]
    slots = tf_internals.slot_lists(optimizer)
    assert len(slots) == 2 and all(
        len(lists) == len(variables) for lists in slots.values()
    )  # Adam: momentums, velocities
    for index, variable in enumerate(variables):
        assert tf_internals.slot_index(optimizer, variable) == index
        for lists in slots.values():
            assert lists[index].name.startswith(tf_internals.slot_name_prefix(variable))
            assert lists[index].shape == variable.shape
    scaled = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam())
    scaled.build(variables)
    assert {id(v) for v in tf_internals.own_variables_of(scaled)}.isdisjoint(
        {id(v) for v in scaled.inner_optimizer.variables}
    )


def test_the_key_of_an_optimizers_variable_in_a_checkpoint(tmp_path):
    model, optimizer = adam_on_a_model()
    path = tf.train.Checkpoint(model=model, optimizer=optimizer).write(str(tmp_path / "ckpt"))
    shapes = tf.train.load_checkpoint(path).get_variable_to_shape_map()
    for index, variable in enumerate(model.trainable_variables):
        assert shapes[tf_internals.saved_trainable_variable_key(index)] == list(variable.shape)


def test_an_object_checkpointed_with_fixed_children_restores_into_the_optimizer(tmp_path):
    """FixedChildren with an optimizer's own children (checkpoint_children)
    and its lists (tracked) writes what the optimizer itself restores."""
    model, optimizer = adam_on_a_model()
    for variable in optimizer.variables:
        variable.assign(tf.fill(variable.shape, tf.cast(7, variable.dtype)))
    children = tf_internals.checkpoint_children(optimizer)
    assert (
        children
        and not {tf_internals.OPTIMIZER_TRAINABLE_VARIABLES, tf_internals.OPTIMIZER_VARIABLES} & children.keys()
    )
    state = tf_internals.FixedChildren(
        {
            **children,
            tf_internals.OPTIMIZER_TRAINABLE_VARIABLES: tf_internals.tracked(list(model.trainable_variables)),
            tf_internals.OPTIMIZER_VARIABLES: tf_internals.tracked(list(optimizer.variables)),
        }
    )
    path = tf.train.Checkpoint(model=model, optimizer=state).write(str(tmp_path / "ckpt"))
    fresh_model, fresh = adam_on_a_model()
    tf.train.Checkpoint(model=fresh_model, optimizer=fresh).read(path).assert_existing_objects_matched()
    assert all(np.all(v.numpy() == 7) for v in fresh.variables)


def test_a_checkpoint_is_written_from_stand_ins_under_its_objects_names(tmp_path):
    """write_in_place_of: each stand-in's values (a tensor, or a variable of
    its own) under the names of the object it stands in for; the objects
    themselves untouched; the checkpoint restores into them as any other."""
    model, optimizer = adam_on_a_model()
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    kernel, slot = model.trainable_variables[0], optimizer.variables[2]
    assert (
        tf_internals.saves_values(kernel) and tf_internals.saves_values(slot) and not tf_internals.saves_values(model)
    )
    sevens = tf_internals.values_in_place({tf_internals.VARIABLE_VALUE: tf.fill(kernel.shape, 7.0)})
    threes = tf.Variable(tf.fill(slot.shape, 3.0))
    path = tf_internals.write_in_place_of(checkpoint, [(kernel, sevens), (slot, threes)], str(tmp_path / "ckpt"))
    assert not np.any(kernel.numpy() == 7) and not np.any(slot.numpy() == 3)
    fresh_model, fresh = adam_on_a_model()
    status = tf.train.Checkpoint(model=fresh_model, optimizer=fresh).read(path)
    status.assert_existing_objects_matched()
    assert np.all(fresh_model.trainable_variables[0].numpy() == 7) and np.all(fresh.variables[2].numpy() == 3)
    np.testing.assert_array_equal(fresh_model.trainable_variables[1].numpy(), model.trainable_variables[1].numpy())


def test_the_optimizer_takes_gradients_as_already_summed():
    summed = tf_internals.gradients_arrive_summed(keras.optimizers.SGD)
    assert issubclass(summed, keras.optimizers.SGD) and summed.__name__ == "SGD"
    pairs = [(tf.constant(1.0), tf.Variable(2.0))]
    assert summed(learning_rate=0.1)._all_reduce_sum_gradients(pairs) == pairs


def test_a_sharded_variable_is_told_apart_and_built_from_shards():
    shards = [tf.Variable([[1.0]]), tf.Variable([[2.0]])]
    whole = tf_internals.sharded_variable(shards)
    assert tf_internals.is_sharded_variable(whole) and not tf_internals.is_sharded_variable(shards[0])
    assert whole.shape == (2, 1) and list(whole.variables) == shards


def test_seed_generator_states_and_auc_counts_are_found_by_their_keras_names():
    model, _ = adam_on_a_model()
    assert (
        len([v for v in model.non_trainable_variables if tf_internals.is_seed_generator_state(v)]) == 1
    )  # the Dropout's
    auc = keras.metrics.AUC(num_thresholds=5)
    auc.update_state([0, 1, 1, 0], [0.1, 0.8, 0.4, 0.6])
    tp, fp, fn, tn = tf_internals.auc_counts(auc, [v.numpy() for v in auc.variables])
    for counts, variable in zip(
        (tp, fp, fn, tn), (auc.true_positives, auc.false_positives, auc.false_negatives, auc.true_negatives)
    ):
        np.testing.assert_array_equal(counts, variable.numpy())


def test_op_determinism_is_read_and_turned_off():
    was = tf_internals.op_determinism_enabled()
    try:
        tf.config.experimental.enable_op_determinism()
        assert tf_internals.op_determinism_enabled() is True
        tf_internals.disable_op_determinism()
        assert tf_internals.op_determinism_enabled() is False
    finally:
        if was:
            tf.config.experimental.enable_op_determinism()


def test_hydras_command_line_parser_callbacks_and_config_files():
    from omegaconf import OmegaConf

    args = hydra_internals.args_parser().parse_args(["-m", "trainer.steps=1,2"])
    assert args.multirun and args.overrides == ["trainer.steps=1,2"]
    assert hydra_internals.callbacks(OmegaConf.create({"hydra": {"callbacks": {}}})).callbacks == []
    assert hydra_internals.config_header("# @package _global_\n# a note\nfoo: 1\n") == {"package": "_global_"}
    assert hydra_internals.config_file_name("mine") == "mine.yaml" == hydra_internals.config_file_name("mine.yaml")
