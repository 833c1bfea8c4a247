"""Compose and check a run's config before Hydra starts the job.

Hydra answers a bad override with exit code 1 and several lines; the tfdistx
contract is exit code 2 and one line naming the key. So a single run is first
composed here with Hydra's compose API (cheap: no TensorFlow), and any
composition error is reworded as a ConfigError.
"""

from typing import Sequence

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException, MissingConfigException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tfdistx.config import topology
from tfdistx.config.paths import config_dir
from tfdistx.config.validate import validate
from tfdistx.errors import ConfigError, Problem


def compose_and_validate(overrides: Sequence[str]):
    """The composed config (with its `hydra` node); raises ConfigError."""
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base=None):
            cfg = compose("config", overrides=list(overrides), return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as error:
        raise as_config_error(error, overrides) from None
    validate(cfg, run_dir=OmegaConf.select(cfg, "hydra.run.dir"))
    return cfg


def as_config_error(error: Exception, overrides: Sequence[str]) -> ConfigError:
    if isinstance(error, MissingConfigException) and error.options is not None:
        group = error.missing_cfg_file.split("/")[0] if error.missing_cfg_file else "?"
        value = _given(group, overrides)
        allowed = topology.FORMS if group == "cluster" else "allowed: " + ", ".join(sorted(error.options))
        return ConfigError([Problem(group, value, allowed)])
    # Type errors come wrapped: Hydra's "Error merging override k=v" caused by
    # OmegaConf's "Value 'abc' ... could not be converted to Integer".
    cause = error.__cause__ or error
    first_line = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
    key = getattr(cause, "full_key", None) or _override_key(str(error))
    return ConfigError([Problem(key or "override", _given(key, overrides) if key else None, first_line)])


def _given(key: str, overrides: Sequence[str]):
    for override in overrides:
        name, _, value = override.lstrip("+~").partition("=")
        if name == key:
            return value
    return None


def _override_key(message: str):
    marker = "override "
    if marker in message:
        return message.split(marker, 1)[1].split("=", 1)[0].strip("'\" ")
    return None
