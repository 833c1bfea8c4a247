"""Your own code during training: the `callbacks` group.

Each entry is a `_target_` built on the chief (where the run directory is
written): either a Keras `keras.callbacks.Callback`, driven through its own
hooks as Keras' `fit` drives it (engine/keras_callbacks.py), or a tfdistx
action: a subclass of engine/loop.py's `Action`, whose hooks are no-ops
until it overrides them, or any callable `(step, record)` with the hooks
it needs (`before_loop`, `before_steps`, `after_steps`, `train_metrics`,
`finish`, `next_stop`, `stop_requested`). A plain function `(step, record)`
is an action as it is, its keys bound.

What Keras' shipped callbacks do here, and which tfdistx refuses because
it does their job itself: core/callbacks.py (checked before TensorFlow
starts; again here, for a subclass of one).

A synchronous cluster's workers must stop, save and fail at the same step:
the chief's callbacks and loggers decide, and the workers learn it with one
small all-reduce (AgreeWithTheChief) per loop call when there are callbacks,
per record otherwise; it carries a learning rate a callback set (Keras'
ReduceLROnPlateau) to them as well.

A callback that raises stops the run with one line naming it and the hook
(exit 1), after the steps trained are saved: a failure in a hook that runs
before or between calls of the steps (on_train_begin, on_epoch_begin,
on_train_batch_begin) is held until the steps of that call are done, so
that every worker of a synchronous cluster saves at the same step.

Callbacks' own state (a Keras EarlyStopping's patience so far, a user's
callback with `get_state()`/`set_state(state)` of JSON-able values) is
saved with every checkpoint and given back on resume (CallbackStates).
"""

import dataclasses
import functools
import inspect
import json
import logging
import os
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Dict, List, Mapping, Optional

import keras
import tensorflow as tf

from tfdistx.core import callbacks as keras_facts
from tfdistx.core.errors import ConfigError, PluginFailed, interrupted
from tfdistx.core.targets import Target, locate
from tfdistx.engine.keras_callbacks import KerasCallback, TrainedModel
from tfdistx.engine.loop import Action, Metrics, Schedule
from tfdistx import rundir
from tfdistx.rundir import keep_aside

log = logging.getLogger(__name__)

_NOT_CALLED = (
    "on_test_begin",
    "on_test_end",
    "on_test_batch_begin",
    "on_test_batch_end",
    "on_predict_begin",
    "on_predict_end",
    "on_predict_batch_begin",
    "on_predict_batch_end",
)


def build(
    callbacks: Mapping[str, Target],
    model,
    optimizer,
    schedule: Schedule,
    run_dir: Path,
    states: "CallbackStates",
    evaluates: bool,
) -> List["Guarded"]:
    """The user's callbacks as loop actions, in their order, their state
    given back from the checkpoint resumed from. A target that takes
    `run_dir` is given the run directory. `evaluates`: whether the run has
    eval data (its records then hold val_ metrics)."""
    actions, trained = [], TrainedModel(model, optimizer)
    for name, target in callbacks.items():
        built = _action_function(target) or in_run_dir(name, target, run_dir).build(object, run_dir=run_dir)
        if isinstance(built, keras.callbacks.Callback):
            keras_classes = _keras_classes(type(built))
            refusal = keras_facts.refusal(
                keras_classes, target.kwargs
            )  # a subclass of one that config/ refuses by name
            if refusal:
                raise ConfigError.for_key(f"callbacks.{name}._target_", target.path, refusal)
            _writes_in_run_dir(name, built, keras_classes, run_dir)
            _say_what_is_not_called(name, built, schedule.steps_per_loop)
            built = KerasCallback(built, trained, schedule, evaluates)
        elif not callable(built):
            raise ConfigError.for_key(
                f"callbacks.{name}._target_",
                target.path,
                "must build a keras.callbacks.Callback or a tfdistx "
                "action: a callable (step, record) with the loop's optional hooks (docs/own-project.md)",
            )
        guarded = Guarded(name, target.path, built)
        states.track(name, guarded)
        actions.append(guarded)
    return actions


def _keras_classes(cls) -> List[str]:
    """The names of Keras' own classes `cls` is (itself, or a base of it)."""
    return [base.__name__ for base in cls.__mro__ if base.__module__.startswith("keras.")]


