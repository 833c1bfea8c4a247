"""Resume-to-first-step at step 1k, 10k and 100k, before and after, side by side in one run.

A run is trained to step 1k, 10k and 100k (the same run, a copy of its run
dir kept at each), on in-memory data (data=synthetic) and on the same
examples in TFRecord files (data=tfrecord, written by `tfdistx data write`).
Each copy is then resumed for one step, two ways:

- after: the built-in source, which starts its input at the step (order.py);
- before: the same source handed over as a plain pipeline function
  (plain_pipelines.py), resumed by reading and dropping the batches already
  trained on (`Dataset.skip`), as every source was before.

Printed: the resumed run's time in its training loop (input start, tracing,
one step, one eval batch, a checkpoint), median of the repeats, and the
ratio to the same way at step 1k. A small MLP (8 features, 16 hidden) at
batch 32 keeps the 100k-step preparation to seconds; the skip is what grows.

    python benchmarks/bench_resume.py [--repeats 3] [--steps 1000,10000,100000] [--quick]

`--quick`: steps 1k and 10k, one repeat: rough numbers.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from side_by_side import interruptible, run, say_estimate

HERE = Path(__file__).resolve().parent
COMMON = [
    "model=mlp",
    "model.hidden_units=[16]",
    "data.batch_size=32",
    "trainer.steps_per_loop=1000",
    "trainer.log_every=1000",
    "trainer.eval_every=0",
    "trainer.eval_steps=1",
    "checkpoint.every_steps=0",
    "checkpoint.export=false",
    "logger.tensorboard=false",
    "logger.console=false",
    "cluster.max_restarts=0",
]
SYNTHETIC = ["data.image_shape=[8]", "data.train_examples=65536", "data.eval_examples=1024"]


def tfdistx(*args, run_dir) -> dict:
    run(
        [sys.executable, "-m", "tfdistx", *COMMON, *args, f"hydra.run.dir={run_dir}"],
        env={
            **os.environ,
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        },
    )
    return json.loads((Path(run_dir) / "summary.json").read_text())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", default="1000,10000,100000")
    parser.add_argument("--quick", action="store_true", help="steps 1k and 10k, one repeat: rough numbers")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.repeats = "1000,10000", 1
    targets = [int(s) for s in args.steps.split(",")]
    # Measured on this project's 2-core machine: a process takes ~4.5 s besides its steps and trains this tiny MLP at
    # ~7,000 steps/s (1,000 a call); a resumed "before" reads and drops 32-example batches at ~20k/s in memory, ~12k/s
    # from files.
    prepare = sum(4.5 + (target - previous) / 7000 for previous, target in zip([0, *targets], targets))
    say_estimate(
        [
            (1, 5, "data write"),
            (2, prepare, f"training to step {targets[-1]:,} in stages"),
            (2 * len(targets) * args.repeats, 4.5, "resumes, after"),
            *[
                (args.repeats, 4.5 + target / 20_000, f"resumes, before, in memory, step {target:,}")
                for target in targets
            ],
            *[(args.repeats, 4.5 + target / 12_000, f"resumes, before, files, step {target:,}") for target in targets],
        ],
        args.quick,
    )

    with tempfile.TemporaryDirectory(prefix="bench-resume-") as scratch:
        scratch = Path(scratch)
        run(
            [
                sys.executable,
                "-m",
                "tfdistx",
                "data",
                "write",
                "data=synthetic",
                *SYNTHETIC,
                "--out",
                str(scratch / "files"),
                "--shards",
                "8",
            ],
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        )
        files = [f"data.train_files={scratch}/files/train-*", f"data.eval_files={scratch}/files/eval-*"]
        kinds = {
            "in memory": (
                ["data=synthetic", *SYNTHETIC],
                ["data=synthetic", "data._target_=plain_pipelines.synthetic", *SYNTHETIC],
            ),
            "TFRecord files": (
                ["data=tfrecord", *files],
                ["data=tfrecord", "data._target_=plain_pipelines.tfrecord", *files],
            ),
        }
        snapshots = {}
        for kind, (after, _) in kinds.items():
            base = scratch / kind.replace(" ", "_")
            for target in targets:
                started = time.perf_counter()
                tfdistx(*after, f"trainer.steps={target}", run_dir=base)
                print(
                    f"  {kind}: trained to step {target} in {time.perf_counter() - started:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
                snapshots[kind, target] = scratch / f"{base.name}-{target}"
                shutil.copytree(base, snapshots[kind, target])

        samples = {(kind, way, target): [] for kind in kinds for way in ("before", "after") for target in targets}
        load_before = os.getloadavg()[0]
        for repeat in range(args.repeats):
            for (kind, way, target), values in samples.items():
                run_dir = scratch / "resumed"
                shutil.rmtree(run_dir, ignore_errors=True)
                shutil.copytree(snapshots[kind, target], run_dir)
                after, before = kinds[kind]
                summary = tfdistx(
                    *(after if way == "after" else before), f"trainer.steps={target + 1}", run_dir=run_dir
                )
                assert summary["resumed_from_step"] == target, summary
                values.append(summary["train_wall_time_sec"])
                print(
                    f"  repeat {repeat + 1}: {kind}, {way}, step {target}: {values[-1]:.2f} s",
                    file=sys.stderr,
                    flush=True,
                )

    medians = {key: statistics.median(values) for key, values in samples.items()}
    print(
        f"Resume to first step (s in the training loop), median of {args.repeats} "
        f"(1-min load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after; {os.cpu_count()} cores)"
    )
    print(
        f"{'data':<16}{'step':>8}{'before (skip)':>15}{'after':>9}{'before / after':>16}"
        f"{'after / after@' + str(targets[0]):>20}"
    )
    for kind in kinds:
        for target in targets:
            before, after = medians[kind, "before", target], medians[kind, "after", target]
            print(
                f"{kind:<16}{target:>8,}{before:>15.2f}{after:>9.2f}"
                f"{before / after:>15.1f}x{after / medians[kind, 'after', targets[0]]:>19.2f}x"
            )


if __name__ == "__main__":
    interruptible(main)
