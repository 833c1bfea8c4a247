"""Preemption: a SIGTERM becomes a checkpoint and exit code 42.

Schedulers announce preemption with SIGTERM (Slurm, Kubernetes, spot VMs),
often to one worker only. Every worker of a synchronous cluster must then
save at the *same* step, because saving is collective. So after each loop
call the workers sum their "signalled" flags with one tiny all-reduce: all of
them see a SIGTERM at the same loop boundary, save, and exit 42. Rerunning
the same command, or the local launcher restarting the cluster, resumes
from that checkpoint.

Why not tf.distribute's PreemptionCheckpointHandler: it counts its own run
calls and restores that counter from the checkpoint directory it is given,
so a non-chief worker (which must save elsewhere) starts with a different
count than the chief; and it brings a second CheckpointManager with
max_to_keep=1 into the run's checkpoint directory.
"""

import contextlib
import logging
import os
import re
import sys
import threading
import time
from types import MappingProxyType
from typing import Callable, List, Mapping, NoReturn, Optional, Sequence

import tensorflow as tf

from tfdistx.cluster import liveness, training_end
from tfdistx.cluster.held import HeldDeadline
from tfdistx.cluster.placement import Placement
from tfdistx.core.errors import EXIT_LOST_PEER, EXIT_PREEMPTED, RunFault, offset_exit
from tfdistx.engine.checkpointing import Checkpointer
from tfdistx.internals import tensorflow as internals
from tfdistx.log_files import into_log_files
from tfdistx.sigterm import SigtermNotice

# What TensorFlow raises in a task whose peer is gone, frozen or aborted the collectives (the text then says which);
# a call's deadline passing (DeadlineExceededError) is one more, where the step was waiting on a peer.
PEER_ERRORS = (
    tf.errors.UnavailableError,
    tf.errors.AbortedError,
    tf.errors.CancelledError,
    tf.errors.InternalError,
    tf.errors.UnknownError,
)

log = logging.getLogger(__name__)


class Preempted(SystemExit):
    """Raised after the preemption checkpoint is written: unwinds (closing
    logs, removing scratch directories) and exits the process with 42 (130:
    the notice was Ctrl-C's)."""

    def __init__(self, code: int = EXIT_PREEMPTED):
        super().__init__(code)


class PreemptionWatcher:
    """Turns the process's SIGTERM notice (sigterm.py) into a checkpoint and
    exit 42 at a loop boundary that every worker of a synchronous cluster
    agrees on: `check(step)` before the first step and after every loop call.
    From its making until `done()`, a first Ctrl-C is such a notice too: the
    checkpoint, then exit 130."""

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        checkpointer: Checkpointer,
        synchronous_cluster: bool,
        notice: SigtermNotice,
    ):
        self.checkpointer, self.notice = checkpointer, notice
        notice.plan = SigtermNotice.TRAINER
        self._anyone = any_task(strategy) if synchronous_cluster else None
        notice.saves = True

    def done(self) -> None:
        """The loop is over: there is no boundary left to save at, and Ctrl-C stops the process at once again."""
        self.notice.saves = False

    def check(self, step: int) -> None:
        """Call at the same points on every worker: saves and exits if any worker was signalled."""
        signalled = self.notice.received.is_set()
        if self._anyone is not None:
            signalled = self._anyone(signalled)
        if signalled:
            self.notice.acting()
            self.checkpointer.save(step)  # nothing new when `step` is the checkpoint the run resumed from
            # every worker has saved before any leaves: a scheduler that ends the whole step at a task's first exit
            # (srun --kill-on-bad-exit) cannot cut the chief's save short
            if self._anyone is not None:
                self._all_saved()
            if self.notice.interrupted:  # Ctrl-C: the one line the user's command shows (a cluster's tasks': once)
                line = f"tfdistx: interrupted at step {step}: checkpoint saved; rerun the same command to resume"
                print(line, file=sys.stderr, flush=True)
                into_log_files(line, logging.WARNING)
            else:
                log.warning("preempted at step %d: checkpoint saved; exiting with %d", step, EXIT_PREEMPTED)
            raise Preempted(self.notice.code)

    def _all_saved(self) -> None:
        """The all-reduce after the save. A ring all-reduce ends on one task
        while another still pulls its last chunk from it: a task that left
        first, having saved, aborts that pull ("Socket closed"). This task
        has saved too, so it is preempted as well, not a lost peer (exit 5
        here while the others exit 42 failed a local elastic round)."""
        try:
            self._anyone(True)
        except PEER_ERRORS as error:
            log.info(
                "a peer left the all-reduce after the preemption checkpoint first: %s", str(error).splitlines()[0][:200]
            )


