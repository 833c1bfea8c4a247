"""tfdistx on every node (cluster.launch=agent): one agent per node, started
by `srun`, by a pod, or by hand, each starting and watching its node's
worker, the rounds agreed through a rendezvous (launch/agent/round_keeper.py).

The same command on every node:

    python -m tfdistx strategy=multiworker cluster.workers=2:4 cluster.launch=agent \\
        cluster.agent.store=node1:29500 hydra.run.dir=/shared/run

The agent on the host `cluster.agent.store` names keeps the rounds (it can
bind that address; the others cannot) and owns the run directory; every
agent beats to it about once a second (the keeper's interval, jittered)
from a thread of its own, so that a node whose agent is busy (a
checkpoint's grace, a restart's back-off) is not taken for lost, each beat
proving the run's secret (launch/agent/run_secret.py, launch/agent/keeper_wire.py).
The rest is the supervisor's (cluster/supervisor.py): this
module is its third membership policy, beside fixed counts (launch.py) and
a host list (elastic.py). A round's TF_CONFIG lists a worker on each of its
nodes, worker:0 (the chief) on the same node from round to round while it
lives; each node's worker resumes from the newest checkpoint on the round's
topology, as a local elastic round's does.

One worker per node, multiworker or parameter servers. The keeper's node
also runs the run's servers, in every round: a parameter-server run's chief
(the coordinator) and ps tasks, as a local elastic run keeps them on the
chief's host, and the tf.data service's dispatcher and data workers (a
fixed run's: no elastic run has the service); the run lives as long as that
node anyway. Under parameter servers the training is done when its chief
is; the other nodes' workers only serve it, and stop when told the run
finished. A lost worker's node is a new round from the newest checkpoint,
as under multiworker. No TensorFlow here, and no training code.
"""

import contextlib
import random
import secrets
import socket
import threading
import time
from pathlib import Path
from typing import Optional

from tfdistx import rundir
from tfdistx.cluster import evaluator as sidecars  # the sidecar evaluator's task
from tfdistx.launch.agent import run_secret
from tfdistx.launch.agent.keeper_wire import CALL_TIMEOUT_SECONDS, Link, Refused, WireError
from tfdistx.cluster.liveness import split_address, task_hosts
from tfdistx.cluster.prefork import Prefork, can_fork
from tfdistx.cluster.processes import ForwardingSignals, SaidOnce, Task, free_ports, shell_code
from tfdistx.launch.agent.round_keeper import (
    DONE,
    ENDED,
    FAILED,
    GROW,
    LOST,
    RUNNING,
    TASK_FAILED,
    WAITING,
    Beat,
    News,
    Place,
    RoundKeeper,
    Told,
    answer,
    beat_seconds,
    listen,
)
from tfdistx.cluster.rounds import Rounds
from tfdistx.cluster.supervisor import POLL_SECONDS, Membership, NoRound, Round, RoundResult, Say, State, Supervisor
from tfdistx.sigterm import SigtermNotice
from tfdistx.spec.errors import (
    EXIT_CLUSTER_DID_NOT_FORM,
    EXIT_INVALID_CONFIG,
    EXIT_LOST_PEER,
    EXIT_PREEMPTED,
    RunFault,
)

# Each wait between beats is the interval less up to this share of it, drawn anew: agents started in the same
# second spread their beats, and none beats later than the interval (a round formed is heard as soon as before).
BEAT_JITTER = 0.25
RETRY_FIRST_SECONDS = 0.25  # a beat that failed is tried again after about this, doubled at each failure,
RETRY_SHARE_OF_LOST_BOUND = 0.2  # up to this share of lost_bound (beat_delay)


