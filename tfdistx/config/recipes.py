"""Recipes: reusable experiment configs, selected with `recipe=NAME`.

A recipe is a YAML file in recipes/ (shipped; the config group `recipe`,
through the link conf/recipe) or in a directory of the user's own, named by
the environment variable TFDISTX_RECIPES (several directories separated by
`:`). A user's recipe shadows a shipped one of the same name, so a recipe
copied out with `tfdistx recipes copy` and edited keeps its name.

    tfdistx recipes [list]                  the recipes, one line each
    tfdistx recipes show NAME [overrides]   the composed config of a run
    tfdistx recipes copy NAME DEST          the file, copied out for editing

`register(overrides)` runs before anything is composed (as
`topology.register` does): it makes the user's directories part of Hydra's
config search path, and registers the cluster topologies the selected
recipes name in their defaults (`override /cluster: 1x4`), which, like the
ones given on the command line, have no file. Nothing here imports
TensorFlow.
"""

import os
import re
from pathlib import Path
from typing import Iterable, List, Optional

from hydra.core.object_type import ObjectType
from hydra.core.plugins import Plugins
from hydra.plugins.config_source import ConfigLoadError, ConfigResult, ConfigSource
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import OmegaConf

from tfdistx.config import topology
from tfdistx.core.paths import config_dir
from tfdistx.core.errors import ConfigError
from tfdistx.internals import hydra as internals

ENV = "TFDISTX_RECIPES"
GROUP = "recipe"


# --- where recipes live -------------------------------------------------------


def user_dirs() -> List[Path]:
    """The directories named by TFDISTX_RECIPES, first one first."""
    value = os.environ.get(ENV, "")
    return [Path(part).expanduser().resolve() for part in value.split(os.pathsep) if part.strip()]


def shipped_dir() -> Path:
    return config_dir() / GROUP


def search_dirs() -> List[Path]:
    """Where `recipe=NAME` is looked up, in order: the user's, then the shipped."""
    return [*user_dirs(), shipped_dir()]


def find(name: str) -> Optional[Path]:
    """The file `recipe=NAME` selects, or None."""
    for directory in search_dirs():
        path = directory / f"{name}.yaml"
        if path.is_file():
            return path
    return None


def available() -> List[dict]:
    """Every recipe visible, shadowed ones included: name, path, description, shadowed_by."""
    seen, found = {}, []
    for directory in search_dirs():
        for path in sorted(directory.glob("*.yaml")) if directory.is_dir() else []:
            name = path.stem
            found.append({"name": name, "path": path, "description": describe(path), "shadowed_by": seen.get(name)})
            seen.setdefault(name, path)
    return found


