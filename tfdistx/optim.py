"""Optimizers and learning-rate schedules from `conf/optimizer/*.yaml`.

One function turns the config into a Keras 3 optimizer. It must be called
inside `strategy.scope()`: Keras binds an optimizer to the strategy current
when it is created.
"""

from typing import Any, Mapping

import keras

_CLASSES = {"adam": keras.optimizers.Adam, "sgd": keras.optimizers.SGD, "adamw": keras.optimizers.AdamW}
_TFDISTX_KEYS = ("name", "lr", "schedule", "warmup_steps", "min_lr_ratio", "scale_lr_with_replicas")


def effective_lr(cfg: Mapping[str, Any], replicas: int) -> float:
    """The peak learning rate: `lr`, times the replicas under linear scaling."""
    return float(cfg["lr"]) * (replicas if cfg.get("scale_lr_with_replicas") else 1)


def schedule(cfg: Mapping[str, Any], replicas: int, total_steps: int):
    peak = effective_lr(cfg, replicas)
    kind = cfg.get("schedule", "constant")
    if kind == "constant":
        return peak
    warmup = int(cfg.get("warmup_steps", 0)) if kind == "warmup_cosine" else 0
    alpha = float(cfg.get("min_lr_ratio", 0.0))
    if warmup == 0:
        return keras.optimizers.schedules.CosineDecay(peak, decay_steps=max(total_steps, 1), alpha=alpha)
    # Keras' CosineDecay warms up linearly from initial_learning_rate to warmup_target.
    return keras.optimizers.schedules.CosineDecay(
        0.0, decay_steps=max(total_steps - warmup, 1), alpha=alpha, warmup_target=peak, warmup_steps=warmup
    )


def build_optimizer(cfg: Mapping[str, Any], replicas: int, total_steps: int) -> keras.optimizers.Optimizer:
    """Everything in the config that is not a tfdistx key goes to the Keras class."""
    kwargs = {k: v for k, v in cfg.items() if k not in _TFDISTX_KEYS}
    return _CLASSES[cfg["name"]](learning_rate=schedule(cfg, replicas, total_steps), **kwargs)