def own_address(store: str) -> str:
    """The address this node reaches the keeper from: the one its peers reach it at (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(split_address(store))
        return probe.getsockname()[0]


def free_port() -> int:
    """A port free on every interface of this node (TensorFlow's server binds them all)."""
    return free_ports(1, host="")[0]


def beat_delay(interval: float, lost_bound: float, failures: int, silent: float = 0.0) -> float:
    """The wait before an agent's next beat. Answered (`failures` 0): the
    keeper's interval, jittered, so that agents started in the same second
    (as Slurm and a JobSet start them) spread their beats over it. After
    `failures` failed beats in a row (a busy keeper, a network blip), the
    keeper `silent` seconds so far: a back-off that starts short and
    doubles, jittered (half to whole), at most a fifth of lost_bound, and
    shorter as the silence nears lost_bound (a quarter of what is left, not
    under RETRY_FIRST_SECONDS): a node whose link comes back beats again
    before the keeper takes it for lost, whatever the back-off had grown to."""
    if failures <= 0:
        return interval * random.uniform(1 - BEAT_JITTER, 1)
    backoff = min(RETRY_FIRST_SECONDS * 2 ** (failures - 1), lost_bound * RETRY_SHARE_OF_LOST_BOUND)
    backoff = min(backoff, max(RETRY_FIRST_SECONDS, (lost_bound - silent) / 4))
    return backoff * random.uniform(0.5, 1.0)


class BeatState:
    """What an agent tells the keeper and what it has heard back, without
    the I/O (Beats does it over a socket; the benchmark's simulated agents
    over asyncio): its status, the round its tasks run in, their code, its
    worker's port; the keeper's latest news of the rounds, its place in the
    round it was placed in, why it waits, how often to beat."""

    def __init__(self, name: str, address: str, port: int = 0, lost_bound: float = 10.0, config: str = ""):
        self.name, self.address, self.port, self.lost_bound, self.config = name, address, port, lost_bound, config
        self.status, self.round, self.code = WAITING, 0, 0
        self.version = 0
        self.news: Optional[News] = None
        self.place: Optional[Place] = None
        self.wait: Optional[tuple] = None
        self.refused: Optional[str] = None  # the keeper refused this agent's config (a signed answer)
        self.interval = beat_seconds(1, lost_bound)

    def set(self, status: str, round_number: int = 0, code: int = 0, port: Optional[int] = None) -> None:
        self.status, self.round, self.code = status, round_number, code
        self.port = self.port if port is None else port

    def request(self) -> dict:
        return Beat(
            self.name, self.address, self.port, self.status, self.round, self.code, self.version, self.config
        ).fields()

    def absorb(self, fields: dict) -> None:
        """The keeper's answer (its wire fields) to the last request."""
        told = Told.read(fields)
        self.interval, self.wait, self.refused = told.beat, told.wait, told.refused
        if told.news is not None:
            self.news, self.version = told.news, max(self.version, told.version)
        if told.place is not None:
            self.place = told.place

    def placed(self) -> Optional[Place]:
        """This agent's place in the round that runs now, if it is in it."""
        news, place = self.news, self.place
        if news is None or place is None or news.why is not None or place.number != news.number:
            return None
        return place

    def closed_or_moved_on(self) -> bool:
        """The round this agent's tasks run in has closed, or another formed without it."""
        return self.news is not None and (self.news.number != self.round or self.news.why is not None)


class Beats:
    """The agent's beats to the keeper at `store`, from a thread, over one
    connection it keeps (launch/agent/keeper_wire.py), each proving the run's
    `secret`: its status, and what the keeper last said (`news`, `place`)
    with when it came (`answered`). A beat that fails is tried again with a
    jittered back-off (beat_delay); a status set is beaten at once."""

    def __init__(self, store: str, address: str, secret: bytes, lost_bound: float = 10.0, config: str = ""):
        # Named apart from any other agent, on this host or started here before: a restarted agent is a new member.
        self.store, self.address, self.name = store, address, f"{address}/{secrets.token_hex(4)}"
        self.lost_bound = lost_bound
        self.state = BeatState(self.name, address, lost_bound=lost_bound, config=config)
        self.call_timeout = min(CALL_TIMEOUT_SECONDS, lost_bound / 3)
        # A connection that answered nothing this long is opened again: a cut link leaves it dead without a word,
        # and TCP's own retransmissions back off past the bound, where a new connection's first try comes within
        # a second. Not sooner: a busy keeper's answer comes late on it, and a new one only adds a handshake.
        self.link = Link(store, secret, stale_after=max(1.5 * self.call_timeout, lost_bound / 4))
        self.failures = 0
        self.trouble: Optional[str] = None  # why the last beat failed, when the keeper refused it
        # the agent starts as if just answered: it waits lost_bound before it says otherwise
        self.answered = time.monotonic()
        self.due = time.monotonic()  # when the beat thread is next due to beat
        self.stalled = (0.0, 0.0)  # the last time the beat thread woke far later than due: (due, woke)
        self.lock, self.stop, self.woken = threading.Lock(), threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run, name="beats", daemon=True)

    def start(self) -> "Beats":
        self.thread.start()
        return self

    def set(self, status: str, round_number: int = 0, code: int = 0, port: Optional[int] = None) -> None:
        """A new status, beaten at once (from the beat thread: the caller does not wait for the keeper)."""
        with self.lock:
            self.state.set(status, round_number, code, port)
        self.woken.set()

    def wake(self) -> None:
        """Beat now rather than at the next interval."""
        self.woken.set()

    def close(self) -> None:
        """No more beats: the thread ends (a beat under way finishes first, within its timeout), the
        connection is closed."""
        self.stop.set()
        self.woken.set()
        if self.thread.is_alive():
            self.thread.join(timeout=self.call_timeout + 1)
        self.link.close()

    @property
    def status(self) -> tuple:
        with self.lock:
            return self.state.status, self.state.round, self.state.code, self.state.port

    def news(self) -> Optional[News]:
        with self.lock:
            return self.state.news

    def placed(self) -> Optional[Place]:
        with self.lock:
            return self.state.placed()

    def wait_line(self) -> Optional[tuple]:
        with self.lock:
            return self.state.wait

    def refused(self) -> Optional[str]:
        with self.lock:
            return self.state.refused

    def beat(self) -> bool:
        """One beat, from the beat thread; whether the keeper answered."""
        with self.lock:
            request = self.state.request()
        try:
            fields = self.link.call(request, self.call_timeout)
        except Refused as refused:
            self.trouble, self.failures = str(refused), self.failures + 1
            return False
        except (OSError, WireError, ValueError):
            self.failures += 1
            return False
        with self.lock:
            try:
                self.state.absorb(fields)
            except (KeyError, TypeError, ValueError):
                self.failures += 1
                return False
            self.answered, self.failures, self.trouble = time.monotonic(), 0, None
        return True

    def silent_for(self) -> float:
        return time.monotonic() - self.answered

    def frozen_for(self) -> float:
        """How long this process itself did not run (SIGSTOP, a debugger, a suspended machine) since the
        keeper last answered, as its beat thread saw it: woken that much later than due, or still not woken."""
        now = time.monotonic()
        late_now = now - self.due - self.call_timeout  # the beat thread should have run by now
        due, woke = self.stalled
        late_before = woke - due if woke >= self.answered else 0.0
        return max(0.0, late_now, late_before)

    def _run(self) -> None:
        self.woken.wait()  # the first beat once a status is set: its worker's port with it
        self.woken.clear()
        self.due = time.monotonic()
        while not self.stop.is_set():
            self.beat()
            with self.lock:
                interval = self.state.interval
            delay = beat_delay(interval, self.lost_bound, self.failures, self.silent_for())
            self.due = time.monotonic() + delay
            self.woken.wait(delay)
            self.woken.clear()
            woke = time.monotonic()
            if woke - self.due > max(self.lost_bound / 2, self.call_timeout + 1):
                self.stalled = (self.due, woke)
            self.due = woke