def in_run_dir(name: str, target: Target, run_dir: Path) -> Target:
    """`target`, a Keras callback that writes where a key says (ModelCheckpoint's
    `filepath` ...: core/callbacks.PATHS), with that path made the run
    dir's: a relative one is the run dir's, as callbacks=csv_logger's is
    (config/run_files.py). One out of the run dir, or over the run's own
    files, is refused (checked before TensorFlow starts for Keras' own
    classes by name; here for a subclass). A target that takes `run_dir`
    places its files itself; anything else is as it was."""
    try:
        cls = locate(target.path)
    except Exception:
        return target  # target.build says why, in one line
    if not (inspect.isclass(cls) and issubclass(cls, keras.callbacks.Callback)) or "run_dir" in _parameters(cls):
        return target
    found = keras_facts.path_key(_keras_classes(cls))
    if found is None or keras_facts.refusal(_keras_classes(cls), target.kwargs):  # a refused one: refused as built
        return target
    key, default, example = found
    value = target.kwargs.get(key, _parameters(cls).get(key, default))
    if value is None:  # not given, no default: the class refuses it as it is built
        return target
    why = rundir.why_not_in_run_dir(str(value), str(run_dir), example)
    if why:
        raise ConfigError.for_key(f"callbacks.{name}.{key}", value, why)
    path = os.path.join(str(run_dir), str(value)) if not os.path.isabs(str(value)) else str(value)
    return dataclasses.replace(target, kwargs=MappingProxyType({**target.kwargs, key: path}))


def _parameters(cls) -> dict:
    """The keyword parameters of `cls`'s constructor, with their defaults (None: none)."""
    try:
        parameters = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return {}
    return {p.name: None if p.default is p.empty else p.default for p in parameters}


def _writes_in_run_dir(name: str, callback, keras_classes: List[str], run_dir: Path) -> None:
    """A built Keras callback that writes where a key says writes in the run
    dir, whatever its constructor made of that key (a subclass's own path)."""
    found = keras_facts.path_key(keras_classes)
    where = getattr(callback, found[0], None) if found else None
    if where is None:
        return
    why = rundir.why_not_in_run_dir(os.path.abspath(str(where)), str(run_dir), found[2])
    if why:
        raise ConfigError.for_key(f"callbacks.{name}.{found[0]}", str(where), why)


