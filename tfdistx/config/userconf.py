"""A user's own config tree beside tfdistx's: `--config-dir DIR` or the
environment variable TFDISTX_CONFIG_PATH (several directories separated by
`:`), as lightning-hydra-template users keep `configs/` in their own repo.

Such a directory holds groups laid out as tfdistx's conf/ is
(`DIR/data/digits.yaml` -> `data=digits`, `DIR/model/small.yaml` ->
`model=small`) and, for whole experiments, `DIR/experiment/NAME.yaml`
files that start with `# @package _global_` (`experiment=NAME`, applied
last, like a recipe).

The directories join Hydra's config search path where Hydra's own
`--config-dir` puts its one: after tfdistx's conf/, so a user's
`config.yaml` never replaces the primary config and a shipped option of
the same name wins (`tfdistx recipes` marks such an option shadowed).
`--config-dir` is turned into TFDISTX_CONFIG_PATH for this process and its
children, deliberately: a sweep's jobs and a local cluster's tasks compose
or import with the same tree. Nothing here imports TensorFlow.
"""

import os
from pathlib import Path
from typing import Dict, List, Sequence

from hydra.core.config_search_path import SearchPathQuery
from hydra.core.plugins import Plugins
from hydra.plugins.search_path_plugin import SearchPathPlugin

from tfdistx.config import topology
from tfdistx.config.errors import ConfigError
from tfdistx.config.paths import config_dir

ENV = "TFDISTX_CONFIG_PATH"
FLAGS = ("--config-dir", "-cd")
PROVIDER = "tfdistx-user-config"
EXPERIMENT = "experiment"


def dirs() -> List[Path]:
    """The user's config directories, first one first."""
    value = os.environ.get(ENV, "")
    return [Path(part).expanduser().resolve() for part in value.split(os.pathsep) if part.strip()]


def take_flags(argv: Sequence[str]) -> List[str]:
    """`argv` without its `--config-dir DIR` flags, each DIR added in front
    of TFDISTX_CONFIG_PATH. Hydra would add the directory itself, but only
    on its own paths (help, sweeps), not where tfdistx composes a single run."""
    rest, given, args = [], [], list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, value = arg.partition("=")
        if name in FLAGS and eq:
            given.append(value)
        elif arg in FLAGS:
            if i + 1 == len(args):
                raise ConfigError.one(arg, None, "needs a directory: --config-dir DIR")
            given.append(args[i + 1])
            i += 1
        else:
            rest.append(arg)
        i += 1
    if given:
        add([Path(d) for d in given])
    return rest


def add(directories: Sequence[Path]) -> None:
    """Put `directories` first in TFDISTX_CONFIG_PATH (a run recorded with them, say)."""
    known = [str(d) for d in dirs()]
    new = [str(Path(d).expanduser().resolve()) for d in directories]
    os.environ[ENV] = os.pathsep.join(dict.fromkeys(new + known))


def check() -> None:
    for directory in dirs():
        if not directory.is_dir():
            raise ConfigError.one(f"--config-dir ({ENV})", str(directory), "is not a directory: a config dir holds "
                                  "GROUP/NAME.yaml files, e.g. data/mine.yaml, experiment/mine.yaml")


class UserConfigSearchPath(SearchPathPlugin):
    """Puts the user's config dirs after tfdistx's own, where Hydra's `--config-dir` would."""

    def manipulate_search_path(self, search_path) -> None:
        for directory in dirs():
            search_path.prepend(provider=PROVIDER, path=f"file://{directory}", anchor=SearchPathQuery(provider="schema"))


def register(overrides: Sequence[str] = ()) -> None:
    """Call before composing: the user's dirs join Hydra's search path.
    Raises ConfigError for a directory that is not one, or an
    `experiment=NAME` no directory holds (with no experiment/ anywhere,
    Hydra would take `experiment` for a key and say it is not one)."""
    check()
    Plugins.instance().register(UserConfigSearchPath)
    known = experiments()
    for name in topology.requested_names(overrides, EXPERIMENT):
        if name not in known and name != "null":
            where = ", ".join(str(d) for d in dirs()) or "none given"
            raise ConfigError.one(EXPERIMENT, name, (f"allowed: {', '.join(sorted(known))}" if known else "no experiments found")
                                  + f" (your {EXPERIMENT}/NAME.yaml files in --config-dir DIR or {ENV}: {where})")


def experiments() -> Dict[str, Path]:
    """experiment=NAME -> its file (the first directory's wins)."""
    found: Dict[str, Path] = {}
    for directory in dirs():
        for path in sorted((directory / EXPERIMENT).glob("*.yaml")):
            found.setdefault(path.stem, path)
    return found


def hint(group: str, value) -> str:
    """Where a user's own option of `group` would go."""
    return f"; or your own: --config-dir DIR with DIR/{group}/{value}.yaml"


def options() -> Dict[str, List[dict]]:
    """The user's own options, by group: name, path, and the shipped option that shadows it (or None)."""
    found: Dict[str, List[dict]] = {}
    shipped = config_dir()
    for directory in dirs():
        for path in sorted(directory.glob("*/*.yaml")) if directory.is_dir() else []:
            group = path.parent.name
            shadow = shipped / group / path.name
            found.setdefault(group, []).append({"name": path.stem, "path": path,
                                                "shadowed_by": shadow if shadow.is_file() else None})
    return found


def recorded(hydra_yaml: dict) -> List[Path]:
    """The user config dirs a run was composed with, from its .hydra/hydra.yaml
    (Hydra records the search path there), so that `tfdistx evaluate` or
    `predict` of that run finds `data=digits` again."""
    sources = ((hydra_yaml or {}).get("hydra", {}).get("runtime", {}) or {}).get("config_sources") or []
    return [Path(s["path"]) for s in sources if isinstance(s, dict) and s.get("provider") == PROVIDER and s.get("path")]