class AgentMembership(Membership):
    """This node's worker in each round the keeper forms with it, and on the
    keeper's node the run's servers (a parameter-server run's chief and ps,
    the tf.data service's) and the sidecar evaluator beside it when the run
    has them."""

    def __init__(self, spec: dict, beats: Beats, say: Say, keeps_rounds: bool = False):
        self.spec, self.beats, self.say = spec, beats, say
        self.keeps_rounds = keeps_rounds
        self.bounds = spec["agent"]
        # The run's sidecars (its evaluator), on the node that also owns the run dir: they only read checkpoints,
        # so they are in no round's membership; each round starts them again, and they skip what they evaluated.
        self.sidecars = sidecars.sidecar_jobs(spec) if keeps_rounds else {}
        self.refusals = SaidOnce()
        self.waits = SaidOnce()  # why this agent waits in no round, said once for each reason
        self.number, self.index = 0, 0  # the round this node's task runs in, and its worker's index there

    def form(self, reason: str, signals: ForwardingSignals) -> Round:
        """Wait, beating, until the keeper forms a round with this node;
        NoRound if the run stopped, finished without it, refused this
        node's config, or the keeper stayed silent `below_min_timeout` seconds."""
        self.beats.set(WAITING, port=free_port())
        silent_limit, store = self.bounds["below_min_timeout"], self.beats.store
        while True:
            news = self.beats.news()
            if news is not None and news.stopped is not None:
                self.say(
                    f"{news.stopped.why}: stopping (exit {news.stopped.code}); "
                    "rerun the same command on every node to resume from the newest checkpoint"
                )
                raise NoRound(news.stopped.code)
            if news is not None and news.finished:
                raise NoRound(0)  # trained to its end by the others: nothing left for this node
            refused = self.beats.refused()
            if refused is not None:
                self.say(
                    f"the rendezvous at {store} refused this agent: {refused}; stopping (exit {EXIT_INVALID_CONFIG})"
                )
                raise NoRound(EXIT_INVALID_CONFIG)
            placed = self.beats.placed()
            if placed is not None and placed.number > self.number:
                return self._placed(placed)
            self._say_why_waiting()
            if self.beats.silent_for() > silent_limit:
                self.say(
                    f"no answer from the rendezvous at {store} for {silent_limit:g}s (cluster.elastic.below_min_timeout): "
                    f"stopping (exit {EXIT_CLUSTER_DID_NOT_FORM}); is the agent on its host running?"
                )
                raise NoRound(EXIT_CLUSTER_DID_NOT_FORM)
            if signals.wait(POLL_SECONDS):
                raise NoRound(shell_code(-signals.received[0]))

    def _say_why_waiting(self) -> None:
        """Why this agent is in no round, said once for each reason: the keeper's (too few agents, the round full,
        another agent of this node in it, joining), or a refusal of its beats (not the run's secret)."""
        wait, trouble = self.beats.wait_line(), self.beats.trouble
        # below MIN: the keeper's own line, which this node's agent need not say again where it keeps the rounds
        if wait is not None and not (self.keeps_rounds and wait[0] == "below") and self.waits.first(wait[0]):
            self.say(wait[1], quiet=wait[0] == "joining")
        if trouble is not None and self.waits.first(trouble):
            self.say(
                f"the rendezvous at {self.beats.store} refused this agent's beats ({trouble}): it waits and tries "
                "again; is this node's cluster.agent.token_file the run's (or, without one, its "
                f"{run_secret.SECRET_FILE})?"
            )

    def _placed(self, place: Place) -> Round:
        self.number, self.index = place.number, place.index
        self.waits = SaidOnce()  # a wait after this round is said again
        servers = place.servers  # the run's servers (a parameter-server run's chief and ps, the tf.data service's)
        cluster = {**servers, "worker": place.workers}
        spec = self.spec
        # Each node's own log directory: its worker's log and scratch (a non-chief's checkpoints), which a worker
        # of the same name on another node, in a later round, must not share while this one may still be ending.
        node_dir = Path(spec["log_dir"]) / f"node-{self.beats.address}"
        node_dir.mkdir(parents=True, exist_ok=True)
        here = {
            **(servers if self.keeps_rounds else {}),
            **{job: [None] * count for job, count in self.sidecars.items()},
        }
        places = [("worker", place.index), *((job, n) for job, on in here.items() for n in range(len(on)))]
        tasks = [
            Task(
                job, n, cluster, spec["command"], node_dir, spec.get("run_log"), self.refusals, spec.get("task_env", {})
            )
            for job, n in places
        ]
        self.beats.set(RUNNING, self.number)
        beside = "".join(f", {job}:{n}" for job, n in places[1:] if job in servers) + (
            " and the sidecar evaluator" if self.sidecars else ""
        )
        self.say(
            f"round {self.number}: this node ({self.beats.address}) runs worker:{place.index} of "
            f"{len(place.workers)}{beside}",
            quiet=True,
        )
        return Round(tasks, task_hosts(cluster))

    def check(self, round_: Round, signals: ForwardingSignals) -> Optional[RoundResult]:
        """The keeper's verdict on the running round, or its silence past lost_bound."""
        silent, bound = self.beats.silent_for(), self.bounds["lost_bound"]
        if silent > bound:
            frozen = self.beats.frozen_for()
            if frozen > bound / 2:
                self.say(
                    f"this agent was stopped for {frozen:.0f}s (SIGSTOP, a debugger, a suspended machine) and sent no "
                    f"beat meanwhile, so the rendezvous took this node for lost after {bound:g}s "
                    "(cluster.elastic.lost_bound): stopping this node's task; it joins a later round"
                )
            else:
                self.say(
                    f"no answer from the rendezvous at {self.beats.store} for {silent:.0f}s "
                    "(cluster.elastic.lost_bound): stopping this node's task; waiting for the rendezvous"
                )
            return RoundResult(
                State.MEMBERSHIP_CHANGED, EXIT_LOST_PEER, lost={"rendezvous": self.beats.store}, silent=True
            )
        current = self.beats.news()
        if current is None:
            return None
        if current.number != self.number:  # formed without this node: the keeper took it for lost
            self._say_taken_for_lost(f"formed round {current.number} without this node")
            return RoundResult(
                State.MEMBERSHIP_CHANGED, EXIT_LOST_PEER, lost={"this node": self.beats.address}, silent=True
            )
        if current.why == LOST and f"worker:{self.index}" in current.lost:
            self._say_taken_for_lost(f"closed round {current.number} without this node")
        if current.why == LOST:  # a node the keeper stopped hearing: gone, or behind a cut link
            return RoundResult(State.MEMBERSHIP_CHANGED, EXIT_LOST_PEER, lost=current.lost, silent=True)
        if current.why == GROW:
            round_.ask_to_checkpoint()
            return RoundResult(
                State.MEMBERSHIP_CHANGED, EXIT_PREEMPTED, joined=current.joining, asked_to_checkpoint=True
            )
        if current.why == TASK_FAILED:  # another node's task: this one is stopped, and the round restarts
            return RoundResult(State.FAILED, current.code)
        if current.finished:  # the chief's node is done (parameter servers): this node's worker served its last step
            return RoundResult(State.SUCCEEDED)
        return None  # running

    def _say_taken_for_lost(self, what: str) -> None:
        """The keeper lost this node while it lives: why, as far as this agent can tell."""
        frozen, bound = self.beats.frozen_for(), self.bounds["lost_bound"]
        if frozen > bound / 2:
            why = (
                f"this agent was stopped for {frozen:.0f}s (SIGSTOP, a debugger, a suspended machine) and sent no "
                "beat meanwhile, so"
            )
        else:
            why = f"no beat of this node reached the rendezvous for {bound:g}s (cluster.elastic.lost_bound), so"
        self.say(f"{why} the rendezvous {what}: stopping this node's task; it joins a later round")

    def failed(self, round_: Round, task: Task, code: int) -> RoundResult:
        """This node's task failed. A peer's loss or failure explains a lost
        peer (exit 5) or a checkpoint (42): the keeper's verdict is waited
        for, lost_bound at most, so that a lost node is a new round, not a
        restart, and another node's failure is the round's, said once."""
        if code in (EXIT_LOST_PEER, EXIT_PREEMPTED):
            deadline = time.monotonic() + self.bounds["lost_bound"] + 2 * self.beats.state.interval
            while time.monotonic() < deadline:
                verdict = self.check(round_, ForwardingSignals([]))
                if verdict is not None:
                    return verdict
                time.sleep(POLL_SECONDS)
        self.beats.set(FAILED, self.number, code)
        return RoundResult(State.FAILED, code)

    def regroup(self, result: RoundResult, signals: ForwardingSignals) -> str:
        return ""  # the keeper says why the next round forms


