"""`tfdistx evaluate RUN_DIR [--step N] [overrides]`: metrics of a run's
checkpoint on the configured eval data, with the run's own config and the
overrides on top (e.g. strategy=one_device cluster=local). Every argument
is checked before TensorFlow starts."""

import argparse
import json
import os

from tfdistx.commands.common import compose, log_lines_as_a_run_shows_them, one_line_errors
from tfdistx.commands.execute import execute
from tfdistx.config.compose import refuse_another_model, saved_overrides, without_hydra
from tfdistx.config.resolve import resolve
from tfdistx.checkpoint_files import find


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
        plain = without_hydra(cfg)
        refuse_another_model(args.run_dir, plain, args.overrides)
        find(
            resolve(plain, os.path.abspath(args.run_dir)).checkpoint.dir, args.step
        )  # --step N, checked before TensorFlow starts
        log_lines_as_a_run_shows_them()
        record = execute(plain, os.path.abspath(args.run_dir), "evaluate", args.step)
    print(json.dumps(record, indent=2, default=float))
    return 0
