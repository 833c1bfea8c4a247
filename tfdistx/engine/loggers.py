"""Where metrics go: the terminal, metrics.jsonl, metrics.csv, TensorBoard, Weights & Biases, MLflow.

Each logger is a callable `(step, metrics)`; the training loop calls them
all at every log or eval step and knows none of them. `for_run` opens the
ones a run's `logger` config asks for: metrics.jsonl, the built-in ones
that are on (each a class of tfdistx/loggers/: opened by its dotted path,
as a user's logger is, with its keys and what it takes of the run's
run_dir, config, total_steps and start_step), and the user's own, each named, so
that one that raises stops the run in one line naming it. The run directory's other files are
written by whole_files.py; the log file is log_files.py's.
"""

import contextlib
import inspect
import logging
from pathlib import Path
from typing import Callable, List, Optional

from tfdistx.core.errors import ConfigError, PluginFailed, RunFault, first_line, interrupted
from tfdistx.core.run_spec import Logger
from tfdistx.core.targets import Target, locate
from tfdistx.loggers import RUNTIME
from tfdistx.loggers.sinks import JsonlLogger
from tfdistx.log_files import log_files
from tfdistx.rundir import cannot_write

log = logging.getLogger(__name__)

JSONL_KEY = "metrics.jsonl"  # the logger every chief has (no key turns it off): named by its file


@contextlib.contextmanager
def for_run(
    run_dir: Path, asked: Logger, total_steps: int, start_step: int, enabled: bool = True, config: Optional[dict] = None
):
    """The loggers the logger group asks for, each GuardedLogger (one that raises
    stops the run in one line naming it), closed on exit; none unless
    `enabled` (only the chief writes the run directory)."""
    sinks: List[GuardedLogger] = []
    log_files()  # a full disk under the run's log file is one line, not a traceback per line

    def opened(key: str, make, *args, **kwargs) -> None:
        sinks.append(GuardedLogger.opening(key, start_step, make, *args, **kwargs))

    try:
        if enabled:
            opened(JSONL_KEY, JsonlLogger, str(run_dir / "metrics.jsonl"), resume_step=start_step)
            runtime = dict(zip(RUNTIME, (run_dir, config or {}, total_steps, start_step)))
            for name, target in asked.on.items():  # tfdistx/loggers/' built_in() order
                make = locate(target.path)
                opened(f"logger.{name}", make, **target.kwargs, **_taken(make, runtime))
            for name, target in asked.own.items():
                sinks.append(
                    GuardedLogger(
                        f"logger.{name}", target.path, own_logger(name, target, run_dir, config or {}), start_step
                    )
                )
    except BaseException:
        _close_all(sinks, failing=True)
        raise
    try:
        yield sinks
    except BaseException:
        _close_all(sinks, failing=True)  # what ended the run is its one line; a close that fails too is a warning
        raise
    _close_all(sinks, failing=False)


def finished(sinks: List["GuardedLogger"]) -> None:
    """Tell the loggers that take it (a `finished()` of theirs) that the run
    has ended well: its summary.json and export are written (W&B's summary
    and model artifact)."""
    for sink in sinks:
        if hasattr(sink, "finished"):
            sink.finished()


def _taken(make, runtime: dict) -> dict:
    """Of what the run passes a built-in logger, what `make` takes (its keys it takes all of)."""
    parameters = inspect.signature(make).parameters
    return {key: value for key, value in runtime.items() if key in parameters}


def _close_all(sinks: List["GuardedLogger"], failing: bool) -> None:
    """Every logger closed, even after one that fails to close: the first
    failure is raised once all are closed, unless the run is failing
    already (its own fault is the line that counts; a close that fails
    too is one warning line)."""
    faults = []
    for sink in sinks:
        try:
            sink.close()
        except Exception as error:  # PluginFailed; a full disk as a logger closes (its own line, from the run's guard)
            if failing:
                log.warning(
                    "%s",
                    error if isinstance(error, PluginFailed) else f"{sink.key} could not close: {first_line(error)}",
                )
            else:
                faults.append(error)
    if faults:
        raise faults[0]


class GuardedLogger:
    """A logger as the loop calls it: `(step, metrics)` at each record,
    `after_steps` if it has it, `close()`. A call that raises stops the run
    with one line naming the logger, as a callback that raises does:
    `logger.NAME (TARGET) raised ValueError at step N: ...`, a PluginFailed
    (a code no launcher retries: the same code would raise again), after
    which the loop saves the steps trained. One that raises in after_steps
    (between records, where the loop cannot stop in step with a cluster's
    other workers) is held until the next record. A disk that cannot be
    written (full, read-only, a file-size limit) is not the logger's fault:
    that error passes on as it is, to the one line and exit code of a full disk."""

    def __init__(self, key: str, target: str, sink, step: int):
        self.key, self.target, self.sink, self.step = key, target, sink, step
        self.held: Optional[PluginFailed] = None
        if hasattr(sink, "after_steps"):  # the loop's Log passes the hook on only to those that have it
            self.after_steps = self._holding(sink.after_steps)
        if hasattr(sink, "finished"):  # after the chief's summary.json and export (finished() below)
            self.finished = lambda: self._raising(lambda step: sink.finished(), self.step)

    @classmethod
    def opening(cls, key: str, step: int, make, *args, **kwargs) -> "GuardedLogger":
        """A built-in logger, opened: one that fails to open is named as one that fails later is
        (by its class, where `make` is a classmethod of it)."""
        owner = make.__self__ if isinstance(getattr(make, "__self__", None), type) else make
        target = f"{owner.__module__}.{owner.__qualname__}"
        try:
            sink = make(*args, **kwargs)
        except (ConfigError, RunFault):
            raise
        except Exception as error:
            if cannot_write(error):
                raise
            raise cls(key, target, None, step)._failure(error, "as it opened") from error
        return cls(key, target, sink, step)

    def __call__(self, step: int, metrics: dict) -> None:
        if self.held:
            raise self.held
        self._raising(self.sink, step, metrics)

    def close(self) -> None:
        close = getattr(self.sink, "close", None)
        if close is not None:
            self._raising(lambda step: close(), self.step)

    def _raising(self, call: Callable, step: int, *args) -> None:
        self.step = step
        try:
            call(step, *args)
        except (ConfigError, RunFault):
            raise
        except Exception as error:
            if interrupted(error):  # Ctrl-C while the logger ran: not the logger's failure
                raise KeyboardInterrupt from None
            if cannot_write(error):
                raise
            raise self._failure(error, f"at step {step}") from error

    def _holding(self, call: Callable) -> Callable:
        def held(step: int) -> None:
            if self.held is None:
                try:
                    self._raising(call, step)
                except PluginFailed as failure:
                    self.held = failure

        return held

    def _failure(self, error: Exception, when: str) -> PluginFailed:
        message = first_line(error)
        return PluginFailed(
            f"{self.key} ({self.target}) raised {type(error).__name__} {when}{': ' + message[:300] if message else ''}"
        )


def own_logger(name: str, target: Target, run_dir: Path, config: dict):
    """A user's logger (`logger.NAME._target_`): built with its keys (and
    `run_dir` and `config`, the run's resolved config, where it takes them);
    called as every logger is, `(step, metrics)` at each record, and closed
    with its `close()` if it has one."""
    built = target.build(object, run_dir=run_dir, config=config)
    if not callable(built):
        raise ConfigError.for_key(
            f"logger.{name}._target_", target.path, "must build a callable (step, metrics), with an optional close()"
        )
    return built
