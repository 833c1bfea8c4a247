"""Keras' callbacks under tfdistx's loop, numbered and fed as Keras' `fit`
numbers and feeds them, so that a callback written for `fit` works
unchanged (the `callbacks` group: engine/callbacks.py builds them).

The loop comes back to Python every `trainer.steps_per_loop` steps at
most, as `fit` does every `steps_per_execution`; an epoch is the span
between two records (every `trainer.log_every` steps, at evaluations, and
the last step):

    on_train_begin({})                    before the first step (of a resumed run too; its state restored after it)
    on_epoch_begin(epoch, {})             before the first call of an epoch; epoch = 0, 1, 2 ... one per record
    on_train_batch_begin(batch, {})       before each call; batch = the call's first step within the epoch (0-based)
    on_train_batch_end(batch, logs)       after each call; batch = its last step within the epoch; logs = the training
                                          metrics since the epoch began, as fit's
    on_epoch_end(epoch, logs)             at the record that ends the epoch (or where a stop ends it), the same
                                          epoch as its begin; logs add `val_*` at evaluations, `learning_rate`
    on_train_end(logs)                    once the loop ends, with the last epoch's logs

Epochs count records from the run's first step, so a resumed run goes on
counting where it left off (the epoch it was stopped in begins again under
its number, and its batches go on from where they were). Every logs dict
also holds `step`, the optimizer steps done. Keras' names: `eval/loss` is
`val_loss`, `lr` is `learning_rate`.

A callback's own state (EarlyStopping's wait and best, ReduceLROnPlateau's
wait and cooldown, ModelCheckpoint's best) is saved with every checkpoint
and given back on resume (engine/callbacks.py: CallbackStates), so that a
resumed run stops, reduces and saves where an uninterrupted one does.
"""

import logging
import math
from typing import Any, Dict, Optional

import keras
import numpy as np

from tfdistx.engine.loop import Action, Metrics, Schedule
from tfdistx.internals import tensorflow as internals

log = logging.getLogger(__name__)

# What Keras' stateful callbacks keep across epochs, by their public
# attributes: saved with the checkpoint, set again after on_train_begin
# (which resets them, as it does for each call of fit). ModelCheckpoint's
# count of batches since its last save is private to Keras: internals.
STATE = {
    keras.callbacks.EarlyStopping: ("wait", "stopped_epoch", "best", "best_epoch"),
    keras.callbacks.ReduceLROnPlateau: ("wait", "cooldown_counter", "best"),
    keras.callbacks.ModelCheckpoint: ("best",),
}
# tfdistx's own speed: fit's logs have no such key (Keras' CSVLogger would make it a column, and a val_ one)
_NOT_KERAS = ("examples_per_sec",)


def keras_logs(record: Metrics) -> Dict[str, float]:
    """A record as Keras names its metrics in callbacks' logs."""
    renamed = {"lr": "learning_rate"}
    return {
        renamed.get(key, "val_" + key[len("eval/") :] if key.startswith("eval/") else key): value
        for key, value in record.items()
        if key not in _NOT_KERAS
    }


class TrainedModel:
    """The model a Keras callback sees as `self.model`: the model being
    trained, with the run's optimizer as its `optimizer` (tfdistx never
    compiles the model, and setting the attribute on it would add the
    optimizer to the model's checkpointed children) and its own
    `stop_training`; everything else is the model's."""

    def __init__(self, model, optimizer):
        self.trained, self.optimizer, self.stop_training = model, optimizer, False

    def __getattr__(self, name):  # only what the lines above do not set
        return getattr(self.trained, name)