def any_task(strategy: tf.distribute.Strategy) -> Callable[[bool], bool]:
    """`anyone(flag)`: whether any task of a synchronous cluster passed True,
    by one tiny all-reduce; every task must call it at the same point."""
    summed = sum_over_tasks(strategy)
    return lambda flag: summed([float(flag)])[0] > 0


def sum_over_tasks(strategy: tf.distribute.Strategy) -> Callable[[List[float]], List[float]]:
    """`summed(values)`: each value summed over the tasks of a synchronous
    cluster (float64), by one all-reduce that every task must call at the
    same point. A task's replicas each give its values divided by their
    number, so a task's values count once."""

    @tf.function(autograph=False)
    def summed(values):
        per_replica = strategy.run(lambda: values / tf.cast(_local_replicas(strategy), tf.float64))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return lambda values: [float(v) for v in summed(tf.constant(values, tf.float64)).numpy()]


def _local_replicas(strategy) -> int:
    return len(strategy.extended.worker_devices)


@contextlib.contextmanager
def lost_peer_in_one_line(
    synchronous_cluster: bool,
    parameter_servers: bool = False,
    placement: Optional[Placement] = None,
    peer_timeout: Optional[float] = None,
    keep: Optional[Callable[[], Optional[str]]] = None,
):
    """A peer of a synchronous cluster that dies or freezes aborts the
    collectives of the others (a dead one at once, a frozen one once it has
    sent no heartbeat for `cluster.peer_timeout`): the task then stops with
    one line naming the peer, instead of a page of traceback, and a code the
    launcher or scheduler restarts on. With parameter servers, a lost worker
    is the coordinator's to schedule around, but a lost ps task takes its
    variables with it: the coordinator stops the same way, to be restarted
    from the newest checkpoint (under Kubernetes' restartPolicy ExitCode a
    traceback's exit 1 would end the job). `placement`: the cluster spec, to
    name a peer that TensorFlow names by its address. `keep`: for a
    synchronous cluster's lost peer, saves what can be kept (the last loop
    boundary's state, commit.py) before the task stops; what it saved, said
    in the line."""
    try:
        yield
    except (*PEER_ERRORS, tf.errors.DeadlineExceededError) as error:
        text = str(error)
        if synchronous_cluster and re.search(
            r"unhealthy|heartbeat|[Cc]ollective ops is aborted|Socket closed|failed to connect", text
        ):
            peers = lost_tasks(text, placement.cluster_spec if placement else {}) or silent_peers(placement)
        elif parameter_servers and "/job:ps/" in text:
            peers = sorted(set(f"ps:{index}" for index in re.findall(r"/job:ps/replica:\d+/task:(\d+)", text)))
        else:
            raise
        who = ", ".join(peers) or "a peer"
        first = next(
            (line.strip() for line in text.splitlines() if re.search(r"unhealthy|abort|heartbeat|connect", line)), ""
        )[:200]
        frozen = (
            " (a frozen peer counts as lost after cluster.peer_timeout={:g}s)".format(peer_timeout)
            if peer_timeout and "heartbeat" in text
            else ""
        )
        # Whether the cluster restarts is the launcher's or scheduler's call (not when the peer failed on bad input):
        # this task only says it can resume.
        kept = _kept(keep) if synchronous_cluster and keep else None
        resumes = kept or "from the newest checkpoint"
        raise RunFault(
            f"lost contact with {who} of the cluster{frozen}, stopping (exit {EXIT_LOST_PEER}: a restart resumes "
            f"{resumes}) (TensorFlow: {first})",
            EXIT_LOST_PEER,
        ) from None


def _kept(keep: Callable[[], Optional[str]]) -> Optional[str]:
    """What `keep` saved, or None: a save that fails leaves the newest checkpoint as it was, said in a warning."""
    try:
        return keep()
    except Exception as error:  # whatever the save met: the lost peer stays the line that counts
        log.warning(
            "could not save the last loop boundary's state (%s: %s): the run resumes from its newest checkpoint",
            type(error).__name__,
            str(error).strip().splitlines()[0][:200] if str(error).strip() else "",
        )
        return None


GONE_EVERY_SECONDS = 1.0  # how often a synchronous task asks whether a peer's process is gone


