"""The outer training loop (cf. Orbit's Controller): run steps, then act.

The loop asks a step runner (runner.py) for as many steps as it can run
before the next action is due, then takes the actions that `Schedule` says
are due at that step: log, evaluate, checkpoint, and check for preemption.
It knows no TensorFlow and no Hydra: a runner, a step counter with
`assign`, and callables are all it takes, so a notebook or a unit test can
drive it.
"""

import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

Metrics = Dict[str, float]


@dataclass
class Schedule:
    """When things happen, in optimizer steps."""

    steps: int
    steps_per_loop: int = 100
    log_every: int = 100
    eval_every: int = 0  # 0: only at the end
    checkpoint_every: int = 0  # 0: only at the end

    def next_stop(self, step: int) -> int:
        """The next step at which the loop must come back to Python."""
        stops = [self.steps, step + self.steps_per_loop, _next_multiple(step, self.log_every)]
        for every in (self.eval_every, self.checkpoint_every):
            if every:
                stops.append(_next_multiple(step, every))
        return min(stops)

    def logs_at(self, step: int) -> bool:
        return step % self.log_every == 0 or step == self.steps

    def evaluates_at(self, step: int) -> bool:
        return bool(self.eval_every and step % self.eval_every == 0) or step == self.steps

    def checkpoints_at(self, step: int) -> bool:
        return bool(self.checkpoint_every and step % self.checkpoint_every == 0)


@dataclass
class Result:
    step: int
    train: Metrics = field(default_factory=dict)
    eval: Metrics = field(default_factory=dict)
    examples_per_sec: float = 0.0
    wall_time_sec: float = 0.0


class Loop:
    def __init__(self, runner, schedule: Schedule, step_counter, *,
                 learning_rate_at: Optional[Callable[[int], float]] = None,
                 checkpointer=None, preemption=None, loggers: List[Callable[[int, Metrics], None]] = ()):
        """`step_counter`: steps completed, saved with the checkpoint (a tf.Variable).
        `checkpointer.save(step)`, `preemption.check(step)` and each
        `logger(step, metrics)` are the actions."""
        self.runner, self.schedule, self.step_counter = runner, schedule, step_counter
        self.learning_rate_at = learning_rate_at
        self.checkpointer, self.preemption, self.loggers = checkpointer, preemption, list(loggers)

    def run(self) -> Result:
        start = time.perf_counter()
        schedule, runner = self.schedule, self.runner
        step = int(self.step_counter.numpy())
        result = Result(step=step)
        window, window_time = None, 0.0
        steady_examples, steady_time, first_call = 0.0, 0.0, True

        while step < schedule.steps:
            num_steps = schedule.next_stop(step) - step
            t0 = time.perf_counter()
            totals = runner.train(step, num_steps)
            elapsed = time.perf_counter() - t0
            step += num_steps
            self.step_counter.assign(step)
            window = totals if window is None else window + totals
            window_time += elapsed
            if not first_call:  # the first call includes tracing
                steady_examples += runner.examples(totals)
                steady_time += elapsed
            first_call = False

            record: Metrics = {}
            if schedule.logs_at(step):
                record.update(runner.results(window))
                if self.learning_rate_at:
                    record["lr"] = self.learning_rate_at(step)
                record["examples_per_sec"] = runner.examples(window) / max(window_time, 1e-9)
                result.train = dict(record)
                window, window_time = None, 0.0
            if schedule.evaluates_at(step):
                result.eval = runner.evaluate()
                record.update(result.eval)
            if record:
                self._log(step, record)
            if self.checkpointer and schedule.checkpoints_at(step):
                self.checkpointer.save(step)
            if self.preemption:
                self.preemption.check(step)

        result.step = step
        if not result.eval:  # resumed a run that had already finished
            result.eval = runner.evaluate()
        if self.checkpointer:
            self.checkpointer.save(step)
        result.examples_per_sec = steady_examples / steady_time if steady_time > 0 else result.train.get("examples_per_sec", 0.0)
        result.wall_time_sec = time.perf_counter() - start
        return result

    def _log(self, step: int, record: Metrics) -> None:
        record = {k: float(v) for k, v in record.items()}
        for logger in self.loggers:
            logger(step, record)


def _next_multiple(step: int, every: int) -> int:
    return (step // every + 1) * every
