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

AUC is the exception: no state of bounded size gives the exact AUC (it
ranks every positive against every negative). An `ExactAUC` (a task's:
tasks/metrics.py) is therefore
computed from every (score, label) pair of the evaluation, gathered from
all replicas and workers (runner.py), by the rank-sum formula, ties counted
half. Over training batches, where gathering every step would cost a
collective per step, it is Keras' thresholded AUC with its error bound
reported beside it (`auc_error`): the trapezoid counts a positive and a
negative that fall between the same two thresholds as half a pair, so the
exact AUC lies within ±0.5·Σ pos·neg/(P·N) of it, summed over those bins.
"""

from typing import Dict, List, Optional

import keras
import numpy as np
import tensorflow as tf

from tfdistx.tasks.metrics import ExactAUC
from tfdistx.internals import tensorflow as internals

# Where the bookkeeping lives in the flat vector, before the metrics' states.
EXAMPLES, LOSS_SUM, FIRST_METRIC = 0, 1, 2


def exact_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """The probability that a positive outscores a negative, ties counted
    half (Mann-Whitney); 0 when either class is missing, as Keras' AUC."""
    scores, positive = np.asarray(scores, np.float64).ravel(), np.asarray(labels).ravel() > 0.5
    p, n = int(positive.sum()), int((~positive).sum())
    if not p or not n:
        return 0.0
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    ranks = ((ends - counts + 1 + ends) / 2.0)[inverse.ravel()]  # 1-based ranks, ties averaged
    return float((ranks[positive].sum() - p * (p + 1) / 2.0) / (p * n))


def auc_error_bound(metric: keras.metrics.AUC, state: List[tf.Tensor]) -> float:
    """How far the thresholded AUC of `state` can be from the exact AUC of
    the same examples: half the positive-negative pairs between the same
    two thresholds, as a fraction of all pairs (mean over labels)."""
    tp, fp, fn, tn = internals.auc_counts(metric, state)
    tp, fp = tp.reshape(tp.shape[0], -1), fp.reshape(fp.shape[0], -1)  # [thresholds, labels]
    pos_in_bin, neg_in_bin = tp[:-1] - tp[1:], fp[:-1] - fp[1:]
    positives = tp[0] + fn.reshape(tp.shape[0], -1)[0]
    negatives = fp[0] + tn.reshape(fp.shape[0], -1)[0]
    pairs = positives * negatives
    bound = np.where(pairs > 0, 0.5 * (pos_in_bin * neg_in_bin).sum(axis=0) / np.maximum(pairs, 1), 0.0)
    return float(bound.mean())


class MetricSet:
    def __init__(self, metrics: Dict[str, keras.metrics.Metric]):
        self.metrics = dict(metrics)
        # Metrics whose value is computed from every example of an evaluation (batch_examples).
        self.ranked = [name for name, metric in self.metrics.items() if isinstance(metric, ExactAUC)]

    def build(self, labels, predictions) -> None:
        """Create the metrics' variables (some, like F1Score, only know their
        shapes from a first batch): one eager update on a sample, then reset."""
        for metric in self.metrics.values():
            metric.update_state(labels, predictions)
            metric.reset_state()
        self.example_width = 2 * int(np.prod(predictions.shape[1:])) if self.ranked else 0
        self._shapes = [[tuple(v.shape) for v in m.variables] for m in self.metrics.values()]
        self._dtypes = [[v.dtype for v in m.variables] for m in self.metrics.values()]
        self.size = FIRST_METRIC + sum(int(np.prod(s)) for shapes in self._shapes for s in shapes)

    def batch_state(self, labels, predictions, per_example_loss) -> tf.Tensor:
        """This batch's flat state vector (float32), on one replica."""
        parts = [
            tf.cast(tf.reshape(tf.size(per_example_loss), [1]), tf.float32),
            tf.reshape(tf.reduce_sum(tf.cast(per_example_loss, tf.float32)), [1]),
        ]
        for metric in self.metrics.values():
            zeros = [tf.zeros(v.shape, v.dtype) for v in metric.variables]
            for value in metric.stateless_update_state(zeros, labels, predictions):
                parts.append(tf.reshape(tf.cast(value, tf.float32), [-1]))
        return tf.concat(parts, axis=0)

    def batch_examples(self, labels, predictions) -> tf.Tensor:
        """[batch, 2·width]: this batch's scores beside its labels, for the
        ranked metrics ([batch, 0] when there are none)."""
        batch = tf.shape(predictions)[0]
        if not self.ranked:
            return tf.zeros([batch, 0], tf.float32)
        width = self.example_width // 2
        return tf.concat(
            [
                tf.reshape(tf.cast(predictions, tf.float32), [batch, width]),
                tf.reshape(tf.cast(labels, tf.float32), [batch, width]),
            ],
            axis=1,
        )

    def zeros(self) -> tf.Tensor:
        return tf.zeros([self.size], tf.float64)

    def results(self, totals: np.ndarray, prefix: str = "", rows: Optional[np.ndarray] = None) -> Dict[str, float]:
        """Loss and every metric from a summed state vector; the ranked
        metrics exact from `rows` (batch_examples of every batch), or
        without them, thresholded with `NAME_error` beside them."""
        totals = np.asarray(totals, dtype=np.float64)
        if rows is not None:  # [examples, scores | labels]
            width = self.example_width // 2
            scores, labels = np.asarray(rows)[:, :width], np.asarray(rows)[:, width:]
        examples = totals[EXAMPLES]
        values = {f"{prefix}loss": float(totals[LOSS_SUM] / max(examples, 1))}
        offset = FIRST_METRIC
        for (name, metric), shapes, dtypes in zip(self.metrics.items(), self._shapes, self._dtypes):
            state: List[tf.Tensor] = []
            for shape, dtype in zip(shapes, dtypes):
                n = int(np.prod(shape))
                state.append(tf.constant(totals[offset : offset + n].reshape(shape), dtype=dtype))
                offset += n
            if name not in self.ranked:
                values[f"{prefix}{name}"] = float(metric.stateless_result(state))
            elif rows is not None:
                values[f"{prefix}{name}"] = float(
                    np.mean([exact_auc(scores[:, i], labels[:, i]) for i in range(width)])
                )
            else:
                values[f"{prefix}{name}"] = float(metric.stateless_result(state))
                values[f"{prefix}{name}_error"] = auc_error_bound(metric, state)
        return values

    @staticmethod
    def examples(totals: np.ndarray) -> float:
        return float(totals[EXAMPLES])
