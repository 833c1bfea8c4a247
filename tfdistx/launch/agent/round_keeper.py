"""The rendezvous of per-node agents (cluster.launch=agent): which agents
train together in each round, decided in one place and asked by every agent
over the network (launch/agent/node.py).

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

For a thousand nodes and more, a beat costs the same whatever the cluster:
it records the agent's status in a dict and answers from what is already
decided; the decisions run on a tick (`tick`, every TICK_SECONDS), once
over the nodes, not on every beat. An answer carries the round only when
the agent's known version of it is older, and its place (the round's
workers' addresses) only once a round. The agents beat every
`beat_seconds`, which the keeper lengthens as the cluster grows (up to a
quarter of lost_bound). Only beats that prove the run's secret reach the
keeper (launch/agent/keeper_wire.py, which serves it); a beat of another config
than the run's is refused.

Hand-written because no maintained library keeps tf.distribute rounds;
torchelastic's rendezvous is PyTorch's. No TensorFlow here.
"""

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import tfdistx.launch.agent.keeper_wire as keeper_wire
from tfdistx.launch.agent.messages import (
    WAITING,
    FAILED,
    DONE,
    ENDED,
    LOST,
    TASK_FAILED,
    GROW,
    FINISHED,
    beat_seconds,
    Beat,
    Stopped,
    News,
)
from tfdistx.cluster.liveness import task_hosts
from tfdistx.core.errors import EXIT_TOO_FEW_WORKERS

KEEPER_WIRE = keeper_wire.WIRE_VERSION  # the wire this keeper is served on (tests/simulated_agents.py reads it)

# The decisions' period, for what time alone decides (a node silent past lost_bound, join_grace over, a node held
# long enough): at most this late. A beat that changes a status is decided on at once (KeeperServer.after_request).
TICK_SECONDS = 0.25
# A node silent for two beats' time (it missed at least one, its jitter aside) starts holding again: holding
# lost_bound seconds means beating all that time, which a node that flaps faster than the bound never does.
STEADY_GAP_BEATS = 2.0
STEADY_GAP_SECONDS = 2.0  # and never less than this
SAY_WAIT_AFTER_SECONDS = 5.0  # a wait below MIN shorter than this is the agents starting: said once past it


@dataclass
class Node:
    address: str  # the host its worker is reached at (two agents may share one: a node per agent, named apart)
    port: int  # where its worker listens in the next round
    first_seen: float  # beating without a gap of the steady gap since
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
    index: Dict[str, int] = field(default_factory=dict)  # member -> its worker's index: no list is searched
    on_node: Dict[str, int] = field(default_factory=dict)  # address -> members there

    def __post_init__(self):
        self.index = {member: i for i, member in enumerate(self.members)}
        for address in self.addresses:
            self.on_node[address] = self.on_node.get(address, 0) + 1

    def workers(self) -> List[str]:
        """A worker on each member's node, "host:port", worker:0 first."""
        return [f"{a}:{p}" for a, p in zip(self.addresses, self.ports)]

    def tasks(self) -> Dict[str, str]:
        """task -> host, as the rounds file keeps them: the servers, then a worker on each member's node."""
        return task_hosts({**self.servers, "worker": self.workers()})


