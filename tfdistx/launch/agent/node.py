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
import socket
import time
from dataclasses import replace
from pathlib import Path
from typing import Mapping, Optional

from tfdistx import rundir
from tfdistx.cluster import evaluator as sidecars  # the sidecar evaluator's task
from tfdistx.cluster.launch_spec import LaunchSpec
from tfdistx.cluster.liveness import split_address, task_hosts
from tfdistx.cluster.prefork import Prefork, can_fork
from tfdistx.cluster.processes import ForwardingSignals, SaidOnce, Task, free_ports, shell_code
from tfdistx.cluster.rounds import Rounds
from tfdistx.cluster.supervisor import (
    POLL_SECONDS,
    Membership,
    NoRound,
    Round,
    RoundResult,
    SupervisorLines,
    State,
    Supervisor,
)
import tfdistx.launch.agent.run_secret as run_secret
from tfdistx.launch.agent.beats import Beats, own_address
from tfdistx.launch.agent.messages import DONE, ENDED, FAILED, GROW, LOST, RUNNING, TASK_FAILED, WAITING, Place
from tfdistx.launch.agent.round_keeper import RoundKeeper, answer, listen
from tfdistx.sigterm import SigtermNotice
from tfdistx.core.errors import (
    EXIT_CLUSTER_DID_NOT_FORM,
    EXIT_INVALID_CONFIG,
    EXIT_LOST_PEER,
    EXIT_PREEMPTED,
    RunFault,
)


def free_port() -> int:
    """A port free on every interface of this node (TensorFlow's server binds them all)."""
    return free_ports(1, host="")[0]


