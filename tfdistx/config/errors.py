"""The one exception a user should ever see from tfdistx, without a traceback.

Anything that is the user's input being wrong (config, dataset name, missing
data offline, a batch that does not divide across the replicas TensorFlow
found) is raised as a ConfigError; the entrypoint prints its lines and exits 2.
"""

from dataclasses import dataclass
from typing import Any

EXIT_INVALID_CONFIG = 2
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
