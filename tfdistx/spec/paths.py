"""Where the config tree lives: inside the package when installed from a
wheel (pyproject maps conf/ to tfdistx/conf), at the repository's top in a
checkout or an editable install."""

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent.parent

CONFIG_PATH_ENV = "TFDISTX_CONFIG_PATH"  # the user's config dirs, as --config-dir gives them (config/userconf.py)


def config_dir() -> Path:
    installed = _PACKAGE / "conf"
    return installed if installed.is_dir() else _PACKAGE.parent / "conf"
