"""The entrypoint: `python -m tfdistx [overrides]` and the `tfdistx` script.

Order matters here: compose and check the config without TensorFlow (so bad
input is refused in under a second with exit code 2), then let Hydra create
the run directory and call `_run`, which imports the training code. A single
run is composed once (config/compose.py) and run with Hydra's `run_job`;
what Hydra answers itself (--help, --cfg, multirun sweeps) goes to
`hydra.main`. The tasks of a local cluster do not compose at all: they read
the parent's resolved config (`tfdistx _task`).
"""

import contextlib
import importlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

import hydra
from hydra._internal.utils import get_args_parser
from omegaconf import DictConfig, OmegaConf

from tfdistx.cluster import placement as cluster
from tfdistx.config import recipes
from tfdistx import rundir
from tfdistx.config import schema, strategies, topology
from tfdistx.config.compose import compose_and_validate, composed, only_given_keys_for_user_targets, saved_overrides
from tfdistx.config.errors import EXIT_INVALID_CONFIG, ConfigError, RunFault, retryable_exits_offset_by
from tfdistx.config.objective import direction
from tfdistx.config.paths import config_dir
from tfdistx.config.validate import validate, writable

# `tfdistx NAME ...` runs a tool instead of a training job. Imported only
# when asked for, so a training run pays nothing for them.
SUBCOMMANDS = {
    "recipes": "tfdistx.config.recipes:main",  # list, show and copy out recipes
    "report": "tfdistx.commands.report:main",  # plots and a table for a run or sweep dir
    "export": "tfdistx.engine.export:main",  # a SavedModel from a run's checkpoint
    "export tfjob": "tfdistx.cluster.kubernetes:main",  # a Kubeflow TFJob for the composed config
    "data write": "tfdistx.data.files:main",  # any data source as sharded TFRecord/CSV files + a manifest
    "evaluate": "tfdistx.cli:evaluate_main",  # metrics of a run's checkpoint on the eval data
    "_task": "tfdistx.cli:task_main",  # one task of a local cluster (started by the launcher)
}


def main(argv: Optional[Sequence[str]] = None):
    """`argv` None: the process's own command line (python -m tfdistx, the
    tfdistx script), and a finished run ends the process; given a list
    (a notebook, a test), main returns."""
    is_entrypoint = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    # TensorFlow's C++ start-up chatter (CPU features, oneDNN) buries the
    # progress display; users can still ask for it.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # `python -m tfdistx` imports a user's `_target_=digits.load` from the
    # current directory; the `tfdistx` script must too (its sys.path[0] is
    # the script's own directory).
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    words = next((n for n in (2, 1) if " ".join(argv[:n]) in SUBCOMMANDS), 0)  # `export tfjob` before `export`
    if words:
        module, function = SUBCOMMANDS[" ".join(argv[:words])].split(":")
        try:
            sys.exit(getattr(importlib.import_module(module), function)(argv[words:]))
        except BrokenPipeError:  # `tfdistx recipes | head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(0)
    schema.register()
    plan = "--plan" in argv
    argv = [arg for arg in argv if arg != "--plan"]
    try:
        args = get_args_parser().parse_args(argv)
        register_config_names(args.overrides)
        if plan:
            from tfdistx.commands.plan import describe

            print(describe(compose_and_validate(args.overrides)))
            return
        if args.multirun:
            first_job = _check_sweep(args.overrides)
            argv += _sweeper_direction(args.overrides, first_job)
    except ConfigError as error:
        refuse(error)
    except Exception as error:  # an override Hydra cannot even parse
        refuse(ConfigError.one("override", " ".join(argv), str(error).strip().splitlines()[0]))
    if not _hydra_handles_it(args):
        try:
            return _run_once(args.overrides, end_process=is_entrypoint)
        except ConfigError as error:  # composition; what the run itself refuses, _run reports
            refuse(error)

    _quiet_sweep_plugins(argv)
    sys.argv = [sys.argv[0]] + argv
    try:
        hydra.main(config_path=str(config_dir()), config_name="config", version_base=None)(_run)()
    except KeyboardInterrupt:  # Ctrl-C: stop quietly, as shells expect
        print("tfdistx: interrupted", file=sys.stderr)
        sys.exit(130)


def register_config_names(overrides) -> None:
    topology.register(overrides)  # cluster=WxD / psPwW names
    recipes.register(overrides)  # TFDISTX_RECIPES dirs, and the clusters the chosen recipes name


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


_ends_process = False  # set by _run_once for _run: the process ends when the run does


