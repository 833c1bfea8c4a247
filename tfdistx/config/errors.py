"""The one exception a user should ever see from tfdistx, without a traceback.

Anything that is the user's input being wrong (config, dataset name, missing
data offline, a batch that does not divide across the replicas TensorFlow
found) is raised as a ConfigError; the entrypoint prints its lines and exits 2.
A fault of the machine or the cluster that a user must act on (a full disk,
a cluster that did not form) is a RunFault: one line, and its own exit code.
"""

from dataclasses import dataclass
from typing import Any

EXIT_INVALID_CONFIG = 2
EXIT_NOT_RETRYABLE = 3  # a full or read-only disk: a restart would fail the same way
EXIT_CLUSTER_DID_NOT_FORM = 4  # a task did not answer within cluster.startup_timeout
EXIT_LOST_PEER = 5  # a synchronous cluster lost a task mid-run: restarted, resuming
EXIT_PREEMPTED = 42


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
    def one(cls, key: str, value: Any, allowed: str) -> "ConfigError":
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
