"""A user's own config tree beside tfdistx's: `--config-dir DIR` or the
environment variable TFDISTX_CONFIG_PATH (several directories separated by
`:`), as lightning-hydra-template users keep `configs/` in their own repo.

Such a directory holds groups laid out as tfdistx's conf/ is
(`DIR/data/digits.yaml` -> `data=digits`, `DIR/model/small.yaml` ->
`model=small`) and, for whole experiments, `DIR/experiment/NAME.yaml`
files that start with `# @package _global_` (`experiment=NAME`, applied
last, like a recipe).

The directories join Hydra's config search path first, so a file named
like one of tfdistx's (`model/mlp.yaml`, `config.yaml`) would replace the
shipped one in every run: such a file is refused (`shadowing`), by every
command that composes, and `tfdistx recipes` lists it as refused.
`--config-dir` is turned into TFDISTX_CONFIG_PATH for this process and its
children, deliberately: a sweep's jobs and a local cluster's tasks compose
or import with the same tree. Nothing here imports TensorFlow.
"""

import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from hydra.core.config_search_path import SearchPathQuery
from hydra.core.plugins import Plugins
from hydra.plugins.search_path_plugin import SearchPathPlugin

from tfdistx.config import topology
from tfdistx.core import strategies
from tfdistx.core.errors import ConfigError, Problem
from tfdistx.core.paths import CONFIG_PATH_ENV, config_dir
from tfdistx.config.recipes import is_global

ENV = CONFIG_PATH_ENV
FLAGS = ("--config-dir", "-cd")
KEY = f"--config-dir ({ENV})"  # how a problem of the user's config dirs is named
PROVIDER = "tfdistx-user-config"
EXPERIMENT = "experiment"
GLOBAL_HEADER = "# @package _global_"  # an experiment's first line: its keys are the run's top level


def dirs() -> List[Path]:
    """The user's config directories, first one first."""
    value = os.environ.get(ENV, "")
    return [Path(part).expanduser().resolve() for part in value.split(os.pathsep) if part.strip()]


def take_flags(argv: Sequence[str]) -> List[str]:
    """`argv` without its `--config-dir DIR` flags, each DIR added in front
    of TFDISTX_CONFIG_PATH. Hydra would add the directory itself, but only
    on its own paths (help, sweeps), not where tfdistx composes a single run."""
    rest, given = split_flags(argv)
    if given:
        add([Path(d) for d in given])
    return rest


def split_flags(argv: Sequence[str]) -> Tuple[List[str], List[str]]:
    """(`argv` without its `--config-dir DIR` flags, each DIR as given)."""
    rest, given, args = [], [], list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, value = arg.partition("=")
        if name in FLAGS and eq:
            given.append(value)
        elif arg in FLAGS:
            if i + 1 == len(args):
                raise ConfigError.for_key(arg, None, "needs a directory: --config-dir DIR")
            given.append(args[i + 1])
            i += 1
        else:
            rest.append(arg)
        i += 1
    return rest, given


def carried(config_dirs: Sequence[str], config_path: Optional[str]) -> List[str]:
    """What a scheduler's tasks compose with beyond the shipped config, as a script or manifest carries it
    (`--config-dir DIR`, `TFDISTX_CONFIG_PATH=...`): this machine's directories, which each node or pod must hold."""
    return [*(f"--config-dir {d}" for d in config_dirs), *([f"{ENV}={config_path}"] if config_path else [])]


def add(directories: Sequence[Path]) -> None:
    """Put `directories` first in TFDISTX_CONFIG_PATH (a run recorded with them, say)."""
    known = [str(d) for d in dirs()]
    new = [str(Path(d).expanduser().resolve()) for d in directories]
    os.environ[ENV] = os.pathsep.join(dict.fromkeys(new + known))


def check() -> None:
    for directory in dirs():
        if not directory.is_dir():
            raise ConfigError.for_key(
                KEY,
                str(directory),
                "is not a directory: a config dir holds "
                "GROUP/NAME.yaml files, e.g. data/mine.yaml, experiment/mine.yaml",
            )


