"""Optimizers and learning-rate schedules from the optimizer group.

One function turns the config into a Keras 3 optimizer: the class the
group names (a shortcut's, core/optimizers.py, or `optimizer._target_`:
any Keras optimizer class, or the user's own subclass), with the group's
other keys checked against what the class takes. It must be called inside
`strategy.scope()`: Keras binds an optimizer to the strategy current when
it is created.

The learning rate follows the training loop's own step, not the optimizer's
`iterations`: parameter-server workers update `iterations` concurrently and
lose increments (measured: 1,063 after 1,500 steps), which froze cosine
decay short of its end. Keras takes a no-argument callable as a learning
rate; the step runner sets the step it is tracing before each update.
"""

import inspect
import math
import time
from typing import Optional

import keras
import numpy as np
import tensorflow as tf

from tfdistx.core.errors import ConfigError
from tfdistx.core.optimizers import BASE_OPTIMIZER, LOSS_SCALE_OPTIMIZER, MULTI_OPTIMIZER, SET_BY_TFDISTX
from tfdistx.core.run_spec import Optimizer
from tfdistx.core.targets import Target, build
from tfdistx.internals import tensorflow as internals


def _gradients_arrive_summed(cls, path: str):
    """Keras' TensorFlow optimizer sums gradients over replicas inside its
    update, after clipping them; tfdistx sums them before (update.py says
    why), so the class is subclassed not to sum them again (refused in one
    line, rather than summed twice, if a Keras release moves the sum).
    Anything but an optimizer class is refused: tfdistx builds it in the
    strategy's scope, and wraps it for loss scaling itself."""
    if not (isinstance(cls, type) and issubclass(cls, keras.optimizers.Optimizer)):
        raise ConfigError.for_key(
            "optimizer._target_", path, "must name a keras.optimizers.Optimizer class, e.g. keras.optimizers.Lion"
        )
    for refused, why in (
        (keras.optimizers.LossScaleOptimizer, LOSS_SCALE_OPTIMIZER),
        (keras.optimizers.MultiOptimizer, MULTI_OPTIMIZER),
    ):
        if issubclass(cls, refused):  # by class: a path the config side does not know by name (a subclass, keras.src's)
            raise ConfigError.for_key("optimizer._target_", path, f"not an optimizer tfdistx builds: {why}")
    if cls is keras.optimizers.Optimizer:
        raise ConfigError.for_key("optimizer._target_", path, f"not an optimizer tfdistx builds: {BASE_OPTIMIZER}")
    return internals.gradients_arrive_summed(cls)


