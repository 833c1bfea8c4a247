"""The outer training loop (cf. Orbit's Controller): run steps, then act.

The loop asks a step runner (runner.py) for as many steps as it can run
before the next stop, makes the step's record (training metrics when
`Schedule` says to log, eval metrics when it says to evaluate), and hands
it to its actions in order. An action is what a run does between steps:
write the record to the loggers, save a checkpoint, stop for preemption.
A new per-loop behaviour is one more action (cf. Orbit's train_actions),
not a new keyword of the loop. An action may ask the loop to stop early
(its `stop_requested` holds the reason): the loop ends at that step, as at
its last one.

It knows no TensorFlow and no Hydra: a runner, a step counter with
`assign`, and actions are all it takes, so a notebook or a unit test can
drive it.
"""

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional

from tfdistx.core.errors import PluginFailed

Metrics = Dict[str, float]
log = logging.getLogger(__name__)


class Action:
    """Something the run does between its steps, as Keras' `Callback`: every
    hook is declared here as a no-op, and an action overrides the ones it
    needs. The loop calls each hook of every action, in the actions' order:

    - `__call__(step, record)`: after each call of the runner, with `record`
      the step's metrics (empty when nothing was logged or evaluated);
    - `next_stop(step)`: the next step at which the action must be called
      (the loop stops there); None: no stop of its own;
    - `before_loop(step)`: once, before the first call of the runner;
    - `before_steps(step)`, `after_steps(step)`: right before and right after
      each call of the runner, with the step counter then (what brackets the
      steps themselves, and not the evaluation, logging or saving between them);
    - `train_metrics(step, metrics)`: after each call of the runner, the
      training metrics since the last record (what Keras' `fit` gives its
      batch hooks);
    - `finish(step)`: once, when the loop ends;
    - `failed(step)`: in order, when an action raised PluginFailed at `step`
      (a callback or a logger that failed), before the loop stops with it;
      it may return what it kept of the steps trained (a saved checkpoint),
      which the failure's line then says;
    - `stop_requested`: a reason (a str) when the action wants the run to
      end at this step, read after every action has been called."""

    stop_requested: Optional[str] = None

    def __call__(self, step: int, record: Metrics) -> None:
        pass

    def next_stop(self, step: int) -> Optional[int]:
        return None

    def before_loop(self, step: int) -> None:
        pass

    def before_steps(self, step: int) -> None:
        pass

    def after_steps(self, step: int) -> None:
        pass

    def train_metrics(self, step: int, metrics: Metrics) -> None:
        pass

    def finish(self, step: int) -> None:
        pass

    def failed(self, step: int) -> Optional[str]:
        return None

    def wants_train_metrics(self) -> bool:
        """Whether `train_metrics` is more than the no-op: the loop works the
        running metrics out only for actions that take them (as Keras'
        CallbackList skips the batch hooks no callback implements)."""
        return type(self).train_metrics is not Action.train_metrics


class Log(Action):
    """Each logger(step, record) gets every non-empty record."""

    def __init__(self, loggers: Iterable[Callable[[int, Metrics], None]]):
        self.loggers = list(loggers)

    def __call__(self, step: int, record: Metrics) -> None:
        if record:
            record = {k: float(v) for k, v in record.items()}
            for logger in self.loggers:
                logger(step, record)

    def after_steps(self, step: int) -> None:
        """Passed on to the loggers that show progress between records (a terminal's status line)."""
        for logger in self.loggers:
            if hasattr(logger, "after_steps"):
                logger.after_steps(step)


