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

Each round is said in one line (`round 2: 4 -> 3 workers (lost worker:3 at
127.0.0.4), resuming from step 12`) and recorded in the rounds file
(summary.json's `rounds`).

In a test, hosts are loopback addresses (127.0.0.N) inside the launcher's
private network namespace, and a host is lost by removing it from the list.
No TensorFlow here, and no training code: the newest checkpoint's step is
read from its file names.
"""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from tfdistx.cluster.launch import (MAX_BACKOFF_SECONDS, NEVER_RESTART, QUICK_GRACE_SECONDS, _Budget, _exit_code, _forwarding_signals, _free_ports,
                                    _loopback_up, _SaidOnce, _signal_group, _Task, _teardown)
from tfdistx.config.errors import EXIT_PREEMPTED, EXIT_TOO_FEW_WORKERS
from tfdistx.engine.checkpoint_files import on_disk  # file names only: no TensorFlow

POLL_SECONDS = 0.2
HOSTS_EVERY_SECONDS = 1.0  # how often a running round reads the host list (a discovery command is run that often)
DISCOVER_TIMEOUT_SECONDS = 30


class HostList:
    """The hosts workers may run on, read from a file or a discovery command
    each time it is asked (one host a line; blank lines and # comments
    skipped). A command that fails or hangs keeps the last list, said once."""

    def __init__(self, path: Optional[str], command: Optional[str]):
        self.path, self.command, self.last, self.failing = path, command, [], False

    def read(self) -> List[str]:
        try:
            if self.path is not None:
                text = Path(self.path).read_text()
            else:
                done = subprocess.run(self.command, shell=True, capture_output=True, text=True, timeout=DISCOVER_TIMEOUT_SECONDS)
                if done.returncode != 0:
                    raise OSError(f"exit code {done.returncode}: {done.stderr.strip()[:200]}")
                text = done.stdout
        except (OSError, subprocess.TimeoutExpired) as error:
            if not self.failing:
                where = self.path if self.path is not None else f"`{self.command}`"
                _say(f"cannot read the hosts from {where} ({error}): keeping the last list, {', '.join(self.last) or 'empty'}")
            self.failing = True
            return list(self.last)
        self.failing = False
        hosts = []
        for line in text.splitlines():
            host = line.split("#", 1)[0].strip()
            if host and host not in hosts:
                hosts.append(host)
        self.last = hosts
        return hosts


class Rounds:
    """The rounds of the run, said and kept (the rounds file, written whole after each)."""

    def __init__(self, path: str, checkpoint_dir: str):
        self.path, self.checkpoint_dir = Path(path), checkpoint_dir
        self.kept: List[dict] = json.loads(self.path.read_text()) if self.path.is_file() else []  # a rerun goes on counting

    def start(self, members: List[str], reason: str, lost: Dict[str, str] = None) -> None:
        step = newest_step(self.checkpoint_dir)
        before = len(self.kept[-1]["members"]) if self.kept else None
        number = len(self.kept) + 1
        self.kept.append({"round": number, "members": {f"worker:{i}": host for i, host in enumerate(members)},
                          "first_step": step + 1, "reason": reason})
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(self.kept, indent=1))
        tmp.replace(self.path)  # whole or not at all
        size = f"{before} -> {len(members)}" if before is not None else f"{len(members)}"
        start = f"resuming from step {step}" if step else "from step 0"
        _say(f"round {number}: {size} workers ({reason}), {start}")


def newest_step(checkpoint_dir: str) -> int:
    paths = on_disk(checkpoint_dir) if Path(checkpoint_dir).is_dir() else []
    return int(paths[-1].rsplit("-", 1)[1]) if paths else 0


def supervise(spec: dict, isolated: bool) -> int:
    """Inside the namespace: the run's rounds, until the training ends, a
    task fails in a way no round cures, or too few hosts are left."""
    global _RUN_LOG
    if isolated:
        _loopback_up()
    elastic, _RUN_LOG = spec["elastic"], spec.get("run_log")
    hosts = HostList(elastic.get("hosts"), elastic.get("discover"))
    rounds = Rounds(elastic["rounds_file"], elastic["checkpoint_dir"])
    restarts = _Budget(spec.get("max_restarts", 0))
    with _forwarding_signals([]) as signals:
        members = _form(hosts, elastic, signals, chief=None)
        if isinstance(members, int):
            return members
        reason = "started"
        while True:
            rounds.start(members, reason)
            code, lost, joined = _run_round(spec, members, hosts, signals)
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
                    return _exit_code(-signals.received[0])
                reason = f"restart {restarts.used} of {restarts.total} after exit code {code}"
            elif lost:
                lost = _not_back(hosts, lost, elastic["lost_bound"], signals)
                reason = ", ".join(f"lost {task} at {host}" for task, host in lost.items()) or "lost hosts came back"
            else:
                reason = ", ".join(f"{host} joined" for host in joined)
            if signals.received:
                return _exit_code(-signals.received[0])
            members = _form(hosts, elastic, signals, chief=members[0])
            if isinstance(members, int):
                return members


def _form(hosts: HostList, elastic: dict, signals: _forwarding_signals, chief: Optional[str]):
    """The next round's hosts (the chief's first), once MAX are listed or MIN
    for `join_grace` seconds; exit 9 after `below_min_timeout` below MIN, the
    signal's code if one comes while waiting."""
    low, high = elastic["min"], elastic["max"]
    started = time.monotonic()
    enough_since = None
    while True:
        listed = hosts.read()
        chosen = _choose(listed, chief, high)
        if len(chosen) >= high:
            return chosen
        now = time.monotonic()
        if len(chosen) >= low:
            enough_since = enough_since or now
            if now - enough_since >= elastic["join_grace"]:
                return chosen
        else:
            enough_since = None
            if now - started >= elastic["below_min_timeout"]:
                where = f"{elastic['hosts']}" if elastic.get("hosts") else f"`{elastic['discover']}`"
                chief_note = f" (the chief's host {chief} among them)" if chief and chief not in listed else ""
                _say(f"{len(chosen)} host(s) usable from {where}{chief_note}, fewer than cluster.elastic.min_workers={low} for "
                     f"{elastic['below_min_timeout']:g}s (cluster.elastic.below_min_timeout): stopping (exit {EXIT_TOO_FEW_WORKERS}); "
                     "rerun the same command to resume from the newest checkpoint")
                return EXIT_TOO_FEW_WORKERS
        if signals.wait(POLL_SECONDS):
            return _exit_code(-signals.received[0])


