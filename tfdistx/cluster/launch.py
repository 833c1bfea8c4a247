"""Start the tasks of a local cluster as real processes, and watch them.

It knows nothing of training: it is given how many tasks each job has, the
command that starts one task (which learns its place from TF_CONFIG), the
jobs whose exit ends the cluster, and a directory for the tasks' logs.

TensorFlow's gRPC servers listen on every interface and have no
authentication, so the tasks run, where the OS allows it, in a private
network namespace that has nothing but loopback (`unshare --user --net`, no
privileges needed); the process that supervises them runs inside it too.

Hand-written because no maintained library does this for tf.distribute:
torchrun is PyTorch's, and TensorFlow ships no local multi-process launcher.
"""

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

from tfdistx.cluster import evaluator as sidecars  # the sidecar evaluator's task
from tfdistx.cluster.processes import (ForwardingSignals, SaidOnce, Task, can_isolate, causes_first, die_with_parent, free_ports,
                                       loopback_up, shell_code, signal_group, teardown)
from tfdistx.config.errors import PERMANENT, ConfigError
from tfdistx.config.strategies import describe_jobs  # no training code: the job table's words
from tfdistx.sigterm import SigtermNotice

log = logging.getLogger(__name__)

QUICK_GRACE_SECONDS = 5  # between SIGTERM and SIGKILL after Ctrl-C, or when a task has died (a preemption has cluster.preemption_grace)
MAX_BACKOFF_SECONDS = 30  # restarts wait 1, 2, 4, ... seconds, at most this
# What a restart would fail the same way (config/errors.py's PERMANENT: a
# callback or logger that raised, an invalid config, a full or read-only
# disk, an install without an API tfdistx uses), and Ctrl-C. A lost task
# (5), a preemption (42), a cluster that did not form in time (4) or a port
# taken by another process (6: a restart picks fresh ports) is worth another try.
NEVER_RESTART = (*PERMANENT, 130)


def run_local_cluster(counts: Dict[str, int], command: List[str], log_dir: str, primary: List[str],
                      isolate: Optional[bool] = None, max_restarts: int = 0, restart_alone: List[str] = (),
                      stopped_task_timeout: float = 60, run_log: Optional[str] = None, evaluator: bool = False,
                      preemption_grace: float = 60, notice: Optional[SigtermNotice] = None,
                      task_env: Optional[Dict[str, str]] = None, elastic: Optional[dict] = None) -> int:
    """Run the cluster to its end; the exit code of the first task that failed, else 0.

    `isolate`: None isolates when possible (and says so when not), True
    insists, False never isolates. A cluster whose task failed or was
    preempted is restarted up to `max_restarts` times, with back-off; tasks
    of the `restart_alone` jobs are restarted on their own. A task stopped for
    `stopped_task_timeout` seconds is killed, as lost. Every task's output
    also goes, prefixed, to `run_log` (the run's one log file). `evaluator`:
    a sidecar evaluator task runs beside the cluster (cluster/evaluator.py).
    After a SIGTERM the tasks get `preemption_grace` seconds to checkpoint.
    `task_env`: added to every task's environment (e.g. its thread counts).
    `notice`: the process's SIGTERM notice (sigterm.py): one that came
    before the cluster started ends the run here. `elastic`: the run
    trains in rounds of as many workers as hosts are listed (cluster/elastic.py).
    """
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    # One fixed name, overwritten by each launch: one a SIGKILL left behind
    # does not pile up (one launcher per run directory: rundir.py).
    spec_path = os.path.join(log_dir, ".cluster.json")
    with open(spec_path, "w") as f:
        json.dump({"counts": counts, "command": command, "log_dir": log_dir, "primary": primary, "max_restarts": max_restarts,
                   "restart_alone": list(restart_alone), "stopped_task_timeout": stopped_task_timeout,
                   "run_log": run_log, "evaluator": evaluator, "preemption_grace": preemption_grace, "task_env": task_env or {},
                   "elastic": elastic}, f)
    # An elastic cluster's supervisor is its own module (it builds on this one's tasks and teardown).
    supervisor = [sys.executable, "-m", "tfdistx.cluster.elastic" if elastic else "tfdistx.cluster.launch", spec_path]
    isolated = isolate is not False and can_isolate()
    if isolated:
        supervisor = ["unshare", "--user", "--map-root-user", "--net", *supervisor, "--isolated"]
        print(f"tfdistx: local cluster ({describe_jobs(counts)}) in a private network namespace: loopback only", flush=True)
    elif isolate:
        os.unlink(spec_path)
        raise ConfigError.one("cluster.isolate", True, "this machine does not allow a private network namespace (unshare --user --net failed)")
    else:
        print(f"tfdistx: WARNING: local cluster ({describe_jobs(counts)}) is NOT isolated: its TensorFlow gRPC servers listen on all "
              "interfaces without authentication while it runs. Allow unprivileged user namespaces, or firewall the ports.", file=sys.stderr, flush=True)
    with ForwardingSignals([]) as forwarding:
        if notice is not None and notice.received.is_set():
            os.unlink(spec_path)
            notice.leave_if_received("before the cluster started")
        proc = subprocess.Popen(supervisor, preexec_fn=die_with_parent)
        forwarding.procs = [proc]
        if forwarding.received:  # came while it was starting
            proc.send_signal(signal.SIGTERM)
        code = proc.wait()
    os.unlink(spec_path)
    return shell_code(code)