class _AgentSay(Say):
    """The agent's lines: on its terminal, and in the run's log unless `quiet` (every node has one of those)."""

    def __call__(self, text: str, quiet: bool = False) -> None:
        if quiet:
            Say(None)(text)
        else:
            super().__call__(text)


def run_agent(spec: dict, notice: Optional[SigtermNotice] = None) -> int:
    """This node's agent, to the run's end: 0 once the training is done, else
    the code it stopped with. `spec`: as a local cluster's
    (launch.run_local_cluster), with `agent`: the store, the bounds, and
    where the rounds are recorded, and `servers`: the tasks the keeper's
    node runs beside its worker, per job (a parameter-server run's chief
    and ps, the tf.data service's)."""
    bounds = spec["agent"]
    say = _AgentSay(spec.get("run_log"))
    secret = run_secret.of_run(spec["run_dir"], bounds.get("token_file"))  # what every beat proves
    keeper, server = _keep_rounds_if_here(bounds, say, secret)
    beats = Beats(
        bounds["store"],
        bounds.get("address") or own_address(bounds["store"]),
        secret,
        bounds["lost_bound"],
        bounds.get("config", ""),
    )
    servers = spec.get("servers") or {}
    if (
        servers and keeper is None
    ):  # a node with a worker only: its end is this node's (a parameter-server worker serves the chief)
        spec = {**spec, "primary": ["worker"]}
    if servers and keeper is not None:  # its tasks sized for the servers beside its worker (a chief steps too)
        spec = {**spec, "task_env": spec.get("keeper_task_env", spec.get("task_env", {}))}
        keeper.servers = lambda: _server_addresses(beats, servers)
        if "chief" in servers:  # parameter servers: the chief's end is the training's
            keeper.finisher = beats.name
    with (
        rundir.exclusive(spec["run_dir"]) if keeper else contextlib.nullcontext()
    ):  # the keeper's node owns the run directory
        attempt = rundir.Attempt.begin(spec["run_dir"], record=spec.get("config_record")) if keeper else None
        beats.start()
        Path(spec["log_dir"]).mkdir(parents=True, exist_ok=True)
        prefork = (
            Prefork(spec["preload"], spec["log_dir"]) if spec.get("preload") and can_fork(spec["command"]) else None
        )
        try:
            with ForwardingSignals([], spec.get("notice_signals", ())) as signals:
                if notice is not None and notice.received.is_set():
                    notice.leave_if_received("before this node's agent started")
                code = Supervisor(
                    spec, AgentMembership(spec, beats, say, keeps_rounds=keeper is not None), signals, say, prefork
                ).run()
        finally:
            if prefork is not None:
                prefork.close()
        if (
            attempt is not None
        ):  # a refused rerun leaves the run's own config; a new run that failed says so to `tfdistx report`
            attempt.end(code)
        beats.set(DONE if code == 0 else ENDED, beats.status[1])
        most = bounds["lost_bound"] + spec.get("preemption_grace", 60)
        if signals.received and code and keeper is not None:
            # Stopped from outside (Ctrl-C, a preemption): the run cannot go on without the rounds this node
            # keeps, so the other agents hear it stopped, at their next beat; one silent for lost_bound is lost.
            why = "interrupted (Ctrl-C)" if signals.ctrl_c else "preempted"
            keeper.stop(code, f"the agent keeping the rounds was {why}")
            most = bounds["lost_bound"]
        _hear_the_end(keeper, beats, code, most)
        beats.close()
        if server is not None:
            server.shutdown()
            server.server_close()
    return code


