"""Hydra's private APIs, each behind a named function (see
tfdistx/internals/__init__.py). Imports Hydra; never TensorFlow.

Every internal here was checked on hydra-core 1.3.8 (pyproject.toml pins
>=1.3.2,<1.4). Nothing private is touched when this module loads: `probe()`
looks, the functions use.
"""

from tfdistx import internals
from tfdistx.internals import Internal

# The parser of Hydra's own command line (overrides, --multirun, --cfg, --help
# ...). Hydra parses sys.argv inside hydra.main only; tfdistx must read the
# same command line before it (to check a run's config before TensorFlow, and
# a sweep's before its first job).
_ARGS_PARSER = Internal(
    "hydra-core", "hydra._internal.utils", "get_args_parser", "to read Hydra's command line before hydra.main does"
)
# What Hydra.run builds from `hydra.callbacks` and hands to run_job: tfdistx
# runs a single run's job itself (composed once), as Hydra's own `run` does.
_CALLBACKS = Internal(
    "hydra-core",
    "hydra._internal.callbacks",
    "Callbacks",
    "to run a single run's job (and its hydra.callbacks) as Hydra's own run does",
)
# A config file's header (`# @package _global_`), as Hydra reads it. A
# ConfigSource plugin (config/recipes.py) must hand it to Hydra with the
# file's config, and reads it to tell an experiment from a group option.
_HEADER = Internal(
    "hydra-core",
    "hydra.plugins.config_source.ConfigSource",
    "_get_header_dict",
    "to read a config file's `# @package` header",
)
# NAME -> NAME.yaml, as Hydra's own config sources name a config's file.
_FILE_NAME = Internal(
    "hydra-core",
    "hydra.plugins.config_source.ConfigSource",
    "_normalize_file_name",
    "to find a recipe's file as Hydra's own config sources do",
)


def args_parser():
    """Hydra's argparse parser of its command line."""
    return _ARGS_PARSER.get()()


def callbacks(cfg):
    """The hydra.callbacks of `cfg`, instantiated, as run_job takes them."""
    return _CALLBACKS.get()(cfg)


def config_header(text: str) -> dict:
    """The `# @key value` lines at the top of a config file's text, as a dict."""
    return _HEADER.get()(text)


def config_file_name(name: str) -> str:
    """The file name Hydra gives the config `name` (NAME.yaml)."""
    return _FILE_NAME.get()(name)


PROBES = (_ARGS_PARSER, _CALLBACKS, _HEADER, _FILE_NAME)


def probe() -> None:
    """Every internal above is there (Gone: the first missing)."""
    internals.probe(PROBES)
