"""tfdistx on every node (cluster.launch=agent): one agent per node, started
by `srun`, by a pod, or by hand, each starting and watching its node's
worker, the rounds agreed through a rendezvous (cluster/round_keeper.py).

The same command on every node:

    python -m tfdistx strategy=multiworker cluster.workers=2:4 cluster.launch=agent \\
        cluster.agent.store=node1:29500 hydra.run.dir=/shared/run

The agent on the host `cluster.agent.store` names keeps the rounds (it can
bind that address; the others cannot) and owns the run directory; every
agent beats to it once a second from a thread of its own, so that a node
whose agent is busy (a checkpoint's grace, a restart's back-off) is not
taken for lost. The rest is the supervisor's (cluster/supervisor.py): this
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
import secrets
import socket
import threading
import time
import xmlrpc.client
from pathlib import Path
from typing import Optional, Tuple

from tfdistx import rundir
from tfdistx.cluster import evaluator as sidecars  # the sidecar evaluator's task
from tfdistx.cluster.liveness import split_address, task_hosts
from tfdistx.cluster.prefork import Prefork, can_fork
from tfdistx.cluster.processes import ForwardingSignals, SaidOnce, Task, free_ports, shell_code
from tfdistx.cluster.round_keeper import (
    DONE,
    ENDED,
    FAILED,
    FINISHED,
    GROW,
    LOST,
    RUNNING,
    TASK_FAILED,
    WAITING,
    RoundKeeper,
    answer,
    listen,
)
from tfdistx.cluster.rounds import Rounds
from tfdistx.cluster.supervisor import POLL_SECONDS, Membership, NoRound, Round, RoundResult, Say, State, Supervisor
from tfdistx.sigterm import SigtermNotice
from tfdistx.spec.errors import EXIT_CLUSTER_DID_NOT_FORM, EXIT_LOST_PEER, EXIT_PREEMPTED, RunFault

BEAT_SECONDS = 1.0
CALL_TIMEOUT_SECONDS = 2.0  # one beat's round trip at most: a cut link is a timeout, not a hang


def own_address(store: str) -> str:
    """The address this node reaches the keeper from: the one its peers reach it at (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(split_address(store))
        return probe.getsockname()[0]


def free_port() -> int:
    """A port free on every interface of this node (TensorFlow's server binds them all)."""
    return free_ports(1, host="")[0]


class _Timeout(xmlrpc.client.Transport):
    def make_connection(self, host):
        connection = super().make_connection(host)
        connection.timeout = CALL_TIMEOUT_SECONDS
        return connection


class Beats:
    """The agent's beats to the keeper at `store`, from a thread: its status,
    and the keeper's last answer (`last`) with when it came (`answered`)."""

    def __init__(self, store: str, address: str):
        # Named apart from any other agent, on this host or started here before: a restarted agent is a new member.
        self.store, self.address, self.name = store, address, f"{address}/{secrets.token_hex(4)}"
        self.status: Tuple[str, int, int, int] = (WAITING, 0, 0, 0)  # status, round, code, port
        self.last: Optional[dict] = None
        self.answered = (
            time.monotonic()
        )  # the agent starts as if just answered: it waits lost_bound before it says otherwise
        self.lock, self.stop = threading.Lock(), threading.Event()
        self.thread = threading.Thread(target=self._run, name="beats", daemon=True)

    def start(self) -> "Beats":
        self.thread.start()
        return self

    def set(self, status: str, round_number: int = 0, code: int = 0, port: Optional[int] = None) -> None:
        with self.lock:
            self.status = (status, round_number, code, self.status[3] if port is None else port)
        self.beat()

    def beat(self) -> None:
        status, number, code, port = self.status
        try:
            proxy = xmlrpc.client.ServerProxy(f"http://{self.store}", transport=_Timeout(), allow_none=True)
            answer = proxy.beat(self.name, self.address, port, status, number, code)
        except (OSError, xmlrpc.client.Error):
            return
        with self.lock:
            self.last, self.answered = answer, time.monotonic()

    def silent_for(self) -> float:
        return time.monotonic() - self.answered

    def _run(self) -> None:
        while not self.stop.wait(BEAT_SECONDS):
            self.beat()


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
        self.number = 0  # the round this node's task runs in

    def form(self, reason: str, signals: ForwardingSignals) -> Round:
        """Wait, beating, until the keeper forms a round with this node;
        NoRound if the run stopped, finished without it, or the keeper
        stayed silent `below_min_timeout` seconds."""
        self.beats.set(WAITING, port=free_port())
        silent_limit, store = self.bounds["below_min_timeout"], self.beats.store
        while True:
            answer = self.beats.last
            if answer and answer["stopped"]:
                self.say(
                    f"{answer['stopped']['why']}: stopping (exit {answer['stopped']['code']}); "
                    "rerun the same command on every node to resume from the newest checkpoint"
                )
                raise NoRound(answer["stopped"]["code"])
            if answer and answer["finished"]:
                raise NoRound(0)  # trained to its end by the others: nothing left for this node
            now = answer and answer["round"]
            if now and now["why"] is None and now["number"] > self.number and self.beats.name in now["members"]:
                return self._placed(now)
            if self.beats.silent_for() > silent_limit:
                self.say(
                    f"no answer from the rendezvous at {store} for {silent_limit:g}s (cluster.elastic.below_min_timeout): "
                    f"stopping (exit {EXIT_CLUSTER_DID_NOT_FORM}); is the agent on its host running?"
                )
                raise NoRound(EXIT_CLUSTER_DID_NOT_FORM)
            if signals.wait(POLL_SECONDS):
                raise NoRound(shell_code(-signals.received[0]))

    def _placed(self, formed: dict) -> Round:
        self.number = formed["number"]
        index = formed["members"].index(self.beats.name)
        servers = formed[
            "servers"
        ]  # the run's servers (a parameter-server run's chief and ps, the tf.data service's), on the keeper's node
        cluster = {**servers, "worker": formed["workers"]}
        spec = self.spec
        # Each node's own log directory: its worker's log and scratch (a non-chief's checkpoints), which a worker
        # of the same name on another node, in a later round, must not share while this one may still be ending.
        node_dir = Path(spec["log_dir"]) / f"node-{self.beats.address}"
        node_dir.mkdir(parents=True, exist_ok=True)
        here = {
            **(servers if self.keeps_rounds else {}),
            **{job: [None] * count for job, count in self.sidecars.items()},
        }
        places = [("worker", index), *((job, n) for job, on in here.items() for n in range(len(on)))]
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
            f"round {self.number}: this node ({self.beats.address}) runs worker:{index} of {len(formed['members'])}{beside}",
            quiet=True,
        )
        return Round(tasks, task_hosts(cluster))

    def check(self, round_: Round, signals: ForwardingSignals) -> Optional[RoundResult]:
        """The keeper's verdict on the running round, or its silence past lost_bound."""
        silent, bound = self.beats.silent_for(), self.bounds["lost_bound"]
        if silent > bound:
            self.say(
                f"no answer from the rendezvous at {self.beats.store} for {silent:.0f}s (cluster.elastic.lost_bound): "
                "stopping this node's task; waiting for the rendezvous"
            )
            return RoundResult(State.MEMBERSHIP_CHANGED, EXIT_LOST_PEER, lost={"rendezvous": self.beats.store})
        current = (self.beats.last or {}).get("round")
        if current is None:
            return None
        if current["number"] != self.number:  # formed without this node: the keeper took it for lost
            return RoundResult(State.MEMBERSHIP_CHANGED, EXIT_LOST_PEER, lost={"this node": self.beats.address})
        if current["why"] == LOST:
            return RoundResult(State.MEMBERSHIP_CHANGED, EXIT_LOST_PEER, lost=current["lost"])
        if current["why"] == GROW:
            round_.ask_to_checkpoint()
            return RoundResult(
                State.MEMBERSHIP_CHANGED, EXIT_PREEMPTED, joined=current["joining"], asked_to_checkpoint=True
            )
        if current["why"] == TASK_FAILED:  # another node's task: this one is stopped, and the round restarts
            return RoundResult(State.FAILED, current["code"])
        if (
            current["why"] == FINISHED
        ):  # the chief's node is done (parameter servers): this node's worker served its last step
            return RoundResult(State.SUCCEEDED)
        return None  # running

    def failed(self, round_: Round, task: Task, code: int) -> RoundResult:
        """This node's task failed. A peer's loss or failure explains a lost
        peer (exit 5) or a checkpoint (42): the keeper's verdict is waited
        for, lost_bound at most, so that a lost node is a new round, not a
        restart, and another node's failure is the round's, said once."""
        if code in (EXIT_LOST_PEER, EXIT_PREEMPTED):
            deadline = time.monotonic() + self.bounds["lost_bound"] + 2 * BEAT_SECONDS
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
    keeper, server = _keep_rounds_if_here(bounds, say)
    beats = Beats(bounds["store"], bounds.get("address") or own_address(bounds["store"]))
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
            _stopped_here(keeper, code, signals.ctrl_c)
            most = bounds["lost_bound"]
        _hear_the_end(keeper, beats, code, most)
        beats.stop.set()
        if server is not None:
            server.shutdown()
            server.server_close()
    return code


