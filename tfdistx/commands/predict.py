"""`tfdistx predict RUN_DIR [--data-files GLOB ...] [--step N] [--out DIR]
[--format csv|tfrecord] [--batch-size N]`: a run's export applied to rows,
its predictions written as sharded files in input order.

- The model: RUN_DIR/export (the SavedModel every run writes), or with
  `--step N` the checkpoint saved at step N, exported first into
  RUN_DIR/export-step-N unless it is there already (as `tfdistx export
  RUN_DIR --step N` does). A run without an export is refused: `tfdistx
  export RUN_DIR` writes one (predict never writes into export/ itself).
- The rows: TFRecord files of tf.train.Example, or CSV files with a header
  (.csv, .csv.gz), parsed by the export's own input signature; without
  `--data-files`, the run's configured data source's eval split.
- The predictions: one shard per input file, in order (row i of shard k is
  row i of file k), every serving output flattened into columns or
  features, and predictions.json (the export, the inputs and their row
  counts, the outputs), in `--out` (default RUN_DIR/predictions, or
  RUN_DIR/predictions-step-N), written beside and moved in whole.

The export is strategy-free (engine/export.py rebuilds the model outside
any strategy and loads the checkpoint into it), so a run trained under any
strategy — multi-worker, parameter servers, mirrored — predicts the same
way: here, in one process. The TensorFlow side is engine/predict.py.
"""

import argparse
import glob
import os
import shutil
import sys
import time
from pathlib import Path
from typing import List, Optional

from tfdistx.commands.common import compose, one_line_errors, start_tensorflow
from tfdistx.core import datafiles
from tfdistx.config.compose import data_names, saved_checkpoint_dir, saved_config, saved_overrides
from tfdistx.core.errors import ConfigError
from tfdistx.core.targets import Target
from tfdistx.config.resolve import resolve
from tfdistx.checkpoint_files import find
from tfdistx.rundir import PREDICTIONS, check_new_directory

DEFAULT_BATCH = 512


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tfdistx predict", description="Predictions of a run's export, as sharded files in input order."
    )
    parser.add_argument("run_dir", help="a run directory (with .hydra/config.yaml and export/)")
    parser.add_argument(
        "--data-files",
        nargs="+",
        action="extend",
        default=None,
        metavar="GLOB",
        help="TFRecord files of tf.train.Example, or CSV files with a header (.csv, .csv.gz); GZIP by .gz "
        "(default: the run's data source's eval split)",
    )
    parser.add_argument(
        "--step",
        type=int,
        default=None,
        help="the checkpoint saved at this step, exported into "
        "RUN_DIR/export-step-N unless it is there (default: RUN_DIR/export)",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="a new directory, or an earlier predict's, which is kept aside "
        "(default: RUN_DIR/predictions, or RUN_DIR/predictions-step-N with --step)",
    )
    parser.add_argument(
        "--format",
        default="csv",
        help="of the predictions: csv (a header, a row per row) or tfrecord "
        "(a tf.train.Example per row, a feature per output); default csv",
    )
    parser.add_argument(
        "--batch-size", type=int, default=DEFAULT_BATCH, help=f"rows per call of the model (default {DEFAULT_BATCH})"
    )
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    with one_line_errors():
        progress = Progress(files=bool(args.data_files))
        try:
            manifest, out = predict(args, progress)
        finally:
            progress.end()
    inputs = f"{len(manifest['inputs'])} file(s)" if args.data_files else manifest["inputs"][0]["source"]
    print(f"tfdistx: predict: {manifest['rows']:,} rows of {inputs} predicted into {out}", file=sys.stderr)
    return 0


def predict(args, progress=None):
    """(predictions.json's content, the output directory). Every argument
    is checked before TensorFlow starts; a --step export this predict wrote
    is removed again if it fails (a refused command changes nothing)."""
    run_dir = os.path.abspath(args.run_dir)
    cfg = saved_config(run_dir)  # a directory that is not a run is refused here
    if args.format not in datafiles.FORMATS:
        raise ConfigError.for_key("--format", args.format, f"one of {', '.join(sorted(datafiles.FORMATS))}")
    if args.batch_size < 1:
        raise ConfigError.for_key("--batch-size", args.batch_size, "at least 1")
    checkpoints = saved_checkpoint_dir(cfg, run_dir)
    own_export = os.path.join(run_dir, "export")
    export_dir = own_export if args.step is None else os.path.join(run_dir, f"export-step-{args.step}")
    out = os.path.abspath(
        args.out or os.path.join(run_dir, "predictions" if args.step is None else f"predictions-step-{args.step}")
    )
    protected = [run_dir, checkpoints, own_export, export_dir]
    _not_inside(out, protected[1:])
    check_new_directory("--out", out, protected, made_by=PREDICTIONS)
    for pattern in args.data_files or ():
        _matches_a_file(pattern)

    spec = checkpoint = None
    if args.step is None:
        if not Path(export_dir, "saved_model.pb").is_file():
            raise ConfigError.for_key(
                "run_dir",
                args.run_dir,
                "has no export/ (the run had checkpoint.export=false, or has not finished): "
                "run `tfdistx export RUN_DIR` first, or give --step N",
            )
    elif not Path(export_dir, "saved_model.pb").is_file():
        spec = _spec(run_dir)
        checkpoint = find(spec.checkpoint.dir, args.step)
        check_new_directory("--step", export_dir, [run_dir, spec.checkpoint.dir])
    if args.data_files is None:
        spec = spec or _spec(run_dir)

    start_tensorflow()
    if checkpoint is not None:
        from tfdistx.engine.export import export_checkpoint  # deferred, as the engine's others: they import TensorFlow

        export_checkpoint(spec, checkpoint, export_dir, protected=[run_dir, spec.checkpoint.dir])
        print(f"tfdistx: predict: exported {os.path.basename(checkpoint)} to {export_dir}", file=sys.stderr)
    try:
        return _predict_with(export_dir, args, cfg, spec.data if spec else None, run_dir, out, protected, progress), out
    except BaseException:
        if checkpoint is not None:  # the export this predict wrote, of no use to anyone now
            shutil.rmtree(export_dir, ignore_errors=True)
        raise


