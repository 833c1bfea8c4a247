"""Is the input what limits training? The same examples from in-memory
tensors, TFRecord files and CSV files, side by side in one run.

The default MLP (784-128-10) and the CNN on MNIST-shaped synthetic data
(8192 examples), and the MLP on tabular rows (16 floats, regression); one
device, global batch 128. The files are written once by `tfdistx data
write` (8 shards, with a manifest). Tables:

1. training: steady examples/s of a whole tfdistx run on each source, and
   its ratio to the in-memory run (the target: file data >= 0.9x for the MLP);
2. input alone: examples/s of each source's input pipeline with no model
   (what the input could feed, on the same cores the model uses).

Every measurement runs in a fresh process; the contenders alternate.

    python benchmarks/bench_input.py [--steps 3000] [--repeats 3] [--models mlp,cnn] [--quick]

`--quick`: the MLP only, 300 steps, one repeat, 100 batches of input alone:
rough numbers.
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from side_by_side import interruptible, run, say_estimate, table

IMAGE = [28, 28, 1]


def env():
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}


def training(data: list, model: str, steps: int) -> float:
    with tempfile.TemporaryDirectory() as run_dir:
        cmd = [
            sys.executable,
            "-m",
            "tfdistx",
            "strategy=one_device",
            f"model={model}",
            *data,
            "data.batch_size=128",
            f"trainer.steps={steps}",
            "trainer.steps_per_loop=100",
            f"trainer.log_every={steps}",
            "trainer.eval_every=0",
            "trainer.eval_steps=1",
            "checkpoint.every_steps=0",
            "checkpoint.export=false",
            "logger.console=false",
            "logger.tensorboard=false",
            f"hydra.run.dir={run_dir}",
        ]
        run(cmd, env=env())
        return json.loads((Path(run_dir) / "summary.json").read_text())["examples_per_sec"]


def input_alone(data: list, batches: int) -> float:
    out = run([sys.executable, __file__, "--input-alone", str(batches), "--", *data], env=env())
    return float(out.stdout.strip().splitlines()[-1])


def _measure_input_alone(batches: int, overrides: list) -> None:
    """In this process: build the source as a run would and time `batches` batches after a warm-up."""
    from tfdistx.commands.common import compose
    from tfdistx.config.resolve import resolve
    from tfdistx.engine.parts import build_source

    cfg = compose([*overrides, "data.batch_size=128"])
    spec = resolve(cfg, "unused")
    source = build_source(spec.data, spec.run_dir)
    import tensorflow as tf

    ds = source.train.batches(None, 128, seed=0, window=cfg.data.shuffle_buffer).prefetch(tf.data.AUTOTUNE)
    iterator = iter(ds)
    for _ in range(50):
        next(iterator)
    started = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    print(batches * 128 / (time.perf_counter() - started))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--input-alone", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="rough numbers in under 2 minutes (see above)")
    args, rest = parser.parse_known_args()
    if args.input_alone:
        return _measure_input_alone(args.input_alone, [a for a in rest if a != "--"])
    alone = 500
    if args.quick:
        args.steps, args.repeats, args.models, alone = 300, 1, "mlp", 100
    models = args.models.split(",")
    # Measured on this project's 2-core machine: a process starts in ~5 s; examples/s (docs/performance.md) by model
    # and source, tabular rows at about 350k whatever the source but CSV (150k); `data write` takes ~5 s a format.
    speeds = {"mlp": (90_000, 77_000, 5_400), "cnn": (5_000, 5_000, 4_000)}
    examples = args.steps * 128
    say_estimate(
        [
            (4, 5, "data write"),
            *[
                (args.repeats, 5 + examples / speed, f"{model}, {source}")
                for model in models
                for source, speed in zip(("in memory", "TFRecord", "CSV"), speeds[model])
            ],
            (2 * args.repeats, 5 + examples / 350_000, "tabular, memory and TFRecord"),
            (args.repeats, 5 + examples / 150_000, "tabular, CSV"),
            (6 * args.repeats, 4.5 + alone * 128 / 100_000, "input alone"),
        ],
        args.quick,
    )

    with tempfile.TemporaryDirectory(prefix="bench-input-") as scratch:
        images = sources(Path(scratch) / "images", "data=synthetic", csv_extra=["data.feature_shape=[28,28,1]"])
        rows = sources(Path(scratch) / "rows", "data=synthetic_regression", extra=["task=regression"])
        relative = lambda medians, name: medians[name] / medians["in memory"]  # noqa: E731
        for model in models:
            table(
                {name: (lambda d=data: training(d, model, args.steps)) for name, data in images.items()},
                args.repeats,
                f"Training, model={model}, MNIST-shaped rows (784 floats), one device, batch 128, {args.steps} steps "
                f"({os.cpu_count()} cores)",
                "vs in memory",
                relative,
            )
            print()
        table(
            {name: (lambda d=data: training(d, "mlp", args.steps)) for name, data in rows.items()},
            args.repeats,
            f"Training, model=mlp, tabular rows (16 floats, regression), one device, batch 128, {args.steps} steps",
            "vs in memory",
            relative,
        )
        print()
        table(
            {
                name: (lambda d=data: input_alone(d, alone))
                for name, data in {**images, **{f"{k}, tabular": v for k, v in rows.items()}}.items()
            },
            args.repeats,
            f"Input alone (no model): {alone} batches of 128 after 50 of warm-up",
            "vs in memory",
            relative,
        )


def sources(out: Path, data: str, extra=(), csv_extra=()) -> dict:
    """The in-memory source and the same examples written as TFRecord and CSV files."""
    found = {"in memory": [data, *extra]}
    for fmt, name in (("tfrecord", "TFRecord files"), ("csv", "CSV files")):
        run(
            [
                sys.executable,
                "-m",
                "tfdistx",
                "data",
                "write",
                data,
                "--out",
                str(out / fmt),
                "--shards",
                "8",
                "--format",
                fmt,
            ],
            env=env(),
        )
        found[name] = [
            f"data={fmt}",
            f"data.train_files={out / fmt}/train-*",
            *extra,
            *(csv_extra if fmt == "csv" else []),
        ]
    return found


if __name__ == "__main__":
    interruptible(main)
