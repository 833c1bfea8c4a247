"""Your own code during training: the `callbacks` group.

Each entry is a `_target_` built on the chief (where the run directory is
written): either a Keras `keras.callbacks.Callback`, driven through its own
hooks, or a tfdistx action with the loop's hooks (engine/loop.py: called
with `(step, record)`; optional `before_loop`, `before_steps`,
`after_steps`, `finish` and `stop_requested`).

When a Keras callback's hooks run (the loop comes back to Python every
`trainer.steps_per_loop` steps at most, as Keras' fit does every
`steps_per_execution`):

    on_train_begin(logs={})            before the first step (also of a resumed run)
    on_epoch_begin(epoch=step)         before the first call after a record
    on_train_batch_begin(batch)        before each call of the steps; batch = steps done
    on_train_batch_end(batch, logs)    after each call; batch = steps done - 1, logs = the record ({} between records)
    on_epoch_end(epoch=step, logs)     at each record: every trainer.log_every steps, and at evaluations
    on_train_end(logs)                 once the loop ends, with the last record

An "epoch" is the span between two records, named by its step (Keras'
CSVLogger writes it in its `epoch` column). Logs name metrics as Keras does:
`eval/loss` is `val_loss`, `lr` is `learning_rate`. The on_test_* and
on_predict_* hooks are not called (tfdistx's evaluation is not Keras'):
a callback that defines them is told so once. `self.model` is the model
being trained, `self.model.optimizer` the run's optimizer (its
`learning_rate` may be set: the schedule goes on scaled from there);
setting `model.stop_training = True` ends the run at that step, as early
stopping does (saved, exit 0, summary.json's `stopped_early`).

A synchronous cluster's workers must stop at the same step: the chief's
callbacks decide, and the workers learn it with one small all-reduce per
loop call (only when there are callbacks), which carries a learning rate
a callback set (Keras' ReduceLROnPlateau) to them as well. A callback that
raises stops the run with one line naming it; a rerun resumes from the
newest checkpoint.
"""

import logging
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional

import keras

from tfdistx.config.errors import ConfigError, RunFault
from tfdistx.config.targets import Target
from tfdistx.engine.loop import Metrics, Schedule

log = logging.getLogger(__name__)

# A callback that raised: not retryable by a launcher (the same code would raise again), as an error no check foresaw.
EXIT_CALLBACK_FAILED = 1
_HOOKS = ("before_loop", "before_steps", "after_steps", "finish")  # and __call__
_NOT_CALLED = ("on_test_begin", "on_test_end", "on_test_batch_begin", "on_test_batch_end", "on_predict_begin", "on_predict_end",
               "on_predict_batch_begin", "on_predict_batch_end")


def build(callbacks: Mapping[str, Target], model, optimizer, schedule: Schedule, run_dir: Path) -> List["Guarded"]:
    """The user's callbacks as loop actions, in their order. A target that
    takes `run_dir` is given the run directory."""
    actions, trained = [], TrainedModel(model, optimizer)
    for name, target in callbacks.items():
        built = target.build(object, run_dir=run_dir)
        if isinstance(built, keras.callbacks.Callback):
            _say_what_is_not_called(name, built, schedule.steps_per_loop)
            built = KerasCallback(built, trained)
        elif not callable(built):
            raise ConfigError.one(f"callbacks.{name}._target_", target.path, "must build a keras.callbacks.Callback or a tfdistx "
                                  "action: a callable (step, record) with the loop's optional hooks (docs/own-project.md)")
        actions.append(Guarded(name, target.path, built))
    return actions


