"""The rendezvous of per-node agents (cluster.launch=agent): which agents
train together in each round, decided in one place and asked by every agent
over the network (cluster/agent.py).

Kept by one agent, the one on the host `cluster.agent.store` names, and
asked by all: torchrun's default rendezvous (c10d) makes the same choice,
its store a TCP server inside the agent on the endpoint's host. The two
other choices, and why not:
- files on the shared run directory (which checkpoints already need): a node
  cut off from its peers may still reach the file server, and would go on
  beating there while its tasks can reach no one; nodes' clocks would have
  to agree to judge a heartbeat's age;
- etcd: one more service to deploy and keep, and no PyPI package ships it.
The cost is torchrun's too: the run lives as long as the keeper's node. An
agent that cannot reach the keeper for `lost_bound` stops its tasks, and
waits for it at most `below_min_timeout` (then exit 4).

Every judgement is on the keeper's clock (time.monotonic): a node is live
while it beat within `lost_bound` seconds. Rounds form from the live agents
waiting for one: MAX of them at once, MIN after `join_grace`; fewer than MIN
for `below_min_timeout` stops the run (exit 9). A running round closes when
a member is lost (no beat for lost_bound, or its agent ended),
when a member's task failed, when all are done, or when a node has waited
`lost_bound` to join a round below MAX (its members then checkpoint). A node
that was lost counts again once it has beaten lost_bound seconds without a
gap: a flapping node changes no round.

Served with the standard library's XML-RPC server (threaded): each call is
one short request, bounded by the caller's socket timeout. Hand-written
because no maintained library keeps tf.distribute rounds; torchelastic's
rendezvous is PyTorch's. No TensorFlow here.
"""

import threading
import time
from dataclasses import dataclass, field
from socketserver import ThreadingMixIn
from typing import Callable, Dict, List, Optional
from xmlrpc.server import SimpleXMLRPCServer

from tfdistx.cluster.liveness import task_hosts
from tfdistx.spec.errors import EXIT_TOO_FEW_WORKERS

# A node's status, as its agent reports it at each beat.
WAITING = "waiting"  # ready for the next round: its tasks have ended, its port is free
RUNNING = "running"  # its tasks run in round `round`
FAILED = "failed"  # its task failed in round `round` with `code`
DONE = "done"  # its tasks finished the training in round `round`
ENDED = "ended"  # the agent has stopped: lost to every round from now on

# A node that missed two beats (agents beat every second) starts holding again: holding lost_bound
# seconds means beating all that time, which a node that flaps faster than the bound never does.
STEADY_GAP_SECONDS = 2.0

# Why a round closed (Round.why).
LOST, TASK_FAILED, GROW, FINISHED = "lost", "failed", "grow", "done"


@dataclass
class Node:
    address: str  # the host its worker is reached at (two agents may share one: a node per agent, named apart)
    port: int  # where its worker listens in the next round
    first_seen: float  # beating without a gap of STEADY_GAP_SECONDS since
    last_seen: float
    status: str = WAITING
    round: int = 0
    code: int = 0
    was_lost: bool = False  # it counts again once it has beaten lost_bound seconds without a gap
    heard_the_end: bool = False  # it was answered with the run's end (finished, or stopped)


@dataclass
class Round:
    number: int
    members: List[str]  # the agents' names, worker:0 (the chief) first
    addresses: List[str]
    ports: List[int]
    reason: str  # why it formed, as the round's line says
    why: Optional[str] = None  # None while it runs; else LOST, TASK_FAILED, GROW or FINISHED
    lost: Dict[str, str] = field(default_factory=dict)  # task -> address of the members lost
    joining: List[str] = field(default_factory=list)  # their addresses
    code: int = 0  # TASK_FAILED: the failed task's exit code
    servers: Dict[str, List[str]] = field(
        default_factory=dict
    )  # the servers on the keeper's node, job -> ["host:port"]

    def workers(self) -> List[str]:
        """A worker on each member's node, "host:port", worker:0 first."""
        return [f"{a}:{p}" for a, p in zip(self.addresses, self.ports)]

    def view(self) -> dict:
        """The plain form an agent is sent."""
        return {
            "number": self.number,
            "workers": self.workers(),
            "members": self.members,
            "reason": self.reason,
            "why": self.why,
            "lost": self.lost,
            "joining": self.joining,
            "code": self.code,
            "servers": self.servers,
        }

    def tasks(self) -> Dict[str, str]:
        """task -> host, as the rounds file keeps them: the servers, then a worker on each member's node."""
        return task_hosts({**self.servers, "worker": self.workers()})