def supervise(spec: dict, isolated: bool) -> int:
    """Inside the namespace: run the cluster, restarting it up to
    `max_restarts` times when its tasks fail or are preempted (exit 42).

    Tasks of the jobs in `restart_alone` (a parameter-server cluster's
    workers, whose work the coordinator reschedules) are restarted on their
    own instead, from the same budget.
    """
    if isolated:
        loopback_up()
    restarts = Budget(spec.get("max_restarts", 0))
    with ForwardingSignals([]) as signals:
        while True:
            code = _run_cluster_once(spec, signals, restarts)
            if code == 0 or signals.received or code in NEVER_RESTART:
                return code
            if not restarts.take():
                if restarts.total:
                    print(f"tfdistx: giving up: the cluster stopped after {restarts.total} restart(s) "
                          f"(cluster.max_restarts={restarts.total}); last exit code {code}", file=sys.stderr, flush=True)
                return code
            delay = min(2 ** (restarts.used - 1), MAX_BACKOFF_SECONDS)
            print(f"tfdistx: the cluster stopped with exit code {code}; restart {restarts.used} of {restarts.total} in {delay}s, "
                  "resuming from the latest checkpoint", file=sys.stderr, flush=True)
            if signals.wait(delay):  # a signal during the back-off ends it
                return shell_code(-signals.received[0])


class Budget:
    """cluster.max_restarts: shared by restarts of the whole cluster and of a task alone."""

    def __init__(self, total: int):
        self.total, self.used = total, 0

    def take(self) -> bool:
        if self.used >= self.total:
            return False
        self.used += 1
        return True