class KerasCallback(Action):
    """A Keras callback driven by the loop's hooks (the table above).
    `hook`: the Keras hook running, for the line that names a failure."""

    def __init__(self, callback, model: TrainedModel, schedule: Schedule, evaluates: bool):
        self.callback, self.model, self.schedule = callback, model, schedule
        self.evaluates = evaluates  # whether records will hold val_ metrics (the run has eval data)
        callback.set_model(model)
        # What fit tells its callbacks (ProgbarLogger draws its bar from them): the epochs, and the batches
        # of one epoch when every epoch has as many (None otherwise, as fit gives for data of unknown length).
        callback.set_params(
            {"verbose": 1, "epochs": schedule.records_until(schedule.steps), "steps": _steps_per_epoch(schedule)}
        )
        self.epoch: Optional[int] = None  # the open epoch's number (None: between epochs)
        self.epoch_start = 0  # the steps done when it began
        self.running: Dict[str, float] = {}  # the training metrics since it began, Keras' names
        self.last: Dict[str, float] = {}
        self.stopped = False
        self.restored: Optional[dict] = None  # its state in the checkpoint resumed from (CallbackStates)
        self.hook = ""

    def before_loop(self, step: int) -> None:
        self._call("on_train_begin", {})
        if self.restored is not None:  # after on_train_begin, which resets what it holds
            set_state(self.callback, self.restored)

    def before_steps(self, step: int) -> None:
        if self.epoch is None:
            self.epoch, self.epoch_start, self.running = (
                self.schedule.records_until(step),
                self.schedule.epoch_start(step),
                {},
            )
            self._call("on_epoch_begin", self.epoch, {})
        self._call("on_train_batch_begin", step - self.epoch_start, {})

    def train_metrics(self, step: int, metrics: Metrics) -> None:
        self.running = {**keras_logs(metrics), "step": step}

    def __call__(self, step: int, record: Metrics) -> None:
        stopping = (
            self.model.stop_training
        )  # the model's flag is every callback's: this one's stop is the change it made
        self._call("on_train_batch_end", step - 1 - self.epoch_start, dict(self.running))
        if self.schedule.records_at(step):
            self._end_epoch(step, record)
        self.stopped = self.stopped or (self.model.stop_training and not stopping)

    def finish(self, step: int) -> None:
        if self.epoch is not None:  # stopped within an epoch: fit ends that epoch too
            self._end_epoch(step, {})
        self._call("on_train_end", dict(self.last))

    def _end_epoch(self, step: int, record: Metrics) -> None:
        logs = {**self.running, **{k: v for k, v in keras_logs(record).items() if k not in self.running}, "step": step}
        self._columns_of_csv_logger(logs)
        self._call("on_epoch_end", self.epoch, logs)
        self.last, self.epoch = logs, None

    def _columns_of_csv_logger(self, logs: dict) -> None:
        """Keras' CSVLogger takes its columns from the first epoch's logs and,
        when they hold no val_ metric, adds a val_ column for every key
        (val_learning_rate, val_step: NA in every row). Under fit the first
        epoch is evaluated; here evaluations come every trainer.eval_every
        steps: the columns are the logs' keys and val_ of the metrics."""
        if isinstance(self.callback, keras.callbacks.CSVLogger) and self.callback.keys is None:
            keys = sorted(logs)
            if self.evaluates and not any(key.startswith("val_") for key in keys):
                keys += [f"val_{key}" for key in sorted(logs) if key not in ("learning_rate", "step")]
            self.callback.keys = keys

    def _call(self, hook: str, *args) -> None:
        self.hook = hook
        getattr(self.callback, hook)(*args)

    @property
    def stop_requested(self) -> Optional[str]:
        return f"{type(self.callback).__name__} set model.stop_training" if self.stopped else None

    def get_state(self) -> Optional[dict]:
        return get_state(self.callback)

    def set_state(self, state: dict) -> None:
        self.restored = state  # given back in before_loop, after on_train_begin


def _steps_per_epoch(schedule: Schedule) -> Optional[int]:
    every = schedule.log_every
    regular = schedule.steps % every == 0 and (not schedule.eval_every or schedule.eval_every % every == 0)
    return every if regular else None


def get_state(callback) -> Optional[dict]:
    """What `callback` keeps across epochs, as JSON-able values: its own
    `get_state()` (a user's opt-in), or Keras' attributes (STATE); None: nothing."""
    if hasattr(callback, "get_state"):
        return callback.get_state()
    names = _state_names(callback)
    if names is None:
        return None
    state = {name: _plain(getattr(callback, name, None)) for name in names}
    if isinstance(callback, keras.callbacks.ModelCheckpoint):
        state["batches"] = internals.model_checkpoint_batches(callback)
    return state


def set_state(callback, state: dict) -> None:
    if hasattr(callback, "set_state"):
        callback.set_state(state)
        return
    for name in _state_names(callback) or ():
        if name in state:
            setattr(callback, name, state[name])
    if isinstance(callback, keras.callbacks.ModelCheckpoint) and "batches" in state:
        internals.set_model_checkpoint_batches(callback, state["batches"])


def _state_names(callback) -> Optional[tuple]:
    for cls, names in STATE.items():
        if isinstance(callback, cls):
            return names
    return None


def _plain(value: Any) -> Any:
    """A value as JSON keeps it (numpy scalars as Python numbers; infinities as JSON's Infinity)."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value