class RoundKeeper:
    """The rounds of one run, for MIN to MAX workers (`low`, `high`; fixed:
    equal). `on_round(number, members, reason)`: said when a round forms
    (members: task -> address). `clock`: seconds, monotonic.

    The keeper's own node also runs the run's servers in every round (a
    parameter-server run's chief and ps tasks, the tf.data service's):
    `servers()` gives their addresses for the next round (fresh ports on
    that node). Under parameter servers the run is done once that node's
    agent (`finisher`) is: its chief's end is the training's, and the other
    nodes' workers only serve it."""

    def __init__(
        self,
        low: int,
        high: int,
        join_grace: float,
        lost_bound: float,
        below_min_timeout: float,
        on_round: Callable[[int, Dict[str, str], str], None] = lambda *a: None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.low, self.high, self.join_grace, self.lost_bound, self.below_min_timeout = (
            low,
            high,
            join_grace,
            lost_bound,
            below_min_timeout,
        )
        self.on_round, self.clock = on_round, clock
        self.numbered_after = (
            0  # the rounds a run in this directory had before (a rerun, a requeued job): counted on from them
        )
        self.nodes: Dict[str, Node] = {}
        self.round: Optional[Round] = None
        self.next_reason = "started"
        self.stopped: Optional[dict] = None  # the run ended without training done: {"code", "why"}
        self.enough_since: Optional[float] = None
        self.below_since: Optional[float] = None
        self.lock = threading.Lock()
        self.servers: Callable[[], Dict[str, List[str]]] = dict  # set by the keeper's agent when the run has servers
        self.finisher: Optional[str] = None  # that agent: the run is done when it is; None: when every member is

    # -- what an agent calls ------------------------------------------------

    def beat(self, agent: str, address: str, port: int, status: str, round_number: int = 0, code: int = 0) -> dict:
        """One beat of the agent named `agent` (a restarted agent has a new
        name), on the host at `address`: its status; what it is told back:
        the current round, the run's end if it has ended."""
        with self.lock:
            now = self.clock()
            node = self.nodes.get(agent)
            if node is None or now - node.last_seen > self.lost_bound:
                was_lost = node is not None
                node = self.nodes[agent] = Node(address, port, first_seen=now, last_seen=now, was_lost=was_lost)
            elif now - node.last_seen > STEADY_GAP_SECONDS:
                node.first_seen = now
            node.last_seen, node.port, node.status, node.round, node.code = now, port, status, round_number, code
            self._decide(now)
            told = {
                "round": self.round.view() if self.round else None,
                "stopped": self.stopped,
                "finished": bool(self.round and self.round.why == FINISHED),
            }
            node.heard_the_end = node.heard_the_end or bool(told["finished"] or told["stopped"])
            return told

    def settled(self) -> bool:
        """Every agent has heard how the run ended, has ended on its own, or
        is gone: the keeper may stop. An agent that is done is not enough: it
        waits to hear that the others are too, and a keeper that stopped
        first left it waiting out its bound (a minute after a finished run)."""
        with self.lock:
            now = self.clock()
            return all(
                node.heard_the_end or node.status == ENDED or now - node.last_seen > self.lost_bound
                for node in self.nodes.values()
            )

    # -- the decisions --------------------------------------------------------

    def _live(self, agent: str, now: float) -> bool:
        node = self.nodes.get(agent)
        return node is not None and node.status != ENDED and now - node.last_seen <= self.lost_bound

    def _decide(self, now: float) -> None:
        current = self.round
        if current is not None and current.why is None:
            self._check_running(current, now)
        if self.stopped or (current is not None and current.why == FINISHED):
            return
        if current is None or current.why is not None:
            self._maybe_form(current, now)

    def _check_running(self, current: Round, now: float) -> None:
        lost = {
            f"worker:{i}": current.addresses[i] for i, agent in enumerate(current.members) if not self._live(agent, now)
        }
        members = [self.nodes[a] for a in current.members]
        in_round = [n for n in members if n.round == current.number]
        if lost:
            current.why, current.lost = LOST, lost
            self.next_reason = ", ".join(f"lost {task} at {address}" for task, address in lost.items())
        elif any(n.status == FAILED for n in in_round):
            current.why, current.code = TASK_FAILED, next(n.code for n in in_round if n.status == FAILED)
            self.next_reason = f"restart after exit code {current.code}"
        elif all(n.status == DONE and n.round == current.number for n in self._finishers(current)):
            current.why = FINISHED
        elif len(current.members) < self.high:
            joining = [a for a in self._waiting(now) if a not in current.members and self._held(a, now)]
            if joining:
                current.why, current.joining = (
                    GROW,
                    [self.nodes[a].address for a in joining[: self.high - len(current.members)]],
                )
                self.next_reason = ", ".join(f"{address} joined" for address in current.joining)

    def _finishers(self, current: Round) -> List[Node]:
        """The members whose end is the training's: the chief's node under parameter servers, else every member."""
        names = [self.finisher] if self.finisher in current.members else current.members
        return [self.nodes[a] for a in names]

    def _held(self, agent: str, now: float) -> bool:
        """Beating, without a gap, for lost_bound seconds up to now."""
        node = self.nodes[agent]
        return now - node.last_seen <= STEADY_GAP_SECONDS and now - node.first_seen >= self.lost_bound

    def _waiting(self, now: float) -> List[str]:
        return [a for a, n in self.nodes.items() if self._live(a, now) and n.status == WAITING]

    def _maybe_form(self, last: Optional[Round], now: float) -> None:
        if last is not None and any(self._live(a, now) and self.nodes[a].status != WAITING for a in last.members):
            return  # a member of the round that closed still runs its tasks (a checkpoint on its way)
        settled = [a for a in self._waiting(now) if not self.nodes[a].was_lost or self._held(a, now)]
        before = last.members if last else []
        # The chief's node first under parameter servers (a round cannot run without it), then last round's members in their order.
        chosen = sorted(
            settled,
            key=lambda a: (
                a != self.finisher,
                a not in before,
                before.index(a) if a in before else 0,
                self.nodes[a].first_seen,
            ),
        )
        chosen = chosen[: self.high]
        if self.finisher is not None and self.finisher not in chosen:
            chosen = []  # waits, as for too few: the run stops after below_min_timeout without the chief's node
        if len(chosen) >= self.low:
            self.below_since = None
            self.enough_since = self.enough_since if self.enough_since is not None else now
            if len(chosen) < self.high and now - self.enough_since < self.join_grace:
                return
            self._form(chosen, (last.number if last else self.numbered_after) + 1)
            return
        self.enough_since = None
        self.below_since = self.below_since if self.below_since is not None else now
        if now - self.below_since >= self.below_min_timeout:
            self.stopped = {
                "code": EXIT_TOO_FEW_WORKERS,
                "why": f"{len(chosen)} agent(s) ready, fewer than the {self.low} a round needs, for "
                f"{self.below_min_timeout:g}s (cluster.elastic.below_min_timeout)",
            }

    def _form(self, chosen: List[str], number: int) -> None:
        nodes = [self.nodes[a] for a in chosen]
        last = self.round
        if (
            last is not None and last.why == LOST and set(last.lost.values()) <= {n.address for n in nodes}
        ):  # lost, back before a round formed
            self.next_reason += ", back"
        self.round = Round(
            number,
            chosen,
            [n.address for n in nodes],
            [n.port for n in nodes],
            self.next_reason,
            servers=self.servers(),
        )
        self.enough_since = None
        self.on_round(number, self.round.tasks(), self.next_reason)


class _Server(ThreadingMixIn, SimpleXMLRPCServer):
    daemon_threads = True


def listen(keeper: RoundKeeper, host: str, port: int) -> _Server:
    """The keeper's server bound at host:port (OSError if the address cannot
    be bound): calls wait in the socket's backlog until `answer`."""
    server = _Server((host, port), logRequests=False, allow_none=True, bind_and_activate=True)
    server.register_function(keeper.beat, "beat")
    return server


def answer(server: _Server) -> None:
    """Answer the calls, from a thread of its own, until server.shutdown()."""
    threading.Thread(target=server.serve_forever, name="round keeper", daemon=True).start()