def _action_function(target: Target) -> Optional[Callable]:
    """A plain function that takes (step, record) besides the keys given:
    the action itself, its keys bound (not called to build one)."""
    try:
        function = locate(target.path)
    except Exception:
        return None  # target.build says why, in one line
    if not inspect.isfunction(function):
        return None
    try:
        left = inspect.signature(function).bind_partial(**target.kwargs).signature.parameters
    except TypeError:
        return None
    required = [
        p
        for n, p in left.items()
        if n not in target.kwargs and p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return functools.partial(function, **target.kwargs) if len(required) == 2 else None


def _say_what_is_not_called(name: str, callback, steps_per_loop: int) -> None:
    own = lambda hook: getattr(type(callback), hook, None) is not getattr(keras.callbacks.Callback, hook)  # noqa: E731
    unused = [hook for hook in _NOT_CALLED if own(hook)]
    if unused:
        log.warning(
            "callbacks.%s: %s not called: tfdistx evaluates without Keras' evaluate and predict",
            name,
            ", ".join(unused),
        )
    batch = [
        hook for hook in ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end") if own(hook)
    ]
    if batch and steps_per_loop > 1:
        log.warning(
            "callbacks.%s: %s run once per call of %d steps (trainer.steps_per_loop), not every step: "
            "trainer.steps_per_loop=1 calls them every step",
            name,
            " and ".join(batch),
            steps_per_loop,
        )


class CSVLogger(keras.callbacks.CSVLogger):
    """Keras' CSVLogger with its file in the run directory (callbacks=csv_logger):
    a relative `filename` is the run dir's, as no interpolation can say in a
    config that commands outside the run (--plan, evaluate) also read. One
    that would leave the run dir is refused (config/run_files.py, before
    TensorFlow starts); with append=false, a file already there is kept aside, not replaced."""

    def __init__(self, run_dir: Path, filename: str = "keras_log.csv", separator: str = ",", append: bool = True):
        why = rundir.why_not_in_run_dir(filename, str(run_dir))
        if why:
            raise ConfigError.for_key("filename", filename, why)
        path = Path(run_dir) / filename
        if not append and path.exists():
            log.info("%s was there: kept as %s", path, keep_aside(path))
        super().__init__(str(path), separator=separator, append=append)


class Guarded(Action):
    """A callback as a loop action: each of its hooks is called, and one
    that raises stops the run with one line naming the callback. A failure
    before or between the steps is held until the call's steps are done
    (the next `__call__`): the loop then saves, in step with every worker."""

    def __init__(self, name: str, path: str, action):
        self.name, self.path, self.action = name, path, action
        self.hooks: Action = action if isinstance(action, Action) else _OwnHooks(action)
        self.held: Optional[PluginFailed] = None

    def next_stop(self, step: int) -> Optional[int]:
        return self.hooks.next_stop(step)  # when the action must be called (the loop stops there)

    def before_loop(self, step: int) -> None:
        self._held(self.hooks.before_loop, step)

    def before_steps(self, step: int) -> None:
        self._held(self.hooks.before_steps, step)

    def after_steps(self, step: int) -> None:
        self._held(self.hooks.after_steps, step)

    def train_metrics(self, step: int, metrics: Metrics) -> None:
        self._held(self.hooks.train_metrics, step, metrics)

    def wants_train_metrics(self) -> bool:
        return self.hooks.wants_train_metrics()

    def finish(self, step: int) -> None:
        self._raising(self.hooks.finish, step)

    def __call__(self, step: int, record: Metrics) -> None:
        if self.held:
            raise self.held
        self._raising(self.hooks, step, record)

    @property
    def stop_requested(self) -> Optional[str]:
        reason = self.hooks.stop_requested
        return f"callbacks.{self.name}: {reason}" if reason else None

    def get_state(self) -> Optional[dict]:
        return self.action.get_state() if hasattr(self.action, "get_state") else None

    def set_state(self, state: dict) -> None:
        try:
            self.action.set_state(state)
        except Exception as error:
            raise self._failure(error, "set_state", None) from error

    def _raising(self, call: Callable, step: int, *args) -> None:
        try:
            call(step, *args)
        except Exception as error:
            if interrupted(error):  # Ctrl-C while the callback ran: not the callback's failure
                raise KeyboardInterrupt from None
            raise self._failure(error, getattr(self.action, "hook", None), step) from error

    def _held(self, call: Callable, step: int, *args) -> None:
        if self.held is None:
            try:
                call(step, *args)
            except Exception as error:
                if interrupted(error):
                    raise KeyboardInterrupt from None
                self.held = self._failure(error, getattr(self.action, "hook", None), step)
                self.held.__cause__ = error

    def _failure(self, error: Exception, hook: Optional[str], step: Optional[int]) -> PluginFailed:
        message = str(error).strip().splitlines()[0] if str(error).strip() else ""
        where = (f" in {hook}" if hook else "") + (f" at step {step}" if step is not None else "")
        return PluginFailed(
            f"callbacks.{self.name} ({self.path}) raised {type(error).__name__}{where}"
            f"{': ' + message[:300] if message else ''}"
        )


class _OwnHooks(Action):
    """A user's action written without the Action base: any callable
    `(step, record)` with the loop's hooks it needs as attributes (a plain
    function has none). The hooks it has are its own; the base's no-ops
    stand for the rest. Looked up once, here, where user code meets the loop."""

    def __init__(self, action):
        self.action = action
        for hook in ("next_stop", "before_loop", "before_steps", "after_steps", "train_metrics", "finish"):
            if hasattr(action, hook):
                setattr(self, hook, getattr(action, hook))

    def __call__(self, step: int, record: Metrics) -> None:
        self.action(step, record)

    def wants_train_metrics(self) -> bool:
        return hasattr(self.action, "train_metrics")

    @property
    def stop_requested(self) -> Optional[str]:
        return getattr(self.action, "stop_requested", None)


class AgreeWithTheChief(Action):
    """After the callbacks, on every task of a synchronous cluster: what the
    chief's callbacks and loggers did becomes every task's, at this step: a
    stop one of them asked for, a learning rate one of them set (`scale`:
    the rate's scale variable, optim.LearningRateAtStep), and a failure
    (every task then saves the steps trained, and stops). `share(values)`:
    the values summed over the tasks, by one small all-reduce
    (preemption.sum_over_tasks), at every call when there are callbacks
    (`every_call`), else at records only (loggers run only then)."""

    def __init__(
        self,
        share: Callable[[List[float]], List[float]],
        callbacks: List[Guarded],
        scale,
        is_chief: bool,
        every_call: bool,
    ):
        self.share, self.callbacks, self.scale, self.is_chief, self.every_call = (
            share,
            callbacks,
            scale,
            is_chief,
            every_call,
        )
        self.stop_requested: Optional[str] = None
        self.shared_at: Optional[int] = None
        self.finished = False

    def __call__(self, step: int, record: Metrics) -> None:
        if self.every_call or record:
            self._agree(step, failed=False)

    def failed(self, step: int) -> None:
        """The chief's callback or logger raised at `step`: the workers learn it (it is their turn to share)."""
        if self.shared_at != step and not self.finished:
            self._agree(step, failed=True)

    def finish(self, step: int) -> None:
        self.finished = True  # the loop has ended: no task shares any more

    def _agree(self, step: int, failed: bool) -> None:
        asked = [callback.stop_requested for callback in self.callbacks if callback.stop_requested]
        stop, scale, chief_failed = self.share(
            [float(bool(asked)), float(self.scale.numpy()) if self.is_chief else 0.0, float(failed)]
        )
        self.shared_at = step
        if (
            chief_failed and not failed
        ):  # a worker: the chief's line names what failed; the loop saves with it, then stops
            raise PluginFailed(f"the chief's callbacks or loggers failed at step {step} (the chief's line names them)")
        if float(self.scale.numpy()) != scale:
            self.scale.assign(scale)
        if stop and not asked:
            self.stop_requested = "a callback of the chief asked to stop"


class StopRecord(tf.train.experimental.PythonState):
    """Which of the user's callbacks asked the run to stop (a Keras
    EarlyStopping, TerminateOnNaN, any callback that set
    model.stop_training, an action's stop_requested), saved with every
    checkpoint as one JSON string: the checkpoint of the step the run
    stopped at carries it, so that a rerun from that checkpoint ends at
    once, as a finished run does (engine/start.py), instead of training on
    until the callback, its state given back, stops it again an epoch
    later. A stop counts only while its callback is in the config (a rerun
    without it trains on). trainer.early_stopping's stop is the objective
    state's (checkpointing.ObjectiveState)."""

    def __init__(self):
        self.restored: Dict[str, str] = {}  # callback name -> the reason it gave, in the checkpoint restored
        self.watched: List[Guarded] = []

    def watch(self, callbacks: List["Guarded"]) -> None:
        self.watched = list(callbacks)

    def stopped(self, configured) -> Optional[str]:
        """Why the restored checkpoint's run stopped early, by a callback that `configured` still names; None."""
        return next((reason for name, reason in self.restored.items() if name in configured), None)

    def serialize(self) -> str:
        return json.dumps({c.name: c.stop_requested for c in self.watched if c.stop_requested})

    def deserialize(self, string) -> None:
        self.restored = json.loads(string.numpy() if hasattr(string, "numpy") else string)


class CallbackStates(tf.train.experimental.PythonState):
    """The callbacks' own state, saved with every checkpoint as one JSON
    string (a checkpoint of the same object graph on every task: the
    workers, which build no callbacks, save what they restored). Keras
    gives a callback no way to save its state, and `fit` forgets it on a
    restart (keras-team/keras#17012); tfdistx resumes everything else
    exactly, so its callbacks too."""

    def __init__(self):
        self.restored: Dict[str, dict] = {}
        self.tracked: Dict[str, Guarded] = {}

    def track(self, name: str, callback: Guarded) -> None:
        self.tracked[name] = callback
        if name in self.restored:
            callback.set_state(self.restored[name])

    def serialize(self) -> str:
        states = (
            {name: callback.get_state() for name, callback in self.tracked.items()}
            if self.tracked
            else dict(self.restored)
        )
        try:
            return json.dumps({name: state for name, state in states.items() if state is not None})
        except (TypeError, ValueError) as error:
            raise PluginFailed(f"callbacks: a get_state() returned what JSON cannot hold ({error})") from error

    def deserialize(self, string) -> None:
        self.restored = json.loads(string.numpy() if hasattr(string, "numpy") else string)
