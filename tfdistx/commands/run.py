"""`python -m tfdistx [overrides]`: a training run, its `--plan`, or a sweep.

Order matters here: compose and check the config without TensorFlow (so bad
input is refused in under a second with exit code 2), then let Hydra create
the run directory and call `_run`, which hands the job to execute.py. A
single run is composed once (config/compose.py) and run with Hydra's
`run_job`; what Hydra answers itself (--help, --cfg, multirun sweeps) goes
to `hydra.main`.
"""

import contextlib
import copy
import functools
import logging
import string
import sys
from typing import Optional, Sequence

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from tfdistx import rundir
from tfdistx.commands.common import one_line_errors, refuse, register_config_names
from tfdistx.cluster.placement import Placement
from tfdistx.commands.execute import execute, placement_of
from tfdistx.commands.plan import describe
from tfdistx.core import elastic
from tfdistx.config.compose import (
    as_config_error,
    compose_and_validate,
    composed,
    keys_for_own_targets,
    only_given_keys_for_user_targets,
    say,
)
from tfdistx.core.errors import ConfigError, RunFault
from tfdistx.core.launch_mode import LaunchMode
from tfdistx.core.objective import direction
from tfdistx.config.resolve import layout_of
from tfdistx.core.paths import config_dir
from tfdistx.config.validate import validate, writable
from tfdistx.internals import hydra as internals
from tfdistx.sigterm import SigtermNotice


def main(argv: Sequence[str], process_ends_after: bool = False):
    """A training run (`--plan`: its plan; `-m`: a sweep of runs) for these
    overrides. `process_ends_after`: the process ends when the run does
    (cli.end_process), so its input pipelines need no teardown."""
    plan, text = "--plan" in argv, ""
    argv = [arg for arg in argv if arg != "--plan"]  # cli.py has taken --config-dir DIR (userconf.take_flags)
    try:
        internals.probe()  # Hydra's internals tfdistx uses, before any of them is
        argv = keys_for_own_targets(
            elastic.expand_shorthand(argv)
        )  # model._target_=mine model.filters=32, for a sweep's jobs too
        args = _parsed(argv)
        register_config_names(args.overrides)
        if plan:
            text = describe(compose_and_validate(args.overrides))
        elif args.help and not args.multirun:
            text = _help(args.overrides)
        elif args.multirun:
            first_job = _check_sweep(args.overrides)
            argv += _sweeper_direction(args.overrides, first_job)
    except (ConfigError, RunFault) as error:
        refuse(error)
    except Exception as error:  # an override Hydra cannot even parse: its words, in one line
        refuse(as_config_error(error, argv))
    if plan or args.help and not args.multirun:
        print(text)
        return
    if not _hydra_handles_it(args):
        try:
            with SigtermNotice() as notice:  # from here a SIGTERM is a preemption (sigterm.py)
                return _run_once(args.overrides, process_ends_after=process_ends_after, notice=notice)
        except (
            ConfigError,
            RunFault,
        ) as error:  # composition, the run dir's lock; what the run itself refuses, _run reports
            refuse(error)

    _quiet_sweep_plugins(argv)
    sys.argv = [sys.argv[0]] + argv  # hydra.main reads its command line from sys.argv, and only there
    try:
        hydra.main(config_path=str(config_dir()), config_name="config", version_base=None)(_run)()
    except KeyboardInterrupt:  # Ctrl-C: stop quietly, as shells expect
        print("tfdistx: interrupted", file=sys.stderr)
        sys.exit(130)


# The flags a run takes, as `--help` lists them (cli.py takes --config-dir first); Hydra's other flags pass too.
FLAGS = "--plan, --help, --config-dir DIR, -m/--multirun, --cfg job, --hydra-help"


def _parsed(argv):
    """The command line as Hydra's parser reads it; a flag it does not know (`--plann`) is refused in one line
    naming it and the flags there are, not with Hydra's usage (its program `__main__.py`, its flags) and exit 2."""
    parser = internals.args_parser()
    parser.exit_on_error = False  # a malformed flag raises (refused by the caller in one line), not SystemExit
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        raise ConfigError.for_key("flag", unknown[0], f"not a flag of tfdistx; the flags are {FLAGS}")
    return args


