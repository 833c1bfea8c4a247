"""An elastic local cluster: training in rounds, each with as many workers as
hosts are listed, from MIN to MAX (config/elastic.py).

A round is a membership: worker:0 (the chief) on the first host of the
first round, for the whole run, and one worker on each other listed host, up
to MAX, in the list's order. The launcher

- forms a round once MAX hosts are listed, or MIN and `join_grace` seconds
  have passed; with fewer than MIN for `below_min_timeout`, it stops (exit 9);
- starts the round's tasks, each with its TF_CONFIG (the host's address, a
  fresh port); every task resumes from the newest checkpoint on the round's
  topology (engine/topology.py: the global batch kept, the example order one
  on every topology), so the steps go on, none lost or trained twice;
- loses a worker whose host leaves the list (its processes are killed, as
  the host's loss would) or whose task dies: the survivors stop, and once
  the host has not been listed again for `lost_bound` seconds the next round
  forms without it. A task that fails on a host still listed is a restart
  of the same round (from `cluster.max_restarts`, as a fixed cluster's);
- grows when a host is listed that the round does not use: the tasks are
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

import json
import signal
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from tfdistx.cluster.hosts import HostList, choose
from tfdistx.cluster.launch import MAX_BACKOFF_SECONDS, NEVER_RESTART, QUICK_GRACE_SECONDS, Budget
from tfdistx.cluster.processes import ForwardingSignals, SaidOnce, Task, free_ports, loopback_up, shell_code, signal_group, teardown
from tfdistx.cluster.rounds import Rounds
from tfdistx.config.errors import EXIT_PREEMPTED, EXIT_TOO_FEW_WORKERS

POLL_SECONDS = 0.2
HOSTS_EVERY_SECONDS = 1.0  # how often a running round reads the host list (a discovery command is run that often)


def supervise(spec: dict, isolated: bool) -> int:
    """Inside the namespace: the run's rounds, until the training ends, a
    task fails in a way no round cures, or too few hosts are left."""
    global _RUN_LOG
    if isolated:
        loopback_up()
    elastic, _RUN_LOG = spec["elastic"], spec.get("run_log")
    hosts = HostList(elastic.get("hosts"), elastic.get("discover"), say=_say)
    rounds = Rounds(elastic["rounds_file"], elastic["checkpoint_dir"], elastic["metrics_file"], say=_say)
    restarts = Budget(spec.get("max_restarts", 0))
    with ForwardingSignals([]) as signals:
        members = _form(hosts, elastic, signals, chief=None)
        if isinstance(members, int):
            return members
        reason = "started"
        while True:
            code, lost, joined = Round(spec, members, rounds, reason).run(hosts, signals, restarts)
            if code == 0 or signals.received or code in NEVER_RESTART:
                return code
            if not lost and not joined:  # a failure the hosts do not explain: a restart of the same round
                if not restarts.take():
                    if restarts.total:
                        _say(f"giving up: the cluster stopped after {restarts.total} restart(s) (cluster.max_restarts={restarts.total}); "
                             f"last exit code {code}")
                    return code
                delay = min(2 ** (restarts.used - 1), MAX_BACKOFF_SECONDS)
                _say(f"the round stopped with exit code {code}; restart {restarts.used} of {restarts.total} in {delay}s")
                if signals.wait(delay):
                    return shell_code(-signals.received[0])
                reason = f"restart {restarts.used} of {restarts.total} after exit code {code}"
            elif lost:
                lost = _not_back(hosts, lost, elastic["lost_bound"], signals)
                reason = ", ".join(f"lost {task} at {host}" for task, host in lost.items()) or "lost hosts came back"
            else:
                reason = ", ".join(f"{host} joined" for host in joined)
            if signals.received:
                return shell_code(-signals.received[0])
            members = _form(hosts, elastic, signals, chief=members[0])
            if isinstance(members, int):
                return members


def _form(hosts: HostList, elastic: dict, signals: ForwardingSignals, chief: Optional[str]):
    """The next round's hosts (the chief's first), once MAX are listed or MIN
    for `join_grace` seconds; exit 9 after `below_min_timeout` below MIN, the
    signal's code if one comes while waiting."""
    low, high = elastic["min"], elastic["max"]
    started = time.monotonic()
    enough_since, waiting_said = None, False
    while True:
        listed = hosts.read()
        chosen = choose(listed, chief, high)
        if len(chosen) >= high:
            return chosen
        now = time.monotonic()
        if len(chosen) >= low:
            enough_since = enough_since or now
            if now - enough_since >= elastic["join_grace"]:
                return chosen
        else:
            enough_since = None
            if not waiting_said:  # a wait of minutes, said once, so that a quiet terminal is not taken for a hang
                _say(f"{len(chosen)} host(s) usable from {hosts.where}, fewer than cluster.elastic.min_workers={low}: waiting for more, "
                     f"at most {elastic['below_min_timeout']:g}s (cluster.elastic.below_min_timeout)")
                waiting_said = True
            if now - started >= elastic["below_min_timeout"]:
                chief_note = f" (the chief's host {chief} is not listed)" if chief and chief not in listed else ""
                _say(f"{len(chosen)} host(s) usable from {hosts.where}{chief_note}, fewer than cluster.elastic.min_workers={low} for "
                     f"{elastic['below_min_timeout']:g}s (cluster.elastic.below_min_timeout): stopping (exit {EXIT_TOO_FEW_WORKERS}); "
                     "rerun the same command to resume from the newest checkpoint")
                return EXIT_TOO_FEW_WORKERS
        if signals.wait(POLL_SECONDS):
            return shell_code(-signals.received[0])


