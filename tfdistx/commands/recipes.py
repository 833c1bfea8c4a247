"""`tfdistx recipes [list|show NAME|copy NAME DEST]`: the recipes that
config/recipes.py finds, listed, composed or copied out for editing."""

import argparse
import shutil
import sys
from pathlib import Path
from typing import Optional, Sequence

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tfdistx import emit
from tfdistx.commands.common import register_config_names
from tfdistx.config import userconf
from tfdistx.config.compose import as_config_error
from tfdistx.core.errors import EXIT_INVALID_CONFIG, ConfigError, RunFault
from tfdistx.core.paths import config_dir
from tfdistx.config.recipes import (
    ENV,
    GROUP,
    available,
    describe,
    downloads,
    find,
    is_global,
    register,
    search_dirs,
    shipped_dir,
    unknown,
    user_dirs,
)
from tfdistx.config.validate import validate
from tfdistx.internals import hydra as internals
from tfdistx.rundir import keep_aside


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        internals.probe()  # the internals of Hydra that tfdistx uses, before any of them is
        args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))  # cli.py has taken --config-dir
        # the list shows an option the config dirs may not hold (userconf.shadowing); `show` refuses it
        userconf.check()
        register([])
        if args.command == "show":
            return _show(args.name, args.overrides, resolve=args.resolve)
        if args.command == "copy":
            return _copy(args.name, Path(args.dest), force=args.force)
        return _list()
    except ConfigError as error:
        for line in error.lines():
            print(line, file=sys.stderr)
        return EXIT_INVALID_CONFIG
    except CommandError as error:
        print(f"tfdistx recipes: {error}", file=sys.stderr)
        return EXIT_INVALID_CONFIG
    except RunFault as gone:
        print(*gone.lines(), file=sys.stderr)
        return gone.code


class CommandError(Exception):
    """A bad argument to a `tfdistx recipes` command (not a config problem)."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tfdistx recipes [--config-dir DIR]",
        description="Reusable experiment configs: run one with `python -m tfdistx recipe=NAME [overrides]`. "
        f"Your own recipes: a directory of NAME.yaml files named by ${ENV}; your own config tree (groups, "
        f"experiment/): --config-dir DIR or ${userconf.ENV}.",
    )
    commands = parser.add_subparsers(dest="command", metavar="{list,show,copy}")
    commands.add_parser("list", help="the recipes, with a one-line description (the default)")
    show = commands.add_parser("show", help="print a recipe's composed config")
    show.add_argument("name")
    show.add_argument("overrides", nargs="*", help="further overrides, as on the tfdistx command line")
    show.add_argument("--resolve", action="store_true", help="resolve ${...} interpolations")
    copy = commands.add_parser("copy", help="copy a recipe's file out for editing")
    copy.add_argument("name")
    copy.add_argument("dest", help="a directory (the file keeps its name) or a file name ending in .yaml")
    copy.add_argument(
        "-f",
        "--force",
        action="store_true",
        help="replace an existing file, keeping it aside as NAME.yaml.replaced-STAMP",
    )
    return parser


def _list() -> int:
    recipes = available()
    if not recipes:
        print("no recipes found in " + ", ".join(map(str, search_dirs())))
        return 0
    width = max(len(r["name"]) for r in recipes)
    for directory in search_dirs():
        here = [r for r in recipes if r["path"].parent == directory]
        if not here:
            continue
        where = f"{directory} (${ENV})" if directory != shipped_dir() else "shipped with tfdistx"
        print(f"{where}:")
        for r in here:
            note = f"  [shadowed by {r['shadowed_by']}]" if r["shadowed_by"] else ""
            if not is_global(r["path"]):
                note += "  [no '# @package _global_' first line: its keys would land under `recipe.`]"
            dataset = downloads(r["path"])
            if dataset:
                note += f"  [downloads {dataset} once: tensorflow-datasets]"
            print(f"  {r['name']:<{width}}  {r['description']}{note}")
    print("\nrun one:  python -m tfdistx recipe=NAME [overrides]    see one:  tfdistx recipes show NAME")
    _list_user_configs()
    return 0


def _list_user_configs() -> None:
    """The user's own config dirs: their experiments and options, by group."""
    options = userconf.options()
    if not userconf.dirs():
        print(
            f"your own groups and experiments: --config-dir DIR or {userconf.ENV}=DIR (DIR/data/NAME.yaml, "
            "DIR/experiment/NAME.yaml)"
        )
        return
    print(f"\nyour config dirs ({userconf.ENV}, --config-dir): {', '.join(map(str, userconf.dirs()))}")
    if not options:
        print("  (no GROUP/NAME.yaml files in them)")
    width = max((len(f"{group}={o['name']}") for group, found in options.items() for o in found), default=0)
    for group in sorted(options, key=lambda g: (g != userconf.EXPERIMENT, g)):
        for option in options[group]:
            note = f"  [refused: {option['refused']}]" if option["refused"] else ""
            if group == userconf.EXPERIMENT and not is_global(option["path"]):
                note += f"  [refused: its first line must be '{userconf.GLOBAL_HEADER}']"
            print(f"  {group + '=' + option['name']:<{width}}  {describe(option['path'])}{note}")


def _show(name: str, overrides: Sequence[str], resolve: bool) -> int:
    if find(name) is None:
        raise unknown(name)
    overrides = [f"{GROUP}={name}", *overrides]
    register_config_names(overrides)
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base=None):
            cfg = compose("config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as error:
        raise as_config_error(error, overrides) from None
    made_by = emit.command_line(["python", "-m", "tfdistx", *overrides])  # one line, whatever the overrides hold
    print(emit.comment(f"{made_by}    ({emit.shell_word(str(find(name)))})"))
    print(OmegaConf.to_yaml(cfg, resolve=resolve), end="")
    try:
        validate(cfg)
    except ConfigError as error:  # still worth seeing, but say it would not run
        print(f"note: python -m tfdistx {' '.join(overrides)} would refuse this config:", file=sys.stderr)
        for line in error.lines():
            print(f"  {line}", file=sys.stderr)
    return 0


def _copy(name: str, dest: Path, force: bool) -> int:
    source = find(name)
    if source is None:
        raise unknown(name)
    target = dest / source.name if dest.is_dir() or dest.suffix != ".yaml" else dest
    if target.exists() and not force:
        raise CommandError(f"{target} exists already: pass --force to replace it (the old file is kept aside)")
    kept = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():  # --force: replaced, and the user's edits kept beside it
            kept = keep_aside(target, keep_suffix=False)  # not a *.yaml: it is no recipe
        shutil.copyfile(source, target)
    except OSError as error:
        raise CommandError(f"cannot write {target}: {error.strerror or error}") from None
    print(f"copied {source} to {target}" + (f" (the file that was there is kept as {kept})" if kept else ""))
    directory = target.parent.resolve()
    if directory not in user_dirs():
        print(f"run it:  {ENV}={directory} python -m tfdistx {GROUP}={target.stem}")
    else:
        print(f"run it:  python -m tfdistx {GROUP}={target.stem}")
    return 0
