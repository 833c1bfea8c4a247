"""What the agents and the keeper of their rounds say to each other
(round_keeper.py keeps the rounds, node.py's agents beat): an agent's
status and beat, the keeper's news of the rounds and an agent's place in
one, as wire fields (keeper_wire.py carries them). No TensorFlow here.
"""

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

# A node's status, as its agent reports it at each beat.
WAITING = "waiting"  # ready for the next round: its tasks have ended, its port is free
RUNNING = "running"  # its tasks run in round `round`
FAILED = "failed"  # its task failed in round `round` with `code`
DONE = "done"  # its tasks finished the training in round `round`
ENDED = "ended"  # the agent has stopped: lost to every round from now on
STATUSES = (WAITING, RUNNING, FAILED, DONE, ENDED)

# Why a round closed (Round.why).
LOST, TASK_FAILED, GROW, FINISHED = "lost", "failed", "grow", "done"

BEAT_SECONDS = 1.0  # an agent's beat while the cluster is small (at most a third of lost_bound)
# What the keeper takes in a second before it asks each agent to beat less often (up to a quarter of lost_bound):
# a beat costs the keeper tens of microseconds (docs/performance.md), so this is a tenth of a core or less.
BEATS_PER_SECOND = 1000


def beat_seconds(agents: int, lost_bound: float) -> float:
    """How often each of `agents` agents beats: once a second while the keeper takes fewer than
    BEATS_PER_SECOND, then less often, at most every quarter of lost_bound; never more than a third of lost_bound
    (a node is lost after lost_bound without a beat: it must be able to miss two)."""
    floor = min(BEAT_SECONDS, lost_bound / 3)
    return max(floor, min(agents / BEATS_PER_SECOND, lost_bound / 4))


@dataclass(frozen=True)
class Beat:
    """One beat of the agent named `agent` (a restarted agent has a new
    name), on the host at `address`: its worker's port for the next round,
    its status, the round its tasks run in and their exit code, the version
    of the round it last heard of, and the digest of the run's config as it
    runs it ("": not checked)."""

    agent: str
    address: str
    port: int
    status: str
    round: int = 0
    code: int = 0
    known: int = 0
    config: str = ""

    def fields(self) -> dict:
        """Its wire form."""
        return {
            "agent": self.agent,
            "address": self.address,
            "port": self.port,
            "status": self.status,
            "round": self.round,
            "code": self.code,
            "known": self.known,
            "config": self.config,
        }

    @classmethod
    def read(cls, fields: dict) -> "Beat":
        """From its wire form; ValueError naming what is not as it should be."""
        try:
            beat = cls(**{key: fields[key] for key in cls.__dataclass_fields__})
        except (KeyError, TypeError) as error:
            raise ValueError(f"a beat without {error}") from None
        for key in ("agent", "address", "status", "config"):
            if not isinstance(getattr(beat, key), str):
                raise ValueError(f"{key} is not a string")
        for key in ("port", "round", "code", "known"):
            if not isinstance(getattr(beat, key), int) or isinstance(getattr(beat, key), bool):
                raise ValueError(f"{key} is not a whole number")
        if beat.status not in STATUSES:
            raise ValueError(f"status {beat.status!r}")
        if not 0 < beat.port < 65536:
            raise ValueError(f"port {beat.port}")
        return beat


@dataclass(frozen=True)
class Stopped:
    """The run ended without its training done: the code every agent stops with, and why."""

    code: int
    why: str


@dataclass(frozen=True)
class News:
    """The rounds as the agents are told of them, at a version: the current
    round's number, why it closed (None while it runs), the failed task's
    code, the members lost (task -> address) and the addresses asking to
    join; and the run's end, if it stopped."""

    number: int
    why: Optional[str] = None
    code: int = 0
    lost: Dict[str, str] = field(default_factory=dict)
    joining: List[str] = field(default_factory=list)
    stopped: Optional[Stopped] = None

    @property
    def finished(self) -> bool:
        return self.why == FINISHED

    def fields(self) -> dict:
        return {
            "number": self.number,
            "why": self.why,
            "code": self.code,
            "lost": self.lost,
            "joining": self.joining,
            "stopped": None if self.stopped is None else {"code": self.stopped.code, "why": self.stopped.why},
        }

    @classmethod
    def read(cls, fields: dict) -> "News":
        stopped = fields.get("stopped")
        return cls(
            int(fields["number"]),
            fields.get("why"),
            int(fields.get("code", 0)),
            dict(fields.get("lost") or {}),
            list(fields.get("joining") or []),
            None if stopped is None else Stopped(int(stopped["code"]), str(stopped["why"])),
        )


@dataclass(frozen=True)
class Place:
    """An agent's place in round `number`: its worker's index (worker:0 is
    the chief), every worker's "host:port", and the servers the keeper's
    node runs beside its worker (job -> ["host:port"])."""

    number: int
    index: int
    workers: List[str]
    servers: Dict[str, List[str]]

    @classmethod
    def read(cls, fields: dict) -> "Place":
        return cls(int(fields["number"]), int(fields["index"]), list(fields["workers"]), dict(fields["servers"]))


@dataclass(frozen=True)
class Told:
    """The keeper's answer to a beat: how often to beat, the version of the
    round, the round's news when the agent's version was older, its place
    when a round formed with it, why it waits when it is in no round
    (a kind, said once by the agent, and a line), and why it was refused
    (its config is not the run's)."""

    beat: float
    version: int
    news: Optional[News] = None
    place: Optional[Place] = None
    wait: Optional[Tuple[str, str]] = None
    refused: Optional[str] = None

    @classmethod
    def read(cls, fields: dict) -> "Told":
        wait = fields.get("wait")
        return cls(
            float(fields["beat"]),
            int(fields["version"]),
            None if fields.get("news") is None else News.read(fields["news"]),
            None if fields.get("place") is None else Place.read(fields["place"]),
            None if wait is None else (str(wait[0]), str(wait[1])),
            fields.get("refused"),
        )