def _server_addresses(beats: Beats, servers: dict) -> dict:
    """The servers' addresses for the next round: on this node (the keeper's), at fresh ports, none its worker's."""
    ports = iter(free_ports(sum(servers.values()), host="", taken=(beats.status[3],)))
    return {job: [f"{beats.address}:{next(ports)}" for _ in range(count)] for job, count in servers.items()}


def _stopped_here(keeper: RoundKeeper, code: int, ctrl_c: bool) -> None:
    """The run's end, as the keeper tells the other agents (round_keeper.py's `stopped`): this node's agent,
    which keeps the rounds, was stopped by Ctrl-C or preempted, and its workers saved (42, 130)."""
    why = "interrupted (Ctrl-C)" if ctrl_c else "preempted"
    with keeper.lock:
        keeper.stopped = keeper.stopped or {"code": code, "why": f"the agent keeping the rounds was {why}"}


def _hear_the_end(keeper: Optional[RoundKeeper], beats: Beats, code: int, most: float) -> None:
    """The keeper serves until every agent has heard how the run ended (or is
    gone); an agent whose node finished waits to hear that the others did."""
    deadline = time.monotonic() + most
    while time.monotonic() < deadline:
        if keeper.settled() if keeper is not None else code != 0 or (beats.last or {}).get("finished"):
            return
        time.sleep(POLL_SECONDS)
        beats.beat()


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


def _keep_rounds_if_here(bounds: dict, say: Say):
    """(the keeper, its server) if this node is the host `cluster.agent.store`
    names, else (None, None). The keeper records the rounds (logs/rounds.json)
    and says each in the run's log."""
    host, port = split_address(bounds["store"])
    _until_resolved(host, port, bounds["below_min_timeout"], say)
    keeper = RoundKeeper(
        bounds["min"], bounds["max"], bounds["join_grace"], bounds["lost_bound"], bounds["below_min_timeout"]
    )
    try:
        server = listen(keeper, host, port)
    except OSError:  # not this host's address, or another agent here keeps them
        return None, None
    rounds = Rounds(bounds["rounds_file"], bounds["checkpoint_dir"], bounds["metrics_file"], say=say)
    keeper.on_round = lambda number, members, reason: rounds.start(members, reason)
    keeper.numbered_after = len(rounds.kept)  # the agents say the same number as the rounds file
    answer(server)
    say(f"keeping the rounds at {bounds['store']} for {bounds['min']}:{bounds['max']} workers", quiet=True)
    return keeper, server