def _run_once(overrides, end_process: bool = False) -> None:
    """A single run: composed once, then run as Hydra's own `run` would."""
    global _ends_process
    _ends_process = end_process
    from hydra._internal.callbacks import Callbacks  # what Hydra.run builds for run_job
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import run_job
    from hydra.types import HydraContext

    with composed(overrides) as cfg:
        try:  # hydra.callbacks are instantiated here
            callbacks = Callbacks(cfg)
        except Exception as error:
            raise ConfigError.one("hydra.callbacks", OmegaConf.to_container(cfg.hydra.callbacks),
                                  str(error).strip().splitlines()[0]) from None
        context = HydraContext(config_loader=GlobalHydra.instance().config_loader(), callbacks=callbacks)
        # Locked before run_job writes .hydra/ into the directory (rundir.py).
        owner = rundir.owned(cfg.hydra.run.dir) if _owns_run_dir(cfg) else contextlib.nullcontext()
        with owner:
            try:
                result = run_job(task_function=_run, config=cfg, job_dir_key="hydra.run.dir", job_subdir_key=None, hydra_context=context)
            except KeyboardInterrupt:
                print("tfdistx: interrupted", file=sys.stderr)
                sys.exit(130)
            _ = result.return_value  # re-raises what the job raised
    if end_process:
        _end_process_now()


def _end_process_now() -> None:
    """Every file of the run is written and closed: end without Python's
    teardown, which destroys the input pipelines and can wait minutes on
    tf.data's autotune thread (train.py keeps them for this)."""
    import atexit

    atexit._run_exitfuncs()  # what must still run: TensorFlow's removal of its autograph temp files, say
    logging.shutdown()  # flushes and closes tfdistx.log
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _run(cfg: DictConfig):
    """One Hydra job: train here, or start a local cluster whose tasks each
    run this job. Multirun jobs are composed by the sweeper, so checked here."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    with one_line_errors():
        if hydra_cfg.mode != RunMode.MULTIRUN:  # composed, checked and locked by _run_once, which then ends the process
            return execute(cfg, hydra_cfg.runtime.output_dir, "train", process_ends_after=_ends_process)
        only_given_keys_for_user_targets(cfg, hydra_cfg.overrides.task)
        validate(cfg)
        with rundir.owned(hydra_cfg.runtime.output_dir) if _owns_run_dir(cfg) else contextlib.nullcontext():
            return execute(cfg, hydra_cfg.runtime.output_dir, "train")


def execute(cfg: DictConfig, run_dir: str, mode: str, step: Optional[int] = None, process_ends_after: bool = False):
    """Train (or evaluate) in this process, or as a local cluster of processes."""
    facts = strategies.get(cfg.strategy.name, cfg.cluster.workers, cfg.cluster.devices_per_worker)
    placement = cluster.detect(facts, cfg.cluster)
    with retryable_exits_offset_by(cfg.cluster.retryable_exit_offset):
        if placement.source == "local":
            return _run_local_cluster(cfg, run_dir, facts, mode, step)
        from tfdistx.engine.quiet_import import import_tensorflow

        import_tensorflow()  # here, where TensorFlow starts: without its start-up banner
        from tfdistx.engine import checkpointing, fit as train

        with checkpointing.stops_cleanly_when_unwritable(cfg.checkpoint.dir or str(Path(run_dir) / "checkpoints")):
            if mode == "evaluate":
                return train.evaluate(cfg, run_dir, placement, step)
            return train.train(cfg, run_dir, placement, process_ends_after=process_ends_after)


def _owns_run_dir(cfg: DictConfig) -> bool:
    """The process that writes a run directory: a single run, a local
    cluster's launcher, or the chief of a scheduler's cluster."""
    facts = strategies.get(cfg.strategy.name, cfg.cluster.workers, cfg.cluster.devices_per_worker)
    return cluster.detect(facts, cfg.cluster).is_chief


def _run_local_cluster(cfg: DictConfig, run_dir: str, facts: strategies.Strategy, mode: str, step: Optional[int]):
    """Every task runs this job from the resolved config written here, in
    the same run directory; only the chief writes the run's files."""
    from tfdistx.cluster.launch import run_local_cluster

    counts = facts.job_counts(cfg.cluster.workers, cfg.cluster.ps)
    most = max(8, 4 * (os.cpu_count() or 1))
    if sum(counts.values()) > most:  # each task is a TensorFlow process of ~0.7 GB (FACTS.md)
        raise ConfigError.one("cluster", cfg.cluster.name, f"a local cluster of {sum(counts.values())} processes on this machine's "
                              f"{os.cpu_count()} cores: at most {most} here; a larger cluster runs under Slurm or Kubernetes")
    logs = Path(run_dir, "logs")
    logs.mkdir(parents=True, exist_ok=True)
    task_config = logs / f"{mode}-config.yaml"
    resolved = OmegaConf.to_container(cfg, resolve=True)
    resolved["cluster"]["launch"] = "tf_config"  # each task is placed by the TF_CONFIG the launcher gives it
    task_config.write_text(OmegaConf.to_yaml(resolved))
    command = [sys.executable, "-m", "tfdistx", "_task", mode, str(run_dir), str(task_config), *([str(step)] if step is not None else [])]
    code = run_local_cluster(counts, command, str(logs),
                             primary=list(facts.primary_jobs), isolate=cfg.cluster.isolate,
                             max_restarts=cfg.cluster.max_restarts, restart_alone=list(facts.restartable_alone),
                             stopped_task_timeout=cfg.cluster.stopped_task_timeout, run_log=str(Path(run_dir) / "tfdistx.log"))
    if code == 130:  # Ctrl-C: the tasks stopped quietly (task_main)
        print("tfdistx: interrupted", file=sys.stderr)
    if code:
        sys.exit(code)
    from tfdistx.engine.fit import objective  # no TensorFlow at import

    if mode == "evaluate":
        return json.loads(Path(run_dir, "evaluations.jsonl").read_text().splitlines()[-1])
    return objective(cfg.trainer.objective, json.loads(Path(run_dir, "summary.json").read_text()))