def _help(overrides) -> str:
    """`--help`: the template of conf/hydra/help/tfdistx.yaml, filled as
    Hydra's app help fills it, with the run's groups and their options.
    Not Hydra's own: it lists every group, Hydra's (hydra/launcher ...)
    too, for a template that prints only the run's, and each of its ~110
    listings deep-copies the whole config repository (6.9 s on an idle
    machine, against the ~12 listings here)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    with initialize_config_dir(config_dir=str(config_dir()), version_base=None, job_name="tfdistx"):
        cfg = GlobalHydra.instance().hydra.compose_config(
            "config", overrides=list(overrides), run_mode=RunMode.RUN, with_log_configuration=False
        )
        loader = GlobalHydra.instance().config_loader()
        options = {
            group: sorted(loader.get_group_options(group)) for group in loader.list_groups("") if group != "hydra"
        }
        groups = "".join(f"{group}: {', '.join(names)}\n" for group, names in sorted(options.items()) if names)
        return string.Template(cfg.hydra.help.template).substitute(APP_CONFIG_GROUPS=groups)


def _hydra_handles_it(args) -> bool:
    """Invocations Hydra answers itself, or (multirun) composes per job."""
    return bool(args.help or args.hydra_help or args.cfg or args.info or args.shell_completion or args.multirun)


def _check_sweep(overrides) -> DictConfig:
    """Before a sweep's first job: every value its lists and ranges name is
    composed and validated (one key varied at a time, the others at their
    first value), and the sweep dir must be writable. Hydra would otherwise
    fail mid-sweep with its own multi-line message and exit 1. Values an
    optimizer draws (interval) or a glob expands are left to the jobs.
    Returns the first job's config."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    fixed, swept = [], []
    for override in OverridesParser.create().parse_overrides(overrides):
        if not override.is_sweep_override():
            fixed.append(override.input_line)
        elif override.is_choice_sweep() or override.is_range_sweep():
            try:
                swept.append((override.get_key_element(), list(override.sweep_string_iterator())))
            except HydraException:  # glob(): needs Hydra's config loader; the jobs check it
                continue
    firsts = {key: values[0] for key, values in swept}
    variants = [firsts] + [{**firsts, key: value} for key, values in swept for value in values[1:]]
    for variant in variants:
        cfg = compose_and_validate(fixed + [f"{key}={value}" for key, value in variant.items()], notes=False)
    problems = writable("hydra.sweep.dir", OmegaConf.select(cfg, "hydra.sweep.dir"))
    if problems:
        raise ConfigError(problems)
    return cfg


def _quiet_sweep_plugins(argv) -> None:
    """Optuna's import of alembic logs seven "setup plugin" lines through
    Hydra's logging, and Optuna colours its own lines even into a file:
    alembic is kept to warnings, and Optuna logs plain, through Hydra's handlers."""
    logging.getLogger("alembic").setLevel(logging.WARNING)
    if _uses_optuna(argv):
        try:
            import optuna
        except ImportError:  # refused with the extra to install, by _check_sweep
            return
        optuna.logging.disable_default_handler()
        optuna.logging.enable_propagation()


def _uses_optuna(args) -> bool:
    return any(arg.startswith("hydra/sweeper=") and "optuna" in arg for arg in args)


def _sweeper_direction(overrides, cfg: DictConfig) -> list:
    """An optimizing sweeper (Optuna) is told which way trainer.objective is
    better (accuracy up, loss down), unless the command line says so itself:
    its own default, minimize, found the worst learning rate for accuracy."""
    if not _uses_optuna(overrides):
        return []
    if any(o.lstrip("+").startswith("hydra.sweeper.direction=") for o in overrides):
        return []
    return [f"hydra.sweeper.direction={direction(str(cfg.trainer.objective))}"]


