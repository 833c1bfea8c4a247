"""How a run's processes start (`cluster.launch`): the one list of the ways,
and the one check of what only tfdistx's own start of the processes gives.

Every side reads it (plain data: neither Hydra nor TensorFlow): the config
side checks `cluster.launch` against it, the spec carries it, and each way
has a room of its own under tfdistx/launch/, named as its value
(tfdistx/launch/__init__.py finds it there). A feature that works only
where tfdistx starts the processes (MPI's tasks, a niced session, elastic
rounds) says so with `Needs`, and `refused` is the one check of it: as
configured, and in a task a scheduler placed under `auto`.

No TensorFlow, no Hydra here.
"""

from dataclasses import dataclass
from enum import Enum
from typing import Any, Iterable, List, Optional, Tuple

from tfdistx.core.errors import Problem


class Starter(Enum):
    """Who starts a run's processes, as a refusal says it."""

    LAUNCHER = "tfdistx's local launcher (cluster.launch=local)"
    AGENTS = "tfdistx's agents, one on every node (cluster.launch=agent)"
    SCHEDULER = "a scheduler"


class LaunchMode(str, Enum):
    """`cluster.launch`: how a process of a multi-process run learns its
    place, and who started it. The value is the config's word and the name
    of its room, tfdistx/launch/<value>; `started_by` is who starts the
    processes under it."""

    # The local launcher, unless this process is one a scheduler placed (its environment says so: the launches'
    # `detected`, tried in their `detect_order`); a task that finds itself so placed checks again (refused).
    AUTO = "auto"
    LOCAL = "local"  # tfdistx starts the cluster's processes on this machine
    TF_CONFIG = "tf_config"  # one task of a cluster placed by TF_CONFIG (a TFJob, by hand)
    JOBSET = "jobset"  # a pod of a Kubernetes JobSet (or a TrainJob): its labels place it
    SLURM = "slurm"  # one task of a Slurm step
    AGENT = "agent"  # its node's agent, which starts the node's worker in each round

    def __str__(self) -> str:  # the config's word in messages and --plan, not "LaunchMode.SLURM"
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    def __repr__(self) -> str:  # a refusal's value, as the config's: cluster.launch='slurm'
        return repr(self.value)

    @property
    def started_by(self) -> Starter:
        return _STARTED_BY[self]

    @property
    def placed_by_a_scheduler(self) -> bool:
        """Its processes are started, and placed, by a scheduler: tfdistx starts none of them."""
        return self.started_by is Starter.SCHEDULER


# Who starts the processes under each mode (a new one is a member above and its line here).
_STARTED_BY = {
    LaunchMode.AUTO: Starter.LAUNCHER,  # unless a scheduler placed this process: then that task checks again
    LaunchMode.LOCAL: Starter.LAUNCHER,
    LaunchMode.TF_CONFIG: Starter.SCHEDULER,
    LaunchMode.JOBSET: Starter.SCHEDULER,
    LaunchMode.SLURM: Starter.SCHEDULER,
    LaunchMode.AGENT: Starter.AGENTS,
}


@dataclass(frozen=True)
class Needs:
    """A feature that works only where tfdistx starts the run's processes: the key and value that ask for it, who
    can start them so (`by`), and what to do instead where another does."""

    key: str
    value: Any
    what: str  # the feature, as a refusal names it: "MPI's communication"
    by: Tuple[Starter, ...]
    instead: str  # "use strategy.communication=ring there"


def refused(needs: Iterable[Optional[Needs]], launch: LaunchMode, placed_by_a_scheduler: bool = False) -> List[Problem]:
    """The features asked for (`needs`, None: not asked) that the processes' starter cannot give: under `launch` as
    configured, or, with `placed_by_a_scheduler`, in a task a scheduler placed (under `auto`, which composes them;
    not a task of tfdistx's own launcher or agents, which started it as each of these needs)."""
    if launch not in set(LaunchMode):
        return []  # refused as cluster.launch, in its own line
    starter = Starter.SCHEDULER if placed_by_a_scheduler else LaunchMode(launch).started_by
    where = (
        "this task was placed by a scheduler"
        if placed_by_a_scheduler
        else f"cluster.launch={launch} has them started by {starter.value}"
    )
    return [
        Problem(
            need.key,
            need.value,
            f"{need.what} needs its processes started by {_either(need.by)}, and {where}: {need.instead}",
        )
        for need in needs
        if need is not None and starter not in need.by
    ]


def _either(starters: Tuple[Starter, ...]) -> str:
    return " or by ".join(starter.value for starter in starters)
