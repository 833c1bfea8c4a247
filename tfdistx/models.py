"""Built-in models. Each returns a built Keras 3 model that outputs logits.

Every builder takes `input_shape` and `num_classes` (from the DataSource) plus
its own hyperparameters from `conf/model/<name>.yaml`.
"""

from typing import Sequence

import keras
from keras import layers

from tfdistx.errors import ConfigError


def mlp(input_shape: Sequence[int], num_classes: int, hidden_units: Sequence[int] = (128,), dropout: float = 0.0) -> keras.Model:
    """The seeds' network: 784-128-10 for MNIST."""
    model = keras.Sequential([keras.Input(shape=tuple(input_shape)), layers.Flatten()], name="mlp")
    for units in hidden_units:
        model.add(layers.Dense(units, activation="relu"))
        if dropout:
            model.add(layers.Dropout(dropout))
    model.add(layers.Dense(num_classes))
    return model


def cnn(input_shape: Sequence[int], num_classes: int, filters: Sequence[int] = (32, 64), dense_units: int = 128, dropout: float = 0.25) -> keras.Model:
    model = keras.Sequential([keras.Input(shape=tuple(input_shape))], name="cnn")
    for width in filters:
        model.add(layers.Conv2D(width, 3, padding="same", activation="relu"))
        model.add(layers.MaxPooling2D())
    model.add(layers.Flatten())
    model.add(layers.Dense(dense_units, activation="relu"))
    if dropout:
        model.add(layers.Dropout(dropout))
    model.add(layers.Dense(num_classes))
    return model


def resnet(input_shape: Sequence[int], num_classes: int, depth: int = 20, width: int = 16, weight_decay: float = 1e-4) -> keras.Model:
    """CIFAR ResNet (He et al. 2016, section 4.2): 3 stages of (depth-2)/6 basic blocks."""
    if (depth - 2) % 6:
        raise ConfigError.one("model.depth", depth, "a CIFAR ResNet has depth 6n+2: 20, 32, 44, 56, 110")
    blocks = (depth - 2) // 6
    reg = keras.regularizers.L2(weight_decay) if weight_decay else None

    def conv(x, filters, stride=1, kernel=3):
        return layers.Conv2D(filters, kernel, strides=stride, padding="same", use_bias=False, kernel_regularizer=reg)(x)

    inputs = keras.Input(shape=tuple(input_shape))
    x = layers.ReLU()(layers.BatchNormalization()(conv(inputs, width)))
    for stage in range(3):
        filters = width * 2**stage
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            shortcut = x
            y = layers.ReLU()(layers.BatchNormalization()(conv(x, filters, stride)))
            y = layers.BatchNormalization()(conv(y, filters))
            if stride != 1 or shortcut.shape[-1] != filters:
                shortcut = layers.BatchNormalization()(conv(shortcut, filters, stride, kernel=1))
            x = layers.ReLU()(layers.Add()([y, shortcut]))
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(num_classes, kernel_regularizer=reg)(x)
    return keras.Model(inputs, outputs, name=f"resnet{depth}")


class ShardedEmbedding(layers.Layer):
    """An embedding table split by rows into `shards` variables.

    ParameterServerStrategy places variables round-robin on the ps tasks, so
    with one shard per ps the table (and its optimizer slots, and the lookup
    traffic) spreads across all of them; a worker fetches only the rows it
    looks up. Written by hand because TensorFlow's own answer, a
    `variable_partitioner`, makes ShardedVariables, which Keras 3 optimizers
    cannot update ("'ShardedVariable' object has no attribute 'handle'",
    measured with TF 2.21 / Keras 3.15).
    """

    def __init__(self, vocab_size: int, dim: int, shards: int = 1, embeddings_initializer="uniform", **kwargs):
        super().__init__(**kwargs)
        self.vocab_size, self.dim, self.shards = vocab_size, dim, max(int(shards), 1)
        self.rows = -(-vocab_size // self.shards)  # rows per shard; id i lives in shard i // rows
        self.initializer = keras.initializers.get(embeddings_initializer)

    def build(self, input_shape):
        self.tables = [self.add_weight(shape=(self.rows, self.dim), initializer=self.initializer, name=f"shard_{i}")
                       for i in range(self.shards)]

    def call(self, ids):
        import tensorflow as tf

        if self.shards == 1:
            return keras.ops.take(self.tables[0], ids, axis=0)
        # With equal-sized shards, TF's "div" strategy puts id i in shard i // rows.
        return tf.nn.embedding_lookup([table.value for table in self.tables], ids)


def wide_deep(input_shape: Sequence[int], num_classes: int, vocab_size: int = 100_000, embedding_dim: int = 16,
              hidden_units: Sequence[int] = (256, 128), shards: int = 1) -> keras.Model:
    """Wide & deep (Cheng et al. 2016) over hashed categorical ids.

    Inputs are `input_shape[0]` integer fields in [0, vocab_size). The deep
    part embeds each field (the large table: vocab_size x embedding_dim, the
    parameter-server use case, in `shards` pieces: one per ps task); the wide
    part is a linear model on the same ids (a vocab_size x num_classes table).
    """
    ids = keras.Input(shape=tuple(input_shape), dtype="int64")
    deep = layers.Flatten()(ShardedEmbedding(vocab_size, embedding_dim, shards, name="deep_embedding")(ids))
    for units in hidden_units:
        deep = layers.Dense(units, activation="relu")(deep)
    deep = layers.Dense(num_classes)(deep)
    wide = ShardedEmbedding(vocab_size, num_classes, shards, embeddings_initializer="zeros", name="wide_weights")(ids)
    wide = layers.Lambda(lambda t: keras.ops.sum(t, axis=1))(wide)
    return keras.Model(ids, layers.Add()([deep, wide]), name="wide_deep")
