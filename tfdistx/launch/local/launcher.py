"""Start a local cluster's supervisor, which starts its tasks as real
processes and watches them (cluster/supervisor.py), and the fixed
membership: the same counts of tasks, on loopback, in every round.

It knows nothing of training: it is given how many tasks each job has, the
command that starts one task (which learns its place from TF_CONFIG), the
jobs whose exit ends the cluster, and a directory for the tasks' logs.

TensorFlow's gRPC servers listen on every interface and have no
authentication, so the tasks run, where the OS allows it, in a private
network namespace that has nothing but loopback (as `unshare --user --net`,
no privileges needed); the process that supervises them runs inside it too.

Hand-written because no maintained library does this for tf.distribute:
torchrun is PyTorch's, and TensorFlow ships no local multi-process launcher.
"""

import json
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from tfdistx.cluster import evaluator as sidecars  # the sidecar evaluator's task
from tfdistx.launch.local.elastic import HostListMembership
from tfdistx.cluster.prefork import Prefork, can_fork, fork, imported_here
from tfdistx.cluster.processes import (
    SCRATCH_DIR,
    ForwardingSignals,
    can_isolate,
    enter_private_network,
    free_ports,
    loopback_up,
    relay_env,
    shell_code,
    yield_the_cores,
)
from tfdistx.cluster.supervisor import Membership, Round, Say, Supervisor
from tfdistx.spec.errors import ConfigError
from tfdistx.spec.strategies import describe_jobs  # no training code: the job table's words
from tfdistx.sigterm import SigtermNotice, leave_preempted, nothing_to_save, release


def run_local_cluster(
    counts: Dict[str, int],
    command: List[str],
    log_dir: str,
    primary: List[str],
    isolate: Optional[bool] = None,
    max_restarts: int = 0,
    restart_alone: List[str] = (),
    stopped_task_timeout: float = 60,
    run_log: Optional[str] = None,
    evaluator: bool = False,
    preemption_grace: float = 60,
    peer_timeout: float = 60,
    notice: Optional[SigtermNotice] = None,
    notice_signals: Sequence[str] = (),
    task_env: Optional[Dict[str, str]] = None,
    elastic: Optional[dict] = None,
    preload: Sequence[str] = (),
    nice: int = 0,
) -> int:
    """Run the cluster to its end; the exit code of the first task that failed, else 0.

    `isolate`: None isolates when possible (and says so when not), True
    insists, False never isolates. A cluster whose task failed or was
    preempted is restarted up to `max_restarts` times, with back-off; tasks
    of the `restart_alone` jobs are restarted on their own. A task stopped for
    `stopped_task_timeout` seconds is killed, as lost. Every task's output
    also goes, prefixed, to `run_log` (the run's one log file). `evaluator`:
    a sidecar evaluator task runs beside the cluster (cluster/evaluator.py).
    After a SIGTERM the tasks get `preemption_grace` seconds to checkpoint;
    a chief whose peer was lost, `peer_timeout` for its call to fail and
    then that grace to save the last loop boundary (supervisor.py);
    `notice_signals` (cluster.notice_signals: USR1 ...) are passed on as one.
    `task_env`: added to every task's environment (e.g. its thread counts).
    `preload`: what every task imports first ("module" or "module:function"),
    done once in a process the tasks are forked from (cluster/prefork.py);
    empty: each task is a fresh process.
    `notice`: the process's SIGTERM notice (sigterm.py): one that came
    before the cluster started ends the run here. `elastic`: the run
    trains in rounds of as many workers as hosts are listed (launch/local/elastic.py).
    `nice`: above 0, the cluster's processes run at that lower priority, in a
    session of their own (processes.yield_the_cores).
    """
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    spec = {
        "counts": counts,
        "command": command,
        "log_dir": log_dir,
        "primary": primary,
        "max_restarts": max_restarts,
        "restart_alone": list(restart_alone),
        "stopped_task_timeout": stopped_task_timeout,
        "run_log": run_log,
        "evaluator": evaluator,
        "preemption_grace": preemption_grace,
        "peer_timeout": peer_timeout,
        "notice_signals": list(notice_signals),
        "task_env": {**(task_env or {}), **relay_env()},  # its chief's status line drawn here, on a terminal
        "preload": list(preload),
        "elastic": elastic,
        "nice": nice,
        "preload_imported": imported_here(list(preload)),
    }  # asked here: in the supervisor, a fork, it would always seem so
    spec = json.loads(json.dumps(spec))  # plain data, as when the supervisor read it from a file
    isolated = isolate is not False and can_isolate()
    if isolated:
        print(
            f"tfdistx: local cluster ({describe_jobs(counts)}) in a private network namespace: loopback only",
            flush=True,
        )
    elif isolate:
        raise ConfigError.one(
            "cluster.isolate",
            True,
            "this machine does not allow a private network namespace (unshare --user --net failed)",
        )
    else:
        print(
            f"tfdistx: WARNING: local cluster ({describe_jobs(counts)}) is NOT isolated: its TensorFlow gRPC servers listen on all "
            "interfaces without authentication while it runs. Allow unprivileged user namespaces, or firewall the ports.",
            file=sys.stderr,
            flush=True,
        )
    with ForwardingSignals([], notice_signals) as forwarding:
        if notice is not None and notice.received.is_set():
            notice.leave_if_received("before the cluster started")
        if forwarding.received:  # came since: nothing started yet, nothing to pass on
            if forwarding.ctrl_c:
                raise KeyboardInterrupt
            leave_preempted(nothing_to_save("SIGTERM", "before the cluster started"))
        # The supervisor: a fork of this process, not a fresh interpreter (its imports are done; where this
        # process has imported what the tasks preload, its prefork is a fork too: cluster/prefork.py). It
        # begins with the signals held, and takes them once its own handlers are set (_supervise); every
        # signal this process receives from now on is passed on to it, once (one that comes as it is forked
        # too, given to it as it joins).
        proc = fork(lambda: _supervise(spec, isolated))
        forwarding.procs = [proc]
        code = proc.wait()
    return shell_code(code)