def task_main(argv) -> int:
    """`tfdistx _task MODE RUN_DIR CONFIG [STEP]`: one task of a local cluster."""
    mode, run_dir, config_path, *rest = argv
    # Plain messages: the launcher prefixes each line with the task's name
    # and files it in logs/<task>.log (as Hydra's job_logging=stdout did).
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(message)s")
    cfg = OmegaConf.load(config_path)  # cluster.launch=tf_config: placed by the launcher's TF_CONFIG
    try:
        with one_line_errors():
            execute(cfg, run_dir, mode, int(rest[0]) if rest else None)
    except KeyboardInterrupt:  # Ctrl-C reaches every task (launch.py): the launcher says "interrupted", once
        sys.exit(130)
    return 0


def evaluate_main(argv) -> int:
    """`tfdistx evaluate RUN_DIR [--step N] [overrides]`: the run's config,
    with the overrides on top (e.g. strategy=one_device cluster=local)."""
    import argparse

    parser = argparse.ArgumentParser(prog="tfdistx evaluate", description="Evaluate a run's checkpoint on the configured eval data.")
    parser.add_argument("run_dir")
    parser.add_argument("--step", type=int, default=None, help="the checkpoint saved at this step (default: the newest)")
    parser.add_argument("overrides", nargs="*", help="config overrides on top of the run's own, e.g. strategy=one_device")
    args = parser.parse_intermixed_args(argv)  # overrides may follow --step N
    schema.register()
    with one_line_errors():
        overrides = [*saved_overrides(args.run_dir), *args.overrides]
        register_config_names(overrides)
        cfg = compose_and_validate(overrides)
        with_hydra = OmegaConf.to_container(cfg)
        with_hydra.pop("hydra", None)
        logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="[%(name)s][%(levelname)s] - %(message)s")
        record = execute(OmegaConf.create(with_hydra), os.path.abspath(args.run_dir), "evaluate", args.step)
    print(json.dumps(record, indent=2, default=float))
    return 0


def _hydra_handles_it(args) -> bool:
    """Invocations Hydra answers itself, or (multirun) composes per job."""
    return bool(args.help or args.hydra_help or args.cfg or args.info or args.shell_completion or args.multirun)


@contextlib.contextmanager
def one_line_errors():
    """The one guard every error passes once TensorFlow may have started: a
    bad config or a fault of the machine is refused in its own lines and
    code (refuse); anything else is a bug or a fault no check foresaw, and
    is one line with exit 1. TFDISTX_TRACEBACK=1 shows the traceback behind
    any of them, for a bug report."""
    try:
        yield
    except (ConfigError, RunFault) as error:
        refuse(error)
    except Exception as error:
        if _wants_traceback():
            raise
        text = str(error).strip()
        first = text.splitlines()[0][:400] if text else ""
        line = f"tfdistx: error: {type(error).__name__}{': ' + first if first else ''} (TFDISTX_TRACEBACK=1 shows the traceback)"
        print(line, file=sys.stderr)
        _into_run_log(line)
        _nothing_more_from_tensorflow()
        sys.exit(1)


def _wants_traceback() -> bool:
    return os.environ.get("TFDISTX_TRACEBACK", "") not in ("", "0")


def refuse(error):
    """One line per problem, no traceback; exit 2 for a bad config, the fault's own code otherwise."""
    if _wants_traceback():
        import traceback

        traceback.print_exc()
    for line in error.lines():
        print(line, file=sys.stderr)
        _into_run_log(line)
    _nothing_more_from_tensorflow()
    sys.exit(error.code if isinstance(error, RunFault) else EXIT_INVALID_CONFIG)


def _nothing_more_from_tensorflow() -> None:
    """After the one line, TensorFlow's own warnings are noise: a refused
    resume's restore, say, lists every value it did not restore when the
    process exits (its restore coordinator's deleter)."""
    logging.getLogger("tensorflow").setLevel(logging.ERROR)


def _into_run_log(line: str) -> None:
    """The refusal goes into the run's log file too (Hydra's tfdistx.log), not twice on the terminal."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.emit(logging.LogRecord("tfdistx", logging.ERROR, __file__, 0, line, None, None))