def _choose(listed: List[str], chief: Optional[str], most: int) -> List[str]:
    """The chief's host first (it writes the run: it stays, and without it no round forms), then the others in list order."""
    if chief is not None and chief not in listed:
        return []
    first = chief or (listed[0] if listed else None)
    return ([first] + [host for host in listed if host != first])[:most] if first else []


def _run_round(spec: dict, members: List[str], hosts: HostList, signals: _forwarding_signals) -> Tuple[int, Dict[str, str], List[str]]:
    """Run one round to its end: (exit code, the lost workers {task: host}, the hosts that asked to join)."""
    ports = _free_ports(len(members))
    cluster = {"worker": [f"{host}:{port}" for host, port in zip(members, ports)]}
    refusals = _SaidOnce()
    tasks = [_Task("worker", index, cluster, spec["command"], Path(spec["log_dir"]), spec.get("run_log"), refusals,
                   spec.get("task_env", {}))
             for index in range(len(members))]
    for task in tasks:
        task.start()
    signals.procs = [task.proc for task in tasks]
    code, lost, joined = _watch(tasks, members, hosts, signals, spec["elastic"]["max"])
    if code == 0 and not signals.received:
        for task in tasks:
            task.succeeded.set()
    preempted = (signals.received and signal.SIGINT not in signals.received) or joined
    _teardown(tasks, ["worker"], grace=spec.get("preemption_grace", 60) if preempted else QUICK_GRACE_SECONDS,
              signalled=bool(signals.received or joined))
    if signals.received:
        own = [t.proc.returncode for t in tasks if t.proc.returncode not in (0, -signal.SIGKILL)]
        code = _exit_code(own[0] if own else -signals.received[0])
    elif joined and any(t.proc.returncode != EXIT_PREEMPTED for t in tasks):
        joined = []  # a task did not checkpoint and leave as asked: a failure, not a growth
        code = next(_exit_code(t.proc.returncode) for t in tasks if t.proc.returncode != EXIT_PREEMPTED)
    for task in tasks:
        for pump in task.pumps:
            pump.join(timeout=5)
    return code, lost, joined


def _watch(tasks: List[_Task], members: List[str], hosts: HostList, signals: _forwarding_signals,
           most: int) -> Tuple[int, Dict[str, str], List[str]]:
    """Until the round ends: every worker done (0), a worker lost (its host
    gone from the list, or its task dead), hosts asking to join (the tasks
    told to checkpoint and stop), or a signal from outside."""
    lost: Dict[str, str] = {}
    next_read = 0.0
    while not signals.received:
        if time.monotonic() >= next_read:
            next_read = time.monotonic() + HOSTS_EVERY_SECONDS
            listed = hosts.read()
            for task, host in zip(tasks, members):
                if host not in listed and task.proc.poll() is None and task is not tasks[0]:
                    _say(f"{host} left the host list: stopping {task.name}, which ran there")
                    _signal_group(task.proc, signal.SIGKILL)  # what the host's loss would do
                    lost[task.name] = host
            joining = [host for host in listed if host not in members][:most - len(members)]
            if joining and not lost and all(task.proc.poll() is None for task in tasks):
                _say(f"{', '.join(joining)} listed: the workers checkpoint at their next loop boundary and stop, "
                     f"for a round of {len(members) + len(joining)}")
                for task in tasks:
                    _signal_group(task.proc, signal.SIGTERM)
                return EXIT_PREEMPTED, {}, joining
        if all(task.proc.poll() == 0 for task in tasks):
            return 0, {}, []
        failed = [(task, host) for task, host in zip(tasks, members) if task.proc.poll() not in (None, 0)]
        if failed:
            task, host = min(failed, key=lambda pair: pair[0].proc.returncode >= 0)  # one killed by a signal is the cause
            code = _exit_code(task.proc.returncode)
            listed = hosts.read()
            lost.update({t.name: h for t, h in zip(tasks, members) if h not in listed and t is not tasks[0]})
            if not lost:
                _say(f"task {task.name} exited with code {code}; stopping the round")
            return code, lost, []
        time.sleep(POLL_SECONDS)
    return 0, lost, []


def _not_back(hosts: HostList, lost: Dict[str, str], bound: float, signals: _forwarding_signals) -> Dict[str, str]:
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
