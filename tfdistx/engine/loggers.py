"""Where metrics go: the terminal, metrics.jsonl, metrics.csv, TensorBoard, Weights & Biases, MLflow.

Each logger is a callable `(step, metrics)`; the training loop calls them
all at every log or eval step and knows none of them. `for_run` opens the
ones a run's `logger` config asks for; the run directory's other files
(summary.json, evaluations.jsonl) are written here too.
"""

import contextlib
import csv
import dataclasses
import json
import logging
import math
import netrc
import os
import sys
import threading
import time
from pathlib import Path
from typing import Callable, List, Optional, Tuple

from tfdistx.config.errors import ConfigError, PluginFailed, RunFault, interrupted
from tfdistx.config.spec import Logger
from tfdistx.config.targets import Target
from tfdistx.rundir import cannot_write
from tfdistx.whole_files import append_whole, keep_steps_up_to, read_jsonl, replacing
from tfdistx.whole_files import write_json  # noqa: F401  (commands/execute.py imports it from here)

log = logging.getLogger(__name__)

JSONL_KEY = "metrics.jsonl"  # the logger every chief has (no key turns it off): named by its file


@contextlib.contextmanager
def for_run(run_dir: Path, asked: Logger, total_steps: int, start_step: int, enabled: bool = True, config: Optional[dict] = None):
    """The loggers the logger group asks for, each Named (one that raises
    stops the run in one line naming it), closed on exit; none unless
    `enabled` (only the chief writes the run directory)."""
    sinks: List[Named] = []
    log_files()  # a full disk under the run's log file is one line, not a traceback per line

    def opened(key: str, make, *args, **kwargs) -> None:
        sinks.append(Named.opening(key, start_step, make, *args, **kwargs))

    try:
        if enabled:
            opened(JSONL_KEY, JsonlLogger, str(run_dir / "metrics.jsonl"), resume_step=start_step)
            if asked.console:
                opened("logger.console", ConsoleProgress, total_steps, start_step=start_step)
            if asked.csv:
                opened("logger.csv", CsvLogger, run_dir / "metrics.csv", resume_step=start_step)
            if asked.tensorboard:
                opened("logger.tensorboard", TensorBoardLogger, str(run_dir / "tensorboard"))
            if asked.wandb:
                opened("logger.wandb", WandbLogger, str(run_dir), config or {}, **dataclasses.asdict(asked.wandb))
            if asked.mlflow:
                from tfdistx.engine.mlflow_logger import MlflowLogger  # MLflow's client only when it is on

                opened("logger.mlflow", MlflowLogger, run_dir, config or {}, checkpoint_dir=_checkpoint_dir(run_dir, config or {}),
                       logged=[record for _, record in read_jsonl(run_dir / "metrics.jsonl")], **dataclasses.asdict(asked.mlflow))
            for name, target in asked.own.items():
                sinks.append(Named(f"logger.{name}", target.path, own_logger(name, target, run_dir, config or {}), start_step))
    except BaseException:
        _close_all(sinks, failing=True)
        raise
    try:
        yield sinks
    except BaseException:
        _close_all(sinks, failing=True)  # what ended the run is its one line; a close that fails too is a warning
        raise
    _close_all(sinks, failing=False)


def _checkpoint_dir(run_dir: Path, config: dict) -> Path:
    """Where the run's checkpoints are (the resolved config's checkpoint.dir, else the run dir's)."""
    return Path((config.get("checkpoint") or {}).get("dir") or run_dir / "checkpoints")


def _close_all(sinks: List["Named"], failing: bool) -> None:
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
                log.warning("%s", error if isinstance(error, PluginFailed) else f"{sink.key} could not close: {_first_line(error)}")
            else:
                faults.append(error)
    if faults:
        raise faults[0]


class Named:
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

    @classmethod
    def opening(cls, key: str, step: int, make, *args, **kwargs) -> "Named":
        """A built-in logger, opened: one that fails to open is named as one that fails later is."""
        target = f"{make.__module__}.{make.__qualname__}"
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
        message = _first_line(error)
        return PluginFailed(f"{self.key} ({self.target}) raised {type(error).__name__} {when}{': ' + message[:300] if message else ''}")


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


def own_logger(name: str, target: Target, run_dir: Path, config: dict):
    """A user's logger (`logger.NAME._target_`): built with its keys (and
    `run_dir` and `config`, the run's resolved config, where it takes them);
    called as every logger is, `(step, metrics)` at each record, and closed
    with its `close()` if it has one."""
    built = target.build(object, run_dir=run_dir, config=config)
    if not callable(built):
        raise ConfigError.one(f"logger.{name}._target_", target.path, "must build a callable (step, metrics), with an optional close()")
    return built


