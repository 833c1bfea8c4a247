"""Binary classification from one logit per example: the click-through task.

Labels are 0/1 (ints or floats). Metrics see probabilities, so AUC, accuracy
(at 0.5) and log loss are the ones a CTR user reads.
"""

import keras
import tensorflow as tf

from tfdistx.core.errors import ConfigError
from tfdistx.tasks import Task, column
from tfdistx.tasks.metrics import ExactAUC


class Binary(Task):
    name = "binary"
    AVAILABLE = {
        "auc": lambda task: ExactAUC(num_thresholds=task.auc_thresholds, name="auc"),
        "accuracy": lambda task: keras.metrics.BinaryAccuracy(threshold=0.5),
        "log_loss": lambda task: keras.metrics.BinaryCrossentropy(),
    }

    def __init__(self, metrics=("auc", "accuracy", "log_loss"), auc_thresholds: int = 200):
        self.choose_metrics(metrics)
        self.auc_thresholds = int(auc_thresholds)

    def num_outputs(self, label_spec, num_classes) -> int:
        return 1

    def check_labels(self, num_classes) -> None:
        if num_classes and num_classes > 2:  # labels 2..9 would be taken as "yes" by the loss, silently
            raise ConfigError.for_key(
                "task",
                self.name,
                f"the data has {num_classes} classes; binary takes labels 0 and 1: use task=classification",
            )

    def loss(self, labels, outputs):
        return keras.losses.binary_crossentropy(column(labels), outputs, from_logits=True)

    def predictions(self, outputs):
        return tf.sigmoid(outputs)

    def metric_inputs(self, labels, outputs):
        return column(labels), self.predictions(outputs)

    def serving_outputs(self, outputs):
        return {"logits": outputs, "probabilities": tf.sigmoid(outputs)}
