"""Optimizers and learning-rate schedules from `conf/optimizer/*.yaml`.

One function turns the config into a Keras 3 optimizer. It must be called
inside `strategy.scope()`: Keras binds an optimizer to the strategy current
when it is created.

The learning rate follows the training loop's own step, not the optimizer's
`iterations`: parameter-server workers update `iterations` concurrently and
lose increments (measured: 1,063 after 1,500 steps), which froze cosine
decay short of its end. Keras takes a no-argument callable as a learning
rate; the step runner sets the step it is tracing before each update.
"""

import keras

from tfdistx.config.spec import Optimizer
from tfdistx.internals import tensorflow as internals


# Keras' TensorFlow optimizer sums gradients over replicas inside its update,
# after clipping them; tfdistx sums them before (update.py says why), so the
# optimizer must not sum them again (refused in one line, rather than summed
# twice, if a Keras release moves the sum).
_summed = internals.gradients_arrive_summed
_CLASSES = {"adam": _summed(keras.optimizers.Adam), "sgd": _summed(keras.optimizers.SGD), "adamw": _summed(keras.optimizers.AdamW)}


def effective_lr(optimizer: Optimizer, replicas: int) -> float:
    """The peak learning rate: `lr`, times the replicas under linear scaling."""
    return float(optimizer.lr) * (replicas if optimizer.scale_lr_with_replicas else 1)


def schedule(optimizer: Optimizer, replicas: int, total_steps: int):
    peak = effective_lr(optimizer, replicas)
    if optimizer.schedule == "constant":
        return peak
    warmup = int(optimizer.warmup_steps) if optimizer.schedule == "warmup_cosine" else 0
    alpha = float(optimizer.min_lr_ratio)
    if warmup == 0:
        return keras.optimizers.schedules.CosineDecay(peak, decay_steps=max(total_steps, 1), alpha=alpha)
    # Keras' CosineDecay warms up linearly from initial_learning_rate to warmup_target.
    return keras.optimizers.schedules.CosineDecay(
        0.0, decay_steps=max(total_steps - warmup, 1), alpha=alpha, warmup_target=peak, warmup_steps=warmup
    )


class LearningRateAtStep:
    """A learning rate (a number or a Keras schedule) at the step in `step`."""

    def __init__(self, rate):
        self.rate = rate
        self.step = None  # a step tensor, set by the step runner while it traces

    def __call__(self):
        if self.step is None:
            raise RuntimeError("the learning rate is read outside a training step")
        return self.rate(self.step) if callable(self.rate) else self.rate

    def at(self, step: int) -> float:
        """The value at `step`, on the host (for logs)."""
        return float(self.rate(step)) if callable(self.rate) else float(self.rate)


def build_optimizer(spec: Optimizer, learning_rate: LearningRateAtStep, loss_scaling: bool = False) -> keras.optimizers.Optimizer:
    """The optimizer group's own keys (`options`) go to the Keras class.
    Clipping is Keras' own, on gradients already summed over replicas.
    `loss_scaling` (mixed_float16): wrapped in Keras' dynamic loss scaling."""
    optimizer = _CLASSES[spec.name](learning_rate=learning_rate, clipnorm=spec.clip_norm, global_clipnorm=spec.global_clip_norm,
                                    **spec.options)
    return keras.optimizers.LossScaleOptimizer(optimizer) if loss_scaling else optimizer
