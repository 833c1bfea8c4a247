"""`tfdistx data write [overrides] --out DIR`: any data source as sharded
TFRecord or CSV files plus a manifest (data/files.py writes them)."""

import argparse
import os
import sys

from tfdistx.commands.common import compose, one_line_errors, start_tensorflow
from tfdistx.core import datafiles
from tfdistx.core.errors import ConfigError
from tfdistx.config.resolve import resolve
from tfdistx.rundir import DATA_FILES, check_new_directory


def main(argv) -> int:
    """tfdistx data write [overrides] --out DIR [--shards N] ..."""
    parser = argparse.ArgumentParser(
        prog="tfdistx data write",
        description="Write the composed data source (data=synthetic, data=mnist, a data._target_ ...) as sharded "
        "TFRecord or CSV files plus a manifest.json, for data=tfrecord / data=csv.",
    )
    parser.add_argument("overrides", nargs="*", help="config overrides choosing the data: data=mnist data.data_dir=...")
    parser.add_argument("--out", required=True, help="directory to write into")
    parser.add_argument(
        "--shards", type=int, default=8, help="train files (default 8: at least as many as input pipelines)"
    )
    parser.add_argument("--eval-shards", type=int, default=1, help="eval files (default 1)")
    parser.add_argument("--format", choices=datafiles.FORMATS, default="tfrecord")
    parser.add_argument("--compression", choices=[c for c in datafiles.COMPRESSIONS if c], default=None)
    args = parser.parse_intermixed_args(argv)
    with one_line_errors():
        for flag, value in (("--shards", args.shards), ("--eval-shards", args.eval_shards)):
            if value < 1:
                raise ConfigError.for_key(flag, value, "at least 1")
        spec = resolve(compose(args.overrides))
        check_new_directory("--out", args.out, made_by=DATA_FILES)
        start_tensorflow()
        from tfdistx.data.files import write  # deferred, as build: they import TensorFlow
        from tfdistx.engine.parts import build_source

        source = build_source(spec.data, spec.run_dir)
        manifest = write(source, args.out, args.shards, args.eval_shards, args.format, args.compression)
    for split, info in manifest["splits"].items():
        print(f"{split}: {sum(info['files'].values())} examples in {len(info['files'])} file(s)")
    pattern = os.path.join(args.out, "train-*")
    print(
        f"wrote {args.out}; train on it with: python -m tfdistx data={args.format} data.train_files='{pattern}'"
        + (f" data.eval_files='{os.path.join(args.out, 'eval-*')}'" if "eval" in manifest["splits"] else ""),
        file=sys.stderr,
    )
    return 0
