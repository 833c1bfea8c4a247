"""The terminal's logger (logger.console): a step line per log step and,
on a terminal, a status line under them: a local cluster's too, whose
chief's output reaches the terminal through its launcher (RELAY_ENV)."""

import math
import os
import sys
import threading
import time
from typing import Optional, Tuple

from tfdistx.log_files import into_log_files
from tfdistx.loggers import BuiltInLogger

# Set by a local cluster's launcher (or an agent) for its tasks when its own standard output is a terminal: the
# chief's output reaches it through a pipe, so the chief sends its status line as a line of its own (STATUS_MARK,
# then the status), which the launcher draws under the run's lines as a single process draws it (cluster/processes.py).
RELAY_ENV = "TFDISTX_STATUS_LINE"
# A private-use character first: no line a run prints starts so, and no line splitter splits at it (str.splitlines
# splits at ASCII's separators).
STATUS_MARK = "\ue000tfdistx-status "


def relayed_status(line: str) -> Optional[str]:
    """The status a relayed status line holds ("" when the status line is to go), or None for any other line."""
    return line[len(STATUS_MARK) :].rstrip("\n") if line.startswith(STATUS_MARK) else None


class ConsoleProgress(BuiltInLogger):
    """One line per log step: step, loss, metrics, examples/s and ETA.

    Plain lines (no carriage returns or colours), so the output reads the
    same in a CI log, a Slurm output file or `| tee`. On a terminal (a TTY)
    a status line sits under them as well: the step, steps/s, time left and
    time taken, redrawn in place after every call of the steps and once a
    second while a call runs (a thread: the main one is inside TensorFlow
    then), as Keras' and Lightning's progress bars are. Its step is the
    last one done, and its rate and time left are measured over the steps
    done so far in this process. A local cluster's chief, whose launcher
    shows a terminal (RELAY_ENV), sends the same status as lines of their
    own for the launcher to draw (`relay`).
    """

    name, on = "console", True

    def __init__(
        self,
        total_steps: int,
        stream=None,
        start_step: int = 0,
        live: Optional[bool] = None,
        relay: Optional[bool] = None,
    ):
        self.total_steps = total_steps
        self.stream = stream or sys.stdout
        self.width = len(str(total_steps))
        self.last_time: Optional[float] = None
        self.last_step: Optional[int] = None
        self.live = _is_a_terminal(self.stream) if live is None else live
        self.relay = not self.live and (os.environ.get(RELAY_ENV) == "1" if relay is None else relay)
        self.step, self.started = start_step, time.monotonic()
        self.first: Optional[Tuple[int, float]] = (
            None  # (step, time) of the first call's end: the rate leaves out tracing
        )
        self.lock, self.stopped = threading.Lock(), threading.Event()
        if self.live or self.relay:
            threading.Thread(target=self._redraw_every_second, name="tfdistx-progress", daemon=True).start()

    @classmethod
    def for_run(cls, total_steps: int, start_step: int = 0) -> "ConsoleProgress":
        """logger.console: on standard output, a status line where that is a terminal."""
        return cls(total_steps, start_step=start_step)

    @classmethod
    def shown(cls, keys) -> str:
        return "terminal"

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
            if self.relay:  # no status left under the lines
                self.stream.write(STATUS_MARK + "\n")
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
        elif self.relay:
            self.stream.write(STATUS_MARK + self.status() + "\n")
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


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"
