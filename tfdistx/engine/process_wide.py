"""What a run sets for its whole process, in one place.

TensorFlow and Keras keep some settings process-wide: the random seeds,
op determinism, Keras' dtype policy, the log levels of their loggers. A
run sets them here and nowhere else, and gives back what it changed when it
ends, so that a later job of a sweep in the same process, a notebook or a
test starts as it would have without it.
"""

import contextlib
import logging
import warnings

import keras
import tensorflow as tf

from tfdistx.internals import tensorflow as internals


@contextlib.contextmanager
def settings_for(seed: int, deterministic: bool):
    """While inside: the run's seed (weights, dropout, input order) and, if
    asked, op determinism; TensorFlow's known noise kept off the terminal."""
    _quiet_known_noise()
    keras.utils.set_random_seed(seed)
    was = internals.op_determinism_enabled()
    if deterministic:
        tf.config.experimental.enable_op_determinism()
    try:
        yield
    finally:
        if not was:
            internals.disable_op_determinism()


@contextlib.contextmanager
def precision(policy: str):
    """Keras' dtype policy while a model is built (its layers take it when
    made): the run's trainer.precision, or float32 for a model rebuilt from a
    checkpoint (Keras keeps float32 master weights under every policy)."""
    before = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(before)


def _quiet_known_noise() -> None:
    # tf.data warns whenever a distributed dataset is iterated inside a
    # tf.function; absl logs every input-sharding callback, and tf.distribute
    # every collective it traces, at INFO level: nothing a user can act on.
    warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data options")
    for name in ("absl", "tensorflow"):
        logging.getLogger(name).setLevel(logging.WARNING)
    tensorflow_log = logging.getLogger("tensorflow")
    if not any(isinstance(f, _SaverRetracing) for f in tensorflow_log.filters):  # once per process
        tensorflow_log.addFilter(_SaverRetracing())


class _SaverRetracing(logging.Filter):
    """TensorFlow's checkpoint saver makes a new tf.function for each save of
    variables that live on other tasks (parameter servers), and its own
    retracing detector then warns that "5 out of the last 5 calls ...
    triggered tf.function retracing" at every save from the fifth on: about
    its own code, nothing a user can change."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("MultiDeviceSaver.save" in message and "retracing" in message)
