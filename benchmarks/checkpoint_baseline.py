"""Periodic checkpoints without tfdistx, on the same model, optimizer, data
and batch as a tfdistx run: Keras 3 `model.fit` with
`ModelCheckpoint(save_weights_only=True)`, and a training loop of one
tf.function a step with a plain `tf.train.Checkpoint` of the same
variables, written synchronously or with
`CheckpointOptions(enable_async=True)`.

Run by bench_checkpoint.py in its own process; prints one JSON line:
`train_sec` (the timed steps, their saves included), `saves`, `save_call_sec`
(what each save call blocked the caller: the mean), `bytes` (one checkpoint)
and `restore_sec` (reading the last checkpoint back into the variables).

TensorFlow's asynchronous checkpoint cannot write Keras 3.15 variables
(its first save holds no `model/` entry and its second raises a
ValueError), so the plain checkpoint holds the TensorFlow variables behind
them (`variable.value`): the same values, under other names.
"""

import argparse
import json
import os
import tempfile
import time

import keras
import tensorflow as tf

from tfdistx.data import synthetic
from tfdistx.models import mlp


def dataset(batch: int):
    source = synthetic(image_shape=(28, 28, 1), num_classes=10, train_examples=8192)
    data = source.train(None).shuffle(8192, seed=0).repeat().batch(batch, drop_remainder=True)
    return data.prefetch(tf.data.AUTOTUNE)


class TimedModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Keras' ModelCheckpoint, each batch hook timed (a save happens in one of them)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    def on_train_batch_end(self, batch, logs=None):
        started = time.perf_counter()
        super().on_train_batch_end(batch, logs)
        self.calls.append(time.perf_counter() - started)


def with_fit(args, model, directory) -> dict:
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    data = dataset(args.batch)
    model.fit(data, epochs=1, steps_per_epoch=2, verbose=0)  # traced, compiled: not timed
    path = os.path.join(directory, "model.weights.h5")
    callbacks = []
    if args.every:
        saver = TimedModelCheckpoint(path, save_weights_only=True, save_freq=args.every)
        callbacks.append(saver)
    started = time.perf_counter()
    model.fit(data, epochs=1, steps_per_epoch=args.steps, verbose=0, callbacks=callbacks)
    elapsed = time.perf_counter() - started
    result = {"train_sec": elapsed, "saves": args.steps // args.every if args.every else 0}
    if args.every:
        slowest = sorted(saver.calls)[-result["saves"] :]  # the hooks that saved: the slowest
        result.update(save_call_sec=sum(slowest) / len(slowest), bytes=os.path.getsize(path))
        started = time.perf_counter()
        model.load_weights(path)
        result["restore_sec"] = time.perf_counter() - started
    return result


def with_checkpoint(args, model, directory) -> dict:
    optimizer = keras.optimizers.Adam(1e-3)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer.build(model.trainable_variables)

    @tf.function
    def step(features, labels):
        with tf.GradientTape() as tape:
            value = loss(labels, model(features, training=True))
        optimizer.apply_gradients(zip(tape.gradient(value, model.trainable_variables), model.trainable_variables))

    variables = [v.value for v in [*model.weights, *optimizer.variables]]
    checkpoint = tf.train.Checkpoint(variables=variables)
    options = tf.train.CheckpointOptions(enable_async=args.mode == "tf_async")
    batches = iter(dataset(args.batch))
    step(*next(batches))  # traced: not timed
    calls, path = [], None
    started = time.perf_counter()
    for done in range(1, args.steps + 1):
        step(*next(batches))
        if args.every and done % args.every == 0:
            called = time.perf_counter()
            path = checkpoint.write(os.path.join(directory, f"ckpt-{done}"), options=options)
            calls.append(time.perf_counter() - called)
    checkpoint.sync()  # the last asynchronous write done: part of the run's time, as a run's end waits for it
    elapsed = time.perf_counter() - started
    result = {"train_sec": elapsed, "saves": len(calls)}
    if calls:
        result["save_call_sec"] = sum(calls) / len(calls)
        result["bytes"] = sum(
            os.path.getsize(os.path.join(directory, name))
            for name in os.listdir(directory)
            if name.startswith(os.path.basename(path) + ".")
        )
        started = time.perf_counter()
        tf.train.Checkpoint(variables=variables).read(path).assert_existing_objects_matched()
        result["restore_sec"] = time.perf_counter() - started
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["fit", "tf_sync", "tf_async"], required=True)
    parser.add_argument("--hidden", required=True, help="the MLP's hidden layer widths")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--every", type=int, default=0, help="steps between saves (0: none)")
    parser.add_argument("--dir", default=None, help="where the checkpoints go (default: a temporary directory)")
    args = parser.parse_args()
    keras.utils.set_random_seed(0)
    model = mlp((28, 28, 1), 10, hidden_units=[int(width) for width in args.hidden.split(",")])
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        result = (with_fit if args.mode == "fit" else with_checkpoint)(args, model, directory)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
