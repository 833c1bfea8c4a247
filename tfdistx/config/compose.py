"""Compose and check a run's config before Hydra starts the job.

Hydra answers a bad override with exit code 1 and several lines; the tfdistx
contract is exit code 2 and one line naming the key. So a single run is
composed here, once, with Hydra's own config loader (cheap: no TensorFlow),
any composition error is reworded as a ConfigError, and the CLI runs the
composed config with Hydra's `run_job` inside `composed(...)` — as Hydra's
own `run` does, without composing a second time.
"""

import contextlib
import dataclasses
import difflib
import functools
import re
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Sequence, Tuple

import yaml
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from tfdistx.config import recipes, schema, topology, userconf
from tfdistx import loggers as builtin_loggers
from tfdistx.core import strategies
from tfdistx.core import paths
from tfdistx.core.paths import config_dir
from tfdistx.config.schema import OPTIMIZER_KEYS, PIPELINE_KEYS, TASK_FACTS, TASK_KEYS, Config
from tfdistx.config.validate import validate
from tfdistx.core.errors import ConfigError, Problem
from tfdistx.core.overrides import given_value


@contextlib.contextmanager
def composed(overrides: Sequence[str], notes: bool = True) -> Iterator[DictConfig]:
    """The composed, validated config (with its `hydra` node); Hydra stays
    initialised inside, for `run_job`. Raises ConfigError."""
    overrides = keys_for_own_targets(overrides)
    with initialize_config_dir(config_dir=str(config_dir()), version_base=None, job_name="tfdistx"):
        try:
            cfg = GlobalHydra.instance().hydra.compose_config(
                "config", overrides=list(overrides), run_mode=RunMode.RUN, with_log_configuration=False
            )
        except (HydraException, OmegaConfBaseException) as error:
            raise _with_valid_keys(as_config_error(error, overrides), overrides) from None
        except yaml.YAMLError as error:  # a user's recipe or config file that is not YAML
            where = getattr(error, "problem_mark", None)
            place = f"{where.name}, line {where.line + 1}" if where else "a config file"
            raise ConfigError.for_key(
                "config file", place, f"is not valid YAML: {getattr(error, 'problem', None) or error}"
            ) from None
        try:  # an interpolation is resolved where it is read: ${nope.nope}, ${oc.env:UNSET}
            told = only_given_keys_for_user_targets(cfg, overrides)
            validate(cfg, run_dir=OmegaConf.select(cfg, "hydra.run.dir"))
        except OmegaConfBaseException as error:
            raise as_config_error(error, overrides) from None
        if notes:  # once the config is good: a note before the refusal of the very key it is about is noise
            say(told)
        yield cfg


# The keys an option leaves for the command line (`???`), and what to write.
MANDATORY = {
    "data.name": "data=tfds data.name=NAME, a TensorFlow Datasets dataset (imdb_reviews, tf_flowers, diamonds ...: "
    "tfds.list_builders() lists them)",
}

# Groups whose `_target_` a user may replace with their own function.
USER_TARGET_GROUPS = ("data", "model", "task", "optimizer")


def keys_for_own_targets(overrides: Sequence[str]) -> list:
    """`model._target_=mypkg.build model.filters=32`: the group's file is the
    default option's (mlp: no `filters`), and Hydra refuses a key a file does
    not have unless it is written `+model.filters`. A group whose target the
    command line names, or whose option is the user's own file (not one
    shipped in conf/), takes its keys as given: `GROUP.KEY=V` is composed as
    `++GROUP.KEY=V` (set, or add). The target's signature checks them when it
    is built (targets.py), so a misspelt key is still refused, with the keys
    the target takes."""
    given = [o.lstrip("+~").partition("=")[0] for o in overrides]
    own = set()
    for group in USER_TARGET_GROUPS:
        option = chosen_option(group, overrides)
        if f"{group}._target_" in given or (option and not (config_dir() / group / f"{option}.yaml").is_file()):
            own.add(group)

    def own_key(override: str) -> bool:
        group, _, rest = override.partition(".")
        if group == "callbacks" and not override.startswith(
            ("+", "~")
        ):  # every callback is the user's: callbacks.NAME.KEY=V adds it
            return "=" in rest
        if group == "logger" and not override.startswith(
            ("+", "~")
        ):  # conf/logger/default.yaml names only the loggers on
            # by default: logger.NAME=V sets or adds a built-in logger's switch, logger.NAME.KEY=V a key of a built-in
            # logger's block or of the user's own logger (config/loggers.py refuses a key or a NAME that is neither)
            key = rest.partition("=")[0]
            return "=" in rest and ("." in key or builtin_loggers.named(key) is not None)
        # optimizer._target_ too: the shipped optimizer files name their class by `name`, and have no _target_ to set.
        return (
            not override.startswith(("+", "~"))
            and group in own
            and "=" in rest
            and (not rest.startswith("_target_=") or group == "optimizer")
        )

    return [f"++{o}" if own_key(o) else o for o in overrides]


