"""Start a local cluster's supervisor, which starts its tasks as real
processes and watches them (cluster/supervisor.py), and the fixed
membership: the same counts of tasks, on loopback, in every round.

It knows nothing of training: it is handed a LaunchSpec (cluster/launch_spec.py):
how many tasks each job has, the command that starts one task (which
learns its place from TF_CONFIG), the jobs whose exit ends the cluster,
and a directory for the tasks' logs.

TensorFlow's gRPC servers listen on every interface and have no
authentication, so the tasks run, where the OS allows it, in a private
network namespace that has nothing but loopback (as `unshare --user --net`,
no privileges needed); the process that supervises them runs inside it too.

Hand-written because no maintained library does this for tf.distribute:
torchrun is PyTorch's, and TensorFlow ships no local multi-process launcher.
"""

import os
import shutil
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import Optional

from tfdistx.cluster import evaluator as sidecars  # the sidecar evaluator's task
from tfdistx.cluster.launch_spec import LaunchSpec
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
from tfdistx.cluster.supervisor import Membership, Round, SupervisorLines, Supervisor
from tfdistx.core.errors import ConfigError
from tfdistx.core.strategies import describe_jobs  # no training code: the job table's words
from tfdistx.sigterm import SigtermNotice, leave_preempted, nothing_to_save, release


def run_local_cluster(spec: LaunchSpec, isolate: Optional[bool] = None, notice: Optional[SigtermNotice] = None) -> int:
    """Run the cluster `spec` says to its end; the exit code of the first task that failed, else 0.

    `isolate`: None isolates when possible (and says so when not), True
    insists, False never isolates. `notice`: the process's SIGTERM notice
    (sigterm.py): one that came before the cluster started ends the run
    here. The rest is the supervisor's (cluster/supervisor.py), a fork of
    this process, over a fixed membership (FixedCounts) or, for a run in
    rounds, a worker per listed host (launch/local/elastic.py).
    """
    Path(spec.log_dir).mkdir(parents=True, exist_ok=True)
    spec = replace(
        spec,
        task_env={**spec.task_env, **relay_env()},  # its chief's status line drawn here, on a terminal
        preload_imported=imported_here(list(spec.preload)),  # asked here: in the supervisor, a fork, always so
    )
    counts = spec.counts
    isolated = isolate is not False and can_isolate()
    if isolated:
        print(
            f"tfdistx: local cluster ({describe_jobs(counts)}) in a private network namespace: loopback only",
            flush=True,
        )
    elif isolate:
        raise ConfigError.for_key(
            "cluster.isolate",
            True,
            "this machine does not allow a private network namespace (unshare --user --net failed)",
        )
    else:
        print(
            f"tfdistx: WARNING: local cluster ({describe_jobs(counts)}) is NOT isolated: its TensorFlow gRPC servers "
            "listen on all interfaces without authentication while it runs. Allow unprivileged user namespaces, "
            "or firewall the ports.",
            file=sys.stderr,
            flush=True,
        )
    with ForwardingSignals([], spec.notice_signals) as forwarding:
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


def _supervise(spec: LaunchSpec, isolated: bool) -> int:
    """The supervisor's process, forked: its signals taken first thing (what came since the fork is
    passed on now), in a process group of its own (Ctrl-C at the terminal reaches the launcher alone,
    which passes it on: once), at the priority asked (`cluster.nice`), then into the private network
    namespace, if the cluster has one."""
    with ForwardingSignals([], spec.notice_signals) as signals:
        release()
        if spec.nice:
            yield_the_cores(spec.nice)  # a session of its own, hence a group
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

    def __init__(self, spec: LaunchSpec):
        self.spec = spec

    def form(self, reason: str, signals: ForwardingSignals) -> Round:
        counts = self.spec.counts
        ports = free_ports(sum(counts.values()))
        cluster = {job: [f"127.0.0.1:{ports.pop()}" for _ in range(n)] for job, n in counts.items() if n}
        return Round.placed(self.spec, cluster, sidecars.sidecar_jobs(self.spec.evaluator))


def main(spec: LaunchSpec, isolated: bool, signals: ForwardingSignals) -> int:
    """The supervisor's process, inside the namespace: the run's rounds, with
    a fixed membership, or an elastic one (`spec.rounds`: launch/local/elastic.py).
    `signals`: the supervisor's, taken since its start."""
    if isolated:
        loopback_up()
    say = SupervisorLines(spec.run_log)
    membership = HostListMembership.of(spec, say) if spec.rounds else FixedCounts(spec)
    # what a launcher killed by SIGKILL left (one launcher per run directory)
    scratch = Path(spec.log_dir) / SCRATCH_DIR
    shutil.rmtree(scratch, ignore_errors=True)
    # The tasks' imports, done once (spec.preload, named by the training side): forked from here on.
    prefork = (
        Prefork(list(spec.preload), spec.log_dir, fork_this=spec.preload_imported)
        if spec.preload and can_fork(list(spec.command))
        else None
    )
    try:
        return Supervisor(spec, membership, signals, say, prefork).run()
    finally:
        if prefork is not None:
            prefork.close()
        shutil.rmtree(scratch, ignore_errors=True)
