"""Every `_target_` checked from its source before TensorFlow starts
(core/static_targets.py), in-process (-m unit): that it exists, is a class
or function, and takes the keys given, for the run, --plan and the
Kubernetes exports alike, in one line with exit 2 and no run dir; and
nothing refused that the source does not say for sure."""

import sys

import pytest

from config_helpers import PREFIX, compose_ok, refused
from tfdistx import cli
from tfdistx.core.static_targets import Found, Missing, look_up

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "overrides, line",
    [
        (
            ["+callbacks.x._target_=keras.callbacks.NoSuchCallback"],
            "callbacks.x._target_='keras.callbacks.NoSuchCallback': module 'keras.callbacks' has no attribute "
            "'NoSuchCallback'",
        ),
        (
            ["model._target_=user_plugins.nope"],
            "model._target_='user_plugins.nope': module 'user_plugins' has no attribute 'nope' (it has: ",
        ),
        (
            ["model._target_=user_plugins.tiny_cnn", "model.filtrs=32"],
            "model.filtrs=32: user_plugins.tiny_cnn takes no such argument; it takes: filters (tfdistx passes "
            "feature_spec, input_shape, num_classes, num_outputs itself)",
        ),
        (
            ["optimizer._target_=keras.optimizers.Nope"],
            "optimizer._target_='keras.optimizers.Nope': module 'keras.optimizers' has no attribute 'Nope'",
        ),
        (
            ["+callbacks.x._target_=keras.callbacks.EarlyStopping", "+callbacks.x.patince=3"],
            "callbacks.x.patince=3: keras.callbacks.EarlyStopping takes no such argument; it takes: monitor, "
            "min_delta, patience, verbose, mode, baseline, restore_best_weights, start_from_epoch (tfdistx passes "
            "run_dir itself)",
        ),
        (
            ["logger.mine._target_=user_plugins.LinesLogger", "logger.mine.nmae=x"],
            "logger.mine.nmae='x': user_plugins.LinesLogger takes no such argument; it takes: name (tfdistx passes "
            "config, run_dir itself)",
        ),
        (
            ["task._target_=tfdistx.tasks.classification.Nope"],
            "task._target_='tfdistx.tasks.classification.Nope': module "
            "'tfdistx.tasks.classification' has no attribute 'Nope'",
        ),
        (["data._target_=keras.callbacks"], "data._target_='keras.callbacks': is a module, not a class or function"),
        (
            [
                "+callbacks.f._target_=keras.callbacks.LambdaCallback",
                "+callbacks.f.on_epoch_end._target_=user_plugins.note_lss",
                "+callbacks.f.on_epoch_end._partial_=true",
            ],
            "callbacks.f.on_epoch_end._target_='user_plugins.note_lss': module 'user_plugins' has no attribute "
            "'note_lss'",
        ),
    ],
)
def test_a_target_that_is_not_there_or_does_not_take_a_key_is_refused_before_tensorflow(tmp_path, overrides, line):
    lines = refused(tmp_path / "run", *overrides)
    assert len(lines) == 1 and lines[0].startswith(PREFIX + line), lines


def test_the_run_plan_and_exports_refuse_it_with_exit_2_and_no_run_dir(tmp_path, capsys):
    bad = "+callbacks.x._target_=keras.callbacks.NoSuchCallback"
    for argv in (
        [bad, f"hydra.run.dir={tmp_path / 'run'}"],
        [bad, "--plan"],
        ["job", "tfjob", bad, "--image", "img"],
        ["job", "jobset", bad, "--image", "img"],
        ["job", "trainjob", bad, "--image", "img"],
    ):
        with pytest.raises(SystemExit) as leaving:
            cli.main(argv)
        assert leaving.value.code == 2, argv
        assert capsys.readouterr().err.splitlines() == [
            "tfdistx: invalid config: callbacks.x._target_='keras.callbacks.NoSuchCallback': module 'keras.callbacks' "
            "has no attribute 'NoSuchCallback'"
        ], argv
    assert not (tmp_path / "run").exists()


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A package of the user's that raises if it is imported: every answer below is read from its source."""
    root = tmp_path / "src" / "ownpkg"
    (root / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "raise RuntimeError('imported')\nfrom .models import build as build\n",
        "models.py": "import keras\nraise RuntimeError('imported')\n"
        "def build(input_shape, num_outputs, width=8):\n    pass\n"
        "def loose(width=8, **kwargs):\n    pass\n"
        "class Base:\n    def __init__(self, depth=1):\n        pass\n"
        "class Child(Base):\n    def __init__(self, width=2, **kwargs):\n        super().__init__(**kwargs)\n"
        "class Stores:\n    def __init__(self, **kwargs):\n        self.kwargs = kwargs\n"
        "class OnKeras(keras.layers.Layer):\n    def __init__(self, units=4, **kwargs):\n"
        "        super().__init__(**kwargs)\n"
        "@some_decorator\ndef decorated(width=1):\n    pass\n"
        "RATE = 0.1\n",
        "star.py": "from ownpkg.models import *\n",
        "lazy.py": "def __getattr__(name):\n    return name\n",
        "sub/__init__.py": "from ..models import Child as Kid\n",
    }
    for name, text in files.items():
        (root / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    yield "ownpkg"
    assert "ownpkg" not in sys.modules  # never imported


@pytest.mark.parametrize(
    "path, answer",
    [
        ("ownpkg.build", Found("function", ("input_shape", "num_outputs", "width"))),  # through a re-export
        (
            "ownpkg.models.nope",
            Missing(
                "module 'ownpkg.models' has no attribute 'nope' (it has: Base, Child, OnKeras, Stores, build, "
                "decorated, loose)"
            ),
        ),
        ("ownpkg.models.Child", Found("class", ("width", "depth"))),  # **kwargs followed up to its base
        ("ownpkg.sub.Kid", Found("class", ("width", "depth"))),  # a relative re-export under another name
        ("ownpkg.models.RATE", Missing("is a float, not a class or function")),
        # not known for sure: left to the engine
        ("ownpkg.models.loose", Found("function", None)),
        ("ownpkg.models.Stores", Found("class", None)),
        (
            "ownpkg.models.OnKeras",
            Found("class", None),
        ),  # Keras' Layer passes **kwargs on in ways the source does not pin down
        ("ownpkg.models.decorated", Found("function", None)),
        ("ownpkg.star.anything", None),
        ("ownpkg.lazy.anything", None),
    ],
)
def test_answers_come_from_the_source_and_only_when_certain(package, path, answer):
    assert look_up(path) == answer


def test_keys_the_source_cannot_rule_out_are_left_to_the_engine(tmp_path, package):
    compose_ok(tmp_path / "run", "model._target_=ownpkg.models.loose", "model.anything=1")
    compose_ok(tmp_path / "run", "model._target_=ownpkg.star.whatever", "model.anything=1")
    assert refused(tmp_path / "run", "model._target_=ownpkg.models.Child", "model.dpth=2") == [
        PREFIX + "model.dpth=2: ownpkg.models.Child takes no such argument; it takes: width, depth (tfdistx passes "
        "feature_spec, input_shape, num_classes, num_outputs itself)"
    ]