@contextlib.contextmanager
def peers_gone_abort_the_collectives(placement: Placement):
    """While open (a synchronous cluster's training loop): a peer whose
    process is gone (its host refuses a connection to its port:
    cluster/liveness.py) ends this task's collectives at once. TensorFlow
    notices a dead peer in a collective that calls it, but a collective
    that waits for the peer to call (measured: a third of the losses of a
    killed worker of a local 2x1) waited until the coordination service's
    heartbeat timeout, `cluster.peer_timeout`: the survivors were stopped
    long before, and the chief saved nothing. Aborted, the call fails as a
    lost peer's does (lost_peer_in_one_line names the peer, and the chief
    saves the last loop boundary). A peer cut off, frozen or whose host is
    down is not refused: that is the heartbeat's to notice, as before."""
    peers = {
        f"{job}:{index}": address
        for job, addresses in placement.cluster_spec.items()
        for index, address in enumerate(addresses)
        if (job, index) != (placement.task_type, placement.task_index)
    }
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(GONE_EVERY_SECONDS):
            gone = [name for name, address in peers.items() if liveness.refused(address)]
            if gone:  # TensorFlow's error reads "Collective ops is aborted by: " and this
                where = "; ".join(f"{name} at ipv4:{peers[name]}: Failed to connect" for name in gone)
                internals.abort_collectives(f"{where} (its process is gone: its host refuses connections to its port)")
                return

    thread = threading.Thread(target=watch, name="tfdistx-peers-gone", daemon=True)
    if peers:
        thread.start()
    try:
        yield
    finally:
        stop.set()


_TASK = re.compile(r"/job:(\w+)(?:/replica:\d+)?/task:(\d+)")
# Errors whose text names the lost task itself, in lost_tasks' order: the
# coordination service reports a heartbeat timeout as the unhealthy task's
# own; a peer that died and came back (a recreated pod) before its death was
# noticed is a new incarnation.
_NAMING_THE_LOST = (
    re.compile(r"Error reported from (/job:\S+?): The following tasks are unhealthy"),
    re.compile(r"(/job:\S+) unexpectedly tried to connect with a different incarnation"),
)


def lost_tasks(text: str, spec: Mapping[str, Sequence[str]]) -> list:
    """The peers a collective's error says are lost, and only those
    (`spec`: the cluster spec, job -> addresses). TensorFlow says it in one
    of these ways, tried in this order: the coordination service found
    tasks that stopped sending heartbeats (a frozen or dead peer: it lists
    them, or reports the error as theirs); a task came back as a new
    incarnation (it died and was restarted, as a recreated pod, before its
    death was noticed); a gRPC connection to an address
    was refused (a dead peer, named by its address); a call to a remote
    target broke on its transport (a peer that died mid-call: "Socket
    closed"). The other targets an error mentions are alive: their calls
    failed only because they relay the same abort ("Collective ops is
    aborted by: ..."), which a ring all-reduce does from every survivor."""
    listed = re.search(r"unhealthy \(stopped sending heartbeats\):[ \t]*\n((?:[ \t]*/job:\S+[ \t]*\n?)+)", text)
    if listed:
        return _names(_TASK.findall(listed.group(1)))
    for naming in _NAMING_THE_LOST:
        named = naming.findall(text)
        if named:
            return _names(_TASK.findall(" ".join(named)))
    by_address = {
        address: f"{job}:{index}" for job, addresses in spec.items() for index, address in enumerate(addresses)
    }
    refused = {
        f"{host.strip('[]')}:{port}" for host, port in re.findall(r"ipv[46]:([^\s,;]+):(\d+): Failed to connect", text)
    }
    if refused & set(by_address):
        return sorted(by_address[address] for address in refused & set(by_address))
    broken = [
        target
        for target, message in re.findall(
            r'remote target (/job:\S+) while calling [^\n]*\n[^\n]*?grpc_message:"([^"]*)', text
        )
        if not message.startswith("Collective ops is aborted")
    ]
    return _names(_TASK.findall(" ".join(broken)))


def silent_peers(placement: Optional[Placement]) -> list:
    """The peers whose server does not answer now (cluster/liveness.py), when
    TensorFlow's error names none: a collective that timed out on a peer cut
    off by the network says only "Deadline Exceeded"."""
    if placement is None:
        return []
    peers = {
        f"{job}:{index}": address
        for job, addresses in placement.cluster_spec.items()
        for index, address in enumerate(addresses)
        if (job, index) != (placement.task_type, placement.task_index)
    }
    return sorted(name for name, address in peers.items() if not liveness.answers(address))


