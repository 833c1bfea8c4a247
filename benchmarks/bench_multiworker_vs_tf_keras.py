"""tfdistx multi-worker against legacy tf-keras `model.fit`, side by side in one run.

Both train the default 784-128-10 MLP with Adam 1e-3 on tfdistx's MNIST-shaped
synthetic data (8192 examples in memory) under MultiWorkerMirroredStrategy:
two worker processes on this machine, one replica each, talking over
127.0.0.1 with TF_CONFIG, the same global batch (half per worker), each
worker shuffling its own element shard, fed by
`distribute_datasets_from_function`. The contenders:

  tfdistx                          `python -m tfdistx strategy=multiworker cluster=2x1 ...`
  tf-keras fit (steps_per_execution=1)     `model.fit`, TF_USE_LEGACY_KERAS=1
  tf-keras fit (steps_per_execution=N)     the same, N = --steps-per-loop

Keras 3 `fit` cannot be a contender: it fails under MultiWorkerMirroredStrategy
(TF 2.21, Keras 3; README, Performance: two workers). tf-keras needs the full `tensorflow` wheel, so its workers
run in their own venv, made on first use at benchmarks/.venv-tf-keras.
Both sides' workers are started by tfdistx.launch.local.launcher: in a private network
namespace with only loopback when the OS allows it, else on the host's
loopback with a warning. Every measurement is a fresh cluster; the contenders
alternate, each is repeated, and the medians and their ratios are printed.
Throughput is global examples/s in steady state, measured on worker 0:
tfdistx leaves out its first (tracing) tf.function call, tf-keras a warm-up fit.

    python benchmarks/bench_multiworker_vs_tf_keras.py [--batch 256] [--steps 2000] [--repeats 3] [--quick]

(with the python that has tfdistx installed). `--quick`: 300 steps, one
repeat: rough numbers (the venv, when it must be made first, is not counted).
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from side_by_side import compare, interruptible, run, say_estimate

HERE = Path(__file__).resolve().parent
VENV = HERE / ".venv-tf-keras"
VENV_PYTHON = VENV / "bin" / "python"
REQUIREMENTS = ["tensorflow==2.21.0", "tf-keras==2.21.0"]  # tf-keras 2.21 goes with TF 2.21
WORKERS = 2


def ensure_tf_keras_venv() -> None:
    marker = VENV / ".installed"
    if marker.exists() and marker.read_text() == " ".join(REQUIREMENTS):
        return
    shutil.rmtree(VENV, ignore_errors=True)  # a half-made one from an interrupted install
    print(f"creating {VENV} with {' '.join(REQUIREMENTS)} (once; a few minutes)", file=sys.stderr, flush=True)
    start = time.monotonic()
    run([sys.executable, "-m", "venv", str(VENV)])
    run([str(VENV_PYTHON), "-m", "pip", "install", "--quiet", *REQUIREMENTS])
    marker.write_text(" ".join(REQUIREMENTS))
    print(f"  installed in {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)


def tfdistx_run(batch: int, steps: int, steps_per_loop: int) -> float:
    with tempfile.TemporaryDirectory() as run_dir:
        cmd = [
            sys.executable,
            "-m",
            "tfdistx",
            "strategy=multiworker",
            f"cluster={WORKERS}x1",
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
        ]
        _run(cmd)
        return json.loads((Path(run_dir) / "summary.json").read_text())["examples_per_sec"]


def tf_keras_fit(batch: int, steps: int, steps_per_execution: int) -> float:
    worker = [
        str(VENV_PYTHON),
        str(HERE / "tf_keras_multiworker_worker.py"),
        f"--batch={batch}",
        f"--steps={steps}",
        f"--steps-per-execution={steps_per_execution}",
    ]
    with tempfile.TemporaryDirectory() as log_dir:
        # The launcher tfdistx itself uses (isolation, TF_CONFIG, teardown), in
        # a child process so that the tasks' output goes to their log files only.
        launch = (
            "import sys; from tfdistx.cluster.launch_spec import LaunchSpec; "
            "from tfdistx.launch.local.launcher import run_local_cluster; "
            f"sys.exit(run_local_cluster(LaunchSpec(command={tuple(worker)!r}, log_dir={log_dir!r}, run_log=None, "
            f"primary=('worker',), counts={{'worker': {WORKERS}}})))"
        )
        _run([sys.executable, "-c", launch])
        lines = (Path(log_dir) / "worker-0.log").read_text().splitlines()
        result = json.loads([line for line in lines if line.startswith("{")][-1])
    assert result["replicas"] == WORKERS, result
    if result["retraced"]:
        print("  WARNING: tf-keras retraced its train function during the timed fit", file=sys.stderr, flush=True)
    return result["examples_per_sec"]


def _run(cmd) -> None:
    out = run(cmd, check=False, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    if "NOT isolated" in out.stderr:
        print(
            "  WARNING: no private network namespace here: the workers' gRPC servers were reachable from the network",
            file=sys.stderr,
            flush=True,
        )
    if out.returncode:
        sys.exit(f"failed ({out.returncode}): {' '.join(cmd)}\n{out.stdout[-3000:]}{out.stderr[-3000:]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256, help="global batch, split across the 2 workers")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument(
        "--steps-per-loop",
        type=int,
        default=100,
        help="tfdistx steps per tf.function call, and tuned fit's steps_per_execution",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="300 steps, one repeat: rough numbers")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.repeats = 300, 1
    # Measured on this project's 2-core machine: a 2-worker cluster takes ~6 s to start and finish; tfdistx trains
    # ~29k examples/s, tf-keras 12-30k (after a warm-up fit of 50 or 2 x steps_per_execution steps). The venv: 25 s
    # here, with a fast network to PyPI.
    examples = args.steps * args.batch
    say_estimate(
        [
            (0 if (VENV / ".installed").exists() else 1, 60, f"making {VENV.name}, once"),
            (args.repeats, 6 + examples / 29_000, "tfdistx, 2 workers"),
            *[
                (args.repeats, 6 + (examples + max(2 * spe, 50) * args.batch) / 20_000, f"tf-keras fit, spe={spe}")
                for spe in (1, args.steps_per_loop)
            ],
        ],
        args.quick,
    )
    ensure_tf_keras_venv()

    contenders = {
        "tfdistx": lambda: tfdistx_run(args.batch, args.steps, args.steps_per_loop),
        "tf-keras fit (steps_per_execution=1)": lambda: tf_keras_fit(args.batch, args.steps, 1),
        f"tf-keras fit (steps_per_execution={args.steps_per_loop})": lambda: tf_keras_fit(
            args.batch, args.steps, args.steps_per_loop
        ),
    }
    compare(
        contenders,
        args.repeats,
        f"MLP 784-128-10, MultiWorkerMirroredStrategy, {WORKERS} workers x 1 CPU replica, "
        f"global batch {args.batch}, {args.steps} steps",
    )


if __name__ == "__main__":
    interruptible(main)
