"""SIGTERM as a notice to save and leave, from a training process's start.

Schedulers announce preemption with SIGTERM (Slurm, Kubernetes, spot VMs)
and kill a few seconds later. Python's default is to die at once, with
nothing printed and nothing saved, which is what a process still starting
(composing, importing TensorFlow, forming the cluster) used to do. So a
training process takes SIGTERM over from its very start: the handler only
notes it (and says so, once), and the phase the process is in decides what
to do: a launcher that has started nothing, or a task still waiting for
peers that never came, leaves with the preemption code at once (nothing
trained, nothing to save); a trainer checkpoints at its next loop boundary,
the first being the start of training (engine/preemption.py); a server the
trainers need (a parameter server, a tf.data service task) keeps serving
until they have saved (engine/serving.py).

No TensorFlow here: it is installed before TensorFlow is imported.
"""

import logging
import signal
import sys
import threading
from typing import Optional

from tfdistx.config.errors import EXIT_PREEMPTED

log = logging.getLogger(__name__)


class SigtermNotice:
    """While open (a context manager, in the main thread), SIGTERM sets
    `received` instead of ending the process; the previous handler comes
    back on exit, so a later job of a sweep in the same process, or a
    notebook, is left as it was. `plan` is what the process will do about
    it, said once when the signal comes."""

    TRAINER = f"checkpointing at the next loop boundary, then exiting with {EXIT_PREEMPTED}"

    def __init__(self, plan: str = TRAINER):
        self.received = threading.Event()
        self.plan = plan
        self._previous = None

    def __enter__(self) -> "SigtermNotice":
        if threading.current_thread() is threading.main_thread():  # signal.signal works only there
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def _on_sigterm(self, signum, frame) -> None:
        if not self.received.is_set() and self.plan:
            log.warning("SIGTERM: %s", self.plan)
        self.received.set()

    def leave_if_received(self, where: str) -> None:
        """Where nothing has started that could save (nothing is trained, and
        no peer waits on this process yet): a SIGTERM means leave now."""
        if self.received.is_set():
            leave_preempted(f"preempted (SIGTERM) {where}: nothing was trained to save; rerun the same command to resume")


def reclaim() -> None:
    """Put Python's SIGTERM handler back after TensorFlow started something
    that takes the signal over: a multi-worker strategy or a server starts
    the coordination service, whose preemption notifier (tsl's
    SigtermNotifier) replaces the process's handler with one that only logs
    "SIGTERM caught" (found in CI: an evicted pod trained on to the end and
    exited 0). Python still reports its own handler, so setting that again
    puts it back: a SigtermNotice's, or by default "end the process"."""
    if threading.current_thread() is threading.main_thread():  # signal.signal works only there
        signal.signal(signal.SIGTERM, signal.getsignal(signal.SIGTERM))


def leave_preempted(message: Optional[str] = None) -> None:
    """Exit with the preemption code (SystemExit: logs close, scratch dirs go)."""
    if message:
        print(f"tfdistx: {message}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_PREEMPTED)