def _names(tasks) -> list:
    return sorted({f"{job}:{index}" for job, index in tasks})


@contextlib.contextmanager
def watching_servers(
    placement: Placement,
    cluster,
    coordinator: bool,
    progressed: Callable[[], float] = time.monotonic,
    servers_told: Mapping[str, str] = MappingProxyType({}),
):
    """While open: the servers this trainer waits on, where TensorFlow would
    wait forever on one that is frozen (cluster/liveness.py), are asked now
    and then whether they are alive: the tf.data service's tasks, and (the
    coordinator of a parameter-server cluster) the ps tasks. One that has not
    answered for `cluster.peer_timeout` seconds ends this task with one
    line and the lost-peer code, which the launcher or scheduler restarts
    from the newest checkpoint. The end comes from the watch's thread
    (os._exit, the logs flushed first): the main thread is then inside
    TensorFlow, waiting on that server, and cannot be unwound.

    The coordinator also watches its workers. A dead one is TensorFlow's to
    schedule around (its calls fail at once), but one cut off by the network
    neither fails nor answers, and the coordinator's join waits on its steps
    for as long as TCP does (measured: over 90 s, no step done). So a worker
    silent for peer_timeout ends the coordinator the same way, but only
    while no loop has finished for as long (`progressed`: when the last did).
    `servers_told`: the servers the chief tells how the training ended
    (cluster/training_end.py), told so before this task ends here."""
    servers = {
        f"{job}:{index}": address
        for job, addresses in placement.service.items()
        for index, address in enumerate(addresses)
    }
    workers = {}
    if coordinator:
        servers.update({f"ps:{index}": address for index, address in enumerate(placement.cluster_spec.get("ps", []))})
        workers = {f"worker:{index}": address for index, address in enumerate(placement.cluster_spec.get("worker", []))}

    def lost(names, waiting=""):
        training_end.tell(servers_told, training_end.cluster_digest(placement), EXIT_LOST_PEER)
        fault = RunFault(
            f"lost contact with {', '.join(names)} of the cluster: no answer for {cluster.peer_timeout:g}s "
            f"(cluster.peer_timeout){waiting}, stopping (exit {EXIT_LOST_PEER}: "
            "a restart resumes from the newest checkpoint)",
            offset_exit(EXIT_LOST_PEER, cluster.retryable_exit_offset),
        )
        end_process_now(fault)

    def stuck() -> bool:
        return time.monotonic() - progressed() >= cluster.peer_timeout

    with (
        liveness.Watch(servers, cluster.peer_timeout, lost),
        liveness.Watch(
            workers, cluster.peer_timeout, lambda names: lost(names, ", and no step done meanwhile"), waited_on=stuck
        ),
        held_by_tensorflow(placement, cluster, servers_told, {**servers, **workers})
        if coordinator
        else contextlib.nullcontext(),
    ):
        yield


def held_by_tensorflow(
    placement: Placement, cluster, servers_told: Mapping[str, str], peers: Mapping[str, str]
) -> HeldDeadline:
    """The coordinator's bound on TensorFlow's hold of its interpreter
    (cluster/held.py): a new function traced (every checkpoint it saves
    traces one) is registered on every worker, waiting on each one's answer
    with the interpreter held, so no watch above can run while a worker cut
    off by the network does not answer. Held `cluster.peer_timeout` seconds,
    it tells its servers, says so in one line naming the `peers` (its ps
    tasks, workers, the service's tasks) that do not answer then, and ends
    with the lost-peer code."""
    return HeldDeadline(
        cluster.peer_timeout,
        f"tfdistx: lost contact with {{who}} of the cluster: TensorFlow held {placement.task_name} in a call waiting "
        f"on it for {cluster.peer_timeout:g}s (cluster.peer_timeout), stopping (exit {EXIT_LOST_PEER}: a restart "
        "resumes from the newest checkpoint)",
        offset_exit(EXIT_LOST_PEER, cluster.retryable_exit_offset),
        servers_told,
        training_end.cluster_digest(placement),
        told=EXIT_LOST_PEER,
        peers=peers,
    )


def end_process_now(fault: RunFault) -> NoReturn:
    """The one line of `fault`, on the terminal and in the run's log, then
    the process ends with its code at once, whatever its threads are doing."""
    for line in fault.lines():
        print(line, file=sys.stderr, flush=True)
        into_log_files(line, logging.ERROR)
    leave_now(fault.code)


def leave_now(code: int) -> NoReturn:
    """The process ends with `code` at once, its logs flushed, whatever its threads are doing."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
