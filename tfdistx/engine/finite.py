"""Whether the weights a run trains are still numbers.

A loss can stay finite while weights it does not reach turn NaN (an
optimizer's 0/0 where a weight's gradient has been zero, Keras' Adafactor
among them: a table's rows no batch looked up, a unit no input reaches,
whose NaN a ReLU turns back into 0). Trained on, checkpointed and
exported, such a model is broken without a word. The loop asks at every
record and before every save (loop.SaveCheckpoints), not after every call
of the steps (one step, with trainer.steps_per_loop=1): one small
computation over the trainable variables, each reduced where it lives (a parameter server's
variables on their ps: one boolean each crosses the network, not the
weights), and one vector of booleans read back. Every synchronous replica
holds the same trainable weights, so every worker decides alike, with no
collective. What it costs: docs/performance.md (benchmarks/bench_finite_weights.py).
"""

from typing import List, Optional

import numpy as np
import tensorflow as tf


class NonFiniteWeights:
    """`()`: the first trainable variable holding a NaN or an infinity, named
    with how many of its entries are not numbers; None when all are."""

    def __init__(self, variables: List):
        # (name, the TF variable its values live in): a keras.Variable's, or each shard of a partitioned one's
        self.parts = [part for variable in variables for part in _parts(variable) if part[1].dtype.is_floating]
        self._finite = tf.function(self._finite_fn, autograph=False)

    def _finite_fn(self):
        flags = []
        for _, variable in self.parts:
            with tf.device(variable.device):  # reduced where it lives: a ps's variable on its ps
                flags.append(tf.reduce_all(tf.math.is_finite(variable)))
        return tf.stack(flags)

    def __call__(self) -> Optional[str]:
        if not self.parts:
            return None
        finite = self._finite().numpy()
        if finite.all():
            return None
        name, variable = self.parts[int(np.argmin(finite))]
        values = variable.numpy()
        bad = int(np.count_nonzero(~np.isfinite(values)))
        what = "NaN" if np.isnan(values).any() else "infinite"
        return f"{name} has {bad:,} of {values.size:,} entries {what}"


def _parts(variable) -> list:
    """(name, TF variable) of the pieces a variable's values live in: a
    partitioned one's shards (sharding.py), else the TF variable behind it."""
    value = (
        variable.value if hasattr(variable, "path") else variable
    )  # Keras 3: the TF variable behind a keras.Variable
    name = getattr(variable, "path", None) or variable.name.split(":")[0]
    shards = getattr(value, "variables", None)
    if shards and len(shards) > 1:
        return [(f"{name} (shard {i})", shard) for i, shard in enumerate(shards)]
    return [(name, value)]
