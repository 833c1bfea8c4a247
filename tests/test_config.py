"""Every shipped config composes and validates; topology names parse."""

import subprocess
import sys

import pytest

from tfdistx.config import recipes
from tfdistx.config import schema, strategies, topology
from tfdistx.config.compose import compose_and_validate
from tfdistx.config.paths import config_dir
from tfdistx.config.errors import ConfigError

schema.register()

SINGLE_PROCESS_STRATEGIES = ["auto", "one_device", "mirrored", "central_storage", "tpu"]


def options(group):
    if group == "strategy":  # its options are the strategy table's rows, not files
        return sorted(strategies.nodes())
    return sorted(p.stem for p in (config_dir() / group).glob("*.yaml"))


def compose(*overrides):
    topology.register(overrides)
    recipes.register(overrides)
    return compose_and_validate(list(overrides))


@pytest.mark.unit
@pytest.mark.parametrize("group", ["model", "data", "optimizer", "trainer", "checkpoint", "logger", "cluster"])
def test_every_option_of_every_group_composes(group):
    found = options(group)
    assert found, f"conf/{group} is empty"
    for option in found:
        cfg = compose(f"{group}={option}", *REQUIRED.get(f"{group}={option}", ()))
        assert cfg[group] is not None


# Options that need a key no default can give: file data needs its files.
REQUIRED = {"data=tfrecord": [f"data.train_files={__file__}"], "data=csv": [f"data.train_files={__file__}"]}


@pytest.mark.unit
@pytest.mark.parametrize("strategy", SINGLE_PROCESS_STRATEGIES)
def test_single_process_strategies_compose(strategy):
    assert compose(f"strategy={strategy}").strategy.name == strategy


@pytest.mark.unit
def test_every_recipe_composes():
    for recipe in options("recipe"):
        compose(f"recipe={recipe}")


@pytest.mark.unit
def test_defaults_are_the_documented_ones():
    cfg = compose()
    assert (cfg.strategy.name, cfg.cluster.name, cfg.model._target_, cfg.data._target_, cfg.optimizer.name) == (
        "auto", "local", "tfdistx.models.mlp", "tfdistx.data.synthetic", "adam")


@pytest.mark.unit
@pytest.mark.parametrize("name, expected", [
    ("1x4", {"workers": 1, "devices_per_worker": 4, "ps": 0}),
    ("4x8", {"workers": 4, "devices_per_worker": 8, "ps": 0}),
    ("ps2w4", {"workers": 4, "devices_per_worker": 1, "ps": 2}),
])
def test_topology_names(name, expected):
    assert {k: v for k, v in topology.parse(name).items() if k in expected} == expected


@pytest.mark.unit
@pytest.mark.parametrize("name", ["4x", "x8", "ps2", "w4", "2*4", "local2"])
def test_malformed_topology_names_are_refused(name):
    assert topology.parse(name) is None
    with pytest.raises(ConfigError, match="WxD"):
        compose(f"cluster={name}")


@pytest.mark.unit
def test_cluster_sweep_registers_every_name():
    assert topology.requested_names(["cluster=1x2,2x1", "model=mlp"]) == ["1x2", "2x1"]


@pytest.mark.unit
def test_all_problems_are_reported_together():
    with pytest.raises(ConfigError) as caught:
        compose("data.batch_size=0", "optimizer.lr=-1", "trainer.log_every=0")
    keys = {p.key for p in caught.value.problems}
    assert keys == {"data.batch_size", "optimizer.lr", "trainer.log_every"}


def test_validation_imports_no_tensorflow():
    code = (
        "import sys\n"
        "from tfdistx.cli import main\n"
        "try:\n    main(['data.batch_size=-1'])\n"
        "except SystemExit as e:\n    print(e.code, 'tensorflow' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["2", "False"], out


def test_help_is_tfdistx_own_and_orients():
    run = subprocess.run([sys.executable, "-m", "tfdistx", "--help"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    for must in ("strategy: auto, central_storage, mirrored, multiworker, one_device, parameter_server, tpu",
                 "WxD", "psPwW", "tfdistx recipes", "tfdistx report", "--plan", "outputs/DATE/TIME", "== Examples =="):
        assert must in run.stdout, must
    assert "powered by Hydra" not in run.stdout


@pytest.mark.unit
def test_the_config_reference_is_generated_and_lists_every_key():
    """docs/config.md is what `python -m tfdistx.config.reference` writes, and
    every key of every composed group option is in it (regenerate with that
    command after changing conf/)."""
    from omegaconf import OmegaConf

    from tfdistx.config import reference

    committed = (config_dir().parent / "docs" / "config.md")
    if not committed.is_file():
        pytest.skip("docs/ is not shipped in the wheel")
    text = committed.read_text()
    assert text == reference.render(), "docs/config.md is stale: python -m tfdistx.config.reference > docs/config.md"
    # a cluster each strategy can run on (the multi-process ones are placed, not launched, by --plan's rules)
    fits = {"multiworker": ["cluster=2x1"], "parameter_server": ["cluster=ps1w2"]}
    for group in ("checkpoint", "cluster", "data", "logger", "model", "optimizer", "strategy", "task", "trainer"):
        for option in options(group):
            cfg = compose(f"{group}={option}", *fits.get(option if group == "strategy" else "", []),
                          *REQUIRED.get(f"{group}={option}", ()))
            flat = OmegaConf.to_container(cfg[group])
            for key in _leaf_keys(flat):
                assert f"| `{group}.{key}` |" in text, f"{group}.{key} (option {option}) is not in docs/config.md"


def _leaf_keys(node, prefix=""):
    for key, value in node.items():
        if isinstance(value, dict) and value:
            yield from _leaf_keys(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"
