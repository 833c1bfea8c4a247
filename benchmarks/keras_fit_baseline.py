"""Keras 3 `model.fit` on the same data, model and batch as a tfdistx run.

Run by the benchmarks in its own process; prints one JSON line with the
steady-state examples/s (the warm-up fit, which traces and compiles, is not
timed). `--model mlp --hidden 1024,1024` is the compute-bound MLP,
`--model resnet --image-shape 32,32,3` ResNet-20 on CIFAR-shaped data.
"""

import argparse
import json
import time

import keras
import tensorflow as tf

from tfdistx.data import synthetic
from tfdistx.models import mlp, resnet


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--steps-per-execution", type=int, default=1)
    parser.add_argument("--model", choices=["mlp", "resnet"], default="mlp")
    parser.add_argument("--hidden", default="128", help="the MLP's hidden layer widths")
    parser.add_argument("--image-shape", default="28,28,1")
    parser.add_argument("--jit-compile", action="store_true")
    args = parser.parse_args()

    keras.utils.set_random_seed(0)
    shape = tuple(int(d) for d in args.image_shape.split(","))
    source = synthetic(image_shape=shape, num_classes=10, train_examples=8192)
    ds = (
        source.train(None)
        .shuffle(8192, seed=0)
        .repeat()
        .batch(args.batch, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )
    if args.model == "mlp":
        model = mlp(shape, source.num_classes, hidden_units=[int(w) for w in args.hidden.split(",")])
    else:
        model = resnet(shape, source.num_classes)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        steps_per_execution=args.steps_per_execution,
        jit_compile=args.jit_compile,
    )
    warmup = max(args.steps_per_execution * 2, 20)
    model.fit(ds, epochs=1, steps_per_epoch=warmup, verbose=0)
    start = time.perf_counter()
    model.fit(ds, epochs=1, steps_per_epoch=args.steps, verbose=0)
    elapsed = time.perf_counter() - start
    print(json.dumps({"examples_per_sec": args.steps * args.batch / elapsed}))


if __name__ == "__main__":
    main()