def chosen_option(group: str, overrides: Sequence[str]):
    """The option of `group` the run composes, where the command line says
    it: `data=digits`, else the one its experiment (applied last) or its
    recipe picks (`override /data: digits`). None: the default's."""
    option = given_value(group, overrides)
    if option is not None:
        return option
    experiment, recipe = given_value(userconf.EXPERIMENT, overrides), given_value(recipes.GROUP, overrides)
    for path in (
        userconf.experiments().get(experiment) if experiment else None,
        recipes.find(recipe) if recipe else None,
    ):
        picked = recipes.options_in(path, group) if path else []
        if picked:
            return picked[-1]
    return None


def only_given_keys_for_user_targets(cfg: DictConfig, overrides: Sequence[str]) -> list:
    """`data._target_=mine.load` on the command line keeps the default
    group's keys (data=synthetic's num_classes: 10...), which would override
    the user function's own defaults. Such a target gets only the keys the
    command line gives, plus tfdistx's own keys of the group (data: the
    pipeline's batch size, cache, shuffle; task: its name and objective); a
    user's own group file (conf/data/mine.yaml, data=mine) is used as written.
    The default task's facts (schema.TASK_FACTS: what it offers) go too,
    unsaid: they are not keys the target would take. Returns the notes that
    say which keys went (`say` prints them, once the config is checked)."""
    given = {o.lstrip("+~").partition("=")[0] for o in overrides}
    # The optimizer keeps tfdistx's keys (lr, schedule, clipping ...), not the shortcut `name` the target replaces;
    # `optimizer.name=lion` over optimizer=adam names another class as well: adam's beta_1, epsilon ... are not Lion's.
    chosen = OmegaConf.select(cfg, "hydra.runtime.choices.optimizer")
    renamed = "optimizer.name" in given and cfg.optimizer.get("name") != chosen
    notes = []
    kept_by_group = (
        ("data", PIPELINE_KEYS),
        ("model", ()),
        ("task", TASK_KEYS),
        ("optimizer", tuple(k for k in OPTIMIZER_KEYS if k != "name")),
    )
    for group, kept in kept_by_group:
        named = (
            f"{group}._target_"
            if f"{group}._target_" in given
            else "optimizer.name"
            if group == "optimizer" and renamed
            else None
        )
        if named is None:
            continue
        dropped = [key for key in cfg[group] if key != "_target_" and key not in kept and f"{group}.{key}" not in given]
        with open_dict(cfg):
            for key in dropped:
                del cfg[group][key]
        # Unsaid: the task's facts, and the optimizer's shortcut `name` that its _target_ replaces.
        told = [
            key
            for key in dropped
            if not (group == "task" and key in TASK_FACTS or group == "optimizer" and key == "name")
        ]
        if told:
            notes.append(
                f"tfdistx: note: {named}={OmegaConf.select(cfg, named)} gets only the {group} keys you give "
                f"(not the default group's {', '.join(told)}): set them with {group}.KEY=VALUE"
            )
    return notes


def say(notes: Sequence[str]) -> None:
    for note in notes:
        print(note, file=sys.stderr)


def compose_and_validate(overrides: Sequence[str], notes: bool = True) -> DictConfig:
    with composed(overrides, notes) as cfg:
        return cfg