class ConsoleProgress:
    """One line per log step: step, loss, metrics, examples/s and ETA.

    Plain lines (no carriage returns or colours), so the output reads the
    same in a CI log, a Slurm output file or `| tee`. On a terminal (a TTY)
    a status line sits under them as well: the step, steps/s, time left and
    time taken, redrawn in place after every call of the steps and once a
    second while a call runs (a thread: the main one is inside TensorFlow
    then), as Keras' and Lightning's progress bars are. Its step is the
    last one done, and its rate and time left are measured over the steps
    done so far in this process.
    """

    def __init__(self, total_steps: int, stream=None, start_step: int = 0, live: Optional[bool] = None):
        self.total_steps = total_steps
        self.stream = stream or sys.stdout
        self.width = len(str(total_steps))
        self.last_time: Optional[float] = None
        self.last_step: Optional[int] = None
        self.live = _is_a_terminal(self.stream) if live is None else live
        self.step, self.started = start_step, time.monotonic()
        self.first: Optional[Tuple[int, float]] = None  # (step, time) of the first call's end: the rate leaves out tracing
        self.lock, self.stopped = threading.Lock(), threading.Event()
        if self.live:
            threading.Thread(target=self._redraw_every_second, name="tfdistx-progress", daemon=True).start()

    def __call__(self, step: int, metrics: dict) -> None:
        now = time.monotonic()
        parts = [f"step {step:>{self.width}}/{self.total_steps}"]
        parts += [f"{k} {fixed_width(v)}" for k, v in metrics.items() if k not in ("examples_per_sec", "lr")]
        if "examples_per_sec" in metrics:
            parts.append(f"{metrics['examples_per_sec']:>7,.0f} ex/s")
        if self.last_time is not None and step > self.last_step:
            seconds_per_step = (now - self.last_time) / (step - self.last_step)
            parts.append(f"ETA {_duration(seconds_per_step * (self.total_steps - step))}")
        self.last_time, self.last_step = now, step
        line = "  ".join(parts)
        with self.lock:  # the line goes above the status line, which is drawn again under it
            self.stream.write(("\r\033[K" if self.live else "") + line + "\n")
            self._draw()
        into_log_files(line, name="tfdistx.progress")

    def after_steps(self, step: int) -> None:
        """The loop's hook, after every call of the steps (loop.Log passes it on)."""
        with self.lock:
            self.step = step
            if self.first is None:
                self.first = (step, time.monotonic())
            self._draw()

    def close(self) -> None:
        self.stopped.set()
        with self.lock:
            if self.live:
                self.stream.write("\r\033[K")
            self.stream.flush()

    def status(self) -> str:
        now = time.monotonic()
        parts = [f"step {self.step:>{self.width}}/{self.total_steps}"]
        if self.first is not None and self.step > self.first[0] and now > self.first[1]:
            rate = (self.step - self.first[0]) / (now - self.first[1])
            parts += [f"{rate:,.1f} steps/s", f"ETA {_duration((self.total_steps - self.step) / rate)}"]
        parts.append(f"{_duration(now - self.started)} elapsed")
        return "  ".join(parts)

    def _draw(self) -> None:
        if self.live:
            self.stream.write("\r\033[K" + self.status())
        self.stream.flush()

    def _redraw_every_second(self) -> None:
        while not self.stopped.wait(1.0):
            with self.lock:
                self._draw()


NUMBER_WIDTH = 7  # a metric's value on a step line: 4 significant digits fill it from 0.01 to 999999


def fixed_width(value: float) -> str:
    """A metric's value with 4 significant digits, trailing zeros kept,
    right-aligned in NUMBER_WIDTH characters, so that a column of step
    lines lines up (`1.300` above `0.9639`, not `1.3`). Values below 0.001
    or from a million up take an exponent (`2.500e-04`)."""
    if not math.isfinite(value):
        return f"{value}".rjust(NUMBER_WIDTH)  # nan, inf
    if value == 0:
        return "0.000".rjust(NUMBER_WIDTH)
    magnitude = math.floor(math.log10(abs(value)))
    if magnitude < -3 or magnitude > 5:
        return f"{value:.3e}".rjust(NUMBER_WIDTH)
    if math.floor(math.log10(abs(float(f"{value:.3e}")))) > magnitude:  # rounds up a digit (9.9996 -> 10.00)
        magnitude += 1
    return f"{value:.{max(0, 3 - magnitude)}f}".rjust(NUMBER_WIDTH)


def _is_a_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or file-less stream
        return False


def into_log_files(line: str, level: int = logging.INFO, name: str = "tfdistx") -> None:
    """A line printed on the terminal goes into the run's log file as well
    (a single run's tfdistx.log, which Hydra's file handler writes), so that
    the file holds the run as the terminal showed it: step lines, warnings,
    refusals. Not through `log.info`: the console handler would print it a
    second time. A local cluster's tasks have no file handler: the launcher
    files their output. Imports no TensorFlow (commands use it too)."""
    for handler in log_files():
        handler.emit(logging.LogRecord(name, level, __file__, 0, line, None, None))


def log_files() -> List[logging.FileHandler]:
    """The run's log files (Hydra's file handler), each of which, once its
    disk cannot take more (full, a file-size limit), says so in one line
    instead of Python's `--- Logging error ---` and a traceback per line."""
    handlers = [handler for handler in logging.getLogger().handlers if isinstance(handler, logging.FileHandler)]
    for handler in handlers:
        if not isinstance(handler.handleError, _SaidOnceWhenUnwritable):
            handler.handleError = _SaidOnceWhenUnwritable(handler)
    return handlers


