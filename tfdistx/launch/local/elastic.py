"""An elastic local cluster: training in rounds, each with as many workers as
hosts are listed, from MIN to MAX (core/elastic.py).

A round is a membership: worker:0 (the chief) on the first host of the
first round, for the whole run, and one worker on each other listed host, up
to MAX, in the list's order. The launcher

- forms a round once MAX hosts are listed, or MIN and `join_grace` seconds
  have passed; with fewer than MIN for `below_min_timeout`, it stops (exit 9);
- starts the round's tasks, each with its TF_CONFIG (the host's address, a
  fresh port); every task resumes from the newest checkpoint on the round's
  topology (engine/topology.py: the global batch kept, the example order one
  on every topology), so the steps go on, none lost or trained twice;
- loses a worker whose host has left the list for `lost_bound` seconds
  (its processes are killed, as the host's loss would; a change of the list
  counts once it has held that long, so a flapping host changes no round:
  hosts.Settled) or whose task dies on a host no longer listed: the
  survivors stop, and once
  the host has not been listed again for `lost_bound` seconds the next round
  forms without it. A task that fails on a host still listed is a restart
  of the same round (from `cluster.max_restarts`, as a fixed cluster's:
  the supervisor's, cluster/supervisor.py, whose membership policy this is);
- grows when a host the round does not use has been listed `lost_bound`
  seconds: the tasks are
  told to checkpoint and stop (SIGTERM: the preemption path, exit 42 at the
  next loop boundary), and the next round takes the host in.

Under parameter servers the chief (the coordinator) and the ps tasks run on
the chief's host. A lost worker is dropped without stopping the run
(the coordinator gives its steps to the others) and, when its host is
listed again, started again in its place (the coordinator takes it back);
below MIN live workers, or on a new host, the coordinator checkpoints and a
new round forms. A lost ps or coordinator is a restart from the checkpoint.

Each round is said in one line (`round 2: 4 -> 3 workers (lost worker:3 at
127.0.0.4), resuming from step 12`) and recorded in the rounds file
(cluster/rounds.py; summary.json's `rounds`).

In a test, hosts are loopback addresses (127.0.0.N) inside the launcher's
private network namespace, and a host is lost by removing it from the list.
No TensorFlow here, and no training code.
"""

import signal
import time
from typing import Dict, List, Optional

from tfdistx.launch.local.hosts import HostList, Settled, choose
from tfdistx.cluster.processes import ForwardingSignals, Task, free_ports, shell_code, signal_group
from tfdistx.cluster.launch_spec import LaunchSpec
from tfdistx.cluster.rounds import Rounds
from tfdistx.cluster.supervisor import POLL_SECONDS, Membership, NoRound, Round, RoundResult, SupervisorLines, State
from tfdistx.core.errors import EXIT_PREEMPTED, EXIT_TOO_FEW_WORKERS

HOSTS_EVERY_SECONDS = 1.0  # how often a running round reads the host list (a discovery command is run that often)


