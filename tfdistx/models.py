"""Built-in models. Each returns a built Keras 3 model with `num_outputs`
raw outputs per example (logits, or values for regression).

tfdistx passes what a builder asks for by name: `input_shape` (the features'
shape, when they are one tensor), `feature_spec` (the features' tf.TensorSpec,
or a dict of them), `num_outputs` (how wide the task needs the output:
classes, 1 for binary, labels, targets) and `num_classes` (the same number,
under the name older model functions use), plus the hyperparameters in
`conf/model/<name>.yaml`, and `vocab_size` (the token ids' count) to a model that takes it, where the
data says it (a text's vocabulary). Models never know the cluster.
"""

from typing import Mapping, Optional, Sequence

import keras
from keras import layers

from tfdistx.core.errors import ConfigError


def _one_tensor(input_shape, model: str) -> tuple:
    """The shape of the one feature tensor these models take (None: the data's features are a dict)."""
    if input_shape is None:
        raise ConfigError.for_key(
            "model",
            model,
            "takes one feature tensor, but the data's features are a dict of several: "
            "use model=wide_deep, a model._target_ that takes feature_spec, or data with one feature besides the label",
        )
    return tuple(input_shape)


def mlp(
    input_shape: Sequence[int], num_outputs: int, hidden_units: Sequence[int] = (128,), dropout: float = 0.0
) -> keras.Model:
    """The default network: 784-128-10 for MNIST."""
    model = keras.Sequential([keras.Input(shape=_one_tensor(input_shape, "mlp")), layers.Flatten()], name="mlp")
    for units in hidden_units:
        model.add(layers.Dense(units, activation="relu"))
        if dropout:
            model.add(layers.Dropout(dropout))
    model.add(
        layers.Dense(num_outputs, name="head")
    )  # named: checkpoint.init_skip=['head/'] leaves it fresh for a new task
    return model


def cnn(
    input_shape: Sequence[int],
    num_outputs: int,
    filters: Sequence[int] = (32, 64),
    dense_units: int = 128,
    dropout: float = 0.25,
) -> keras.Model:
    model = keras.Sequential([keras.Input(shape=_one_tensor(input_shape, "cnn"))], name="cnn")
    for width in filters:
        model.add(layers.Conv2D(width, 3, padding="same", activation="relu"))
        model.add(layers.MaxPooling2D())
    model.add(layers.Flatten())
    model.add(layers.Dense(dense_units, activation="relu"))
    if dropout:
        model.add(layers.Dropout(dropout))
    model.add(layers.Dense(num_outputs, name="head"))
    return model


def resnet(
    input_shape: Sequence[int], num_outputs: int, depth: int = 20, width: int = 16, weight_decay: float = 1e-4
) -> keras.Model:
    """CIFAR ResNet (He et al. 2016, section 4.2): 3 stages of (depth-2)/6 basic blocks."""
    if (depth - 2) % 6:
        raise ConfigError.for_key("model.depth", depth, "a CIFAR ResNet has depth 6n+2: 20, 32, 44, 56, 110")
    blocks = (depth - 2) // 6
    reg = keras.regularizers.L2(weight_decay) if weight_decay else None

    def conv(x, filters, stride=1, kernel=3):
        return layers.Conv2D(filters, kernel, strides=stride, padding="same", use_bias=False, kernel_regularizer=reg)(x)

    inputs = keras.Input(shape=_one_tensor(input_shape, "resnet"))
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
    outputs = layers.Dense(num_outputs, kernel_regularizer=reg, name="head")(x)
    return keras.Model(inputs, outputs, name=f"resnet{depth}")


def text(
    input_shape: Sequence[int],
    num_outputs: int,
    vocab_size: Optional[int] = None,
    embedding_dim: int = 64,
    hidden_units: Sequence[int] = (64,),
    dropout: float = 0.0,
) -> keras.Model:
    """A small text model over token ids (data=tfds's texts): an embedding
    bag (each token's vector, averaged over the tokens that are not padding)
    and a dense layer or two. `vocab_size`: the token ids' count, which the
    data says (a text's vocabulary: tfdistx passes it)."""
    shape = _one_tensor(input_shape, "text")
    if vocab_size is None:
        raise ConfigError.for_key(
            "model",
            "text",
            "takes token ids, and the data does not say how many there are (data=tfds with a text does): "
            "use it with data=tfds data.name=A_TEXT_DATASET (imdb_reviews, ag_news_subset ...)",
        )
    inputs = keras.Input(shape=shape, dtype="int64", name="tokens")
    x = layers.Embedding(int(vocab_size), embedding_dim, mask_zero=True, name="embedding")(inputs)
    x = layers.GlobalAveragePooling1D(name="bag")(x)  # the mask: padding (id 0) is left out of the average
    for units in hidden_units:
        x = layers.Dense(units, activation="relu")(x)
        if dropout:
            x = layers.Dropout(dropout)(x)
    return keras.Model(inputs, layers.Dense(num_outputs, name="head")(x), name="text")


