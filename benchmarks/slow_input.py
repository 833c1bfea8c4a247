"""An input-bound data source for benchmarks/bench_data_service.py: MNIST-
shaped synthetic examples whose preprocessing costs CPU time (`rounds`
small matrix products per example; the default is about 5 ms a batch of
128 on one core of this machine, several times the MLP's training step).
Named as `data._target_=slow_input.heavy` with benchmarks/ on PYTHONPATH."""

import numpy as np
import tensorflow as tf

from tfdistx.data import DataSource, shard


def heavy(examples: int = 8192, rounds: int = 8, seed: int = 0) -> DataSource:
    rng = np.random.default_rng(seed)
    images = rng.random((examples, 28, 28), dtype=np.float32)
    labels = (
        (images.reshape(examples, -1) @ rng.standard_normal((784, 10)).astype(np.float32)).argmax(1).astype(np.int64)
    )
    mix = tf.constant((rng.standard_normal((28, 28)) / np.sqrt(28)).astype(np.float32))

    def preprocess(image, label):
        x = image
        for _ in range(rounds):  # stands for decoding and augmenting: real work per example
            x = tf.tanh(tf.matmul(x, mix) + image)
        return tf.reshape(x, [784]), label

    def train(ctx):
        ds = shard(tf.data.Dataset.from_tensor_slices((images, labels)), ctx)
        return ds.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE)

    return DataSource(train=train, eval=None, num_classes=10, train_examples=examples)
