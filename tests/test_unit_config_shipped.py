"""Every shipped config composes and validates, in-process (-m unit); the
documented defaults; the generated config reference. (Topology names:
test_unit_config_cluster.py; every recipe: test_unit_config_recipes.py.)"""

import pytest

from tfdistx.config import recipes
from tfdistx.config import schema, topology
from tfdistx.core import strategies
from tfdistx.config.compose import compose_and_validate
from tfdistx.core.paths import config_dir

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


# Options that need a key no default can give: file data needs its files, data=tfds its dataset's name.
REQUIRED = {
    "data=tfrecord": [f"data.train_files={__file__}"],
    "data=csv": [f"data.train_files={__file__}"],
    "data=tfds": ["data.name=imdb_reviews"],  # any TensorFlow Datasets dataset: named on the command line
}


@pytest.mark.unit
@pytest.mark.parametrize("strategy", SINGLE_PROCESS_STRATEGIES)
def test_single_process_strategies_compose(strategy):
    assert compose(f"strategy={strategy}").strategy.name == strategy


@pytest.mark.unit
def test_defaults_are_the_documented_ones():
    cfg = compose()
    assert (cfg.strategy.name, cfg.cluster.name, cfg.model._target_, cfg.data._target_, cfg.optimizer.name) == (
        "auto",
        "local",
        "tfdistx.models.mlp",
        "tfdistx.data.synthetic",
        "adam",
    )


@pytest.mark.unit
def test_the_config_reference_is_generated_and_lists_every_key():
    """docs/config.md is what `python -m tfdistx.config.reference` writes, and
    every key of every composed group option is in it (regenerate with that
    command after changing conf/)."""
    from omegaconf import OmegaConf

    from tfdistx.config import reference

    committed = config_dir().parent / "docs" / "config.md"
    if not committed.is_file():
        pytest.skip("docs/ is not shipped in the wheel")
    text = committed.read_text()
    assert text == reference.render(), "docs/config.md is stale: python -m tfdistx.config.reference > docs/config.md"
    # a cluster each strategy can run on (the multi-process ones are placed, not launched, by --plan's rules)
    fits = {"multiworker": ["cluster=2x1"], "parameter_server": ["cluster=ps1w2"]}
    for group in ("checkpoint", "cluster", "data", "logger", "model", "optimizer", "strategy", "task", "trainer"):
        for option in options(group):
            cfg = compose(
                f"{group}={option}",
                *fits.get(option if group == "strategy" else "", []),
                *REQUIRED.get(f"{group}={option}", ()),
            )
            flat = OmegaConf.to_container(cfg[group])
            for key in _leaf_keys(flat):
                assert f"| `{group}.{key}` |" in text, f"{group}.{key} (option {option}) is not in docs/config.md"


def _leaf_keys(node, prefix=""):
    for key, value in node.items():
        if isinstance(value, dict) and value:
            yield from _leaf_keys(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"