def saved_config(run_dir: str) -> DictConfig:
    """The config a run composed (its .hydra/config.yaml), for `tfdistx export`."""
    path = Path(run_dir) / ".hydra" / "config.yaml"
    if not path.is_file():
        raise ConfigError.for_key("run_dir", str(run_dir), "is not a tfdistx run directory (no .hydra/config.yaml)")
    return _load_run_file(run_dir, path)


def saved_overrides(run_dir: str) -> list:
    """The overrides a run was started with (its .hydra/overrides.yaml)."""
    path = Path(run_dir) / ".hydra" / "overrides.yaml"
    if not path.is_file():
        raise ConfigError.for_key("run_dir", str(run_dir), "is not a tfdistx run directory (no .hydra/overrides.yaml)")
    overrides = _load_run_file(run_dir, path)
    if not OmegaConf.is_list(overrides):
        raise ConfigError.for_key("run_dir", str(run_dir), f"its {path.name} is not a list of overrides")
    hydra_yaml = Path(run_dir) / ".hydra" / "hydra.yaml"
    if hydra_yaml.is_file():  # the user config dirs it was composed with (`data=digits` of --config-dir conf)
        userconf.add(userconf.recorded(OmegaConf.to_container(_load_run_file(run_dir, hydra_yaml))))
    return [str(o) for o in overrides]


def plain_value(cfg: DictConfig, key: str):
    """`cfg`'s value at the dotted `key` as plain Python (None when it is
    not there, or is an interpolation that only resolves inside the run)."""
    try:
        value = OmegaConf.select(cfg, key)
        return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    except Exception:  # ${hydra:...}, say: not needed outside the run
        return None


def hydra_run_dir(cfg: DictConfig) -> Optional[str]:
    """The run directory Hydra will make for `cfg` (hydra.run.dir); None for a config without Hydra's node."""
    return OmegaConf.select(cfg, "hydra.run.dir")


def without_hydra(cfg: DictConfig) -> DictConfig:
    """The run's own config, without Hydra's node: what a command run outside Hydra's job hands on."""
    plain = OmegaConf.to_container(cfg)
    plain.pop("hydra", None)
    return OmegaConf.create(plain)


def saved_checkpoint_dir(cfg: DictConfig, run_dir: str) -> str:
    """Where the run whose saved config is `cfg` keeps its checkpoints."""
    return paths.checkpoint_dir(plain_value(cfg, "checkpoint.dir"), run_dir)


def data_names(cfg: DictConfig) -> Tuple[Any, Any]:
    """A run's data.label and data.features, as plain values (what predict names a file's columns by)."""
    return plain_value(cfg, "data.label"), plain_value(cfg, "data.features")


def saved_objective(run_dir: Path) -> str:
    """A run's trainer.objective, from the config it saved; for a run without
    one it can read, the objective of the config composed with no override
    (the conf tree's default, not a second one said here)."""
    objective = None
    path = Path(run_dir) / ".hydra" / "config.yaml"
    if path.is_file():
        try:
            objective = OmegaConf.select(OmegaConf.load(path), "trainer.objective")
        except Exception:  # a file that is not a config: as if there were none
            objective = None
    return str(objective) if objective is not None else default_objective()


@functools.lru_cache(maxsize=1)
def default_objective() -> str:
    """trainer.objective when no override names one (composed once a process)."""
    schema.register()
    return str(compose_and_validate([], notes=False).trainer.objective)


# What a run's checkpoints hold of its config: the model (every key of
# it) and the optimizer's kind (its slots); and the key naming each.
HELD = {"model": ("model", "model._target_"), "optimizer": ("optimizer.name", "optimizer.name")}