def _say_what_is_not_called(name: str, callback, steps_per_loop: int) -> None:
    own = lambda hook: getattr(type(callback), hook, None) is not getattr(keras.callbacks.Callback, hook)
    unused = [hook for hook in _NOT_CALLED if own(hook)]
    if unused:
        log.warning("callbacks.%s: %s not called: tfdistx evaluates without Keras' evaluate and predict", name, ", ".join(unused))
    batch = [hook for hook in ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end") if own(hook)]
    if batch and steps_per_loop > 1:
        log.warning("callbacks.%s: %s run once per call of %d steps (trainer.steps_per_loop), not every step: "
                    "trainer.steps_per_loop=1 calls them every step", name, " and ".join(batch), steps_per_loop)


def keras_logs(record: Metrics) -> Dict[str, float]:
    """A record as Keras names its metrics in callbacks' logs."""
    renamed = {"lr": "learning_rate"}
    return {renamed.get(key, "val_" + key[len("eval/"):] if key.startswith("eval/") else key): value for key, value in record.items()}


class CSVLogger(keras.callbacks.CSVLogger):
    """Keras' CSVLogger with its file in the run directory (callbacks=csv_logger):
    a relative `filename` is the run dir's, as no interpolation can say in a
    config that commands outside the run (--plan, evaluate) also read."""

    def __init__(self, run_dir: Path, filename: str = "keras_log.csv", separator: str = ",", append: bool = True):
        super().__init__(str(Path(run_dir) / filename), separator=separator, append=append)


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


class KerasCallback:
    """A Keras callback driven by the loop's hooks (the table above)."""

    def __init__(self, callback, model):
        self.callback, self.model = callback, model
        callback.set_model(model)
        self.last: Metrics = {}
        self.epoch_open = self.stopped = False

    def before_loop(self, step: int) -> None:
        self.callback.on_train_begin({})

    def before_steps(self, step: int) -> None:
        if not self.epoch_open:
            self.callback.on_epoch_begin(step)
            self.epoch_open = True
        self.callback.on_train_batch_begin(step)

    def __call__(self, step: int, record: Metrics) -> None:
        logs = keras_logs(record)
        stopping = self.model.stop_training  # the model's flag is every callback's: this one's stop is the change it made
        self.callback.on_train_batch_end(step - 1, logs)
        if logs:
            self.callback.on_epoch_end(step, logs)
            self.last, self.epoch_open = logs, False
        self.stopped = self.stopped or (self.model.stop_training and not stopping)

    def finish(self, step: int) -> None:
        self.callback.on_train_end(self.last)

    @property
    def stop_requested(self) -> Optional[str]:
        return f"{type(self.callback).__name__} set model.stop_training" if self.stopped else None


class Guarded:
    """A callback as a loop action: each hook it has is called, and one that
    raises stops the run with one line naming the callback."""

    def __init__(self, name: str, path: str, action):
        self.name, self.path, self.action = name, path, action
        for hook in _HOOKS:
            if hasattr(action, hook):
                setattr(self, hook, self._guard(getattr(action, hook)))
        if hasattr(action, "next_stop"):  # when the action must be called (the loop stops there)
            self.next_stop = action.next_stop

    def __call__(self, step: int, record: Metrics) -> None:
        self._guard(self.action)(step, record)

    @property
    def stop_requested(self) -> Optional[str]:
        reason = getattr(self.action, "stop_requested", None)
        return f"callbacks.{self.name}: {reason}" if reason else None

    def _guard(self, call: Callable) -> Callable:
        def guarded(*args):
            try:
                return call(*args)
            except Exception as error:
                message = str(error).strip().splitlines()[0] if str(error).strip() else ""
                raise RunFault(f"callbacks.{self.name} ({self.path}) raised {type(error).__name__} at step {args[0]}"
                               f"{': ' + message[:300] if message else ''}; the newest checkpoint is kept, and a rerun resumes from it",
                               EXIT_CALLBACK_FAILED) from error
        return guarded


class AgreeWithTheChief:
    """After the callbacks, on every task of a synchronous cluster: what the
    chief's callbacks did becomes every task's, at this step: a stop one of
    them asked for, and a learning rate one of them set (`scale`: the
    rate's scale variable, optim.LearningRateAtStep). `share(values)`: the
    values summed over the tasks, by one small all-reduce (preemption.sum_over_tasks)."""

    def __init__(self, share: Callable[[List[float]], List[float]], callbacks: List[Guarded], scale, is_chief: bool):
        self.share, self.callbacks, self.scale, self.is_chief = share, callbacks, scale, is_chief
        self.stop_requested: Optional[str] = None

    def __call__(self, step: int, record: Metrics) -> None:
        asked = [callback.stop_requested for callback in self.callbacks if callback.stop_requested]
        stop, scale = self.share([float(bool(asked)), float(self.scale.numpy()) if self.is_chief else 0.0])
        if float(self.scale.numpy()) != scale:
            self.scale.assign(scale)
        if stop and not asked:
            self.stop_requested = "a callback of the chief asked to stop"
