"""Regression: real-valued targets (a scalar or a vector per example)."""

import keras
import tensorflow as tf

from tfdistx.core.errors import ConfigError
from tfdistx.tasks import Task, label_width

LOSSES = ("mse", "mae", "huber")


class Regression(Task):
    name = "regression"
    AVAILABLE = {
        "rmse": lambda task: keras.metrics.RootMeanSquaredError(name="rmse"),
        "mae": lambda task: keras.metrics.MeanAbsoluteError(name="mae"),
        "mse": lambda task: keras.metrics.MeanSquaredError(name="mse"),
    }

    def __init__(self, metrics=("rmse", "mae"), loss: str = "mse", huber_delta: float = 1.0):
        self.choose_metrics(metrics)
        if loss not in LOSSES:
            raise ConfigError.for_key("task.loss", loss, f"allowed: {', '.join(LOSSES)}")
        self.loss_name, self.huber_delta = loss, float(huber_delta)

    def num_outputs(self, label_spec, num_classes) -> int:
        return label_width(label_spec)

    def check_labels(self, num_classes) -> None:
        if num_classes:  # class ids as numbers: a model would learn their order, which they do not have
            raise ConfigError.for_key(
                "task", self.name, f"the data's labels are {num_classes} classes, not values: use task=classification"
            )

    def loss(self, labels, outputs):
        targets = self._targets(labels, outputs)
        if self.loss_name == "mae":
            return keras.losses.mean_absolute_error(targets, outputs)
        if self.loss_name == "huber":
            return keras.losses.huber(targets, outputs, delta=self.huber_delta)
        return keras.losses.mean_squared_error(targets, outputs)

    def metric_inputs(self, labels, outputs):
        return self._targets(labels, outputs), outputs

    def serving_outputs(self, outputs):
        return {"predictions": outputs}

    @staticmethod
    def _targets(labels, outputs):
        """Labels as [batch, targets], like the outputs (a scalar label becomes a column)."""
        return tf.reshape(tf.cast(labels, outputs.dtype), tf.shape(outputs))
