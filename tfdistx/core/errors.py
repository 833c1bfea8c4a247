"""The one exception a user should ever see from tfdistx, without a traceback.

Anything that is the user's input being wrong (config, dataset name, missing
data offline, a batch that does not divide across the replicas TensorFlow
found) is raised as a ConfigError; the entrypoint prints its lines and exits 2.
A fault of the machine or the cluster (a full disk, a port in use, a run
directory another run holds, a cluster that did not form) is a RunFault:
one line, and its own exit code, so that launchers and schedulers can tell
what a retry can cure (RETRYABLE) from what it cannot.
"""

import contextlib
import re
from dataclasses import dataclass
from typing import Any

EXIT_PLUGIN_FAILED = 1  # a callback or logger of the user's raised: not retried (the same code would raise again)
EXIT_INVALID_CONFIG = 2
EXIT_NOT_RETRYABLE = 3  # a full or read-only disk: a restart would fail the same way
EXIT_CLUSTER_DID_NOT_FORM = 4  # a task did not answer within cluster.startup_timeout
EXIT_LOST_PEER = 5  # a synchronous cluster lost a task mid-run: restarted, resuming
EXIT_PORT_IN_USE = 6  # a task's port is taken on its host: a restart on other (or freed) ports can succeed
EXIT_RUN_DIR_LOCKED = 7  # another run holds the run directory: a later try can succeed, once it ends
EXIT_UNSUPPORTED_VERSION = (
    8  # an installed TensorFlow, Keras or Hydra lacks a private API tfdistx uses (tfdistx/internals): never retried
)
EXIT_TOO_FEW_WORKERS = (
    9  # an elastic run had fewer hosts than cluster.elastic.min_workers for below_min_timeout: it waited its bound
)
EXIT_NO_NETWORK = (
    10  # a dataset to download, and no network to download it: a fault of the machine, which no retry cures here
)
EXIT_PREEMPTED = 42
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT, as a shell says it): the user stopped the run; never retried
# The signals that, like SIGTERM, mean "checkpoint and leave with EXIT_PREEMPTED" (cluster.notice_signals, named as
# Slurm's --signal names them): USR1 by default, so that Slurm's time-limit notice (`sbatch --signal=B:USR1@120`,
# passed on to the step by `tfdistx job slurm`'s script) is one with no override. SIGTERM always is; INT is
# Ctrl-C and HUP a closed terminal, which stop a run; any other signal is left alone.
NOTICE_SIGNALS = ("USR1", "USR2")
DEFAULT_NOTICE_SIGNALS = ("USR1",)
# The codes a restart can cure. `cluster.retryable_exit_offset` is added to
# them, for a scheduler that retries only some codes: Kubernetes' restartPolicy
# ExitCode retries 128-255 and treats 1-127 as permanent (kubernetes.py).
RETRYABLE = (EXIT_CLUSTER_DID_NOT_FORM, EXIT_LOST_PEER, EXIT_PORT_IN_USE, EXIT_RUN_DIR_LOCKED, EXIT_PREEMPTED)
# The codes no restart can cure: the same code, config, disk or install fails the same way again. The one list
# of them: the local launcher never restarts them (cluster/supervisor.py), a JobSet's failure policy fails the set
# on them (launch/jobset.py), and a TFJob's pods leave with them below 128, where the operator does not
# retry (launch/kubernetes.py: only RETRYABLE is moved up).
PERMANENT = (EXIT_PLUGIN_FAILED, EXIT_INVALID_CONFIG, EXIT_NOT_RETRYABLE, EXIT_UNSUPPORTED_VERSION, EXIT_NO_NETWORK)
RETRYABLE_EXIT_OFFSET_FOR_KUBERNETES = 128  # 42 -> 170, 4 -> 132, 5 -> 133, 6 -> 134, 7 -> 135
MAX_RETRYABLE_EXIT_OFFSET = 255 - max(RETRYABLE)


def interrupted(error: BaseException) -> bool:
    """Is `error` Ctrl-C in disguise? A KeyboardInterrupt raised while a C
    function was calling back into Python comes out of it wrapped: CPython's
    SystemError "... returned a result with an exception set", the interrupt
    its cause (a worker interrupted inside numpy's __array__ says so)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


@dataclass(frozen=True)
class Problem:
    key: str
    value: Any
    allowed: str

    def __str__(self) -> str:
        return f"{self.key}={self.value!r}: {self.allowed}"


class ConfigError(Exception):
    def __init__(self, problems):
        self.problems = list(problems)
        super().__init__("; ".join(map(str, self.problems)))

    @classmethod
    def for_key(cls, key: str, value: Any, allowed: str) -> "ConfigError":
        return cls([Problem(key, value, allowed)])

    def lines(self) -> list:
        return [f"tfdistx: invalid config: {p}" for p in self.problems]


class RunFault(Exception):
    """A run stopped by its environment, not its config: one line, and `code`."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code

    def lines(self) -> list:
        return [f"tfdistx: {self}"]


class PluginFailed(RunFault):
    """A callback or logger (the user's code, or one tfdistx ships) raised.
    `what`: the line naming it; the training loop adds what it kept of the
    steps trained (`kept`) before the run stops."""

    def __init__(self, what: str, kept: str = "the newest checkpoint is kept, and a rerun resumes from it"):
        super().__init__(f"{what}; {kept}", EXIT_PLUGIN_FAILED)
        self.what = what

    def keeping(self, kept: str) -> "PluginFailed":
        """The same failure, saying what was kept."""
        return PluginFailed(self.what, kept).with_traceback(self.__traceback__)


def offset_exit(code: int, offset: int) -> int:
    """`code` as the process leaves with it: a retryable one moved up by `offset`."""
    return code + offset if code in RETRYABLE else code


@contextlib.contextmanager
def retryable_exits_offset_by(offset: int):
    """The process's retryable exit codes (RETRYABLE) moved up by `offset`,
    whether they leave as a RunFault or as a SystemExit (preemption)."""
    try:
        yield
    except RunFault as fault:
        fault.code = offset_exit(fault.code, offset)
        raise
    except SystemExit as leaving:
        if offset_exit(leaving.code, offset) != leaving.code:
            raise SystemExit(offset_exit(leaving.code, offset)) from None
        raise


_COLOURS = re.compile(r"\x1b\[[0-9;]*m")


def first_line(error: BaseException, most: int = 300) -> str:
    """The line of an error that says what went wrong, for a message of one line: its first line that is not
    blank (TensorFlow's errors say it in `.message`), without terminal colours or the tensors' values Keras
    prints after it; where Keras wraps an error raised in a layer's call under `Exception encountered when
    calling X.call().`, the cause below it, and where. Cut at `most` characters; the error's type when it says
    nothing."""
    text = getattr(error, "message", None)
    if not isinstance(text, str) or not text.strip():
        text = str(error)
    lines = [line for line in (_COLOURS.sub("", line).strip() for line in text.splitlines()) if line]
    if not lines:
        return type(error).__name__
    if len(lines) > 1 and lines[0].startswith("Exception encountered when calling"):
        return f"{_no_values(lines[1])[:most]} (in {lines[0].split('calling ', 1)[1].rstrip('.')})"
    return _no_values(lines[0])[:most]


def _no_values(line: str) -> str:
    """A reason without the tensors' values Keras prints after it."""
    return line.split(" Inputs received:")[0].split("<tf.Tensor")[0].rstrip(" :[(") or line