def refuse_another_model(run_dir: str, cfg: DictConfig, overrides: Sequence[str]) -> None:
    """An override of the model or the optimizer that the run's checkpoints
    do not hold is refused naming what the run was trained with (`tfdistx evaluate`)."""
    saved = saved_config(run_dir)
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        group = key.split(".", 1)[0]
        if group not in HELD:
            continue
        held, name = HELD[group]
        if plain_value(cfg, held) == plain_value(saved, held):
            continue
        choice = _choice(run_dir, group)
        trained = (
            f"{key}={plain_value(saved, key)!r}"
            if "." in key
            else f"{group}={choice}"
            if choice
            else f"{name}={plain_value(saved, name)}"
        )
        raise ConfigError.for_key(
            key,
            value,
            f"this run was trained with {trained}, which its checkpoints hold: evaluate takes the "
            f"run's own {group}; drop this override (nothing was changed)",
        )


def _choice(run_dir: str, group: str) -> Optional[str]:
    """The option of `group` the run was composed with (model=mlp), as Hydra recorded it."""
    hydra_yaml = Path(run_dir) / ".hydra" / "hydra.yaml"
    try:
        return OmegaConf.select(OmegaConf.load(hydra_yaml), f"hydra.runtime.choices.{group}")
    except Exception:  # none recorded (a run written by another tool): the section itself is named
        return None


def _load_run_file(run_dir: str, path: Path):
    try:
        return OmegaConf.load(path)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        reason = getattr(error, "strerror", None) or getattr(error, "problem", None) or type(error).__name__
        raise ConfigError.for_key(
            "run_dir", str(run_dir), f"its .hydra/{path.name} cannot be read ({reason})"
        ) from None


# What `pip install 'tfdistx[sweep]'` adds (pyproject.toml), by the option names users give.
SWEEP_EXTRA_PLUGINS = ("optuna", "joblib", "submitit_slurm", "submitit_local", "tfdistx_slurm")


def as_config_error(error: Exception, overrides: Sequence[str]) -> ConfigError:
    if isinstance(error, MissingConfigException) and error.options is not None:
        group = error.missing_cfg_file.split("/")[0] if error.missing_cfg_file else "?"
        value = given_value(group, overrides)
        allowed = (
            topology.FORMS
            if group == "cluster"
            else "allowed: " + ", ".join(sorted(error.options)) + userconf.hint(group, value)
        )
        if group == "hydra":  # hydra/sweeper=..., hydra/launcher=...
            group = "/".join(error.missing_cfg_file.split("/")[:2])
            value = given_value(group, overrides) or error.missing_cfg_file.split("/")[-1]
            # tfdistx_slurm (conf/hydra/launcher) stands on submitit's plugin: not offered without it
            options = sorted(o for o in error.options if o != "tfdistx_slurm" or "submitit_slurm" in error.options)
            allowed = "allowed: " + ", ".join(options)
            if value in SWEEP_EXTRA_PLUGINS:
                allowed = (
                    "its Hydra plugin is not installed: pip install 'tfdistx[sweep]'; installed now: "
                    f"{', '.join(options)}"
                )
        return ConfigError([Problem(group, value, allowed)])
    missing_plugin = re.search(r"Could not load 'hydra/(sweeper|launcher)/(\w+)'", str(error))
    if missing_plugin and missing_plugin[2] in SWEEP_EXTRA_PLUGINS:  # e.g. tfdistx_slurm's own default, submitit_slurm
        group = f"hydra/{missing_plugin[1]}"
        return ConfigError(
            [
                Problem(
                    group,
                    given_value(group, overrides),
                    "its Hydra plugin is not installed: pip install 'tfdistx[sweep]'",
                )
            ]
        )
    already = re.search(r"Could not append to config\. An item is already at '([^']+)'", str(error))
    if already:  # `+KEY=V` for a key the config has: Hydra's answer offers a `++KEY=V` the user never wrote
        key = already[1]
        value = given_value(key, overrides)
        return ConfigError(
            [
                Problem(
                    key,
                    value,
                    f"the config has this key already: set it without the leading +, as {key}={value} "
                    "(+KEY=VALUE adds a key the config does not have)",
                )
            ]
        )
    missing_option = re.search(r"Could not load '(\w+)/([^'/]+)'", str(error))
    if (
        missing_option and missing_option[1] != "hydra"
    ):  # an option in a list (logger=[default,nope]): Hydra names no options then
        group, value = missing_option[1], missing_option[2]
        return ConfigError(
            [Problem(group, value, f"allowed: {', '.join(group_options(group))}{userconf.hint(group, value)}")]
        )
    if isinstance(error, OverrideParseException):  # `trainer.steps='3`, `logger=[a,b`: what Hydra cannot parse
        key, _, value = error.override.partition("=")
        return ConfigError([Problem(key, value, f"Hydra cannot parse this override: {hydras_words(error.message)}")])
    ambiguous = re.match(r"Ambiguous value for argument '([^']*)'", str(error))
    if ambiguous:  # `logger=wandb,csv`: Hydra's three ways out, for this key and these values
        key, _, value = ambiguous[1].lstrip("+~").partition("=")
        return ConfigError(
            [
                Problem(
                    key,
                    value,
                    f"Ambiguous value: to use it as a list, write {key}=[{value}]; to use it as a string, quote "
                    f"the value: {key}='{value}'; to sweep over it, add --multirun to your command line",
                )
            ]
        )
    # Type errors come wrapped: Hydra's "Error merging override k=v" caused by
    # OmegaConf's "Value 'abc' ... could not be converted to Integer".
    cause = error.__cause__ or error
    if isinstance(cause, MissingMandatoryValue) and getattr(cause, "full_key", None):  # a `???` of a group's file
        key = cause.full_key
        return ConfigError([Problem(key, None, f"must be given: {MANDATORY.get(key, f'{key}=VALUE')}")])
    first_line = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
    key = getattr(cause, "full_key", None) or _override_key(str(error))
    if key:
        return ConfigError([Problem(key, given_value(key, overrides), first_line)])
    # An override Hydra names in its words (`Sweep parameters 'k=v' requires --multirun`): that override, and
    # Hydra's message whole; else the overrides as given, never a key of None.
    named = next((o for o in overrides if f"'{o}'" in str(error)), None)
    key, _, value = (named or "").lstrip("+~").partition("=")
    if named:
        return ConfigError([Problem(key, value, hydras_words(str(error)))])
    return ConfigError([Problem("overrides", " ".join(overrides), hydras_words(str(error)))])


