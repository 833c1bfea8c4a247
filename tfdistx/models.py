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
