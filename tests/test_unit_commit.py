"""The in-memory commit (engine/commit.py): the copy of a checkpoint's
variables taken before a call of the steps, put back after a failed call.
The end-to-end claim (a lost host costs at most one loop, the weights those
of an uninterrupted run) is test_elastic.py's."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdistx.engine.commit import Commit

pytestmark = pytest.mark.unit


def test_restore_puts_back_every_variable_the_checkpoint_holds_as_it_was_before_the_steps():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
    step = tf.Variable(40, dtype=tf.int64)
    commit = Commit(tf.train.Checkpoint(model=model, optimizer=optimizer, step=step))
    assert commit.restore() is None  # nothing taken yet
    before = [v.numpy().copy() for v in [*model.variables, *optimizer.variables]]
    commit.before_steps(40)
    # what a call that failed half way leaves: the iterations counted, some weights changed
    optimizer.iterations.assign_add(1)
    model.layers[0].kernel.assign(model.layers[0].kernel + 1.0)
    step.assign(50)
    assert commit.restore() == 40
    assert int(step.numpy()) == 40
    for value, variable in zip(before, [*model.variables, *optimizer.variables]):
        np.testing.assert_array_equal(variable.numpy(), value)


def test_a_variable_synchronized_on_read_means_no_copy():
    """Reading it is an all-reduce over every worker, which the chief alone cannot do."""
    summed = tf.Variable(
        0.0, synchronization=tf.VariableSynchronization.ON_READ, aggregation=tf.VariableAggregation.SUM
    )
    commit = Commit(tf.train.Checkpoint(summed=summed))
    commit.before_steps(10)
    assert commit.variables == [] and commit.restore() is None