def _run_once(overrides, process_ends_after: bool = False, notice: Optional[SigtermNotice] = None) -> None:
    """A single run: composed once, then run as Hydra's own `run` would."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import run_job
    from hydra.types import HydraContext

    with composed(overrides) as cfg:
        try:  # hydra.callbacks are instantiated here
            callbacks = internals.callbacks(cfg)  # what Hydra.run builds for run_job
        except Exception as error:
            raise ConfigError.for_key(
                "hydra.callbacks", OmegaConf.to_container(cfg.hydra.callbacks), str(error).strip().splitlines()[0]
            ) from None
        context = HydraContext(config_loader=GlobalHydra.instance().config_loader(), callbacks=callbacks)
        placement = placement_of(layout_of(cfg))  # worked out once for the run
        config_subdir = _recorded_by_the_owner_alone(cfg, placement)
        # Locked before run_job writes .hydra/ into the directory (rundir.py).
        with rundir.owned(cfg.hydra.run.dir) if placement.is_chief else contextlib.nullcontext():
            job = functools.partial(
                _run,
                process_ends_after=process_ends_after,
                notice=notice,
                placement=placement,
                config_subdir=config_subdir,
            )
            try:
                result = run_job(
                    task_function=job,
                    config=cfg,
                    job_dir_key="hydra.run.dir",
                    job_subdir_key=None,
                    hydra_context=context,
                )
            except KeyboardInterrupt:
                print("tfdistx: interrupted", file=sys.stderr)
                sys.exit(130)
            _ = result.return_value  # re-raises what the job raised


def _recorded_by_the_owner_alone(cfg: DictConfig, placement: Placement) -> Optional[str]:
    """Only the process that owns the run dir writes the run's config into
    it (.hydra/): a refused rerun puts back the files it replaced
    (rundir.owned), which another task's Hydra, rewriting them in any order
    with that, would undo. The others' Hydra writes none (hydra.output_subdir
    null for their job). Under agents the owner is known only later, to the
    node that keeps the rounds, which then records the config itself: its
    subdirectory is returned for that, and the run dir is marked as a run's
    before any node writes its logs there."""
    if placement.is_chief:
        return None
    subdir = cfg.hydra.output_subdir
    with read_write(cfg.hydra), open_dict(cfg.hydra):
        cfg.hydra.output_subdir = None
    if placement.launch is LaunchMode.AGENT:
        rundir.mark_as_a_runs(cfg.hydra.run.dir)
        return subdir
    return None


def _config_record(cfg: DictConfig, subdir: str) -> dict:
    """What Hydra's run_job writes into RUN/SUBDIR for this job (hydra.core.utils.run_job):
    the job's config, Hydra's own, and the overrides, by file name."""
    from hydra.core.hydra_config import HydraConfig

    hydra_cfg = copy.deepcopy(HydraConfig.instance().cfg)
    with read_write(hydra_cfg.hydra), open_dict(hydra_cfg.hydra):
        hydra_cfg.hydra.output_subdir = subdir  # as recorded by a run that wrote it itself
    return {
        "config.yaml": OmegaConf.to_yaml(cfg),
        "hydra.yaml": OmegaConf.to_yaml(hydra_cfg),
        "overrides.yaml": OmegaConf.to_yaml(hydra_cfg.hydra.overrides.task),
    }


def _run(
    cfg: DictConfig,
    process_ends_after: bool = False,
    notice: Optional[SigtermNotice] = None,
    placement: Optional[Placement] = None,
    config_subdir: Optional[str] = None,
):
    """One Hydra job: train here, or start a local cluster whose tasks each
    run this job. Multirun jobs are composed by the sweeper, so checked here.
    `process_ends_after`: the process ends when the run does (_run_once);
    `notice`: its SIGTERM notice (a sweep's jobs take their own);
    `placement`: where this process stands (a sweep's jobs: worked out here);
    `config_subdir`: where an agent's node records the config if it turns out to own the run dir."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    with one_line_errors():
        if hydra_cfg.mode != RunMode.MULTIRUN:  # composed, checked and locked by _run_once, which then ends the process
            record = _config_record(cfg, config_subdir) if config_subdir else None
            return execute(
                cfg,
                hydra_cfg.runtime.output_dir,
                "train",
                process_ends_after=process_ends_after,
                notice=notice,
                placement=placement,
                config_record=record,
            )
        told = only_given_keys_for_user_targets(cfg, hydra_cfg.overrides.task)
        validate(cfg)
        say(told)
        placement = placement_of(layout_of(cfg))
        with rundir.owned(hydra_cfg.runtime.output_dir) if placement.is_chief else contextlib.nullcontext():
            return execute(cfg, hydra_cfg.runtime.output_dir, "train", placement=placement)
