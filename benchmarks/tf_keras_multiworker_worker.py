"""One worker of the legacy tf-keras `model.fit` multi-worker baseline.

Run by bench_multiworker_vs_tf_keras.py with the python of its tf-keras venv
(full `tensorflow` + `tf-keras`), once per worker, each learning its place
from TF_CONFIG. Worker 0 prints one JSON line with the steady-state global
examples/s (the warm-up fit, which traces, is not timed).

Data, model and input pipeline are those of a tfdistx run with
`model=mlp data=synthetic`: tfdistx.data.synthetic's arrays (same generator,
same draws), each worker's element shard shuffled, repeated and batched at
the per-replica size through `distribute_datasets_from_function`.
"""

import argparse
import json
import os
import time

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # tf.keras is tf-keras, not Keras 3

import numpy as np
import tensorflow as tf
import tf_keras as keras


def synthetic_train(examples: int = 8192, seed: int = 0):
    """tfdistx.data.synthetic(image_shape=(28, 28, 1), num_classes=10)'s train arrays."""
    rng = np.random.default_rng(seed)
    rule = rng.standard_normal((28 * 28, 10)).astype(np.float32)
    images = rng.random((examples, 28, 28, 1), dtype=np.float32)
    labels = np.argmax((images.reshape(examples, -1) - 0.5) @ rule, axis=1).astype(np.int64)
    return images, labels


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, required=True, help="global batch")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--steps-per-execution", type=int, default=1)
    args = parser.parse_args()

    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # before any other TF op
    keras.utils.set_random_seed(0)
    images, labels = synthetic_train()

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        ds = tf.data.Dataset.from_tensor_slices((images, labels))
        ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
        ds = ds.shuffle(8192, seed=0, reshuffle_each_iteration=True).repeat()
        ds = ds.batch(ctx.get_per_replica_batch_size(args.batch), drop_remainder=True)
        return ds.prefetch(tf.data.AUTOTUNE)

    ds = strategy.distribute_datasets_from_function(dataset_fn)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input(shape=(28, 28, 1)),
                keras.layers.Flatten(),
                keras.layers.Dense(128, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            steps_per_execution=args.steps_per_execution,
        )

    def barrier():
        # The workers leave a fit seconds apart (measured: worker 0 timed 3.4 s
        # for a fit worker 1 timed 5.2 s). A tiny all-reduce on both sides of
        # the clock makes worker 0's window span both workers' steps, as
        # tfdistx's does (each of its calls ends in an all-reduced .numpy()).
        strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(1.0)), axis=None).numpy()

    warmup = max(args.steps_per_execution * 2, 50)
    model.fit(ds, epochs=1, steps_per_epoch=warmup, verbose=0)
    traces = model.train_function.experimental_get_tracing_count()
    barrier()
    start = time.perf_counter()
    model.fit(ds, epochs=1, steps_per_epoch=args.steps, verbose=0)
    barrier()
    elapsed = time.perf_counter() - start
    if strategy.cluster_resolver.task_id == 0:
        print(
            json.dumps(
                {
                    "examples_per_sec": args.steps * args.batch / elapsed,
                    "replicas": strategy.num_replicas_in_sync,
                    "retraced": model.train_function.experimental_get_tracing_count() != traces,
                    "tf": tf.__version__,
                    "tf_keras": keras.__version__,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