def hydras_words(message: str) -> str:
    """Hydra's message of several lines in one: its lines joined, a line
    that only points (`   ^`) said as the column it points at."""
    lines = []
    for line in message.strip().splitlines():
        if line.strip() == "^":
            lines[-1] += f" (at column {line.index('^') + 1 - len('LexerNoViableAltException: ')})" if lines else ""
        elif line.strip():
            lines.append(line.strip())
    return "; ".join(lines) or "Hydra refused it"


def group_options(group: str) -> list:
    """The options of a config group: tfdistx's files in conf/GROUP/ and
    the user's in their config dirs (but those refused as shadowing one)."""
    shipped = [path.stem for path in userconf.shipped_files() if path.parent.as_posix() == group]
    own = [option["name"] for option in userconf.options().get(group, []) if option["refused"] is None]
    return sorted(set(shipped + own))


def _with_valid_keys(error: ConfigError, overrides: Sequence[str]) -> ConfigError:
    """`model.nonsense=3` is told the keys `model` does have: composed again
    without that override, which is cheap (no TensorFlow)."""
    problem = error.problems[0]
    if len(error.problems) == 1 and "." not in problem.key and "not in 'Config'" in problem.allowed:
        return _not_a_group(problem, overrides)
    if len(error.problems) != 1 or "not in" not in problem.allowed or "." not in problem.key:
        return error
    parent = problem.key.rpartition(".")[0]
    # A key under a missing one (strategy.partitioner.max_shards) names the missing one: that override goes too.
    under = lambda o: o.lstrip("+~").partition("=")[0] == problem.key or o.lstrip("+~").startswith(problem.key + ".")
    rest = [o for o in overrides if not under(o)]
    try:
        node = OmegaConf.select(
            GlobalHydra.instance().hydra.compose_config(
                "config", overrides=rest, run_mode=RunMode.RUN, with_log_configuration=False
            ),
            parent,
        )
    except Exception:  # another bad override: the first answer stands
        return error
    if node is not None and not OmegaConf.is_config(node) and any(under(o) for o in overrides):
        # strategy.partitioner=true strategy.partitioner.max_shards=3: the first made it a value, not a mapping
        shown = str(node).lower() if isinstance(node, bool) else node  # as written on a command line
        return ConfigError(
            [
                Problem(
                    problem.key,
                    problem.value,
                    f"{parent} is {shown} here, not a mapping of keys: set {parent}.KEY=VALUE without {parent}={shown}",
                )
            ]
        )
    if not OmegaConf.is_dict(node):
        return error
    names = list(node.keys())
    if parent == "logger":  # the built-in loggers, beside what the config composed (the user's own)
        names = [row.name for row in builtin_loggers.built_in()] + [
            name for name in names if builtin_loggers.named(name) is None
        ]
    keys = ", ".join(str(k) for k in names)
    given = next((o.lstrip("+~").partition("=") for o in overrides if under(o)), None)
    key, value = (given[0], given[2]) if given else (problem.key, problem.value)
    name = problem.key.rpartition(".")[2]
    # An option of another strategy: which strategies take it is a fact of the strategy table.
    elsewhere = (
        f" (strategy.{name} is for strategy={', '.join(strategies.taking(name))})"
        if parent == "strategy" and strategies.taking(name)
        else ""
    )
    target = str(node.get("_target_") or "")
    if (
        parent in USER_TARGET_GROUPS and target and not target.startswith("tfdistx.")
    ):  # the user's function may take it: Hydra's `+` adds it
        elsewhere += f"; for your own target {target}, add it with +{key}={value} (or put it in the YAML)"
    return ConfigError([Problem(key, value, f"{parent} has no key {name!r}; its keys: {keys}{elsewhere}")])