def describe(path: Path) -> str:
    """A recipe's first comment line that is not a Hydra directive (`# @package`)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        return f"(unreadable: {error.strerror})"
    for line in lines:
        text = line.strip()
        if not text.startswith("#"):
            if text:
                break
            continue
        text = text.lstrip("#").strip()
        if text and not text.startswith("@"):
            return text
    return "(no description: start the file with a comment line)"


def is_global(path: Path) -> bool:
    try:
        return internals.config_header(path.read_text(encoding="utf-8")[:512]).get("package") == "_global_"
    except (OSError, ValueError):
        return False


# --- Hydra: the user's directories as part of the `recipe` group ----------------


class RecipeDirSource(ConfigSource):
    """A directory of NAME.yaml files, seen by Hydra as the `recipe` group.

    A plain file:// search path entry would need a `recipe/` folder inside the
    user's directory; this source answers `recipe/NAME` from `DIR/NAME.yaml`
    and nothing else. Files keep their header (`# @package _global_`) and
    their defaults list (`override /strategy: mirrored`), as in recipes/.
    """

    @staticmethod
    def scheme() -> str:
        return "tfdistx-recipes"

    def _file(self, config_path: str) -> Optional[Path]:
        group, _, name = config_path.partition("/")
        if group != GROUP or not name or "/" in name:
            return None
        return Path(self.path) / internals.config_file_name(name)

    def load_config(self, config_path: str) -> ConfigResult:
        path = self._file(config_path)
        if path is None or not path.is_file():
            raise ConfigLoadError(f"Config not found: {config_path} in {self.path}")
        text = path.read_text(encoding="utf-8")
        return ConfigResult(
            config=OmegaConf.load(path),
            path=self.full_path(),
            provider=self.provider,
            header=internals.config_header(text),
        )

    def available(self) -> bool:
        return Path(self.path).is_dir()

    def is_group(self, config_path: str) -> bool:
        return config_path in ("", GROUP)

    def is_config(self, config_path: str) -> bool:
        path = self._file(config_path)
        return path is not None and path.is_file()

    def list(self, config_path: str, results_filter: Optional[ObjectType]) -> List[str]:
        if config_path != GROUP or results_filter == ObjectType.GROUP or not self.available():
            return []
        return sorted(path.stem for path in Path(self.path).glob("*.yaml"))


class UserRecipesSearchPath(SearchPathPlugin):
    """Puts the TFDISTX_RECIPES directories before the shipped configs."""

    def manipulate_search_path(self, search_path) -> None:
        for directory in reversed(user_dirs()):  # prepending: the first named ends up first
            search_path.prepend(provider="tfdistx-user-recipes", path=f"{RecipeDirSource.scheme()}://{directory}")


def register(overrides: Iterable[str]) -> None:
    """Call before composing: user recipe dirs, and the topologies the selected recipes name.

    Raises ConfigError when TFDISTX_RECIPES names something that is not a directory.
    """
    for directory in user_dirs():
        if not directory.is_dir():
            raise ConfigError.for_key(ENV, os.environ.get(ENV), f"{directory} is not a directory of recipe files")
    plugins = Plugins.instance()
    plugins.register(RecipeDirSource)  # also registers the tfdistx-recipes:// scheme
    plugins.register(UserRecipesSearchPath)
    names = []
    for recipe in requested(overrides):
        path = find(recipe)
        if path is None:  # refused here: `optional recipe` in config.yaml would skip it silently
            raise unknown(recipe)
        names += _clusters_in(path)
    topology.register([f"cluster={name}" for name in names])


def unknown(name: str) -> ConfigError:
    names = sorted({r["name"] for r in available()})
    return ConfigError.for_key(GROUP, name, "allowed: " + ", ".join(names))


def requested(overrides: Iterable[str]) -> List[str]:
    """Every value given to `recipe=` in these overrides, sweeps included."""
    return topology.requested_names(overrides, GROUP)


def _clusters_in(path: Path) -> List[str]:
    """`cluster` options named in a recipe's defaults list (`override /cluster: 1x4`)."""
    return options_in(path, "cluster")


def options_in(path: Path, wanted: str) -> List[str]:
    """Options of group `wanted` named in a recipe's defaults list."""
    try:
        defaults = OmegaConf.to_container(OmegaConf.load(path)).get("defaults") or []
    except Exception:  # Hydra reports a broken file properly when it composes it
        return []
    names = []
    for entry in defaults if isinstance(defaults, list) else []:
        if isinstance(entry, dict):
            for key, value in entry.items():
                group = re.sub(r"^override\s+", "", str(key)).lstrip("/").split("@")[0]
                if group == wanted and isinstance(value, str):
                    names.append(value)
    return names


# The data source that downloads (tensorflow-datasets); the others read what is on this machine.
DOWNLOADING_SOURCE = "tfdistx.data.tfds"


def downloads(path: Path) -> Optional[str]:
    """The dataset a recipe downloads on its first run (a tensorflow-datasets
    data option in its defaults), or None: `tfdistx recipes` says which
    recipes need the network once."""
    for option in options_in(path, "data"):
        data = _shipped_data(option)
        if data is not None and data.get("_target_") == DOWNLOADING_SOURCE:
            return str(data.get("name", option))
    return None


def _shipped_data(option: str):
    """A shipped data option's keys, over those of the options of its group it extends (data=mnist: data=tfds's,
    named in its defaults); None for an option that is not shipped (the user's own, which we cannot judge here)."""
    try:
        data = OmegaConf.load(config_dir() / "data" / f"{option}.yaml")
    except Exception:
        return None
    bases = [entry for entry in data.get("defaults") or [] if isinstance(entry, str) and entry != "_self_"]
    found = [_shipped_data(base) for base in bases if base != option]
    return OmegaConf.merge(*[base for base in found if base is not None], data)
