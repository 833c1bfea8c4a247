"""`tfdistx export RUN_DIR [--step N] [--out DIR]`: a SavedModel from any
kept checkpoint of a run (engine/export.py writes it)."""

import argparse
import os
import sys
from pathlib import Path
from typing import List, Optional

from tfdistx.commands.common import one_line_errors
from tfdistx.config.compose import saved_config
from tfdistx.config.spec import resolve
from tfdistx.engine import checkpointing
from tfdistx.engine.export import export_checkpoint


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="tfdistx export", description="Write a SavedModel from a run's checkpoint.")
    parser.add_argument("run_dir", help="a run directory (with .hydra/config.yaml and checkpoints/)")
    parser.add_argument("--step", type=int, default=None, help="the checkpoint saved at this step (default: the newest; "
                        "the best with checkpoint.keep_best, as the run exported)")
    parser.add_argument("--out", default=None, help="where to write the SavedModel: a new directory, or an earlier export, "
                        "which is kept aside (default: RUN_DIR/export, or RUN_DIR/export-step-N with --step)")
    args = parser.parse_args(argv)

    with one_line_errors():
        spec = resolve(saved_config(args.run_dir), args.run_dir)
        # Without --step, the checkpoint the run itself exported: the best one under checkpoint.keep_best, else the newest.
        path = checkpointing.find(spec.checkpoint.dir, args.step, prefer_best=spec.checkpoint.keep_best)
        default = "export" if args.step is None else f"export-step-{args.step}"  # the run's own export stays the final step's
        target = export_checkpoint(spec, path, args.out or str(Path(args.run_dir) / default),
                                   protected=[args.run_dir, spec.checkpoint.dir])
    print(f"tfdistx: exported {os.path.basename(path)} to {target}", file=sys.stderr)
    return 0
