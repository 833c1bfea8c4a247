"""Metrics a task can name that the engine computes in a way of its own.

`ExactAUC` marks a ROC AUC that must be exact over an evaluation: no
Keras state of bounded size gives it, so the engine (engine/metrics.py)
gathers every (score, label) pair of the evaluation from all replicas and
ranks them; over training batches it is Keras' thresholded AUC, with its
error bound beside it. It lives here, with the tasks that name it, so that
a task never reaches into the engine.
"""

import keras


class ExactAUC(keras.metrics.AUC):
    """ROC AUC, exact over an evaluation (see above); as a Keras metric,
    the thresholded AUC of training batches. `multi_label`: the mean of
    the per-label AUCs."""
