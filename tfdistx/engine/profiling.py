"""A profiler trace of chosen steps (`trainer.profile_steps=[START, END]`), as a loop action.

TensorFlow's profiler records every op the traced steps ran, on the host and
the devices, into <logdir>/plugins/profile/<time>/<host>.xplane.pb, where
TensorBoard's Profile tab finds it. The action makes the loop stop at START
and at END (`next_stop`), and starts the profiler right before the runner's
call that follows step START and stops it right after the call that ends at
step END (loop.py's `before_steps`/`after_steps`): the trace holds those
steps and not the evaluation, logging or checkpointing between calls. The
steps themselves are unchanged (the same batches in the same order, the same
weights); only where the loop comes back to Python moves.
"""

import logging
from pathlib import Path

import tensorflow as tf

from tfdistx.engine.loop import Action

log = logging.getLogger(__name__)


class ProfileSteps(Action):
    """`writes`: this process traces (the chief; under parameter servers,
    the coordinator, whose trace shows the steps it schedules, not the
    workers' ops). The other tasks of a synchronous cluster get the action
    too, without tracing: every task must stop the loop at the same steps,
    because each call of the loop ends in a collective (preemption.py)."""

    def __init__(self, start: int, end: int, logdir: str, writes: bool = True, note: str = ""):
        self.start, self.end, self.logdir, self.writes, self.note = start, end, str(logdir), writes, note
        self.tracing_from = None  # the step the running trace started at
        self.done = False
        self.first_step = None  # where the loop started

    def next_stop(self, step: int):
        if step < self.start:
            return self.start
        if step < self.end:
            return self.end
        return None

    def before_steps(self, step: int) -> None:
        self.first_step = step if self.first_step is None else self.first_step
        # START itself, or (a resumed run) the first call inside the span: the trace then starts there
        if self.writes and not self.done and self.tracing_from is None and self.start <= step < self.end:
            try:
                tf.profiler.experimental.start(self.logdir)
            except tf.errors.AlreadyExistsError:  # a profiler of the user's own runs in this process
                log.warning(
                    "trainer.profile_steps: another profiler is running in this process; no trace of steps %d to %d",
                    self.start,
                    self.end,
                )
                self.done = True
                return
            self.tracing_from = step
            if step != self.start:
                log.info(
                    "trainer.profile_steps: the run resumed at step %d, inside [%d, %d]: tracing from step %d",
                    step,
                    self.start,
                    self.end,
                    step,
                )

    def after_steps(self, step: int) -> None:
        if self.tracing_from is not None and step >= self.end:
            self._stop(step)

    def finish(self, step: int) -> None:
        if self.tracing_from is not None:  # the run ended before END: stopped early, or its epochs were fewer steps
            self._stop(step)
        elif self.writes and not self.done:
            ran = (
                f"trained from step {self.first_step} to step {step}"
                if self.first_step is not None
                else "trained no step"
            )
            log.info("trainer.profile_steps=[%d, %d]: no trace: this run %s", self.start, self.end, ran)

    def close(self) -> None:
        """The loop ended by an exception: the trace so far is kept, and the
        profiler is free for a later run in this process (a sweep's next job)."""
        if self.tracing_from is not None:
            self._stop(None)

    def _stop(self, step) -> None:
        tf.profiler.experimental.stop()
        started, self.tracing_from, self.done = self.tracing_from, None, True
        runs = sorted((Path(self.logdir) / "plugins" / "profile").glob("*/"), key=lambda p: p.stat().st_mtime)
        where = runs[-1] if runs else Path(self.logdir) / "plugins" / "profile"
        steps = f"steps {started} to {step}" if step is not None else f"from step {started} until the run failed"
        log.info(
            "profile of %s written to %s: `tensorboard --logdir %s`, Profile tab%s",
            steps,
            where,
            self.logdir,
            self.note,
        )