def _run_cluster_once(spec: dict, signals: ForwardingSignals, restarts: Budget) -> int:
    """Start every task on fresh ports, stream their output, wait for the end."""
    counts, log_dir = spec["counts"], Path(spec["log_dir"])
    ports = free_ports(sum(counts.values()))
    cluster = {job: [f"127.0.0.1:{ports.pop()}" for _ in range(n)] for job, n in counts.items() if n}
    refusals = SaidOnce()  # every task refuses a bad config alike: its line is shown once
    env = spec.get("task_env", {})
    tasks = [Task(job, index, cluster, spec["command"], log_dir, spec.get("run_log"), refusals, env) for job, addresses in cluster.items()
             for index in range(len(addresses))]
    # Sidecars (the evaluator) get the cluster's TF_CONFIG with their own task type, and no address in it.
    tasks += [Task(job, index, cluster, spec["command"], log_dir, spec.get("run_log"), refusals, env)
              for job, n in sidecars.sidecar_jobs(spec).items() for index in range(n)]
    for task in tasks:
        task.start()

    signals.procs = [task.proc for task in tasks]
    code = _wait(tasks, spec["primary"], spec.get("restart_alone", []), signals, restarts, spec.get("stopped_task_timeout", 60))
    if code == 0 and not signals.received:  # training is done: the evaluator evaluates its final checkpoint
        sidecars.let_finish([t.proc for t in tasks if sidecars.is_sidecar(t.job)], lambda: bool(signals.received))
    if code == 0 and not signals.received:
        for task in tasks:
            task.succeeded.set()
    # A SIGTERM from outside leaves the tasks time to checkpoint. After Ctrl-C,
    # or once a task has died (its peers, blocked in a collective, can neither
    # checkpoint nor leave but by SIGKILL), there is nothing to wait for.
    preempted = signals.received and signal.SIGINT not in signals.received
    teardown(tasks, spec["primary"], grace=spec.get("preemption_grace", 60) if preempted else QUICK_GRACE_SECONDS,
              signalled=bool(signals.received))
    if signals.received:  # the tasks' own verdict if they gave one (42: checkpointed), else 128 + signal
        own = [t.proc.returncode for t in tasks if t.proc.returncode not in (0, -signal.SIGKILL) and not sidecars.is_sidecar(t.job)]
        code = shell_code(own[0] if own else -signals.received[0])
    for task in tasks:
        for pump in task.pumps:
            pump.join(timeout=5)
    return code


def _wait(tasks: List[Task], primary: List[str], restart_alone: List[str], signals: ForwardingSignals, restarts: Budget,
          stopped_limit: float = 60) -> int:
    """Until a task fails (its code), a signal came (already passed on to the
    tasks), or every primary task has exited 0 (0).

    A task that stays stopped (SIGSTOP, a debugger) `stopped_limit` seconds is
    killed, so that it counts as lost: a parameter-server coordinator would
    otherwise wait on its step forever (TensorFlow notices a dead worker, not
    a frozen one), and a synchronous cluster is restarted without waiting on it.
    """
    sidecars_ended = set()
    while True:
        if signals.received:
            return 0
        primaries_done = True
        for task in causes_first(tasks):
            if task.stopped_for() > stopped_limit:
                print(f"tfdistx: task {task.name} has been stopped for more than {stopped_limit:g}s "
                      "(cluster.stopped_task_timeout): treating it as lost", file=sys.stderr, flush=True)
                signal_group(task.proc, signal.SIGKILL)
                task.proc.wait()
            code = task.proc.poll()
            if sidecars.is_sidecar(task.job):  # never restarted, never stops the cluster: said once if it failed
                if code not in (None, 0) and task.name not in sidecars_ended:
                    sidecars.report_exit(task.name, shell_code(code))
                if code is not None:
                    sidecars_ended.add(task.name)
                continue
            if code not in (None, 0, *NEVER_RESTART) and task.job in restart_alone and restarts.take():
                print(f"tfdistx: task {task.name} exited with code {shell_code(code)}; restarting it alone "
                      f"(restart {restarts.used} of {restarts.total})", file=sys.stderr, flush=True)
                task.start()
                signals.procs = [t.proc for t in tasks]
                code = None
            elif code not in (None, 0):
                print(f"tfdistx: task {task.name} exited with code {shell_code(code)}; stopping the cluster", file=sys.stderr, flush=True)
                return shell_code(code)
            if task.job in primary and code is None:
                primaries_done = False
        if primaries_done:
            return 0
        time.sleep(0.2)


if __name__ == "__main__":
    spec_path = sys.argv[1]
    sys.exit(supervise(json.loads(Path(spec_path).read_text()), isolated="--isolated" in sys.argv[2:]))