class ShardedEmbedding(layers.Layer):
    """An embedding table split by rows into `shards` variables.

    ParameterServerStrategy places variables round-robin on the ps tasks, so
    with one shard per ps the table (and its optimizer slots, and the lookup
    traffic) spreads across all of them; a worker fetches only the rows it
    looks up. Written by hand before tfdistx trained Keras 3 models on
    TensorFlow's own answer, a `variable_partitioner` (`strategy.partitioner`,
    engine/sharding.py), whose lookups of a Keras Embedding read the whole
    table to the worker.
    """

    def __init__(self, vocab_size: int, dim: int, shards: int = 1, embeddings_initializer="uniform", **kwargs):
        super().__init__(**kwargs)
        self.vocab_size, self.dim, self.shards = vocab_size, dim, max(int(shards), 1)
        self.rows = -(-vocab_size // self.shards)  # rows per shard; id i lives in shard i // rows
        self.initializer = keras.initializers.get(embeddings_initializer)

    def build(self, input_shape):
        self.tables = [
            self.add_weight(shape=(self.rows, self.dim), initializer=self.initializer, name=f"shard_{i}")
            for i in range(self.shards)
        ]

    def call(self, ids):
        import tensorflow as tf

        parts = [part for table in self.tables for part in getattr(table.value, "variables", [table.value])]
        if len(parts) > len(self.tables):  # strategy.partitioner split the shards themselves
            return _lookup_in_parts(parts, ids)
        if self.shards == 1:
            return keras.ops.take(self.tables[0], ids, axis=0)
        # With equal-sized shards, TF's "div" strategy puts id i in shard i // rows.
        return tf.nn.embedding_lookup([table.value for table in self.tables], ids)


def _lookup_in_parts(parts, ids):
    """Rows of the table that is `parts` (row ranges, of any sizes) put end to
    end: each id looked up in its part alone, on the part's own device, so
    only the rows looked up move. TF's "div" lookup would assume its own
    split of the rows, which two levels of splitting do not keep."""
    import tensorflow as tf

    flat = tf.reshape(ids, [-1])
    starts = [0]
    for part in parts[:-1]:
        starts.append(starts[-1] + part.shape[0])
    which = tf.searchsorted(tf.constant(starts[1:], flat.dtype), flat, side="right")
    which = tf.cast(which, tf.int32)
    local = flat - tf.gather(tf.constant(starts, flat.dtype), which)
    positions = tf.dynamic_partition(tf.range(tf.size(flat)), which, len(parts))
    rows = [tf.gather(part, piece) for part, piece in zip(parts, tf.dynamic_partition(local, which, len(parts)))]
    found = tf.dynamic_stitch(positions, rows)
    return tf.reshape(found, tf.concat([tf.shape(ids), tf.shape(found)[1:]], 0))


def wide_deep(
    feature_spec,
    num_outputs: int,
    vocab_size: int = 100_000,
    embedding_dim: int = 16,
    hidden_units: Sequence[int] = (256, 128),
    shards: int = 1,
) -> keras.Model:
    """Wide & deep (Cheng et al. 2016) over named inputs.

    Integer features are hashed categorical ids in [0, vocab_size): the deep
    part embeds them (the large table, vocab_size x embedding_dim: the
    parameter-server use case, in `shards` pieces, one per ps task) and the
    wide part is a linear model on the same ids (a vocab_size x num_outputs
    table). Float features go into the deep tower and the wide part as they
    are. A single integer tensor of features counts as one categorical input.
    """
    single = not isinstance(feature_spec, Mapping)
    specs = {"categorical": feature_spec} if single else feature_spec
    inputs = {
        name: keras.Input(shape=tuple(spec.shape), dtype=spec.dtype.name, name=name) for name, spec in specs.items()
    }
    ids = [x for x in inputs.values() if "int" in x.dtype]
    dense = [x for x in inputs.values() if "int" not in x.dtype]
    if not ids:
        have = (
            ", ".join(f"{k}: {v.dtype.name} {tuple(v.shape)}" for k, v in specs.items())
            if single
            else f"{feature_spec.dtype.name} {tuple(feature_spec.shape)}"
        )
        raise ConfigError.for_key(
            "model",
            "wide_deep",
            f"needs integer (categorical id) features; the data's features are {have}: use data=synthetic_categorical "
            "or ids of your own",
        )
    deep_table = ShardedEmbedding(vocab_size, embedding_dim, shards, name="deep_embedding")
    wide_table = ShardedEmbedding(vocab_size, num_outputs, shards, embeddings_initializer="zeros", name="wide_weights")
    ids = ids[0] if len(ids) == 1 else layers.Concatenate()(ids)
    # Layers are named: Keras' default names ("dense", ...) would clash with the inputs'.
    flat_dense = [layers.Flatten(name=f"flat_{x.name}")(x) for x in dense]
    deep = layers.Flatten(name="deep_embedded")(deep_table(ids))
    if flat_dense:
        deep = layers.Concatenate(name="deep_inputs")([deep, *flat_dense])
    for i, units in enumerate(hidden_units):
        deep = layers.Dense(units, activation="relu", name=f"deep_{i}")(deep)
    deep = layers.Dense(num_outputs, name="deep_out")(deep)
    wide = SumOverFields(name="wide_ids")(wide_table(ids))
    if flat_dense:
        numbers = layers.Concatenate(name="wide_inputs")(flat_dense) if len(flat_dense) > 1 else flat_dense[0]
        wide = layers.Add(name="wide")([wide, layers.Dense(num_outputs, use_bias=False, name="wide_dense")(numbers)])
    return keras.Model(
        inputs["categorical"] if single else inputs, layers.Add(name="logits")([deep, wide]), name="wide_deep"
    )


class SumOverFields(layers.Layer):
    """[batch, fields, n] -> [batch, n]: the wide part's sum over the id fields.
    A layer (not a Lambda) so that the exported model needs no Python code."""

    def call(self, x):
        return keras.ops.sum(x, axis=1)
