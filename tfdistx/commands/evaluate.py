"""`tfdistx evaluate RUN_DIR [--step N] [overrides]`: metrics of a run's
checkpoint on the configured eval data, with the run's own config and the
overrides on top (e.g. strategy=one_device cluster=local). Every argument
is checked before TensorFlow starts."""

import argparse
import json
import os
from pathlib import Path

from omegaconf import OmegaConf

from tfdistx.commands.common import compose, log_lines_as_a_run_shows_them, one_line_errors, plain_value
from tfdistx.commands.execute import execute
from tfdistx.config.compose import saved_config, saved_overrides
from tfdistx.spec.errors import ConfigError
from tfdistx.config.resolve import resolve
from tfdistx.checkpoint_files import find

# What a run's checkpoints hold of its config: the model (every key of
# it) and the optimizer's kind (its slots); and the key naming each.
HELD = {"model": ("model", "model._target_"), "optimizer": ("optimizer.name", "optimizer.name")}


def main(argv) -> int:
    parser = argparse.ArgumentParser(
        prog="tfdistx evaluate", description="Evaluate a run's checkpoint on the configured eval data."
    )
    parser.add_argument("run_dir")
    parser.add_argument(
        "--step", type=int, default=None, help="the checkpoint saved at this step (default: the newest)"
    )
    parser.add_argument(
        "overrides", nargs="*", help="config overrides on top of the run's own, e.g. strategy=one_device"
    )
    args = parser.parse_intermixed_args(argv)  # overrides may follow --step N
    with one_line_errors():
        # An evaluation has no sidecar evaluator: the run's
        # cluster.evaluator=true must not refuse strategy=one_device here.
        cfg = compose([*saved_overrides(args.run_dir), "cluster.evaluator=false", *args.overrides])
        with_hydra = OmegaConf.to_container(cfg)
        with_hydra.pop("hydra", None)
        plain = OmegaConf.create(with_hydra)
        _no_other_model(args.run_dir, plain, args.overrides)
        find(
            resolve(plain, os.path.abspath(args.run_dir)).checkpoint.dir, args.step
        )  # --step N, checked before TensorFlow starts
        log_lines_as_a_run_shows_them()
        record = execute(plain, os.path.abspath(args.run_dir), "evaluate", args.step)
    print(json.dumps(record, indent=2, default=float))
    return 0


def _no_other_model(run_dir: str, cfg, overrides) -> None:
    """An override of the model or the optimizer that the run's checkpoints
    do not hold is refused naming what the run was trained with."""
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
        raise ConfigError.one(
            key,
            value,
            f"this run was trained with {trained}, which its checkpoints hold: evaluate takes the "
            f"run's own {group}; drop this override (nothing was changed)",
        )


def _choice(run_dir: str, group: str):
    """The option of `group` the run was composed with (model=mlp), as Hydra recorded it."""
    hydra_yaml = Path(run_dir) / ".hydra" / "hydra.yaml"
    try:
        return OmegaConf.select(OmegaConf.load(hydra_yaml), f"hydra.runtime.choices.{group}")
    except Exception:  # none recorded (a run written by another tool): the section itself is named
        return None
