"""Gradient accumulation with and without XLA, side by side in one run.

The README's accumulation example (`data.batch_size=256
trainer.accumulate_steps=8`: steps of 2,048 examples) with the default
784-128-10 MLP on MNIST-shaped synthetic data, one device, Adam, under
`trainer.jit_compile=auto` (what a user gets), `false` and `true` (one and
several steps per XLA call); and, for scale, the same 2,048 examples a step
in one batch, without and with XLA. Every measurement is a fresh process;
contenders alternate; throughput excludes the first call (tracing and
compiling). The ratios are auto's speed over each contender's.

    python benchmarks/bench_accumulation.py [--batch 256] [--accumulate 8] [--steps 400] [--repeats 3] [--quick]

`--quick`: 100 steps, one repeat (rough numbers, about 2 minutes).
"""

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from side_by_side import compare, interruptible, run, say_estimate

HERE = Path(__file__).resolve().parent
# For the estimate, measured on this project's 2-core machine:
# examples/s, and a process's seconds besides its timed steps.
RATE, OVERHEAD = 60_000, 8


def tfdistx_run(batch: int, accumulate: int, steps: int, steps_per_loop: int, *extra: str) -> float:
    with tempfile.TemporaryDirectory() as run_dir:
        cmd = [
            sys.executable,
            "-m",
            "tfdistx",
            "strategy=one_device",
            "model=mlp",
            "data=synthetic",
            f"data.batch_size={batch}",
            f"trainer.accumulate_steps={accumulate}",
            f"trainer.steps={steps}",
            f"trainer.steps_per_loop={steps_per_loop}",
            f"trainer.log_every={steps}",
            "trainer.eval_every=0",
            "trainer.eval_steps=1",
            "checkpoint.every_steps=0",
            "checkpoint.export=false",
            "logger.console=false",
            "logger.tensorboard=false",
            f"hydra.run.dir={run_dir}",
            *extra,
        ]
        run(cmd, env=_env())
        return json.loads((Path(run_dir) / "summary.json").read_text())["examples_per_sec"]


def _env():
    return {
        **os.environ,
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256, help="data.batch_size: one micro-batch")
    parser.add_argument("--accumulate", type=int, default=8, help="trainer.accumulate_steps")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--steps-per-loop", type=int, default=50, help="trainer.steps_per_loop")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="100 steps, one repeat: rough numbers")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.repeats = 100, 1
    b, n, steps, loop = args.batch, args.accumulate, args.steps, args.steps_per_loop
    contenders = {
        "auto": lambda: tfdistx_run(b, n, steps, loop),
        "jit_compile=false": lambda: tfdistx_run(b, n, steps, loop, "trainer.jit_compile=false"),
        "jit_compile=true, 1 step per XLA call": lambda: tfdistx_run(
            b, n, steps, loop, "trainer.jit_compile=true", "trainer.steps_per_xla_call=1"
        ),
        "jit_compile=true, 10 steps per XLA call": lambda: tfdistx_run(
            b, n, steps, loop, "trainer.jit_compile=true", "trainer.steps_per_xla_call=10"
        ),
        f"one batch of {b * n}, jit_compile=false": lambda: tfdistx_run(
            b * n, 1, steps, loop, "trainer.jit_compile=false"
        ),
        f"one batch of {b * n}, jit_compile=true": lambda: tfdistx_run(
            b * n, 1, steps, loop, "trainer.jit_compile=true", "trainer.steps_per_xla_call=1"
        ),
    }
    say_estimate([(len(contenders) * args.repeats, OVERHEAD + steps * b * n / RATE, "tfdistx")], args.quick)
    print(f"{os.cpu_count()} cores", flush=True)
    compare(
        contenders,
        args.repeats,
        f"MLP 784-128-10, one device, {n} micro-batches of {b} a step, {steps} steps",
        ours="auto",
    )


if __name__ == "__main__":
    interruptible(main)