class RoundKeeper:
    """The rounds of one run, for MIN to MAX workers (`low`, `high`; fixed:
    equal). `on_round(number, members, reason)`: said when a round forms
    (members: task -> address). `clock`: seconds, monotonic. `say`: the
    keeper's own lines (a long wait below MIN, an agent refused). `config`:
    the digest of the run's config; a beat of another is refused ("": not
    checked).

    The keeper's own node also runs the run's servers in every round (a
    parameter-server run's chief and ps tasks, the tf.data service's):
    `servers()` gives their addresses for the next round (fresh ports on
    that node). Under parameter servers the run is done once that node's
    agent (`finisher`) is: its chief's end is the training's, and the other
    nodes' workers only serve it.

    `beat` records and answers (what an agent calls, over the wire); `tick`
    decides (the server calls it every TICK_SECONDS; the tests, on their
    own clock)."""

    def __init__(
        self,
        low: int,
        high: int,
        join_grace: float,
        lost_bound: float,
        below_min_timeout: float,
        on_round: Callable[[int, Dict[str, str], str], None] = lambda *a: None,
        clock: Callable[[], float] = time.monotonic,
        say: Callable[[str], None] = lambda text: None,
        config: str = "",
    ):
        self.low, self.high, self.join_grace, self.lost_bound, self.below_min_timeout = (
            low,
            high,
            join_grace,
            lost_bound,
            below_min_timeout,
        )
        self.on_round, self.clock, self.say, self.config = on_round, clock, say, config
        self.numbered_after = (
            0  # the rounds a run in this directory had before (a rerun, a requeued job): counted on from them
        )
        self.nodes: Dict[str, Node] = {}
        self.round: Optional[Round] = None
        self.next_reason = "started"
        self.stopped: Optional[Stopped] = None  # the run ended without training done
        self.enough_since: Optional[float] = None
        self.below_since: Optional[float] = None
        self.below_said = False
        self.lock = threading.Lock()
        self.servers: Callable[[], Dict[str, List[str]]] = dict  # set by the keeper's agent when the run has servers
        self.finisher: Optional[str] = None  # that agent: the run is done when it is; None: when every member is
        self.interval = beat_seconds(1, lost_bound)
        self.steady_gap = max(STEADY_GAP_SECONDS, STEADY_GAP_BEATS * self.interval)
        # What every beat's answer is built from, made once per change (a round formed or closed, the run stopped):
        self.version = 0
        self.formed_version = 0  # the version at which the current round formed: its place is sent once
        self.news: Optional[dict] = None
        self.workers_encoded = self.servers_encoded = b""  # the current round's, encoded once
        self.waiting_line: Optional[str] = None  # why no round forms, once it has been so for a while
        self.refused_configs: Dict[str, str] = {}  # address -> the digest refused there, said once
        self.change = False  # a beat changed what the decisions read since take_change last asked

    # -- what an agent calls ------------------------------------------------

    def beat(self, beat: Beat) -> bytes:
        """Record one beat; the answer, encoded (JSON of Told's fields). Constant time: the decisions are the
        tick's, and a round's addresses were encoded once, when it formed."""
        with self.lock:
            now = self.clock()
            if self.config and beat.config and beat.config != self.config:
                return _encoded({"beat": self.interval, "version": self.version, "refused": self._refuse_config(beat)})
            node = self.nodes.get(beat.agent)
            if node is None or now - node.last_seen > self.lost_bound:
                was_lost = node is not None
                node = self.nodes[beat.agent] = Node(
                    beat.address, beat.port, first_seen=now, last_seen=now, was_lost=was_lost
                )
            elif now - node.last_seen > self.steady_gap:
                node.first_seen = now
            self.change |= (node.status, node.round, node.code) != (beat.status, beat.round, beat.code)
            self.change |= node.first_seen == now  # a node new, or back
            node.last_seen, node.port, node.status, node.round, node.code = (
                now,
                beat.port,
                beat.status,
                beat.round,
                beat.code,
            )
            return self._told(beat, node, now)

    def take_change(self) -> bool:
        """Whether a beat since the last call changed what the decisions read (a status, a new node): the server
        then ticks soon, so that a round forms or closes at once, not a tick later."""
        with self.lock:
            change, self.change = self.change, False
            return change

    def _told(self, beat: Beat, node: Node, now: float) -> bytes:
        told = {"beat": self.interval, "version": self.version}
        current = self.round
        if beat.known < self.version:
            told["news"] = self.news
            if self.stopped is not None or (current is not None and current.why == FINISHED):
                node.heard_the_end = True
        index = current.index.get(beat.agent) if current is not None else None
        if index is None and self.stopped is None:
            wait = self._why_waiting(beat, node, now)
            if wait is not None:
                told["wait"] = wait
        if index is None or beat.known >= self.formed_version:
            return _encoded(told)
        # Its place in the round formed since it last heard: the workers' addresses as encoded when it formed.
        place = b'{"number":%d,"index":%d,"servers":%s,"workers":%s}' % (
            current.number,
            index,
            self.servers_encoded,
            self.workers_encoded,
        )
        return _encoded(told)[:-1] + b',"place":' + place + b"}"

    def _why_waiting(self, beat: Beat, node: Node, now: float) -> Optional[Tuple[str, str]]:
        """Why this agent, in no round, waits (kind, line), if it is worth saying."""
        current = self.round
        if current is not None and current.why is None and beat.status == WAITING:
            if len(current.members) >= self.high:
                beside = (
                    f"; another agent at {beat.address} is in it (a second agent for one node waits)"
                    if current.on_node.get(beat.address)
                    else ""
                )
                return (
                    "full",
                    f"not placed: round {current.number} runs with its most workers (cluster.workers={self.high})"
                    f"{beside}: this agent waits for a place, until a member is lost or the run ends",
                )
            return (
                "joining",
                f"not placed yet: round {current.number} runs with {len(current.members)} of at most {self.high} "
                f"workers, and grows for this node once it has beaten for {self.lost_bound:g}s without a gap "
                "(cluster.elastic.lost_bound)",
            )
        if (current is None or current.why is not None) and self.waiting_line is not None:
            return ("below", self.waiting_line)
        return None

    def _refuse_config(self, beat: Beat) -> str:
        why = (
            f"its config is not the run's (config digest {beat.config[:12]} there, {self.config[:12]} at the "
            "rendezvous): every node runs the same command, with the same overrides and config files"
        )
        if self.refused_configs.get(beat.address) != beat.config:
            self.refused_configs[beat.address] = beat.config
            self.say(f"the rendezvous refused the agent at {beat.address}: {why}")
        return why

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

    def stop(self, code: int, why: str) -> None:
        """The run ends here, with `code` (the agent keeping the rounds was stopped from outside: Ctrl-C, a
        preemption): every agent is told at its next beat, unless the run had already ended."""
        with self.lock:
            if self.stopped is None:
                self.stopped = Stopped(code, why)
                self._changed()

    # -- the decisions --------------------------------------------------------

    def tick(self) -> None:
        """Decide what the beats since the last tick call for: a round formed, closed or grown, the run stopped."""
        with self.lock:
            now = self.clock()
            self._decide(now)
            live = sum(1 for n in self.nodes.values() if now - n.last_seen <= self.lost_bound)
            self.interval = beat_seconds(live, self.lost_bound)
            self.steady_gap = max(self.steady_gap, STEADY_GAP_BEATS * self.interval)

    def _changed(self) -> None:
        """The round or the run's end changed: a new version, which every agent is told once."""
        self.version += 1
        current = self.round
        self.news = News(
            current.number if current else 0,
            current.why if current else None,
            current.code if current else 0,
            dict(current.lost) if current else {},
            list(current.joining) if current else [],
            self.stopped,
        ).fields()

    def _live(self, agent: str, now: float) -> bool:
        node = self.nodes.get(agent)
        return node is not None and node.status != ENDED and now - node.last_seen <= self.lost_bound

    def _decide(self, now: float) -> None:
        current = self.round
        if current is not None and current.why is None:
            self._check_running(current, now)
            if current.why is not None:
                self._changed()
        if self.stopped or (current is not None and current.why == FINISHED):
            return
        if current is None or current.why is not None:
            self._maybe_form(current, now)

    def _check_running(self, current: Round, now: float) -> None:
        members = [self.nodes[a] for a in current.members]
        lost = {
            f"worker:{i}": current.addresses[i]
            for i, n in enumerate(members)
            if n.status == ENDED or now - n.last_seen > self.lost_bound
        }
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
            joining = [
                a for a in self._waiting(now) if a not in current.index and self._held(a, now)
            ]  # in the order they first beat: who asked first joins first
            if joining:
                current.why, current.joining = (
                    GROW,
                    [self.nodes[a].address for a in joining[: self.high - len(current.members)]],
                )
                self.next_reason = ", ".join(f"{address} joined" for address in current.joining)

    def _finishers(self, current: Round) -> List[Node]:
        """The members whose end is the training's: the chief's node under parameter servers, else every member."""
        names = [self.finisher] if self.finisher in current.index else current.members
        return [self.nodes[a] for a in names]

    def _held(self, agent: str, now: float) -> bool:
        """Beating, without a gap, for lost_bound seconds up to now."""
        node = self.nodes[agent]
        return now - node.last_seen <= self.steady_gap and now - node.first_seen >= self.lost_bound

    def _waiting(self, now: float) -> List[str]:
        return [a for a, n in self.nodes.items() if self._live(a, now) and n.status == WAITING]

    def _maybe_form(self, last: Optional[Round], now: float) -> None:
        if last is not None and any(self._live(a, now) and self.nodes[a].status != WAITING for a in last.members):
            return  # a member of the round that closed still runs its tasks (a checkpoint on its way)
        settled = [a for a in self._waiting(now) if not self.nodes[a].was_lost or self._held(a, now)]
        ready = min(len(settled), self.high)
        if self.finisher is not None and self.finisher not in settled:
            ready = 0  # waits, as for too few: the run stops after below_min_timeout without the chief's node
        if ready >= self.low:
            self.below_since, self.below_said, self.waiting_line = None, False, None
            self.enough_since = self.enough_since if self.enough_since is not None else now
            if ready < self.high and now - self.enough_since < self.join_grace:
                return
            self._form(self._chosen(settled, last), (last.number if last else self.numbered_after) + 1)
            return
        self.enough_since = None
        self.below_since = self.below_since if self.below_since is not None else now
        waited = now - self.below_since
        if waited >= self.below_min_timeout:
            self.stopped = Stopped(
                EXIT_TOO_FEW_WORKERS,
                f"{ready} agent(s) ready, fewer than the {self.low} a round needs, for "
                f"{self.below_min_timeout:g}s (cluster.elastic.below_min_timeout)",
            )
            self.waiting_line = None
            self._changed()
        elif self.below_min_timeout > SAY_WAIT_AFTER_SECONDS and waited >= min(
            SAY_WAIT_AFTER_SECONDS, self.below_min_timeout / 2
        ):  # a bound this short ends in its own line soon enough: the wait is said where it is long
            left = self.below_min_timeout - waited
            chief = (
                " (the chief's node, this one, among them)"
                if self.finisher is not None and self.finisher not in settled
                else ""
            )
            self.waiting_line = (
                f"the rendezvous has {ready} agent(s) ready, fewer than the {self.low} a round needs{chief}: "
                f"waiting for more, at most {left:.0f}s more (cluster.elastic.below_min_timeout="
                f"{self.below_min_timeout:g}), then the run stops (exit {EXIT_TOO_FEW_WORKERS})"
            )
            if not self.below_said:
                self.below_said = True
                self.say(self.waiting_line)

    def _chosen(self, settled: List[str], last: Optional[Round]) -> List[str]:
        """The next round's members, at most MAX: the chief's node first under parameter servers (a round
        cannot run without it), then last round's members in their order, then the others as they came."""
        before = last.index if last else {}
        chosen = sorted(
            settled,
            key=lambda a: (
                a != self.finisher,
                a not in before,
                before.get(a, 0),
                self.nodes[a].first_seen,
            ),
        )
        return chosen[: self.high]

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
        self.workers_encoded = _encoded(self.round.workers())
        self.servers_encoded = _encoded(self.round.servers)
        self.enough_since = None
        self._changed()
        self.formed_version = self.version
        self.on_round(number, self.round.tasks(), self.next_reason)


def _encoded(value) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def listen(
    keeper: RoundKeeper, host: str, port: int, secret: bytes, say: Callable[[str], None] = lambda text: None
) -> keeper_wire.KeeperServer:
    """The keeper's server bound at host:port (OSError if the address cannot
    be bound): agents' connections wait in its backlog until `answer`. Only
    beats that prove `secret` reach the keeper; the others are refused, and
    said once per source address."""

    def handle(fields: dict, peer: str) -> dict:
        return keeper.beat(Beat.read(fields))

    return keeper_wire.KeeperServer(
        host,
        port,
        secret,
        handle,
        keeper.tick,
        TICK_SECONDS,
        most_agents=keeper.high,
        say=say,
        changed=keeper.take_change,
    )


def answer(server: keeper_wire.KeeperServer) -> None:
    """Answer the agents, and decide on the tick, from a thread of its own, until server.shutdown()."""
    server.answer()
