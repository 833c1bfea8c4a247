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
import re
import signal
import threading

import tensorflow as tf

from tfdistx.engine.checkpointing import Checkpointer
from tfdistx.config.errors import EXIT_LOST_PEER, EXIT_PREEMPTED, RunFault

log = logging.getLogger(__name__)


class Preempted(SystemExit):
    """Raised after the preemption checkpoint is written: unwinds (closing
    logs, removing scratch directories) and exits the process with 42."""

    def __init__(self):
        super().__init__(EXIT_PREEMPTED)


class PreemptionWatcher:
    """While open (a context manager), a SIGTERM sets a flag instead of
    killing the process; the previous handler comes back on exit, so a later
    job of a multirun in the same process is not left with this one's."""

    def __init__(self, strategy: tf.distribute.Strategy, checkpointer: Checkpointer, synchronous_cluster: bool):
        self.checkpointer = checkpointer
        self.signalled = threading.Event()
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        self._anyone = None
        if synchronous_cluster:
            @tf.function
            def anyone_signalled(flag):
                per_replica = strategy.run(tf.identity, args=(flag,))
                return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None) > 0

            self._anyone = anyone_signalled

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        signal.signal(signal.SIGTERM, self._previous)

    def _on_sigterm(self, signum, frame):
        log.warning("SIGTERM: checkpointing at the next loop boundary, then exiting with %d", EXIT_PREEMPTED)
        self.signalled.set()

    def check(self, step: int) -> None:
        """Call after every loop call, on every worker: saves and exits if any worker was signalled."""
        signalled = self.signalled.is_set()
        if self._anyone is not None:
            signalled = bool(self._anyone(tf.constant(float(signalled))).numpy())
        if signalled:
            self.checkpointer.save(step)
            log.warning("preempted at step %d: checkpoint saved; exiting with %d", step, EXIT_PREEMPTED)
            raise Preempted()


@contextlib.contextmanager
def lost_peer_in_one_line(synchronous_cluster: bool, parameter_servers: bool = False):
    """A peer of a synchronous cluster that dies or freezes aborts the
    collectives of the others (TensorFlow's heartbeat notices within about a
    minute): the task then stops with one line naming the peer, instead of a
    page of traceback, and a code the launcher or scheduler restarts on.
    With parameter servers, a lost worker is the coordinator's to schedule
    around, but a lost ps task takes its variables with it: the coordinator
    stops the same way, to be restarted from the newest checkpoint (under
    Kubernetes' restartPolicy ExitCode a traceback's exit 1 would end the job)."""
    try:
        yield
    except (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError, tf.errors.InternalError,
            tf.errors.UnknownError, tf.errors.DeadlineExceededError) as error:
        text = str(error)
        if synchronous_cluster and re.search(r"unhealthy|heartbeat|[Cc]ollective ops is aborted|Socket closed|failed to connect", text):
            peers = sorted(set(re.findall(r"/job:(\w+)/replica:\d+/task:(\d+)", text.split("unhealthy", 1)[-1])))
        elif parameter_servers and "/job:ps/" in text:
            peers = sorted(set(re.findall(r"/job:(ps)/replica:\d+/task:(\d+)", text)))
        else:
            raise
        who = ", ".join(f"{job}:{index}" for job, index in peers) or "a peer"
        first = next((line.strip() for line in text.splitlines() if re.search(r"unhealthy|abort|heartbeat|connect", line)), "")[:200]
        # Whether the cluster restarts is the launcher's or scheduler's call (not when the peer failed on bad input):
        # this task only says it can resume.
        raise RunFault(f"lost contact with {who} of the cluster, stopping (exit {EXIT_LOST_PEER}: a restart resumes from the "
                       f"newest checkpoint) (TensorFlow: {first})", EXIT_LOST_PEER) from None