class AgentMembership(Membership):
    """This node's worker in each round the keeper forms with it, and on the
    keeper's node the run's servers (a parameter-server run's chief and ps,
    the tf.data service's) and the sidecar evaluator beside it when the run
    has them."""

    def __init__(self, spec: LaunchSpec, beats: Beats, say: SupervisorLines, keeps_rounds: bool = False):
        self.spec, self.beats, self.say = spec, beats, say
        self.keeps_rounds = keeps_rounds
        self.bounds = spec.rounds.bounds
        # The run's sidecars (its evaluator), on the node that also owns the run dir: they only read checkpoints,
        # so they are in no round's membership; each round starts them again, and they skip what they evaluated.
        self.sidecars = sidecars.sidecar_jobs(spec.evaluator) if keeps_rounds else {}
        self.refusals = SaidOnce()
        self.waits = SaidOnce()  # why this agent waits in no round, said once for each reason
        self.number, self.index = 0, 0  # the round this node's task runs in, and its worker's index there

    def form(self, reason: str, signals: ForwardingSignals) -> Round:
        """Wait, beating, until the keeper forms a round with this node;
        NoRound if the run stopped, finished without it, refused this
        node's config, or the keeper stayed silent `below_min_timeout` seconds."""
        self.beats.set(WAITING, port=free_port())
        silent_limit, store = self.bounds.below_min_timeout, self.beats.store
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
                    f"no answer from the rendezvous at {store} for {silent_limit:g}s "
                    f"(cluster.elastic.below_min_timeout): stopping (exit {EXIT_CLUSTER_DID_NOT_FORM}); "
                    "is the agent on its host running?"
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
        node_dir = Path(spec.log_dir) / f"node-{self.beats.address}"
        node_dir.mkdir(parents=True, exist_ok=True)
        here = {
            **(servers if self.keeps_rounds else {}),
            **{job: [None] * count for job, count in self.sidecars.items()},
        }
        places = [("worker", place.index), *((job, n) for job, on in here.items() for n in range(len(on)))]
        tasks = [
            Task(job, n, cluster, list(spec.command), node_dir, spec.run_log, self.refusals, dict(spec.task_env))
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
        silent, bound = self.beats.silent_for(), self.bounds.lost_bound
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
        frozen, bound = self.beats.frozen_for(), self.bounds.lost_bound
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
            deadline = time.monotonic() + self.bounds.lost_bound + 2 * self.beats.state.interval
            while time.monotonic() < deadline:
                verdict = self.check(round_, ForwardingSignals([]))
                if verdict is not None:
                    return verdict
                time.sleep(POLL_SECONDS)
        self.beats.set(FAILED, self.number, code)
        return RoundResult(State.FAILED, code)

    def regroup(self, result: RoundResult, signals: ForwardingSignals) -> str:
        return ""  # the keeper says why the next round forms


class _AgentLines(SupervisorLines):
    """The agent's lines: on its terminal, and in the run's log unless `quiet` (every node has one of those)."""

    def __call__(self, text: str, quiet: bool = False) -> None:
        if quiet:
            SupervisorLines(None)(text)
        else:
            super().__call__(text)


def run_agent(spec: LaunchSpec, notice: Optional[SigtermNotice] = None) -> int:
    """This node's agent, to the run's end: 0 once the training is done, else
    the code it stopped with. `spec`: as a local cluster's, with `rounds`
    (the bounds, and where the rounds are recorded) and `agent` (the store,
    what the agents prove, and the servers the keeper's node runs beside
    its worker, per job: a parameter-server run's chief and ps, the tf.data
    service's)."""
    bounds, rendezvous = spec.rounds.bounds, spec.agent
    say = _AgentLines(spec.run_log)
    secret = run_secret.of_run(rendezvous.run_dir, rendezvous.token_file)  # what every beat proves
    keeper, server = _keep_rounds_if_here(spec, say, secret)
    address = rendezvous.address or own_address(rendezvous.store)
    beats = Beats(rendezvous.store, address, secret, bounds.lost_bound, rendezvous.config)
    servers = rendezvous.servers
    if servers and keeper is None:
        spec = replace(spec, primary=("worker",))  # a worker only: its end is its node's (a ps worker serves the chief)
    if servers and keeper is not None:  # its tasks sized for the servers beside its worker (a chief steps too)
        spec = replace(spec, task_env=rendezvous.keeper_task_env)
        keeper.servers = lambda: _server_addresses(beats, servers)
        if "chief" in servers:  # parameter servers: the chief's end is the training's
            keeper.finisher = beats.name
    # the keeper's node owns the run directory
    with rundir.exclusive(rendezvous.run_dir) if keeper else contextlib.nullcontext():
        record = dict(rendezvous.config_record)
        attempt = rundir.Attempt.begin(rendezvous.run_dir, record=record) if keeper else None
        beats.start()
        Path(spec.log_dir).mkdir(parents=True, exist_ok=True)
        forked = spec.preload and can_fork(list(spec.command))
        prefork = Prefork(list(spec.preload), spec.log_dir) if forked else None
        try:
            with ForwardingSignals([], spec.notice_signals) as signals:
                if notice is not None and notice.received.is_set():
                    notice.leave_if_received("before this node's agent started")
                membership = AgentMembership(spec, beats, say, keeps_rounds=keeper is not None)
                code = Supervisor(spec, membership, signals, say, prefork).run()
        finally:
            if prefork is not None:
                prefork.close()
        if attempt is not None:  # a refused rerun leaves the run's own config; a new run that failed says so
            attempt.end(code)
        beats.set(DONE if code == 0 else ENDED, beats.status[1])
        most = bounds.lost_bound + spec.preemption_grace
        if signals.received and code and keeper is not None:
            # Stopped from outside (Ctrl-C, a preemption): the run cannot go on without the rounds this node
            # keeps, so the other agents hear it stopped, at their next beat; one silent for lost_bound is lost.
            why = "interrupted (Ctrl-C)" if signals.ctrl_c else "preempted"
            keeper.stop(code, f"the agent keeping the rounds was {why}")
            most = bounds.lost_bound
        _hear_the_end(keeper, beats, code, most)
        beats.close()
        if server is not None:
            server.shutdown()
            server.server_close()
    return code


def _server_addresses(beats: Beats, servers: Mapping[str, int]) -> dict:
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


def _until_resolved(host: str, port: int, most: float, say: SupervisorLines) -> None:
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


def _keep_rounds_if_here(spec: LaunchSpec, say: SupervisorLines, secret: bytes):
    """(the keeper, its server) if this node is the host `cluster.agent.store`
    names, else (None, None). The keeper records the rounds (logs/rounds.json)
    and says each in the run's log; it admits only beats that prove `secret`
    and carry the run's config (its digest)."""
    bounds, rendezvous, record = spec.rounds.bounds, spec.agent, spec.rounds.record
    host, port = split_address(rendezvous.store)
    _until_resolved(host, port, bounds.below_min_timeout, say)
    keeper = RoundKeeper(
        bounds.min,
        bounds.max,
        bounds.join_grace,
        bounds.lost_bound,
        bounds.below_min_timeout,
        say=say,
        config=rendezvous.config,
    )
    try:
        server = listen(keeper, host, port, secret, say)
    except OSError:  # not this host's address, or another agent here keeps them
        return None, None
    rounds = Rounds(record.rounds_file, record.checkpoint_dir, record.metrics_file, say=say)
    keeper.on_round = lambda number, members, reason: rounds.start(members, reason)
    keeper.numbered_after = len(rounds.kept)  # the agents say the same number as the rounds file
    answer(server)
    say(f"keeping the rounds at {rendezvous.store} for {bounds.min}:{bounds.max} workers", quiet=True)
    return keeper, server
