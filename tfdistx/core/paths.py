"""Where the config tree lives: inside the package when installed from a
wheel (pyproject maps conf/ to tfdistx/conf), at the repository's top in a
checkout or an editable install."""

from pathlib import Path
from typing import Optional, Union

_PACKAGE = Path(__file__).resolve().parent.parent

CONFIG_PATH_ENV = "TFDISTX_CONFIG_PATH"  # the user's config dirs, as --config-dir gives them (config/userconf.py)


def checkpoint_dir(configured: Optional[str], run_dir: Union[str, Path]) -> str:
    """Where a run keeps its checkpoints: checkpoint.dir as configured (as given: a gs:// one stays a URL),
    or by default RUN_DIR/checkpoints (the one place that default is said)."""
    return str(configured) if configured else str(Path(run_dir) / "checkpoints")


def config_dir() -> Path:
    installed = _PACKAGE / "conf"
    return installed if installed.is_dir() else _PACKAGE.parent / "conf"