class SaveCheckpoints(Action):
    """A checkpoint every `every` steps (0: only at the end), written in the
    background (`checkpointer.save_in_background`: the steps wait only for
    its snapshot), with the best checkpoint when one is due at that step;
    and, written whole before the loop goes on, at the end and when a
    callback or logger failed (the steps trained since the last save are
    kept). Never a state whose training loss is no longer a number (NaN or
    infinite, since the last record), nor one whose weights are not
    (`nonfinite_weights()`: the name of a weight that holds a NaN or an
    infinity, or None; a loss can stay finite while weights it does not
    reach are NaN; asked at every record and before every save, not at
    every call of the steps, which can be a single step): that save would
    replace the last good checkpoint, or rotate it out (max_to_keep), with
    weights nothing can resume from; the newest checkpoint stays the last
    good one (and so does the export, which is of it), and the log says so
    once. Weights that are not numbers also stop the run at that step
    (`stop_requested`), as a NaN loss does under Keras' TerminateOnNaN:
    nothing trains out of them. `keeps(save)`: a save of another action's
    (the best checkpoint) made only while the state is a good one."""

    def __init__(self, checkpointer, every: int, nonfinite_weights: Optional[Callable[[], Optional[str]]] = None):
        self.checkpointer, self.every = checkpointer, every
        self.nonfinite_weights = nonfinite_weights
        self.broken_since: Optional[int] = None  # the first step whose loss or weights were not numbers
        self.broken_why = "the loss is not a number"
        self.stop_requested: Optional[str] = None
        self.weights_checked_at: Optional[int] = None

    def next_stop(self, step: int) -> Optional[int]:
        return _next_multiple(step, self.every) if self.every else None

    def keeps(self, save: Callable[[int], object]) -> Callable[[int], object]:
        """`save`, made only while no loss or weight has stopped being a number."""
        return lambda step: save(step) if self._good(step) else None

    def _good(self, step: int) -> bool:
        """Whether the state at `step` may be saved: its loss and (asked once a step) its weights are numbers."""
        if self.nonfinite_weights is not None and self.broken_since is None and self.weights_checked_at != step:
            self.weights_checked_at = step
            weight = self.nonfinite_weights()
            if weight is not None:
                self.broken_since, self.broken_why = step, "the weights are not numbers"
                self.stop_requested = f"the weights are not numbers: {weight}"
                log.warning(
                    "step %d: %s; the run stops, and no checkpoint is saved from here on (the newest stays %s)",
                    step,
                    self.stop_requested,
                    self._newest(),
                )
        return self.broken_since is None

    def train_metrics(self, step: int, metrics: Metrics) -> None:
        loss = metrics.get("loss")
        if self.broken_since is None and loss is not None and not math.isfinite(loss):
            self.broken_since = step
            log.warning(
                "step %d: the loss is %s; no checkpoint is saved from here on (the newest stays %s)",
                step,
                loss,
                self._newest(),
            )

    def __call__(self, step: int, record: Metrics) -> None:
        saving = bool(self.every and step % self.every == 0)
        good = self._good(step) if (saving or record) else self.broken_since is None
        # nothing when neither it nor the best (marked by keeps(save_best), of a good state only) is due
        self.checkpointer.save_in_background(step, latest=saving and good)

    def finish(self, step: int) -> None:
        if self._good(step):
            self.checkpointer.save(step)

    def failed(self, step: int) -> str:
        if not self._good(step):
            return (
                f"step {step} is not saved ({self.broken_why}): the newest checkpoint is kept, "
                "and a rerun resumes from it"
            )
        self.checkpointer.save(step)
        return f"the steps trained are saved (step {step}), and a rerun resumes from there"

    def _newest(self) -> str:
        saved = self.checkpointer.last_saved
        return f"the one at step {saved}" if saved is not None else "the one this run started from, if any"


class CheckPreemption(Action):
    """`preemption.check(step)` before the first call of the runner (a
    SIGTERM while the run was starting) and after every call: it saves and
    exits when the cluster is being preempted (preemption.py)."""

    def __init__(self, preemption):
        self.preemption = preemption

    def before_loop(self, step: int) -> None:
        self.preemption.check(step)

    def __call__(self, step: int, record: Metrics) -> None:
        self.preemption.check(step)