def shadowing() -> List[Problem]:
    """A file of the user's dirs named like one of tfdistx's own
    (model/mlp.yaml, config.yaml): the user's dirs come first in Hydra's
    search path, so it would replace the shipped one in every run, even a
    run that never names it. Refused: an option of one's own takes a name
    of its own."""
    shipped = shipped_files() if dirs() else []
    return [
        shadow_problem(directory / relative, relative)
        for directory in dirs()
        for relative in shipped
        if (directory / relative).is_file()
    ]


def shipped_files() -> List[Path]:
    """tfdistx's config files, relative to conf/: config.yaml, model/mlp.yaml,
    recipe/mnist_mlp.yaml (conf/recipe is a link), hydra/help/tfdistx.yaml;
    and strategy/NAME.yaml for each strategy, an option though not a file
    (schema.register stores the strategy table's rows)."""
    root = config_dir()
    files = [
        Path(folder, name).relative_to(root)
        for folder, _, names in os.walk(root, followlinks=True)
        for name in names
        if name.endswith(".yaml")
    ]
    return sorted(files + [Path("strategy", f"{name}.yaml") for name in strategies.NAMES])


def shadow_problem(path: Path, relative: Path) -> Problem:
    group, name = relative.parent.as_posix(), relative.stem
    if group == ".":
        shadowed, fix = f"tfdistx's primary config {relative.name}", f"rename it, e.g. my_{relative.name}"
    else:
        shadowed, fix = (
            f"the shipped option {group}={name}",
            f"rename it, e.g. {group}/my_{name}.yaml (and pick it with {group}=my_{name})",
        )
    return Problem(KEY, str(path), f"has the name of {shadowed}, which it would replace in every run: {fix}")


class UserConfigSearchPath(SearchPathPlugin):
    """Puts the user's config dirs in Hydra's search path (first: see `shadowing`)."""

    def manipulate_search_path(self, search_path) -> None:
        for directory in dirs():
            search_path.prepend(
                provider=PROVIDER, path=f"file://{directory}", anchor=SearchPathQuery(provider="schema")
            )


def register(overrides: Sequence[str] = ()) -> None:
    """Call before composing: the user's dirs join Hydra's search path.
    Raises ConfigError for a directory that is not one, or an
    `experiment=NAME` no directory holds (with no experiment/ anywhere,
    Hydra would take `experiment` for a key and say it is not one)."""
    check()
    shadows = shadowing()
    if shadows:
        raise ConfigError(shadows)
    Plugins.instance().register(UserConfigSearchPath)
    known = experiments()
    for name in topology.requested_names(overrides, EXPERIMENT):
        if name not in known and name != "null":
            where = ", ".join(str(d) for d in dirs()) or "none given"
            raise ConfigError.for_key(
                EXPERIMENT,
                name,
                (f"allowed: {', '.join(sorted(known))}" if known else "no experiments found")
                + f" (your {EXPERIMENT}/NAME.yaml files in --config-dir DIR or {ENV}: {where})",
            )
        if name in known and not is_global(
            known[name]
        ):  # Hydra would nest its keys under `experiment.` and fail saying nothing of why
            raise ConfigError.for_key(
                EXPERIMENT,
                name,
                f"{known[name]} does not start with '{GLOBAL_HEADER}': an experiment's keys "
                "are the run's top level (trainer:, data: ...): make that its first line",
            )


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
    """The user's own options, by group: name, path, and why it is refused
    (named like a shipped option: shadowing) or None."""
    found: Dict[str, List[dict]] = {}
    shipped = set(shipped_files())
    for directory in dirs():
        for path in sorted(directory.glob("*/*.yaml")) if directory.is_dir() else []:
            group = path.parent.name
            relative = Path(group, path.name)
            refused = str(shadow_problem(path, relative)) if relative in shipped else None
            found.setdefault(group, []).append({"name": path.stem, "path": path, "refused": refused})
    return found


def recorded(hydra_yaml: dict) -> List[Path]:
    """The user config dirs a run was composed with, from its .hydra/hydra.yaml
    (Hydra records the search path there), so that `tfdistx evaluate` or
    `predict` of that run finds `data=digits` again."""
    sources = ((hydra_yaml or {}).get("hydra", {}).get("runtime", {}) or {}).get("config_sources") or []
    return [Path(s["path"]) for s in sources if isinstance(s, dict) and s.get("provider") == PROVIDER and s.get("path")]
