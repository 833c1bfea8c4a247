"""Keras 3 `model.fit` on the same data, model and batch as a tfdistx run.

Run by bench_vs_keras_fit.py in its own process; prints one JSON line with the
steady-state examples/s (the warm-up fit, which traces, is not timed).
"""

import argparse
import json
import time

import keras
import tensorflow as tf

from tfdistx.data import synthetic
from tfdistx.models import mlp


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--steps-per-execution", type=int, default=1)
    args = parser.parse_args()

    keras.utils.set_random_seed(0)
    source = synthetic(image_shape=(28, 28, 1), num_classes=10, train_examples=8192)
    ds = (source.train(None).shuffle(8192, seed=0).repeat()
          .batch(args.batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE))
    model = mlp((28, 28, 1), source.num_classes)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        steps_per_execution=args.steps_per_execution,
    )
    warmup = max(args.steps_per_execution * 2, 50)
    model.fit(ds, epochs=1, steps_per_epoch=warmup, verbose=0)
    start = time.perf_counter()
    model.fit(ds, epochs=1, steps_per_epoch=args.steps, verbose=0)
    elapsed = time.perf_counter() - start
    print(json.dumps({"examples_per_sec": args.steps * args.batch / elapsed}))


if __name__ == "__main__":
    main()
