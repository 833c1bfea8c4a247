"""In-process helpers for the `unit` config tests (tests/test_unit_config_*.py).

`refused` and `compose_ok` compose exactly as the command line does
(commands/common.compose); `config_factory` (the `configs` fixture) composes each base config
once per module and hands out copies, which a test changes and re-checks with
`validate` (what compose calls after Hydra has composed): one bad value,
checked in milliseconds. No subprocess, no TensorFlow.
"""

import copy

import pytest
from omegaconf import OmegaConf, open_dict

from tfdistx.commands.common import compose
from tfdistx.core.errors import ConfigError
from tfdistx.config.validate import validate

PREFIX = "tfdistx: invalid config: "


def refused(run_dir, *overrides) -> list:
    """Every line the command line would print for these overrides (it must refuse them)."""
    with pytest.raises(ConfigError) as caught:
        compose([*overrides, f"hydra.run.dir={run_dir}"], notes=False)
    lines = caught.value.lines()
    assert lines and all(line.startswith(PREFIX) for line in lines), lines
    return lines


def compose_ok(run_dir, *overrides):
    return compose([*overrides, f"hydra.run.dir={run_dir}"], notes=False)


def problems(cfg) -> list:
    """The lines `validate` refuses `cfg` with ([] when it is accepted)."""
    try:
        validate(cfg)
    except ConfigError as error:
        return error.lines()
    return []


def changed(cfg, changes: dict):
    """`cfg` with each dotted key set to its value (keys the group lacks are added)."""
    with open_dict(cfg):
        for key, value in changes.items():
            OmegaConf.update(cfg, key, value, merge=False, force_add=True)
    return cfg


def config_factory(run_dir):
    """configs(*overrides) -> a fresh copy of the config those overrides
    compose to (each composed and validated once): the `configs` fixture (conftest.py)."""
    cache = {}

    def get(*overrides):
        if overrides not in cache:
            cache[overrides] = compose_ok(run_dir, *overrides)
        return copy.deepcopy(cache[overrides])

    return get
