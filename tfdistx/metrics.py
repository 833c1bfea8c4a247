"""Keras metrics made exact over every replica and worker.

A stateful Keras metric updated inside `strategy.run` keeps one state per
replica (or, under parameter servers, races on a shared one), and an AUC
computed from one replica's shard is simply wrong. So tfdistx uses Keras
metrics statelessly: each step computes every metric's state for its own
batch (`stateless_update_state` from zeros), the states of all replicas are
summed with one all-reduce of a single flat vector, the training loop adds
them up across steps, and the metric's own `stateless_result` turns the
grand total into a value. That needs additive state — sums and counts — which
every Keras mean, accuracy, confusion-matrix, AUC and F1 metric has.

The flat vector is [examples, loss sum, metric states...], so a step runner
reduces one tensor per step whatever the task.
"""

from typing import Dict, List

import keras
import numpy as np
import tensorflow as tf

# Where the bookkeeping lives in the flat vector, before the metrics' states.
EXAMPLES, LOSS_SUM, FIRST_METRIC = 0, 1, 2


class MetricSet:
    def __init__(self, metrics: Dict[str, keras.metrics.Metric]):
        self.metrics = dict(metrics)

    def build(self, labels, predictions) -> None:
        """Create the metrics' variables (some, like F1Score, only know their
        shapes from a first batch): one eager update on a sample, then reset."""
        for metric in self.metrics.values():
            metric.update_state(labels, predictions)
            metric.reset_state()
        self._shapes = [[tuple(v.shape) for v in m.variables] for m in self.metrics.values()]
        self._dtypes = [[v.dtype for v in m.variables] for m in self.metrics.values()]
        self.size = FIRST_METRIC + sum(int(np.prod(s)) for shapes in self._shapes for s in shapes)

    def batch_state(self, labels, predictions, per_example_loss) -> tf.Tensor:
        """This batch's flat state vector (float32), on one replica."""
        parts = [tf.cast(tf.reshape(tf.size(per_example_loss), [1]), tf.float32),
                 tf.reshape(tf.reduce_sum(tf.cast(per_example_loss, tf.float32)), [1])]
        for metric in self.metrics.values():
            zeros = [tf.zeros(v.shape, v.dtype) for v in metric.variables]
            for value in metric.stateless_update_state(zeros, labels, predictions):
                parts.append(tf.reshape(tf.cast(value, tf.float32), [-1]))
        return tf.concat(parts, axis=0)

    def zeros(self) -> tf.Tensor:
        return tf.zeros([self.size], tf.float64)

    def results(self, totals: np.ndarray, prefix: str = "") -> Dict[str, float]:
        """Loss and every metric from a summed state vector."""
        totals = np.asarray(totals, dtype=np.float64)
        examples = totals[EXAMPLES]
        values = {f"{prefix}loss": float(totals[LOSS_SUM] / max(examples, 1))}
        offset = FIRST_METRIC
        for (name, metric), shapes, dtypes in zip(self.metrics.items(), self._shapes, self._dtypes):
            state: List[tf.Tensor] = []
            for shape, dtype in zip(shapes, dtypes):
                n = int(np.prod(shape))
                state.append(tf.constant(totals[offset:offset + n].reshape(shape), dtype=dtype))
                offset += n
            values[f"{prefix}{name}"] = float(metric.stateless_result(state))
        return values

    @staticmethod
    def examples(totals: np.ndarray) -> float:
        return float(totals[EXAMPLES])