def _server_addresses(beats: Beats, servers: dict) -> dict:
    """The servers' addresses for the next round: on this node (the keeper's), at fresh ports, none its worker's."""
    ports = iter(free_ports(sum(servers.values()), host="", taken=(beats.status[3],)))
    return {job: [f"{beats.address}:{next(ports)}" for _ in range(count)] for job, count in servers.items()}


def _hear_the_end(keeper: Optional[RoundKeeper], beats: Beats, code: int, most: float) -> None:
    """The keeper serves until every agent has heard how the run ended (or is
    gone); an agent whose node finished waits to hear that the others did."""
    deadline = time.monotonic() + most
    while time.monotonic() < deadline:
        news = beats.news()
        if keeper.settled() if keeper is not None else code != 0 or (news is not None and news.finished):
            return
        time.sleep(POLL_SECONDS)
        beats.wake()


def _until_resolved(host: str, port: int, most: float, say: Say) -> None:
    """Wait until the store's host name resolves: a pod's own DNS name (a
    JobSet's headless service) appears only once the pod runs, and the
    agent that keeps the rounds must not take its own name's absence for
    another host's. At most `most` seconds, then exit 4 in one line."""
    deadline, said = time.monotonic() + most, False
    while True:
        try:
            socket.getaddrinfo(host, port)
            return
        except socket.gaierror as error:
            if time.monotonic() >= deadline:
                raise RunFault(
                    f"cluster.agent.store={host}:{port}: {host} does not resolve on this node ({error.strerror}) "
                    f"after {most:g}s (cluster.elastic.below_min_timeout)",
                    EXIT_CLUSTER_DID_NOT_FORM,
                ) from None
            if not said:
                say(f"waiting for {host} (cluster.agent.store) to resolve, at most {most:g}s", quiet=True)
                said = True
            time.sleep(POLL_SECONDS)