def _predict_with(
    export_dir: str, args, cfg, data: Optional[Target], run_dir: str, out: str, protected, progress
) -> dict:
    """The predictions of the files asked for (named by the run's saved config `cfg`), or of the eval split of the
    run's `data` (the spec's)."""
    from tfdistx.engine import predict as engine  # deferred: it imports TensorFlow
    from tfdistx.engine.parts import build_source

    files = engine.find_files(args.data_files) if args.data_files else None
    export = engine.load_export(export_dir)
    if files is not None:
        names = row_names(cfg)

        def parts():
            return [engine.Part(name, engine.file_rows(name, export, args.batch_size, names)) for name in files]
    else:
        what = f"the eval split of the run's data ({data.path})"

        def parts():
            return [
                engine.Part(
                    what,
                    engine.source_rows(build_source(data, Path(run_dir)), export, args.batch_size, what),
                    is_file=False,
                )
            ]

    about = {
        "run_dir": os.path.abspath(args.run_dir),
        "export": {"checkpoint_step": args.step},
        "data_files": args.data_files,
        "batch_size": args.batch_size,
    }
    return engine.predict(export, parts, out, args.format, protected=protected, progress=progress, about=about)


def _matches_a_file(pattern: str) -> None:
    """A local glob that matches no file is refused now (a remote one, gs://, once TensorFlow can list it)."""
    if not datafiles.is_remote(pattern) and not any(
        os.path.isfile(name) for name in glob.glob(os.path.expanduser(pattern))
    ):
        raise ConfigError.for_key("--data-files", os.path.abspath(os.path.expanduser(pattern)), "no file matches")


def _spec(run_dir: str):
    """The run's spec, composed from its own overrides as `tfdistx evaluate` does."""
    return resolve(compose(saved_overrides(run_dir), notes=False), run_dir)


def row_names(cfg):
    """What the run's data config says about the names in its files: a
    one-tensor model's input (`features`) is the run's one feature by its
    own name (data.features: {image: ...}); the label (data.label) is never
    a feature; var_len features are padded or cut as in training."""
    label, features = data_names(cfg)
    label = label if isinstance(label, str) else "label"
    if isinstance(features, str):  # data=tfds data.features=text: the one feature, by its name
        features = {features: None}
    features = features if isinstance(features, dict) else {}
    inputs = [name for name in features if name != label]
    from tfdistx.engine.predict import RowNames  # deferred: it imports TensorFlow

    return RowNames(
        aliases={"features": inputs[0]} if len(inputs) == 1 else {},
        labels=tuple(dict.fromkeys(["label", label])),
        var_len=tuple(name for name in inputs if isinstance(features[name], dict) and features[name].get("var_len")),
    )


def _not_inside(out: str, kept) -> None:
    """No predictions inside a run's checkpoints or an export: they would be taken for part of it."""
    target = Path(out).resolve()
    for path in map(lambda p: Path(p).resolve(), kept):
        if path == target or path in target.parents:
            raise ConfigError.for_key(
                "--out", out, f"is inside {path}, which holds the run's model: name another directory"
            )


class Progress:
    """One line on stderr while predict runs: rewritten in place (at most 4
    times a second) on a terminal; otherwise a plain line as files finish,
    at most one per file and one a second."""

    def __init__(self, files: bool, stream=None):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.files, self.last, self.shown = files, 0.0, False

    def __call__(self, done: int, total: int, rows: int, finished: bool) -> None:
        now = time.monotonic()
        if now - self.last < (0.25 if self.tty else 1.0) or not (self.tty or finished):
            return
        self.last = now
        line = (
            f"tfdistx: predict: {done}/{total} files, {rows:,} rows"
            if self.files
            else f"tfdistx: predict: {rows:,} rows"
        )
        if self.tty:
            print(f"\r\x1b[K{line}", end="", file=self.stream, flush=True)
            self.shown = True
        else:
            print(line, file=self.stream, flush=True)

    def end(self) -> None:
        if self.shown:
            print("\r\x1b[K", end="", file=self.stream, flush=True)
