"""Tasks: what a batch means — the loss, the metrics, and what a prediction is.

A task sits between a model's outputs and the labels, as TF Model Garden's
`Task` and Keras' `compile(loss, metrics)` do. The built-in tasks are
`classification`, `binary`, `multilabel` and `regression` (one module each);
`task._target_=mypkg.MyTask` plugs in your own.

The contract for your own task — subclass `Task` and define:

    loss(labels, outputs)        -> the per-example loss, shape [batch]
    num_outputs(label_spec, num_classes) -> how wide the model's output must be

and, if the defaults do not fit:

    metrics()                    -> {name: keras.metrics.Metric}; each is updated with
                                    metric_inputs(labels, outputs) = (labels, predictions(outputs))
    predictions(outputs)         -> what the metrics see (e.g. probabilities)
    check_labels(num_classes)    -> raise ConfigError for data the task cannot learn from
    serving_outputs(outputs)     -> {name: tensor}: what the exported model returns
    forward(model, batch, training) -> (labels, outputs): for batches that are
                                    not (features, labels) pairs

The gradients and the update (loss scaling, the sum over replicas, clipping,
accumulation) are tfdistx's, the same for every task: see update.py.

Metrics must have additive state (sums and counts, as every Keras mean,
accuracy, confusion-matrix, AUC and F1 metric has): tfdistx sums their state
over replicas, workers and batches and computes the result once, so a metric
is exact over the whole cluster and the same under every strategy.
`tests/user_plugins.py` holds a complete example.
"""

import functools
import logging
from typing import Callable, Dict, Sequence, Tuple

import keras
import tensorflow as tf

from tfdistx.core.errors import ConfigError


class Task:
    """Base class: the shared training step, and metrics chosen by name."""

    name = "task"
    # name -> a function of the task that makes the Keras metric; a
    # subclass lists what `task.metrics=[...]` may name (its YAML's `offers`
    # says the same to the checks before TensorFlow starts: a test compares).
    AVAILABLE: Dict[str, callable] = {}
    metric_names: Sequence[str] = ()

    def choose_metrics(self, names: Sequence[str]) -> None:
        """The metrics `metrics()` makes, by name (config: task.metrics)."""
        unknown = [m for m in names if m not in self.AVAILABLE]
        if unknown:
            raise ConfigError.for_key(
                "task.metrics", list(names), f"task={self.name} offers {', '.join(self.AVAILABLE)}"
            )
        self.metric_names = list(names)

    # -- what a subclass defines ---------------------------------------------

    def loss(self, labels, outputs) -> tf.Tensor:
        raise NotImplementedError

    def num_outputs(self, label_spec: tf.TensorSpec, num_classes) -> int:
        raise NotImplementedError

    # -- defaults --------------------------------------------------------------

    def metrics(self) -> Dict[str, keras.metrics.Metric]:
        return {name: self.AVAILABLE[name](self) for name in self.metric_names}

    def predictions(self, outputs):
        return outputs

    def check_labels(self, num_classes) -> None:
        """Raise ConfigError when data with `num_classes` (None: not
        classes) is not data this task can learn from; checked after the
        model has been tried on the data."""

    def metric_inputs(self, labels, outputs) -> Tuple:
        return labels, self.predictions(outputs)

    def serving_outputs(self, outputs) -> Dict[str, tf.Tensor]:
        return {"outputs": outputs}

    def forward(self, model, batch, training: bool):
        """(labels, outputs) of one batch; outputs in float32 whatever the
        model computes in (mixed precision), so losses and metrics are exact."""
        features, labels = batch
        return labels, float32(model(features, training=training))

    def eval_step(self, model, batch):
        labels, outputs = self.forward(model, batch, training=False)
        return labels, outputs, self.loss(labels, outputs)


def traced(task: Task, name: str) -> Callable:
    """The task's method `name` as tfdistx's traced steps call it.

    tfdistx traces its steps without AutoGraph (its own traced code is
    written in TensorFlow's control flow: converting it cost each process
    about 1.3 CPU seconds before its first step, docs/performance.md), as
    Keras' `fit` traces its steps. A task of tfdistx's own is called as it
    is. A task of a user's own keeps what it had before: its methods are
    converted by AutoGraph (a Python `if` or `for` on a tensor becomes
    TensorFlow's), and whatever they call with them, as every traced call
    was."""
    method = getattr(task, name)
    if type(task).__module__.startswith(__name__ + ".") or type(task).__module__ == __name__:
        return method
    try:
        return functools.partial(tf.autograph.to_graph(getattr(type(task), name)), task)
    except (
        Exception
    ) as error:  # AutoGraph's ConversionError (not public): no source (a class made in a shell), or code it cannot read
        # What AutoGraph did when it converted a traced call and could not: run it as written, with a warning.
        logging.getLogger(__name__).warning(
            "AutoGraph could not convert %s.%s; it runs as written (%s)",
            type(task).__name__,
            name,
            str(error).splitlines()[0][:200],
        )
        return method


def float32(outputs):
    """Floating outputs (a tensor or a dict of them) cast to float32."""
    return tf.nest.map_structure(lambda t: tf.cast(t, tf.float32) if t.dtype.is_floating else t, outputs)


def column(labels, dtype=tf.float32) -> tf.Tensor:
    """Labels of shape [batch] (or [batch, 1]) as a [batch, 1] column."""
    return tf.reshape(tf.cast(labels, dtype), [-1, 1])


def label_width(label_spec: tf.TensorSpec) -> int:
    """The size of one (unbatched) example's label vector: 1 for a scalar label."""
    return int(label_spec.shape[-1]) if label_spec.shape.rank else 1
