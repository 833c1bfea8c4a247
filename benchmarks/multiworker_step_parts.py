"""One task of bench_multiworker_step.py's cluster: the parts of a multi-worker step, timed apart.

Run by the local launcher (tfdistx.launch.local.launcher) in every worker, with
TF_CONFIG set. Every worker runs the same collectives in the same order;
worker 0 prints one JSON line of milliseconds:

  all_reduce       {bytes: ms} one float32 all-reduce of that size, in a loop of many
  gradients        the default MLP's four gradients summed as tfdistx's step sums them
                   (one replica-context all_reduce of the list)
  metric_state     the few floats of a step's metrics' state, as one all-reduce
  compute          tfdistx's own update (engine/update.py: forward, backward, Adam) on one
                   fixed per-replica batch, outside the strategy: no collective, but every
                   worker computing at once, as in the step
  input            tfdistx's own input pipeline (data/input.py) as the step reads it: one batch
  input_distributed_iterator   the same batches through the strategy's distributed iterator

    python multiworker_step_parts.py --batch 256 --repeats 200
"""

import argparse
import json
import os
import time

import numpy as np
import tensorflow as tf

from tfdistx import models
from tfdistx.data import input as input_lib
from tfdistx.data.sources import synthetic
from tfdistx.engine.update import Update
from tfdistx.internals import tensorflow as internals
from tfdistx.core import threads
from tfdistx.tasks.classification import Classification

SIZES = [4_000, 400_000, 4_000_000, 40_000_000]  # bytes of float32


def per_call_ms(fn, repeats: int) -> float:
    """Milliseconds of one iteration of `fn(n)`, a tf.function running n of them in a loop."""
    fn(tf.constant(2)).numpy()  # traced, and the collectives' groups formed
    best = float("inf")
    for _ in range(3):  # the least of three: this machine is shared
        started = time.perf_counter()
        fn(tf.constant(repeats)).numpy()
        best = min(best, (time.perf_counter() - started) / repeats * 1e3)
    return best


def all_reduce_loop(strategy, shapes):
    """The loop in cross-replica context, one all-reduce a strategy.run, as tfdistx's step loop runs."""
    values = [tf.ones(shape) for shape in shapes]

    def replica():
        summed = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, values)
        return summed[0][(0,) * len(shapes[0])]

    @tf.function
    def loop(n):
        total = tf.constant(0.0)
        for _ in tf.range(n):
            total += strategy.experimental_local_results(strategy.run(replica))[0]  # each sum is used
        return total

    return loop


def reader(strategy, iterator):
    @tf.function
    def read(n):
        total = tf.constant(0, tf.int64)
        for _ in tf.range(n):
            images, labels = next(iterator)
            total += tf.reduce_sum(strategy.experimental_local_results(labels)[0])  # each batch is used
        return total

    return read


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=256, help="global batch")
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()

    if os.environ.get(threads.NO_SPINNING_ENV) == "1":  # as a run's task does (engine/join.py)
        internals.disable_thread_spinning()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    workers = strategy.num_replicas_in_sync
    per_replica = args.batch // workers
    result = {"workers": workers, "batch": args.batch, "all_reduce": {}}

    for size in SIZES:
        repeats = max(5, args.repeats * 400_000 // max(size, 400_000))
        result["all_reduce"][size] = per_call_ms(all_reduce_loop(strategy, [[size // 4]]), repeats)
    with strategy.scope():
        model = models.mlp((28, 28, 1), 10)
    shapes = [v.shape.as_list() for v in model.trainable_variables]
    result["gradient_bytes"] = 4 * sum(int(np.prod(s)) for s in shapes)
    result["gradients"] = per_call_ms(all_reduce_loop(strategy, shapes), args.repeats)
    result["metric_state"] = per_call_ms(all_reduce_loop(strategy, [[4]]), args.repeats)

    # Compute alone: the same update, built outside the strategy's scope, so that its
    # sum over replicas is the default strategy's (nothing to sum).
    task = Classification()
    local_model = models.mlp((28, 28, 1), 10)
    optimizer = tf.keras.optimizers.Adam(1e-3)
    update = Update(task, local_model, optimizer, per_replica)
    rng = np.random.default_rng(0)
    batch = (
        tf.constant(rng.random((per_replica, 28, 28, 1), dtype=np.float32)),
        tf.constant(rng.integers(0, 10, per_replica)),
    )
    state = lambda labels, outputs, per_example: tf.reduce_sum(per_example)  # noqa: E731

    @tf.function
    def compute(n):
        total = tf.constant(0.0)
        for _ in tf.range(n):
            total += update((batch,), tf.constant(0, tf.int64), state, tf.constant(0.0, tf.float64))
        return total

    result["compute"] = per_call_ms(compute, args.repeats)

    # Input alone: tfdistx's pipeline as the step gets it (data/input.py: a plain
    # dataset here), and the same dataset through the strategy's distributed iterator.
    plain = input_lib.train_dataset(strategy, synthetic(), args.batch, seed=0, shuffle_buffer=8192)
    result["input"] = per_call_ms(reader(strategy, iter(plain)), args.repeats)
    distributed = strategy.distribute_datasets_from_function(lambda ctx: plain)
    result["input_distributed_iterator"] = per_call_ms(reader(strategy, iter(distributed)), args.repeats)
    if strategy.cluster_resolver.task_id == 0:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
