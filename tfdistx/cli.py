"""The entrypoint: `python -m tfdistx [overrides]` and the `tfdistx` script.

Order matters here: check the config without TensorFlow (so bad input is
refused in under a second with exit code 2), then let Hydra create the run
directory and call `_run`, which imports the training code.
"""

import importlib
import json
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

import hydra
from hydra._internal.utils import get_args_parser
from omegaconf import DictConfig

from tfdistx import cluster, recipes
from tfdistx.config import schema, topology
from tfdistx.config.compose import compose_and_validate
from tfdistx.config.paths import config_dir
from tfdistx.config.validate import validate
from tfdistx.errors import EXIT_INVALID_CONFIG, ConfigError


# `tfdistx NAME ...` runs a tool instead of a training job. Imported only
# when asked for, so a training run pays nothing for them.
SUBCOMMANDS = {
    "recipes": "tfdistx.recipes:main",  # list, show and copy out recipes
    "report": "tfdistx.report:main",  # plots and a table for a run or sweep dir
}


def main(argv: Optional[Sequence[str]] = None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        module, function = SUBCOMMANDS[argv[0]].split(":")
        try:
            sys.exit(getattr(importlib.import_module(module), function)(argv[1:]))
        except BrokenPipeError:  # `tfdistx recipes | head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(0)
    # TensorFlow's C++ start-up chatter (CPU features, oneDNN) buries the
    # progress display; users can still ask for it.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    schema.register()
    plan = "--plan" in argv
    argv = [arg for arg in argv if arg != "--plan"]
    try:
        args = get_args_parser().parse_args(argv)
        topology.register(args.overrides)
        recipes.register(args.overrides)  # TFDISTX_RECIPES dirs, and the clusters the chosen recipes name
        if plan:
            from tfdistx.plan import describe

            print(describe(compose_and_validate(args.overrides)))
            return
        if not _hydra_handles_it(args):
            compose_and_validate(args.overrides)
    except ConfigError as error:
        _refuse(error)
    except Exception as error:  # an override Hydra cannot even parse
        _refuse(ConfigError.one("override", " ".join(argv), str(error).strip().splitlines()[0]))

    sys.argv = [sys.argv[0]] + argv
    try:
        hydra.main(config_path=str(config_dir()), config_name="config", version_base=None)(_run)()
    except KeyboardInterrupt:  # Ctrl-C: stop quietly, as shells expect
        print("tfdistx: interrupted", file=sys.stderr)
        sys.exit(130)


def _run(cfg: DictConfig):
    """One Hydra job: validate (again, for multirun jobs), then train here,
    or start a local cluster whose tasks each run this same job."""
    from hydra.core.hydra_config import HydraConfig

    run_dir = HydraConfig.get().runtime.output_dir
    try:
        validate(cfg)
        placement = cluster.detect(cfg.strategy.name, cfg.cluster)
        if placement.source == "local":
            return _run_local_cluster(cfg, run_dir, list(HydraConfig.get().overrides.task))
        from tfdistx.train import train  # imports TensorFlow

        return train(cfg, run_dir, placement)
    except ConfigError as error:
        _refuse(error)


def _run_local_cluster(cfg: DictConfig, run_dir: str, overrides: list):
    """Every task reruns this job's overrides in the same run directory
    (given explicitly: each process would otherwise stamp its own time)."""
    from tfdistx.launch import run_local_cluster

    strategy = cluster.multi_process_strategy(cfg.strategy.name, cfg.cluster)
    command = [
        sys.executable, "-m", "tfdistx", *overrides,
        f"hydra.run.dir='{run_dir}'",
        "hydra.output_subdir=null",  # this process already wrote .hydra/
        "hydra/job_logging=stdout",  # the launcher prefixes and files each task's output
        "cluster.launch=tf_config",
    ]
    counts = cluster.job_counts(strategy, cfg.cluster)
    parameter_servers = strategy == "parameter_server"
    # With parameter servers the coordinator (chief) drives training and
    # reschedules a lost worker's work, so a worker is restarted on its own.
    code = run_local_cluster(counts, command, os.path.join(run_dir, "logs"),
                             primary=["chief"] if parameter_servers else ["worker"],
                             isolate=cfg.cluster.isolate, max_restarts=cfg.cluster.max_restarts,
                             restart_alone=["worker"] if parameter_servers else [])
    if code:
        sys.exit(code)
    from tfdistx.train import objective  # no TensorFlow at import

    summary = json.loads(Path(run_dir, "summary.json").read_text())
    return objective(cfg.trainer.objective, summary)


def _hydra_handles_it(args) -> bool:
    """Invocations Hydra answers itself, or (multirun) composes per job."""
    return bool(args.help or args.hydra_help or args.cfg or args.info or args.shell_completion or args.multirun)


def _refuse(error: ConfigError):
    for line in error.lines():
        print(line, file=sys.stderr)
    sys.exit(EXIT_INVALID_CONFIG)