class TrackObjective(Action):
    """The objective's best value (with `save_best`, its checkpoint) and early
    stopping, from the records that hold `objective`: eval metrics at
    evaluations, training metrics at log steps.

    `state` keeps what is known across a resume (read() -> dict, write(dict);
    checkpointing.ObjectiveState saves it with every checkpoint), so this
    action must come before the actions that save. Every worker of a
    synchronous cluster sees the same record (metrics are reduced over all
    replicas), so all of them save a best checkpoint, and stop, at the same
    step. Early stopping follows Keras' EarlyStopping: the run stops once
    `patience` records in a row have not beaten the best by more than
    `min_delta`; the best checkpoint is the strictly best value.
    """

    def __init__(
        self,
        objective: str,
        lower_is_better: bool,
        state,
        *,
        save_best: Optional[Callable[[int], object]] = None,
        patience: Optional[int] = None,
        min_delta: float = 0.0,
    ):
        self.objective, self.lower_is_better, self.state = objective, lower_is_better, state
        self.save_best, self.patience, self.min_delta = save_best, patience, min_delta
        self.stop_requested: Optional[str] = None

    def better(self, value: float, than: Optional[float], by: float = 0.0) -> bool:
        if than is None:
            return value == value  # NaN is never an improvement
        return value < than - by if self.lower_is_better else value > than + by

    def exhausted(self) -> bool:
        """Whether the state (of a restored checkpoint) says patience ran out."""
        return self.patience is not None and self.state.read()["waited"] >= self.patience

    def __call__(self, step: int, record: Metrics) -> None:
        if self.objective not in record:
            return
        value, state = float(record[self.objective]), self.state.read()
        new_best = self.better(value, state["best"])
        if new_best:
            state.update(best=value, best_step=step)
        if self.patience is not None:
            if self.better(value, state["reference"], self.min_delta):
                state.update(reference=value, waited=0)
            else:
                state["waited"] += 1
        self.state.write(state)  # before any save of this step: the checkpoints carry it
        if new_best and self.save_best:
            self.save_best(step)
        if self.patience is not None and state["waited"] >= self.patience:
            self.stop_requested = self.reason(state)

    def reason(self, state: dict) -> str:
        """Why the run stopped early, as its summary says it."""
        best = (
            f"best {state['best']:.6g} at step {state['best_step']}" if state["best"] is not None else "never a number"
        )
        return (
            f"{self.objective} has not improved by more than {self.min_delta:g} for {self.patience} "
            f"evaluation{'s' if self.patience != 1 else ''} ({best})"
        )