class Round:
    """One round's tasks: a worker on each member host, and the chief and the
    ps tasks (parameter servers) on the chief's host, the first member."""

    def __init__(self, spec: dict, members: List[str], rounds: Rounds, reason: str):
        self.spec, self.members, self.rounds = spec, members, rounds
        self.primary, self.alone = spec["primary"], spec.get("restart_alone", [])
        placed = {job: (members if job == "worker" else [members[0]] * n) for job, n in spec["counts"].items() if n}
        ports = iter(free_ports(sum(map(len, placed.values()))))
        cluster = {job: [f"{host}:{next(ports)}" for host in on] for job, on in placed.items()}
        refusals = SaidOnce()
        self.tasks = [Task(job, index, cluster, spec["command"], Path(spec["log_dir"]), spec.get("run_log"), refusals,
                            spec.get("task_env", {}))
                      for job, on in placed.items() for index in range(len(on))]
        self.host = {task.name: host for task, host in zip(self.tasks, [h for on in placed.values() for h in on])}
        self.dropped: Dict[str, str] = {}  # parameter servers: workers lost while the coordinator goes on
        rounds.start(self.workers_at(), reason)

    def workers_at(self) -> Dict[str, str]:
        """The round's live members, task -> host."""
        return {name: host for name, host in self.host.items() if name not in self.dropped}

    def run(self, hosts: HostList, signals: ForwardingSignals, restarts: Budget) -> Tuple[int, Dict[str, str], List[str]]:
        """To the round's end: (exit code, the lost workers {task: host}, the hosts that asked to join)."""
        for task in self.tasks:
            task.start()
        signals.procs = [task.proc for task in self.tasks]
        code, lost, joined = self._watch(hosts, signals, restarts)
        if code == 0 and not signals.received:
            for task in self.tasks:
                task.succeeded.set()
        asked = code == EXIT_PREEMPTED and not signals.received  # the launcher asked for a checkpoint: growth, or below MIN
        preempted = (signals.received and signal.SIGINT not in signals.received) or asked
        # A synchronous round that lost a worker has nothing to save (a checkpoint needs every worker), and a
        # survivor blocked in a collective with the lost one can leave only by SIGKILL: no grace to wait out.
        grace = self.spec.get("preemption_grace", 60) if preempted else 0 if lost and not self.alone else QUICK_GRACE_SECONDS
        teardown(self.tasks, self.primary, grace=grace, signalled=bool(signals.received) or asked)
        primaries = [t for t in self.tasks if t.job in self.primary]
        if signals.received:
            own = [t.proc.returncode for t in self.tasks if t.proc.returncode not in (0, -signal.SIGKILL)]
            code = shell_code(own[0] if own else -signals.received[0])
        elif asked and any(t.proc.returncode != EXIT_PREEMPTED for t in primaries):
            lost, joined = {}, []  # a trainer did not checkpoint and leave as asked: a failure
            code = next(shell_code(t.proc.returncode) for t in primaries if t.proc.returncode != EXIT_PREEMPTED)
        for task in self.tasks:
            for pump in task.pumps:
                pump.join(timeout=5)
        return code, lost, joined

    def _checkpoint_and_stop(self) -> None:
        """The preemption path: the trainers save at their next loop boundary and exit 42."""
        for task in self.tasks:
            if task.proc.poll() is None:
                signal_group(task.proc, signal.SIGTERM)

    def _watch(self, hosts: HostList, signals: ForwardingSignals, restarts: Budget) -> Tuple[int, Dict[str, str], List[str]]:
        """Until the round ends: the trainers done (0), a worker lost (its host
        gone from the list, or its task dead) that the round cannot go on
        without, hosts asking to join, too few workers left, or a signal."""
        lost: Dict[str, str] = {}
        elastic, chief_host = self.spec["elastic"], self.members[0]
        next_read = 0.0
        while not signals.received:
            if time.monotonic() >= next_read:
                next_read = time.monotonic() + HOSTS_EVERY_SECONDS
                listed = hosts.read()
                for task in self.tasks:
                    host = self.host[task.name]
                    if host == chief_host:  # fixed for the whole run
                        continue
                    if host not in listed and task.proc.poll() is None:
                        _say(f"{host} left the host list: stopping {task.name}, which ran there")
                        signal_group(task.proc, signal.SIGKILL)  # what the host's loss would do
                        task.proc.wait()
                        if task.job in self.alone:
                            self._drop(task, host)
                        else:
                            lost[task.name] = host
                    elif host in listed and task.name in self.dropped:
                        self._take_back(task, host, signals)
                live = sum(name.startswith("worker:") for name in self.workers_at())
                if self.dropped and live < elastic["min"]:
                    _say(f"{live} live worker(s), fewer than cluster.elastic.min_workers={elastic['min']}: the trainers checkpoint and stop")
                    self._checkpoint_and_stop()
                    return EXIT_PREEMPTED, dict(self.dropped), []
                joining = [host for host in listed if host not in self.members][:elastic["max"] - len(self.members)]
                if joining and not lost and not self.dropped and all(task.proc.poll() is None for task in self.tasks):
                    _say(f"{', '.join(joining)} listed: the trainers checkpoint at their next loop boundary and stop, "
                         f"for a round of {len(self.members) + len(joining)} workers")
                    self._checkpoint_and_stop()
                    return EXIT_PREEMPTED, {}, joining
            if all(task.proc.poll() == 0 for task in self.tasks if task.job in self.primary):
                return 0, {}, []
            failed = [task for task in self.tasks if task.proc.poll() not in (None, 0) and task.name not in self.dropped]
            for task in [t for t in failed if t.job in self.alone and t.proc.returncode not in NEVER_RESTART]:
                if self.host[task.name] not in hosts.read():  # its host is gone (the list said so after the task died)
                    self._drop(task, self.host[task.name])
                    failed.remove(task)
                elif restarts.take():  # its host is still listed: restarted alone, as in a fixed cluster
                    _say(f"task {task.name} exited with code {shell_code(task.proc.returncode)}; restarting it alone "
                         f"(restart {restarts.used} of {restarts.total})")
                    task.start()
                    signals.procs = [t.proc for t in self.tasks]
                    failed.remove(task)
            if failed:
                task = min(failed, key=lambda t: t.proc.returncode >= 0)  # one killed by a signal is the cause
                code = shell_code(task.proc.returncode)
                listed = hosts.read()
                lost.update({t.name: h for t, h in zip(self.tasks, self.host.values()) if h not in listed and h != chief_host})
                if not lost:
                    _say(f"task {task.name} exited with code {code}; stopping the round")
                return code, lost, []
            time.sleep(POLL_SECONDS)
        return 0, lost, []

    def _drop(self, task: Task, host: str) -> None:
        self.dropped[task.name] = host
        self.rounds.start(self.workers_at(), f"lost {task.name} at {host}", resumed=False)

    def _take_back(self, task: Task, host: str, signals: ForwardingSignals) -> None:
        del self.dropped[task.name]
        task.start()  # at its address: the coordinator gives it steps again
        signals.procs = [t.proc for t in self.tasks]
        self.rounds.start(self.workers_at(), f"{task.name} back at {host}", resumed=False)


def _not_back(hosts: HostList, lost: Dict[str, str], bound: float, signals: ForwardingSignals) -> Dict[str, str]:
    """The lost workers whose host is still not listed after `bound` seconds."""
    deadline = time.monotonic() + bound
    while True:
        listed = hosts.read()
        gone = {task: host for task, host in lost.items() if host not in listed}
        if not gone or time.monotonic() >= deadline or signals.wait(POLL_SECONDS):
            return gone


_RUN_LOG: Optional[str] = None  # the run's log (tfdistx.log), set once by supervise


def _say(text: str) -> None:
    """A line of the launcher's own, on the terminal and in the run's log."""
    line = f"tfdistx: {text}\n"
    sys.stderr.write(line)
    sys.stderr.flush()
    if _RUN_LOG:
        with open(_RUN_LOG, "a") as log:
            log.write(line)


if __name__ == "__main__":
    sys.exit(supervise(json.loads(Path(sys.argv[1]).read_text()), isolated="--isolated" in sys.argv[2:]))