def _supervise(spec: dict, isolated: bool) -> int:
    """The supervisor's process, forked: its signals taken first thing (what came since the fork is
    passed on now), in a process group of its own (Ctrl-C at the terminal reaches the launcher alone,
    which passes it on: once), at the priority asked (`cluster.nice`), then into the private network
    namespace, if the cluster has one."""
    with ForwardingSignals([], spec.get("notice_signals", ())) as signals:
        release()
        if spec.get("nice"):
            yield_the_cores(spec["nice"])  # a session of its own, hence a group
        else:
            os.setpgid(0, 0)
        # A process group outside the terminal's foreground one is stopped when it writes to the terminal, if
        # the terminal says so (`stty tostop`): its tasks' lines are the run's output.
        signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        if isolated:
            try:
                enter_private_network()
            except OSError as error:  # can_isolate's probe passed a moment ago; as `unshare` said it: one line, exit 1
                print(
                    f"tfdistx: the local cluster could not enter its private network namespace: {error}",
                    file=sys.stderr,
                    flush=True,
                )
                return 1
        return main(spec, isolated, signals)


class FixedCounts(Membership):
    """A fixed local cluster: `counts` tasks per job, all on loopback, on
    fresh ports each round (a port another process took is not taken again),
    with the sidecars beside them. Its membership never changes: a task that
    failed is a restart of the same cluster, or of the task alone."""

    def __init__(self, spec: dict):
        self.spec = spec

    def form(self, reason: str, signals: ForwardingSignals) -> Round:
        counts = self.spec["counts"]
        ports = free_ports(sum(counts.values()))
        cluster = {job: [f"127.0.0.1:{ports.pop()}" for _ in range(n)] for job, n in counts.items() if n}
        return Round.placed(self.spec, cluster, sidecars.sidecar_jobs(self.spec))


def main(spec: dict, isolated: bool, signals: ForwardingSignals) -> int:
    """The supervisor's process, inside the namespace: the run's rounds, with
    a fixed membership, or an elastic one (`spec["elastic"]`: launch/local/elastic.py).
    `signals`: the supervisor's, taken since its start."""
    if isolated:
        loopback_up()
    say = Say(spec.get("run_log"))
    membership = HostListMembership.of(spec, say) if spec.get("elastic") else FixedCounts(spec)
    scratch = (
        Path(spec["log_dir"]) / SCRATCH_DIR
    )  # what a launcher killed by SIGKILL left (one launcher per run directory)
    shutil.rmtree(scratch, ignore_errors=True)
    # The tasks' imports, done once (spec["preload"], named by the training side): forked from here on.
    prefork = (
        Prefork(spec["preload"], spec["log_dir"], fork_this=spec.get("preload_imported", False))
        if spec.get("preload") and can_fork(spec["command"])
        else None
    )
    try:
        return Supervisor(spec, membership, signals, say, prefork).run()
    finally:
        if prefork is not None:
            prefork.close()
        shutil.rmtree(scratch, ignore_errors=True)