class _SaidOnceWhenUnwritable:
    """A log file handler's handleError: an unwritable disk is one warning
    line (the run's own writes stop it with its line and exit code, or it
    goes on with its lines on the terminal only); any other error is Python's."""

    def __init__(self, handler: logging.Handler):
        self.handler, self.said = handler, False

    def __call__(self, record: logging.LogRecord) -> None:
        cause = cannot_write(sys.exc_info()[1])
        if cause is None:
            logging.Handler.handleError(self.handler, record)
        elif not self.said:
            self.said = True
            print(f"tfdistx: warning: {getattr(self.handler, 'baseFilename', 'the log file')} cannot be written ({cause}): "
                  "the run's lines go on to the terminal only", file=sys.stderr, flush=True)


class JsonlLogger:
    """metrics.jsonl: one JSON object per log step, each line written whole
    (append_whole: a full disk or a file-size limit leaves no half line).

    On resume, lines past the restored step are dropped first (they were
    logged after the last checkpoint and will be trained and logged again),
    so the file never holds a step twice.
    """

    def __init__(self, path: str, resume_step: int = 0):
        self.path = Path(path)
        if self.path.exists():
            keep_steps_up_to(self.path, resume_step)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def __call__(self, step: int, metrics: dict) -> None:
        append_whole(self.fd, (json.dumps({"step": step, **metrics}) + "\n").encode())

    def close(self) -> None:
        os.close(self.fd)


class CsvLogger:
    """metrics.csv: a row per log step, a column per metric (`step` first),
    for a spreadsheet. A metric first seen after the first row (the eval
    metrics, at the first evaluation) adds a column: the file is rewritten
    once, whole, with the rows so far empty in it. On resume, rows past the
    restored step are dropped first, as metrics.jsonl's lines are."""

    def __init__(self, path: Path, resume_step: int = 0):
        self.path = path
        self.columns = ["step"]
        if path.exists():
            columns, rows = self._read()
            self.columns = columns or self.columns
            self._rewrite([row for row in rows if _int_or_none(row.get("step")) is not None and int(row["step"]) <= resume_step])

    def __call__(self, step: int, metrics: dict) -> None:
        row = {"step": step, **metrics}
        new = [key for key in row if key not in self.columns]
        if new:
            rows = self._read()[1] if self.path.exists() else []
            self.columns += new
            self._rewrite(rows + [row])
            return
        with open(self.path, "a", newline="") as file:
            csv.DictWriter(file, self.columns).writerow(row)

    def _read(self):
        with open(self.path, newline="") as file:
            reader = csv.DictReader(file)
            return list(reader.fieldnames or []), list(reader)

    def _rewrite(self, rows) -> None:
        """Written whole, then moved into place: a reader never sees half of it."""
        with replacing(self.path, newline="") as file:
            writer = csv.DictWriter(file, self.columns, restval="")
            writer.writeheader()
            writer.writerows(rows)


def _int_or_none(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


class TensorBoardLogger:
    def __init__(self, logdir: str):
        import tensorflow as tf

        self.tf = tf
        self.writer = tf.summary.create_file_writer(logdir)

    def __call__(self, step: int, metrics: dict) -> None:
        with self.writer.as_default(step=step):
            for key, value in metrics.items():
                name = key if "/" in key else f"train/{key}"
                self.tf.summary.scalar(name, value)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    """Weights & Biases, offline unless an API key is configured.

    Offline runs write under <run dir>/wandb and upload later with
    `wandb sync`; tfdistx never needs the network. An online run that cannot
    reach W&B within `init_timeout` seconds (a key but no network) falls
    back to offline with one warning line: training never waits on it.
    """

    def __init__(self, run_dir: str, config: dict, project: str, entity: Optional[str], mode: Optional[str], tags: Tuple[str, ...],
                 init_timeout: float):
        import wandb

        self.wandb = wandb
        mode = mode or ("online" if _wandb_key_configured() else "offline")
        init = dict(project=project, entity=entity, dir=run_dir, config=config, tags=list(tags), reinit="finish_previous")
        if mode != "online":
            self.run = wandb.init(mode=mode, **init)
            return
        try:  # quiet: its retries would print a screenful; the outcome is said below
            self.run = wandb.init(mode="online", settings=wandb.Settings(init_timeout=init_timeout, silent=True), **init)
            log.info("W&B run: %s", self.run.url)
        except Exception as error:  # wandb's CommError, UsageError, a timeout: all mean "not now"
            log.warning("W&B is unreachable (%s): logging offline to %s/wandb instead; `wandb sync` uploads it later",
                        str(error).strip().splitlines()[0][:160], run_dir)
            self.run = wandb.init(mode="offline", settings=wandb.Settings(silent=True), **init)

    def __call__(self, step: int, metrics: dict) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


def _wandb_key_configured() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"
