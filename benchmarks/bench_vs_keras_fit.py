"""tfdistx against plain Keras 3 `model.fit`, side by side in one run.

The default 784-128-10 MLP on MNIST-shaped synthetic data (in memory), one
device, Adam, the same global batch and the same input pipeline (shuffle,
batch, prefetch). Every measurement runs in a fresh process; the contenders
alternate, each is repeated, and the medians and their ratios are printed.
Throughput is steady state: tracing/warm-up is excluded on both sides.

    python benchmarks/bench_vs_keras_fit.py [--batch 128] [--steps 2000] [--repeats 3] [--quick]

`--quick`: 300 steps, one repeat (rough numbers, under a minute).
"""

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from side_by_side import compare, interruptible, run, say_estimate

HERE = Path(__file__).resolve().parent


def tfdistx_run(batch: int, steps: int, steps_per_loop: int, *extra: str) -> float:
    with tempfile.TemporaryDirectory() as run_dir:
        cmd = [
            sys.executable,
            "-m",
            "tfdistx",
            "strategy=one_device",
            "model=mlp",
            "data=synthetic",
            f"data.batch_size={batch}",
            f"trainer.steps={steps}",
            f"trainer.steps_per_loop={steps_per_loop}",
            f"trainer.log_every={steps}",
            "trainer.eval_every=0",
            "trainer.eval_steps=1",
            "checkpoint.every_steps=0",
            "logger.console=false",
            "logger.tensorboard=false",
            f"hydra.run.dir={run_dir}",
            *extra,
        ]
        run(cmd, env=_env())
        return json.loads((Path(run_dir) / "summary.json").read_text())["examples_per_sec"]


def keras_fit(batch: int, steps: int, steps_per_execution: int, jit_compile: bool = False) -> float:
    cmd = [
        sys.executable,
        str(HERE / "keras_fit_baseline.py"),
        f"--batch={batch}",
        f"--steps={steps}",
        f"--steps-per-execution={steps_per_execution}",
        *(["--jit-compile"] if jit_compile else []),
    ]
    out = run(cmd, env=_env())
    return json.loads(out.stdout.strip().splitlines()[-1])["examples_per_sec"]


def _env():
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument(
        "--steps-per-loop",
        type=int,
        default=100,
        help="tfdistx steps per tf.function call, and tuned fit's steps_per_execution",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="300 steps, one repeat: rough numbers, under a minute")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.repeats = 300, 1
    # Measured here: a process starts in ~5 s (TensorFlow's import, tracing); tfdistx trains ~100k examples/s, fit ~55k
    # (after a warm-up fit of 20 or 2 x steps_per_execution steps).
    examples = args.steps * args.batch
    say_estimate(
        [
            (2 * args.repeats, 5 + examples / 100_000, "tfdistx"),
            (3 * args.repeats, 5 + (examples + max(2 * args.steps_per_loop, 20) * args.batch) / 55_000, "keras fit"),
        ],
        args.quick,
    )

    contenders = {
        "tfdistx": lambda: tfdistx_run(args.batch, args.steps, args.steps_per_loop),
        # the whole step under XLA as before steps_per_xla_call: one XLA call a step
        "tfdistx (steps_per_xla_call=1)": lambda: tfdistx_run(
            args.batch, args.steps, args.steps_per_loop, "trainer.steps_per_xla_call=1"
        ),
        "keras fit (steps_per_execution=1)": lambda: keras_fit(args.batch, args.steps, 1),
        f"keras fit (steps_per_execution={args.steps_per_loop})": lambda: keras_fit(
            args.batch, args.steps, args.steps_per_loop
        ),
        # Keras compiles its whole step with XLA when asked: the issue-20 target is measured against this one
        f"keras fit (steps_per_execution={args.steps_per_loop}, jit_compile)": lambda: keras_fit(
            args.batch, args.steps, args.steps_per_loop, True
        ),
    }
    compare(contenders, args.repeats, f"MLP 784-128-10, one device, global batch {args.batch}, {args.steps} steps")


if __name__ == "__main__":
    interruptible(main)
