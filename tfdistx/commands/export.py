"""`tfdistx export RUN_DIR [--step N] [--out DIR]`: a SavedModel from any
kept checkpoint of a run (engine/export.py writes it). Every argument is
checked before TensorFlow starts."""

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import List, Optional

from tfdistx.commands.common import log_lines_as_a_run_shows_them, one_line_errors, start_tensorflow
from tfdistx.config.compose import saved_config
from tfdistx.core.errors import ConfigError
from tfdistx.config.resolve import resolve
from tfdistx.checkpoint_files import find
from tfdistx.rundir import check_new_directory


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="tfdistx export", description="Write a SavedModel from a run's checkpoint.")
    parser.add_argument("run_dir", help="a run directory (with .hydra/config.yaml and checkpoints/)")
    parser.add_argument(
        "--step",
        type=int,
        default=None,
        help="the checkpoint saved at this step (default: the newest; "
        "the best with checkpoint.keep_best, as the run exported)",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="where to write the SavedModel: a new directory, or an earlier export, "
        "which is kept aside (default: RUN_DIR/export, or RUN_DIR/export-step-N with --step, "
        "which never replaces RUN_DIR/export)",
    )
    args = parser.parse_args(argv)

    with one_line_errors():
        spec = resolve(saved_config(args.run_dir), args.run_dir)
        # Without --step, the checkpoint the run itself exported:
        # the best one under checkpoint.keep_best, else the newest.
        path = find(spec.checkpoint.dir, args.step, prefer_best=spec.checkpoint.keep_best)
        default = (
            "export" if args.step is None else f"export-step-{args.step}"
        )  # the run's own export stays the final step's
        out = args.out or str(Path(args.run_dir) / default)
        protected = [args.run_dir, spec.checkpoint.dir]
        _not_over_the_runs_own_export(out, args.run_dir, args.step)
        check_new_directory("--out", out, protected)
        log_lines_as_a_run_shows_them(logging.WARNING)  # its own line says what it exported
        start_tensorflow()
        from tfdistx.engine.export import export_checkpoint  # deferred: it imports TensorFlow

        target = export_checkpoint(spec, path, out, protected=protected)
    print(f"tfdistx: exported {os.path.basename(path)} to {target}", file=sys.stderr)
    return 0


def _not_over_the_runs_own_export(out: str, run_dir: str, step: Optional[int]) -> None:
    """RUN/export is the model the run exported, as summary.json and
    `tfdistx predict RUN` take it: only an export of that checkpoint (no
    --step) may replace it, and nothing is written inside it."""
    target, own = Path(out).resolve(), (Path(run_dir) / "export").resolve()
    if own in target.parents:
        raise ConfigError.for_key(
            "--out", out, f"is inside {own}, the run's own export: name a directory outside it (nothing was changed)"
        )
    if target == own and step is not None:
        raise ConfigError.for_key(
            "--out",
            out,
            f"is the run's own export, which stays the model the run exported (summary.json "
            f"describes it): --step {step} writes {Path(run_dir) / f'export-step-{step}'} by default; "
            "name another directory (nothing was changed)",
        )