def _keywords(cls) -> list:
    """The keywords an optimizer class takes: its own, and those of the
    classes it passes **kwargs up to (Keras' base optimizer checks them,
    and refuses the rest); less those tfdistx sets itself."""
    names = []
    for klass in getattr(cls, "__mro__", ()):
        init = vars(klass).get("__init__")
        if init is None or klass is object:
            continue
        params = inspect.signature(init).parameters.values()
        names += [
            p.name
            for p in params
            if p.name not in ("self", *names, *SET_BY_TFDISTX) and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return names


def schedule(optimizer: Optimizer, replicas: int, total_steps: int) -> "LearningRateAtStep":
    """The learning rate through the run. Linear scaling (scale_lr_with_replicas)
    multiplies every value by the replicas."""
    scale = replicas if optimizer.scale_lr_with_replicas else 1
    if isinstance(optimizer.schedule, Target):
        own = optimizer.schedule.build(keras.optimizers.schedules.LearningRateSchedule)
        rate = WarmUp(own, int(optimizer.warmup_steps), scale) if optimizer.warmup_steps or scale != 1 else own
        refuse_non_finite(rate, total_steps, optimizer.schedule.path)
        return LearningRateAtStep(rate, peak=float(own(0)) * scale, source=optimizer.schedule.path)
    peak = float(optimizer.lr) * scale
    if optimizer.schedule == "constant":
        return LearningRateAtStep(
            WarmUp(peak, int(optimizer.warmup_steps)) if optimizer.warmup_steps else peak, peak=peak
        )
    warmup = int(optimizer.warmup_steps) if optimizer.schedule == "warmup_cosine" else 0
    alpha = float(optimizer.min_lr_ratio)
    if warmup == 0:
        return LearningRateAtStep(
            keras.optimizers.schedules.CosineDecay(peak, decay_steps=max(total_steps, 1), alpha=alpha), peak=peak
        )
    # Keras' CosineDecay warms up linearly from initial_learning_rate to warmup_target.
    return LearningRateAtStep(
        keras.optimizers.schedules.CosineDecay(
            0.0, decay_steps=max(total_steps - warmup, 1), alpha=alpha, warmup_target=peak, warmup_steps=warmup
        ),
        peak=peak,
    )


def refuse_non_finite(rate, total_steps: int, path: str) -> None:
    """A schedule of the user's whose rate is not a finite number at some
    step of the run is refused before the first step (ConfigError: like
    optimizer.lr=nan), naming the first such step: trained on, it makes a
    NaN model that exits 0, and the checkpoints it saves replace the good
    ones. Checked here, once, up front, because that is cheap: the
    schedule is one TensorFlow computation over all the run's steps at
    once (milliseconds for a million steps); checked at each record
    instead, NaN steps could already be saved by a checkpoint between
    records. A schedule that cannot take a vector of steps is asked one
    step at a time, for as many steps as that takes at most ~2 s; past
    them, LearningRateAtStep.at (each record's rate) checks the rest."""
    steps = max(int(total_steps), 1)
    try:
        values = np.asarray(rate(tf.range(steps, dtype=tf.int64)), dtype=np.float64)
        values = np.broadcast_to(values, (steps,)) if values.size == 1 else values.reshape(steps)
        first = 0
    except Exception:  # noqa: BLE001 (the user's code: any failure means "not vectorised") one step at a time
        values, first, started = [], 0, time.perf_counter()
        for step in range(steps):
            values.append(float(rate(step)))
            if not math.isfinite(values[-1]) or time.perf_counter() - started > 2.0:
                break
        values = np.asarray(values)
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        step = first + int(bad[0])
        raise non_finite(path, step, float(values[bad[0]]))


def non_finite(path: str, step: int, value: float) -> ConfigError:
    return ConfigError.for_key(
        "optimizer.schedule._target_",
        path,
        f"its learning rate at step {step} is {value}: a schedule must give a "
        "finite rate at every step of the run (a rate that is not a number trains a model that is not one)",
    )


class WarmUp(keras.optimizers.schedules.LearningRateSchedule):
    """A schedule of the user's (`optimizer.schedule._target_`), or a
    constant rate, after `warmup_steps` of linear warm-up from 0 to its
    first value, times `scale`. Written here because Keras warms up only
    its CosineDecay."""

    def __init__(self, schedule, warmup_steps: int, scale: float = 1.0):
        self.schedule, self.warmup_steps, self.scale = schedule, warmup_steps, scale

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        rate = self.schedule(tf.maximum(step - self.warmup_steps, 0.0)) if callable(self.schedule) else self.schedule
        after = self.scale * tf.cast(rate, tf.float32)
        if not self.warmup_steps:
            return after
        return tf.where(step < self.warmup_steps, after * step / self.warmup_steps, after)

    def get_config(self):
        return {"warmup_steps": self.warmup_steps, "scale": self.scale}


class LearningRateAtStep:
    """A learning rate (a number or a Keras schedule) at the step in `step`,
    times `scale`: a variable a callback may set through the optimizer's
    `learning_rate` (Keras' ReduceLROnPlateau), saved with the checkpoint.
    `peak`: its largest planned value (the summary and the topology record it)."""

    def __init__(self, rate, peak: float = 0.0, source: str = "optimizer.lr"):
        self.rate, self.peak, self.source = (
            rate,
            peak,
            source,
        )  # source: what the rate comes from, as the config names it
        self.step = None  # a step tensor, set by the step runner while it traces
        self.scale: Optional[tf.Variable] = (
            None  # 1.0 until a callback sets the rate (build.py makes it in the strategy's scope)
        )
        self.steps_done: Optional[tf.Variable] = None  # the loop's step counter: where the rate is read between steps

    def __call__(self):
        if self.step is None:  # read by a callback between steps (Keras' optimizer.learning_rate)
            if self.steps_done is None:
                raise RuntimeError("the learning rate is read outside a training step")
            return tf.constant(self.at(int(self.steps_done.numpy())), tf.float32)
        rate = self.rate(self.step) if callable(self.rate) else self.rate
        return rate * tf.cast(self.scale, tf.float32) if self.scale is not None else rate

    def at(self, step: int) -> float:
        """The value at `step`, on the host (for logs). Not a finite number:
        a ConfigError, before the record's actions (its checkpoint) run:
        for the steps refuse_non_finite could not check up front."""
        value = self._planned(step) * (float(self.scale.numpy()) if self.scale is not None else 1.0)
        if not math.isfinite(value):
            raise non_finite(self.source, step, value)
        return value

    def assign(self, value) -> None:
        """Keras' optimizer.learning_rate setter: the rate from now on is `value`,
        and the schedule goes on from there (scaled by value / planned)."""
        planned = self._planned(int(self.steps_done.numpy())) if self.steps_done is not None else 0.0
        if self.scale is None or planned <= 0:
            raise ValueError("the learning rate can be set only after the warm-up, once the run's rate is above 0")
        self.scale.assign(float(value) / planned)

    def _planned(self, step: int) -> float:
        return float(self.rate(step)) if callable(self.rate) else float(self.rate)


def build_optimizer(
    section: Optimizer, learning_rate: LearningRateAtStep, loss_scaling: bool = False
) -> keras.optimizers.Optimizer:
    """The optimizer from its config `section`: the group's own keys (`options`) go to the class, checked
    against what it takes. Clipping is Keras' own, on gradients already
    summed over replicas. `loss_scaling` (mixed_float16): wrapped in Keras'
    dynamic loss scaling."""
    optimizer = build(
        "optimizer",
        section.target,
        dict(section.options),
        keras.optimizers.Optimizer,
        takes=_keywords,
        wrap=lambda cls: _gradients_arrive_summed(cls, section.target),
        learning_rate=learning_rate,
        clipnorm=section.clip_norm,
        global_clipnorm=section.global_clip_norm,
    )
    return keras.optimizers.LossScaleOptimizer(optimizer) if loss_scaling else optimizer