class HostListMembership(Membership):
    """A worker on each listed host, from MIN to MAX (`spec.rounds`); the
    chief's host, the first of the first round, stays for the whole run."""

    def __init__(self, spec: LaunchSpec, hosts: HostList, rounds: Rounds, say: SupervisorLines):
        self.spec, self.bounds, self.hosts, self.rounds, self.say = spec, spec.rounds.bounds, hosts, rounds, say
        self.alone = spec.restart_alone
        self.chief: Optional[str] = None
        self.members: List[str] = []  # the running round's hosts, the chief's first
        self.next_read = 0.0
        # A change of the list counts for a round once it has held lost_bound seconds: a flapping host changes no round.
        # A task that died on a host no longer listed is lost at once (failed, goes_on_without: the list as it is).
        self.settled = Settled(self.bounds.lost_bound)

    @classmethod
    def of(cls, spec: LaunchSpec, say: SupervisorLines) -> "HostListMembership":
        rounds, record = spec.rounds, spec.rounds.record
        told = Rounds(record.rounds_file, record.checkpoint_dir, record.metrics_file, say=say)
        return cls(spec, HostList(rounds.hosts, rounds.discover, say=say), told, say)

    def form(self, reason: str, signals: ForwardingSignals) -> Round:
        """The round's tasks: a worker on each member host, and the chief
        and the ps tasks (parameter servers) on the chief's host."""
        self.members = self._wait_for_hosts(signals)
        self.chief = self.members[0]
        placed = {
            job: (self.members if job == "worker" else [self.chief] * n) for job, n in self.spec.counts.items() if n
        }
        ports = iter(free_ports(sum(map(len, placed.values()))))
        round_ = Round.placed(
            self.spec, {job: [f"{host}:{next(ports)}" for host in on] for job, on in placed.items()}, {}
        )
        self.rounds.start(round_.members(), reason)
        self.next_read = 0.0
        return round_

    def _wait_for_hosts(self, signals: ForwardingSignals) -> List[str]:
        """The next round's hosts (the chief's first), once MAX are listed or
        MIN for `join_grace` seconds; NoRound (exit 9) after
        `below_min_timeout` below MIN, or with the signal's code if one comes."""
        low, high, bounds = self.bounds.min, self.bounds.max, self.bounds
        started = time.monotonic()
        enough_since, waiting_said = None, False
        while True:
            listed = self._settled()
            chosen = choose(listed, self.chief, high)
            if len(chosen) >= high:
                return chosen
            now = time.monotonic()
            if len(chosen) >= low:
                enough_since = enough_since or now
                if now - enough_since >= bounds.join_grace:
                    return chosen
            else:
                enough_since = None
                if not waiting_said:  # a wait of minutes, said once, so that a quiet terminal is not taken for a hang
                    self.say(
                        f"{len(chosen)} host(s) usable from {self.hosts.where}, fewer than "
                        f"cluster.elastic.min_workers={low}: waiting for more, at most "
                        f"{bounds.below_min_timeout:g}s (cluster.elastic.below_min_timeout)"
                    )
                    waiting_said = True
                if now - started >= bounds.below_min_timeout:
                    chief_note = (
                        f" (the chief's host {self.chief} is not listed)"
                        if self.chief and self.chief not in listed
                        else ""
                    )
                    self.say(
                        f"{len(chosen)} host(s) usable from {self.hosts.where}{chief_note}, fewer than "
                        f"cluster.elastic.min_workers={low} for {bounds.below_min_timeout:g}s "
                        f"(cluster.elastic.below_min_timeout): stopping (exit {EXIT_TOO_FEW_WORKERS}); rerun the same "
                        "command to resume from the newest checkpoint"
                    )
                    raise NoRound(EXIT_TOO_FEW_WORKERS)
            if signals.wait(POLL_SECONDS):
                raise NoRound(shell_code(-signals.received[0]))

    def check(self, round_: Round, signals: ForwardingSignals) -> Optional[RoundResult]:
        """About once a second, the host list: a worker whose host left is
        stopped (lost, or dropped under parameter servers), a dropped one
        whose host is back is started again; too few workers left, or a host
        asking to join, ends the round with the trainers' checkpoint."""
        if time.monotonic() < self.next_read:
            return None
        self.next_read = time.monotonic() + HOSTS_EVERY_SECONDS
        now_listed = self._listed()
        listed = list(self.settled.hosts)  # a host that comes or goes counts once its change has held
        for task in round_.tasks:
            host = round_.hosts[task.name]
            if host == self.chief:  # fixed for the whole run
                continue
            if host not in listed and task.proc.poll() is None:
                self.say(
                    f"{host} left the host list (for {self.bounds.lost_bound:g}s, cluster.elastic.lost_bound): "
                    f"stopping {task.name}, which ran there"
                )
                signal_group(task.proc, signal.SIGKILL)  # what the host's loss would do
                task.proc.wait()
                task.clear_scratch()
                if task.job in self.alone:
                    self._drop(round_, task, host)
                else:
                    round_.lost[task.name] = host
            elif host in listed and host in now_listed and task.name in round_.dropped:
                self._take_back(round_, task, host, signals)
        live = sum(name.startswith("worker:") for name in round_.members())
        if round_.dropped and live < self.bounds.min:
            self.say(
                f"{live} live worker(s), fewer than cluster.elastic.min_workers={self.bounds.min}: the trainers "
                "checkpoint and stop"
            )
            round_.ask_to_checkpoint()
            return RoundResult(
                State.MEMBERSHIP_CHANGED, EXIT_PREEMPTED, lost=dict(round_.dropped), asked_to_checkpoint=True
            )
        joining = [host for host in listed if host in now_listed and host not in self.members][
            : self.bounds.max - len(self.members)
        ]
        if (
            joining
            and not round_.lost
            and not round_.dropped
            and all(task.proc.poll() is None for task in round_.tasks)
        ):
            self.say(
                f"{', '.join(joining)} listed: the trainers checkpoint at their next loop boundary and stop, "
                f"for a round of {len(self.members) + len(joining)} workers"
            )
            round_.ask_to_checkpoint()
            return RoundResult(State.MEMBERSHIP_CHANGED, EXIT_PREEMPTED, joined=joining, asked_to_checkpoint=True)
        return None

    def goes_on_without(self, round_: Round, task: Task) -> bool:
        """A parameter-server worker whose host is gone (the list said so after the task died) is dropped."""
        host = round_.hosts[task.name]
        if host in self._listed():
            return False
        self._drop(round_, task, host)
        return True

    def failed(self, round_: Round, task: Task, code: int) -> RoundResult:
        """A failure the hosts explain (a member's host is gone) is a new
        round without it; any other, a restart of the same round. A trainer
        that left with 42 by itself checkpointed: its peers get the time to."""
        listed = self._listed()
        round_.lost.update(
            {name: host for name, host in round_.hosts.items() if host not in listed and host != self.chief}
        )
        state = State.MEMBERSHIP_CHANGED if round_.lost else State.FAILED
        return RoundResult(state, code, lost=dict(round_.lost), asked_to_checkpoint=code == EXIT_PREEMPTED)

    def regroup(self, result: RoundResult, signals: ForwardingSignals) -> str:
        if result.lost:
            lost = self._not_back(result.lost, signals)
            return ", ".join(f"lost {task} at {host}" for task, host in lost.items()) or "lost hosts came back"
        return ", ".join(f"{host} joined" for host in result.joined)

    def _not_back(self, lost: Dict[str, str], signals: ForwardingSignals) -> Dict[str, str]:
        """The lost workers whose host is still not listed after `lost_bound` seconds."""
        deadline = time.monotonic() + self.bounds.lost_bound
        while True:
            listed = self._listed()
            gone = {task: host for task, host in lost.items() if host not in listed}
            if not gone or time.monotonic() >= deadline or signals.wait(POLL_SECONDS):
                return gone

    def _listed(self) -> List[str]:
        """The hosts listed now (each read also tells `settled` what changed)."""
        listed = self.hosts.read()
        self.settled.update(listed)
        return listed

    def _settled(self) -> List[str]:
        """The hosts whose being listed, or not, has held lost_bound seconds."""
        return self.settled.update(self.hosts.read())

    def _drop(self, round_: Round, task: Task, host: str) -> None:
        round_.dropped[task.name] = host
        self.rounds.start(round_.members(), f"lost {task.name} at {host}", resumed=False)

    def _take_back(self, round_: Round, task: Task, host: str, signals: ForwardingSignals) -> None:
        del round_.dropped[task.name]
        round_.restart(task, signals)  # at its address: the coordinator gives it steps again
        self.rounds.start(round_.members(), f"{task.name} back at {host}", resumed=False)
