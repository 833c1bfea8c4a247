"""Single-label classification: one logit per class, sparse integer labels."""

import keras
import tensorflow as tf

from tfdistx.core.errors import ConfigError
from tfdistx.tasks import Task


class Classification(Task):
    name = "classification"
    AVAILABLE = {
        "accuracy": lambda task: keras.metrics.SparseCategoricalAccuracy(),
        "top_k_accuracy": lambda task: keras.metrics.SparseTopKCategoricalAccuracy(k=task.top_k),
    }

    def __init__(self, metrics=("accuracy",), top_k: int = 5):
        self.choose_metrics(metrics)
        self.top_k = int(top_k)

    def num_outputs(self, label_spec, num_classes) -> int:
        if not num_classes:
            raise ConfigError.for_key(
                "task", self.name, "the data does not say how many classes it has (DataSource.num_classes)"
            )
        if "top_k_accuracy" in self.metric_names and self.top_k >= num_classes:
            raise ConfigError.for_key(
                "task.top_k",
                self.top_k,
                f"must be below the data's {num_classes} classes (top {num_classes} is always right)",
            )
        return int(num_classes)

    def loss(self, labels, outputs):
        return keras.losses.sparse_categorical_crossentropy(self._ids(labels), outputs, from_logits=True)

    def metric_inputs(self, labels, outputs):
        return self._ids(labels), outputs  # accuracy and top-k rank the logits

    def serving_outputs(self, outputs):
        return {"logits": outputs, "probabilities": tf.nn.softmax(outputs), "classes": tf.argmax(outputs, axis=-1)}

    @staticmethod
    def _ids(labels):
        return tf.reshape(tf.cast(labels, tf.int64), [-1])