def _not_a_group(problem: Problem, overrides: Sequence[str]) -> ConfigError:
    """`modle=cnn`: OmegaConf says only that 'modle' is not in 'Config'; the
    groups are named, and the closest of them."""
    groups = (
        [f.name for f in dataclasses.fields(Config)]
        + [recipes.GROUP]
        + ([userconf.EXPERIMENT] if userconf.experiments() else [])
    )
    top = problem.key.lstrip("+~")
    # as typed: `modle=cnn`, or `trainr.steps=3` (a key under the misspelt group)
    key, value = next(
        (
            (name, value)
            for name, _, value in (o.lstrip("+~").partition("=") for o in reversed(overrides))
            if name == top or name.startswith(top + ".")
        ),
        (top, None),
    )
    closest = difflib.get_close_matches(top, groups, n=1)
    hint = (
        f"; the closest: {closest[0] + key[len(top) :]}" + (f"={value}" if value is not None else "") if closest else ""
    )
    return ConfigError(
        [Problem(key, value, f"not a group or key of the config: the groups are {', '.join(sorted(groups))}{hint}")]
    )


def _override_key(message: str):
    marker = "override "
    if marker in message:
        return message.split(marker, 1)[1].split("=", 1)[0].strip("'\" ")
    return None


# What the image has when it has tfdistx: the package and what it installs.
_INSTALLED_WITH_TFDISTX = (
    "tfdistx",
    "keras",
    "tensorflow",
    "tensorflow_datasets",
    "numpy",
    "hydra",
    "omegaconf",
    "wandb",
    "mlflow",
)


def code_the_image_must_have(cfg: DictConfig) -> Dict[str, str]:
    """The top-level modules the config's `_target_`s name beyond what
    tfdistx installs (a user's own package, say), each with the first key
    that names it: the pods import them, so the image must have them."""
    found: Dict[str, str] = {}

    def walk(node, where: str) -> None:
        if isinstance(node, dict):
            target = node.get("_target_")
            if isinstance(target, str) and "${" not in target:
                module = target.split(".")[0]
                if module not in _INSTALLED_WITH_TFDISTX:
                    found.setdefault(module, f"{where}._target_={target}" if where else f"_target_={target}")
            for key, value in node.items():
                walk(value, f"{where}.{key}" if where else str(key))
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, f"{where}[{index}]")

    walk(OmegaConf.to_container(cfg, resolve=False), "")
    return found
