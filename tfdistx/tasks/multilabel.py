"""Multi-label tagging: one independent sigmoid per label, multi-hot labels."""

import keras
import tensorflow as tf

from tfdistx.tasks import Task, label_width
from tfdistx.tasks.metrics import ExactAUC


class Multilabel(Task):
    name = "multilabel"
    AVAILABLE = {
        "micro_f1": lambda task: keras.metrics.F1Score(average="micro", threshold=task.threshold, name="micro_f1"),
        "macro_f1": lambda task: keras.metrics.F1Score(average="macro", threshold=task.threshold, name="macro_f1"),
        "auc": lambda task: ExactAUC(
            multi_label=True, num_thresholds=task.auc_thresholds, name="auc"
        ),  # mean of per-label AUCs
    }

    def __init__(self, metrics=("micro_f1", "macro_f1", "auc"), threshold: float = 0.5, auc_thresholds: int = 200):
        self.choose_metrics(metrics)
        self.threshold, self.auc_thresholds = float(threshold), int(auc_thresholds)

    def num_outputs(self, label_spec, num_classes) -> int:
        return label_width(label_spec)

    def loss(self, labels, outputs):
        # binary_crossentropy averages over the last axis: one value per example
        return keras.losses.binary_crossentropy(tf.cast(labels, outputs.dtype), outputs, from_logits=True)

    def predictions(self, outputs):
        return tf.sigmoid(outputs)

    def metric_inputs(self, labels, outputs):
        return tf.cast(labels, tf.float32), self.predictions(outputs)

    def serving_outputs(self, outputs):
        return {"logits": outputs, "probabilities": tf.sigmoid(outputs)}
