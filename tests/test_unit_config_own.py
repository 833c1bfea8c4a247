"""A user's own config tree and targets, composed in-process as the command
line composes them: `--config-dir DIR` / TFDISTX_CONFIG_PATH groups and
experiments, a target's keys without Hydra's `+`, and the refusal of a key
a target does not take."""

import pytest

from config_helpers import PREFIX, compose_ok, refused
from tfdistx import cli
from tfdistx.config import userconf
from tfdistx.config.compose import keys_for_own_targets
from tfdistx.core.errors import ConfigError
from tfdistx.core.targets import Target

pytestmark = pytest.mark.unit


def project(root):
    """A user's config dir: a data option and an experiment over it."""
    (root / "data").mkdir(parents=True)
    (root / "experiment").mkdir()
    (root / "data" / "digits.yaml").write_text(
        "# five classes of synthetic digits\n_target_: tfdistx.data.synthetic\nbatch_size: 64\nnum_classes: 5\n"
    )
    (root / "experiment" / "mine.yaml").write_text(
        "# @package _global_\n# my digits run\ndefaults:\n  - override /data: digits\ntrainer:\n  steps: 30\n"
    )
    return root


@pytest.fixture
def own_conf(tmp_path, monkeypatch):
    monkeypatch.setenv(userconf.ENV, "")  # recorded, so what take_flags adds is undone after the test
    return project(tmp_path / "conf")


def test_config_dir_adds_groups_and_experiments(tmp_path, own_conf, monkeypatch):
    rest = userconf.take_flags(["--config-dir", str(own_conf), "experiment=mine", "trainer.seed=3"])
    assert rest == ["experiment=mine", "trainer.seed=3"]
    cfg = compose_ok(tmp_path / "run", *rest)
    assert (cfg.data.num_classes, cfg.data.batch_size, cfg.trainer.steps, cfg.trainer.seed) == (5, 64, 30, 3)
    # the environment variable is the same thing, for any command
    monkeypatch.setenv(userconf.ENV, str(own_conf))
    assert compose_ok(tmp_path / "run", "data=digits").data.num_classes == 5


def test_unknown_experiment_and_option_say_where_they_would_go(tmp_path, own_conf, monkeypatch):
    assert refused(tmp_path / "run", "experiment=mine") == [
        PREFIX + "experiment='mine': no experiments found (your experiment/NAME.yaml files in --config-dir DIR or "
        "TFDISTX_CONFIG_PATH: none given)"
    ]
    assert refused(tmp_path / "run", "data=digits")[0].endswith(
        "; or your own: --config-dir DIR with DIR/data/digits.yaml"
    )
    monkeypatch.setenv(userconf.ENV, str(own_conf))
    assert refused(tmp_path / "run", "experiment=yours") == [
        PREFIX + f"experiment='yours': allowed: mine (your experiment/NAME.yaml files in --config-dir DIR or "
        f"TFDISTX_CONFIG_PATH: {own_conf})"
    ]
    monkeypatch.setenv(userconf.ENV, str(tmp_path / "nowhere"))
    assert "is not a directory" in refused(tmp_path / "run", "data=synthetic")[0]


def test_recipes_lists_the_users_options_and_what_downloads(own_conf, monkeypatch, capsys):
    with pytest.raises(SystemExit) as leaving:  # as `tfdistx recipes --config-dir DIR` runs it
        cli.main(["recipes", "--config-dir", str(own_conf)])
    assert leaving.value.code == 0
    out = capsys.readouterr().out
    assert "experiment=mine  my digits run" in out and "data=digits" in out and "five classes" in out
    assert "mnist_mlp" in out and "[downloads mnist once: tensorflow-datasets]" in out
    assert "downloads" not in next(
        line for line in out.splitlines() if line.strip().startswith("wide_deep_ps")
    )  # synthetic


def test_a_targets_keys_need_no_plus(tmp_path):
    overrides = ["model._target_=user_plugins.tiny_cnn", "model.filters=32", "data.batch_size=16", "trainer.steps=5"]
    assert keys_for_own_targets(overrides) == [
        "model._target_=user_plugins.tiny_cnn",
        "++model.filters=32",
        "data.batch_size=16",
        "trainer.steps=5",
    ]
    cfg = compose_ok(tmp_path / "run", *overrides)
    assert cfg.model.filters == 32 and "hidden_units" not in cfg.model
    # a shipped option keeps Hydra's check, with the keys it has
    assert refused(tmp_path / "run", "model.filters=32") == [
        PREFIX + "model.filters='32': model has no key 'filters'; its keys: _target_, hidden_units, dropout"
    ]


def test_a_key_the_target_does_not_take_is_refused_with_its_parameters(tmp_path):
    """Before TensorFlow starts, from the target's source (static_targets.py);
    and by the engine when it builds the target, in the same words."""
    line = (
        PREFIX
        + "data.exampels=64: user_plugins.constant_data takes no such argument; it takes: features, num_classes, "
        "examples (tfdistx passes nothing itself)"
    )
    assert refused(
        tmp_path / "run", "data._target_=user_plugins.constant_data", "data.exampels=64", "data.features=4"
    ) == [line]
    with pytest.raises(ConfigError) as caught:
        Target("data", "user_plugins.constant_data", {"exampels": 64, "features": 4}).build(expect=object)
    assert caught.value.lines() == [line]
