"""Does an MPI all-reduce pay inside a multi-worker step? TensorFlow's
collective (a ring over gRPC) against MPI's, called from the step, side by
side in the same processes; and one process with the whole batch beside them.

The step is the default MLP's (784-128-10, global batch 256, split over W
workers; SGD: the update is not the question), run `STEPS` times in one
tf.function call as tfdistx runs `trainer.steps_per_loop` steps. Each worker
is a task of a MultiWorkerMirroredStrategy cluster on loopback (TF_CONFIG
from its MPI rank), its threads sized as tfdistx's launcher sizes a local
cluster's (cluster.task_threads=auto, no spinning). Per step, in turn, in the
same processes, the least of three timed calls of each:

- `none`: forward, backward and update; the gradients not summed (the floor).
- `grpc`: the gradients summed by TensorFlow's collective, the four of them in
  one call (`ReplicaContext.all_reduce`), as tfdistx sums them.
- `mpi`: the gradients concatenated, summed by one MPI `Allreduce` (MPICH's
  shared memory between processes of one host) in a host call of the step
  (`tf.numpy_function`), and split again.
- `1 float grpc` / `1 float mpi`: the `none` step plus one all-reduce of one
  float; less `none`, the latency an all-reduce adds whatever its size (its
  alpha, in the columns `alpha grpc` and `alpha mpi`).

MPI needs its processes started by its own launcher, so this script starts
`mpiexec -n W` of itself for each W; MPICH and mpi4py install from PyPI as
wheels and are not dependencies of tfdistx:

    pip install mpich mpi4py
    python benchmarks/bench_mpi_in_step.py [--workers 2 4] [--steps 500]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

BATCH = 256
MODES = ("none", "grpc", "mpi", "1 float grpc", "1 float mpi")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=500, help="steps in each timed call")
    parser.add_argument("--rank-of", type=int, help=argparse.SUPPRESS)  # set in the processes mpiexec starts
    args = parser.parse_args()
    if args.rank_of is not None:
        return worker(args.rank_of, args.steps)
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
    if mpiexec is None:
        print("needs MPI's launcher: pip install mpich mpi4py", file=sys.stderr)
        return 2
    one = json.loads(
        subprocess.run(
            [sys.executable, __file__, "--rank-of", "1", "--steps", str(args.steps)],
            env={**os.environ, "BENCH_ONE_PROCESS": "1"},
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    print(f"one process, batch {BATCH}: {one['none']:.3f} ms a step\n")
    print(
        f"{'workers':>7} | "
        + " | ".join(f"{mode:>12}" for mode in MODES)
        + " | alpha grpc | alpha mpi | grpc / one | mpi / one"
    )
    for workers in args.workers:
        out = subprocess.run(
            [
                mpiexec,
                "-n",
                str(workers),
                sys.executable,
                __file__,
                "--rank-of",
                str(workers),
                "--steps",
                str(args.steps),
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        ms = json.loads(out.strip().splitlines()[-1])
        print(
            f"{workers:>7} | "
            + " | ".join(f"{ms[mode]:>12.3f}" for mode in MODES)
            + f" | {ms['1 float grpc'] - ms['none']:>10.3f} | {ms['1 float mpi'] - ms['none']:>9.3f}"
            + f" | {one['none'] / ms['grpc']:>9.2f}x | {one['none'] / ms['mpi']:>8.2f}x"
        )
    print("\nms a step (least of three calls); the ratios are examples/s against one process with the whole batch")
    return 0


def worker(workers: int, steps: int) -> int:
    """One task (or, with BENCH_ONE_PROCESS, the one process): the timings as a JSON line on rank 0's stdout."""
    alone = os.environ.get("BENCH_ONE_PROCESS") == "1"
    if alone:
        rank, comm = 0, None
    else:
        from mpi4py import MPI

        comm, rank = MPI.COMM_WORLD, MPI.COMM_WORLD.rank
        os.environ["TF_CONFIG"] = json.dumps(
            {
                "cluster": {"worker": [f"127.0.0.1:{24500 + i}" for i in range(workers)]},
                "task": {"type": "worker", "index": rank},
            }
        )
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
        from tfdistx.core.threads import environment, task_threads

        threads, _ = task_threads("auto", {"worker": workers})
        os.environ.update(environment(threads))  # as tfdistx's launcher gives a local cluster's task
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow as tf

    if not alone:
        from tfdistx.internals.tensorflow import disable_thread_spinning

        disable_thread_spinning()  # as a local cluster's task (engine/join.py)
    strategy = tf.distribute.get_strategy() if alone else tf.distribute.MultiWorkerMirroredStrategy()
    rng = np.random.default_rng(rank)
    per_worker = BATCH if alone else BATCH // workers
    x = tf.constant(rng.standard_normal((per_worker, 784)), tf.float32)
    y = tf.constant(rng.integers(0, 10, per_worker), tf.int32)
    with strategy.scope():
        variables = [
            tf.Variable(rng.standard_normal(shape).astype(np.float32) * 0.01)
            for shape in ((784, 128), (128,), (128, 10), (10,))
        ]
    sizes = [int(np.prod(v.shape)) for v in variables]
    summed = np.empty(sum(sizes), np.float32)
    one = np.empty(1, np.float32)

    def mpi_sum(flat):
        out = summed if flat.size == summed.size else one
        comm.Allreduce(flat, out)
        return out.copy()

    def mpi(tensor):
        result = tf.numpy_function(mpi_sum, [tensor], tf.float32, stateful=True)
        result.set_shape(tensor.shape)
        return result

    def step(mode):
        with tf.GradientTape() as tape:
            hidden = tf.nn.relu(x @ variables[0] + variables[1])
            loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(y, hidden @ variables[2] + variables[3])
            )
        grads = tape.gradient(loss, variables)
        context = tf.distribute.get_replica_context()
        if mode == "grpc":
            grads = context.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        elif mode == "mpi":
            flat = mpi(tf.concat([tf.reshape(g, [-1]) for g in grads], 0))
            grads = [tf.reshape(part, v.shape) for part, v in zip(tf.split(flat, sizes), variables)]
        elif mode.startswith("1 float"):  # one all-reduce of one float, added to every gradient
            tiny = (
                context.all_reduce(tf.distribute.ReduceOp.SUM, tf.zeros([1]))
                if mode == "1 float grpc"
                else mpi(tf.zeros([1]))
            )
            grads = [g + tiny[0] for g in grads]
        for v, g in zip(variables, grads):
            v.assign_sub(0.01 * g)

    def loop_of(mode):
        @tf.function(autograph=False)
        def loop(n):
            return tf.while_loop(
                lambda i: i < n, lambda i: (strategy.run(step, args=(mode,)), i + 1)[1], [tf.constant(0)]
            )

        return loop

    modes = ("none",) if alone else MODES
    loops = {mode: loop_of(mode) for mode in modes}
    for loop in loops.values():
        loop(tf.constant(10))  # traced, and the collectives' groups formed
    best = {mode: float("inf") for mode in modes}
    for _ in range(3):
        for mode, loop in loops.items():  # in turn: a slower minute of this shared machine falls on every mode
            if comm is not None:
                comm.Barrier()
            started = time.perf_counter()
            loop(tf.constant(steps))
            best[mode] = min(best[mode], (time.perf_counter() - started) / steps * 1e3)
    if rank == 0:
        print(json.dumps(best), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