@dataclass
class Schedule:
    """When things happen, in optimizer steps."""

    steps: int
    steps_per_loop: int
    log_every: int
    eval_every: int  # 0: only at the end

    def next_stop(self, step: int) -> int:
        """The next step at which the loop must come back to Python to log or evaluate."""
        stops = [self.steps, step + self.steps_per_loop, _next_multiple(step, self.log_every)]
        if self.eval_every:
            stops.append(_next_multiple(step, self.eval_every))
        return min(stops)

    def logs_at(self, step: int) -> bool:
        return step % self.log_every == 0 or step == self.steps

    def evaluates_at(self, step: int) -> bool:
        return bool(self.eval_every and step % self.eval_every == 0) or step == self.steps

    def records_at(self, step: int) -> bool:
        """Whether the loop makes a record at `step` (it logs or evaluates there)."""
        return self.logs_at(step) or self.evaluates_at(step)

    def records_until(self, step: int) -> int:
        """How many records the steps 1..`step` make: the Keras epoch that
        begins after `step` is numbered so (epochs 0, 1, 2 ..., one per
        record), on a resumed run too, whatever stopped it where."""
        if step <= 0:
            return 0
        made = step // self.log_every
        if self.eval_every:
            made += step // self.eval_every - step // math.lcm(self.log_every, self.eval_every)
        if (
            step >= self.steps
            and self.steps % self.log_every
            and not (self.eval_every and self.steps % self.eval_every == 0)
        ):
            made += 1  # the last step records, whatever the cadence
        return made

    def epoch_start(self, step: int) -> int:
        """The step after which the epoch holding step + 1 began: the last record at or before `step` (0: none)."""
        starts = [step // self.log_every * self.log_every]
        if self.eval_every:
            starts.append(step // self.eval_every * self.eval_every)
        if step >= self.steps:
            starts.append(self.steps)
        return max(starts)


@dataclass
class RunningRecord:
    """The training metrics' sums (the runner's arrays) since the last log
    (`window`, and the seconds its steps took) and since the last record
    (`epoch`: what `train_metrics` hands the actions). Saved with every
    checkpoint (checkpointing.RunningRecordState), so that a record that
    spans a resume sums the steps before it too, as an uninterrupted run's."""

    window: Optional[object] = None
    window_time: float = 0.0
    epoch: Optional[object] = None

    def fits(self, size: int) -> bool:
        """Whether the sums are of a metric set of `size` values (a resume
        with other metrics: the sums restart, said once)."""
        return all(sums is None or len(sums) == size for sums in (self.window, self.epoch))


@dataclass
class Result:
    step: int
    train: Metrics = field(default_factory=dict)
    eval: Metrics = field(default_factory=dict)
    examples_per_sec: float = 0.0
    wall_time_sec: float = 0.0
    stopped_early: Optional[dict] = None  # {"step", "reason"}: an action asked the loop to stop


class Loop:
    def __init__(
        self,
        runner,
        schedule: Schedule,
        step_counter,
        actions: Iterable[Action] = (),
        *,
        learning_rate_at: Optional[Callable[[int], float]] = None,
        running: Optional[RunningRecord] = None,
    ):
        """`step_counter`: steps completed, saved with the checkpoint (a
        tf.Variable). `actions` are called in order after each call of the
        runner. `running`: the running record, as the checkpoint resumed
        from left it (a new one: nothing summed yet)."""
        self.runner, self.schedule, self.step_counter = runner, schedule, step_counter
        self.actions: List[Action] = list(actions)
        self.learning_rate_at = learning_rate_at
        self.running = running if running is not None else RunningRecord()

    def next_stop(self, step: int) -> int:
        stops = [self.schedule.next_stop(step)]
        for action in self.actions:
            stop = action.next_stop(step)
            if stop is not None:
                stops.append(stop)
        return min(stops)

    def run(self) -> Result:
        start = time.perf_counter()
        schedule, runner = self.schedule, self.runner
        step = int(self.step_counter.numpy())
        result = Result(step=step)
        running, evaluated_at = self.running, None  # the sums since the last log and the last record (a Keras epoch)
        steady_examples, steady_time, first_call = 0.0, 0.0, True
        watching = [action for action in self.actions if action.wants_train_metrics()]
        for action in self.actions:
            action.before_loop(step)

        while step < schedule.steps:
            num_steps = self.next_stop(step) - step
            for action in self.actions:
                action.before_steps(step)
            t0 = time.perf_counter()
            totals = runner.train(step, num_steps)
            elapsed = time.perf_counter() - t0
            step += num_steps
            self.step_counter.assign(step)
            for action in self.actions:
                action.after_steps(step)
            running.window = totals if running.window is None else running.window + totals
            running.window_time += elapsed
            if not first_call:  # the first call includes tracing
                steady_examples += runner.examples(totals)
                steady_time += elapsed
            first_call = False
            if watching:  # on the host, from the sums the call returned: no step of the device's
                running.epoch = totals if running.epoch is None else running.epoch + totals
                since_record = runner.results(running.epoch)
                for action in watching:
                    action.train_metrics(step, since_record)

            record: Metrics = {}
            if schedule.logs_at(step):
                record.update(runner.results(running.window))
                if self.learning_rate_at:
                    record["lr"] = self.learning_rate_at(step)
                record["examples_per_sec"] = runner.examples(running.window) / max(running.window_time, 1e-9)
                result.train = dict(record)
                running.window, running.window_time = None, 0.0
            if schedule.evaluates_at(step):
                result.eval, evaluated_at = runner.evaluate(), step
                record.update(result.eval)
            if schedule.records_at(step):
                running.epoch = None
            try:
                for action in self.actions:
                    action(step, record)
            except PluginFailed as failure:
                raise self._kept_after(failure, step) from failure.__cause__
            reasons = [reason for reason in (action.stop_requested for action in self.actions) if reason]
            if reasons:
                result.stopped_early = {"step": step, "reason": reasons[0]}
                break

        result.step = step
        if not result.eval or (
            result.stopped_early and evaluated_at != step
        ):  # resumed a finished run; stopped between evaluations
            result.eval = runner.evaluate()
        failures = []
        # every one: a callback's failed on_train_end does not keep the last save from being made
        for action in self.actions:
            try:
                action.finish(step)
            except PluginFailed as failure:
                failures.append(failure)
        if failures:
            raise self._kept_after(failures[0], step)
        result.examples_per_sec = (
            steady_examples / steady_time if steady_time > 0 else result.train.get("examples_per_sec", 0.0)
        )
        result.wall_time_sec = time.perf_counter() - start
        return result

    def _kept_after(self, failure: PluginFailed, step: int) -> PluginFailed:
        """A callback or logger failed at `step`: the actions' `failed` hooks
        keep what was trained (a save), and the failure says what they kept."""
        kept = [note for note in (action.failed(step) for action in self.actions) if note]
        return failure.keeping("; ".join(kept)) if kept else failure


def _next_multiple(step: int, every: int) -> int:
    return (step // every + 1) * every
