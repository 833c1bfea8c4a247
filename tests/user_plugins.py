"""A user's own model and data functions, plugged in with `_target_`."""

import keras
import numpy as np
import tensorflow as tf

from tfdistx.data import DataSource, shard


def tiny_model(input_shape, num_classes):
    return keras.Sequential([keras.Input(shape=tuple(input_shape)), keras.layers.Flatten(), keras.layers.Dense(num_classes)])


def constant_data(features: int = 8, num_classes: int = 2, examples: int = 256):
    """Label = whether the first feature is positive: trivially learnable."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((examples, features)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    return DataSource(
        train=lambda ctx: shard(tf.data.Dataset.from_tensor_slices((x, y)), ctx),
        eval=lambda ctx: shard(tf.data.Dataset.from_tensor_slices((x, y)), ctx),
        input_shape=(features,),
        num_classes=num_classes,
        train_examples=examples,
    )


def broken_on_worker_1(**kwargs):
    """Data that cannot be built on worker 1 of a cluster: the launcher must stop the others."""
    import json
    import os

    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    if task.get("index") == 1:
        raise RuntimeError("worker 1 cannot read its data")
    from tfdistx.data import synthetic

    return synthetic(**kwargs)


def crashing_on_worker_1(**kwargs):
    """Worker 1 of a cluster dies hard (exit code 3) every time it starts."""
    import json
    import os

    if json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index") == 1:
        os._exit(3)
    from tfdistx.data import synthetic

    return synthetic(**kwargs)