def _keep_rounds_if_here(bounds: dict, say: Say, secret: bytes):
    """(the keeper, its server) if this node is the host `cluster.agent.store`
    names, else (None, None). The keeper records the rounds (logs/rounds.json)
    and says each in the run's log; it admits only beats that prove `secret`
    and carry the run's config (`bounds["config"]`, its digest)."""
    host, port = split_address(bounds["store"])
    _until_resolved(host, port, bounds["below_min_timeout"], say)
    keeper = RoundKeeper(
        bounds["min"],
        bounds["max"],
        bounds["join_grace"],
        bounds["lost_bound"],
        bounds["below_min_timeout"],
        say=say,
        config=bounds.get("config", ""),
    )
    try:
        server = listen(keeper, host, port, secret, say)
    except OSError:  # not this host's address, or another agent here keeps them
        return None, None
    rounds = Rounds(bounds["rounds_file"], bounds["checkpoint_dir"], bounds["metrics_file"], say=say)
    keeper.on_round = lambda number, members, reason: rounds.start(members, reason)
    keeper.numbered_after = len(rounds.kept)  # the agents say the same number as the rounds file
    answer(server)
    say(f"keeping the rounds at {bounds['store']} for {bounds['min']}:{bounds['max']} workers", quiet=True)
    return keeper, server
