"""The optimizer group's facts: its shortcut names and its schedules.

`optimizer.name` is a shortcut for a Keras optimizer class (one row here);
`optimizer._target_` names any class, Keras' or the user's own, and the
engine builds it (engine/optim.py). `optimizer.schedule` is one of the named
schedules, or a mapping with the `_target_` of a Keras
LearningRateSchedule (or the user's own). No TensorFlow here: the names are
checked before it starts.
"""

from typing import Any, Mapping, Optional

# Every optimizer class of keras.optimizers that trains a model on its own (REFUSED: the others, and why).
CLASSES = {
    name.lower(): f"keras.optimizers.{name}"
    for name in (
        "Adadelta",
        "Adafactor",
        "Adagrad",
        "Adam",
        "AdamW",
        "Adamax",
        "Ftrl",
        "Lamb",
        "Lion",
        "Muon",
        "Nadam",
        "RMSprop",
        "ScheduleFreeAdamW",
        "SGD",
    )
}

# The classes of keras.optimizers that tfdistx does not build, and why: refused by name before TensorFlow starts
# (validate.py), and by class, a subclass too, when the engine builds the optimizer (engine/optim.py).
MULTI_OPTIMIZER = (
    "its per-layer optimizers are objects you would build, each with its own learning rate, clipping and "
    "sum over replicas, which tfdistx sets on the one optimizer it builds (optimizer.lr, optimizer.schedule, "
    "optimizer.clip_norm): name one optimizer class, e.g. optimizer.name=adamw"
)
LOSS_SCALE_OPTIMIZER = (
    "it wraps another optimizer to scale the loss, which tfdistx does itself: name the optimizer and set "
    "trainer.precision=mixed_float16"
)
BASE_OPTIMIZER = "the base class has no update rule of its own: name one of its subclasses, e.g. optimizer.name=adamw"
OPTIMIZER_MAP = (
    "it is no optimizer but the mapping from variables to optimizers that MultiOptimizer takes, which tfdistx does "
    "not build either (one optimizer, its learning rate, clipping and sum over replicas set by tfdistx): name one "
    "optimizer class, e.g. optimizer.name=adamw"
)
REFUSED = {
    "keras.optimizers.MultiOptimizer": MULTI_OPTIMIZER,
    "keras.optimizers.OptimizerMap": OPTIMIZER_MAP,
    "keras.optimizers.LossScaleOptimizer": LOSS_SCALE_OPTIMIZER,
    "keras.optimizers.Optimizer": BASE_OPTIMIZER,
    "keras.Optimizer": BASE_OPTIMIZER,
}

# How many copies of each trained weight an optimizer keeps (its slots: Adam's two moments ...), what a checkpoint
# holds besides the model (core/checkpoint_size.py): counted on Keras 3.15's optimizers, built. Adafactor's are
# factored (a row and a column for a matrix), so not a count of copies: not here. The options that keep one more:
# a momentum (sgd, rmsprop), rmsprop's centered, amsgrad's maximum (adam, adamw).
SLOTS = {
    "adadelta": 2,
    "adagrad": 1,
    "adam": 2,
    "adamw": 2,
    "adamax": 2,
    "ftrl": 2,
    "lamb": 2,
    "lion": 1,
    "muon": 1,
    "nadam": 2,
    "rmsprop": 1,
    "schedulefreeadamw": 2,
    "sgd": 0,
}
_ONE_MORE = {"momentum": ("sgd", "rmsprop"), "centered": ("rmsprop",), "amsgrad": ("adam", "adamw")}


def slots_per_weight(group: Mapping[str, Any]) -> Optional[int]:
    """Copies of each trained weight the optimizer group's optimizer keeps; None: not known (a class of the user's)."""
    target = group.get("_target_")
    name = next((short for short, path in CLASSES.items() if path == target), None) if target else group.get("name")
    if name not in SLOTS:
        return None
    return SLOTS[name] + sum(1 for option, names in _ONE_MORE.items() if name in names and group.get(option))


# Named schedules: constant, cosine decay to min_lr_ratio, and cosine after a linear warm-up (warmup_steps).
SCHEDULES = ("constant", "cosine", "warmup_cosine")


def target_of(group: Mapping[str, Any]) -> Optional[str]:
    """The dotted path of the optimizer class the group names: its
    `_target_`, else its shortcut's class; None: neither is valid."""
    return group.get("_target_") or CLASSES.get(group.get("name"))


def shown_name(group: Mapping[str, Any]) -> str:
    """The optimizer as the plan and the logs name it: its shortcut, or its class's path."""
    return str(group.get("_target_") or group.get("name"))


# Keywords of every Keras optimizer that tfdistx sets itself, and the key to set instead: a value given to the class
# would be overridden (the rate, clipping) or would fight tfdistx's own accumulation and loss scaling.
SET_BY_TFDISTX = {
    "learning_rate": "optimizer.lr (or optimizer.schedule)",
    "clipnorm": "optimizer.clip_norm",
    "global_clipnorm": "optimizer.global_clip_norm",
    "gradient_accumulation_steps": "trainer.accumulate_steps",
    "loss_scale_factor": "trainer.precision=mixed_float16",
}
