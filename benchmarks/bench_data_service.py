"""The input pipeline on a tf.data service (`data.service.workers`) against
the same pipeline in the trainer, on an input-bound job.

The default MLP on MNIST-shaped examples whose preprocessing costs about
5 ms a batch of 128 on one core (benchmarks/slow_input.py), one_device,
with 0 (the pipeline in the trainer, tf.data's parallel map), 1 and 2
tf.data service workers (plus their dispatcher: local processes launched
beside the trainer), in both modes. The source is a pipeline function, which
distributed_epoch splits by element: one round trip to the dispatcher per
example. Each run is a fresh process; the contenders alternate;
medians and ratios against 0 workers are printed, and the preprocessing's
own cost, measured first on one thread.

    python benchmarks/bench_data_service.py [--steps 2000] [--repeats 3] [--quick]

On one machine the service adds no cores, only processes: it pays where
the trainer's cores are busy training and the service's workers run on
other machines (or idle cores). `--quick`: 150 steps, one repeat (and the first batches, prefetched
while the trainer starts, weigh more: rough).
"""

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from side_by_side import interruptible, run, say_estimate, table

HERE = Path(__file__).resolve().parent
BATCH = 128


def tfdistx_run(service_workers: int, steps: int, mode: str) -> float:
    with tempfile.TemporaryDirectory() as run_dir:
        cmd = [
            sys.executable,
            "-m",
            "tfdistx",
            "strategy=one_device",
            "model=mlp",
            "data._target_=slow_input.heavy",
            f"data.batch_size={BATCH}",
            f"data.service.workers={service_workers}",
            f"data.service.mode={mode}",
            f"trainer.steps={steps}",
            f"trainer.steps_per_loop={min(50, steps // 3)}",
            f"trainer.log_every={steps}",
            "trainer.eval_every=0",
            "checkpoint.every_steps=0",
            "checkpoint.export=false",
            "logger.console=false",
            "logger.tensorboard=false",
            "cluster.max_restarts=0",
            f"hydra.run.dir={run_dir}",
        ]
        run(cmd, env=_env())
        return json.loads((Path(run_dir) / "summary.json").read_text())["examples_per_sec"]


def preprocessing_ms() -> float:
    """ms a batch of the pipeline alone, on one thread (in a child, as everything here)."""
    code = (
        "import time, tensorflow as tf; from slow_input import heavy\n"
        "o = tf.data.Options(); o.threading.private_threadpool_size = 1\n"
        "it = iter(heavy().train(None).repeat().batch(%d).with_options(o)); next(it)\n"
        "t = time.perf_counter()\nfor _ in range(30): next(it)\n"
        "print((time.perf_counter() - t) / 30 * 1000)" % BATCH
    )
    return float(run([sys.executable, "-c", code], env=_env()).stdout.strip().splitlines()[-1])


def _env():
    return {
        **os.environ,
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="150 steps, one repeat: rough numbers, under 2 minutes")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.repeats = 150, 1
    # Measured here (load average 7-10): a run starts in ~6 s, ~12 s with the service's 2-3 more processes, and
    # trains ~16k examples/s with the pipeline in the trainer, ~3.5k in distributed_epoch (a dispatcher round trip
    # per example), ~16k in parallel_epochs.
    examples = args.steps * BATCH
    say_estimate(
        [
            (1, 5, "the preprocessing alone"),
            (3 * args.repeats, 12 + examples / 16_000, "in the trainer, parallel_epochs"),
            (2 * args.repeats, 12 + examples / 3_500, "distributed_epoch"),
        ],
        args.quick,
    )
    print(
        f"preprocessing: {preprocessing_ms():.1f} ms a batch of {BATCH} on one thread; {os.cpu_count()} cores here",
        flush=True,
    )
    contenders = {"in the trainer (data.service off)": lambda: tfdistx_run(0, args.steps, "distributed_epoch")}
    for mode in ("distributed_epoch", "parallel_epochs"):
        for workers in (1, 2):
            contenders[f"{workers} service worker(s), {mode}"] = lambda w=workers, m=mode: tfdistx_run(w, args.steps, m)
    baseline = next(iter(contenders))
    table(
        contenders,
        args.repeats,
        f"input-bound MLP, one_device, batch {BATCH}, {args.steps} steps",
        "vs in the trainer",
        lambda medians, name: medians[name] / medians[baseline],
    )


if __name__ == "__main__":
    interruptible(main)
