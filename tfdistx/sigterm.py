"""SIGTERM (and USR1, cluster.notice_signals) as a notice to save and leave, from a training process's start.

Schedulers announce preemption with SIGTERM (Slurm, Kubernetes, spot VMs)
and kill a few seconds later; Slurm's notice before a job's time limit is
the signal `sbatch --signal` names (USR1 in the script `tfdistx export
slurm` writes), which cluster.notice_signals makes a notice too (USR1 by
default; the same in every way below). Python's default is to die at once, with
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
from typing import Dict, Optional, Sequence

from tfdistx.spec.errors import DEFAULT_NOTICE_SIGNALS, EXIT_PREEMPTED

log = logging.getLogger(__name__)


class SigtermNotice:
    """While open (a context manager, in the main thread), SIGTERM, and the
    `signals` that mean the same (cluster.notice_signals: USR1 by default,
    Slurm's time-limit notice), set `received` instead of ending the
    process; the previous handlers come back on exit, so a later job of a
    sweep in the same process, or a notebook, is left as it was. `plan` is
    what the process will do about it, said once when the signal comes.
    Every phase reads `received` (engine/preemption.py, serving, the sidecar
    evaluator, the rendezvous), so a USR1 is a SIGTERM everywhere a
    SIGTERM is one; `signal_name` is the first one's, for the messages."""

    TRAINER = f"checkpointing at the next loop boundary, then exiting with {EXIT_PREEMPTED}"

    def __init__(self, plan: str = TRAINER, signals: Sequence[str] = DEFAULT_NOTICE_SIGNALS):
        self.received = threading.Event()
        self.plan = plan
        self.signal_name = "SIGTERM"
        self._signals = tuple(signals)
        self._previous: Dict[int, object] = {}
        self._saying: Optional[threading.Thread] = None

    def __enter__(self) -> "SigtermNotice":
        if threading.current_thread() is threading.main_thread():  # signal.signal works only there
            self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._on_notice)
            self.listen(self._signals)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}
        if self._saying is not None:  # the notice's line is out before the process ends
            self._saying.join(timeout=5)

    def listen(self, signals: Sequence[str]) -> None:
        """The notice signals besides SIGTERM, as the composed config names
        them (cluster.notice_signals): taken from the process's start with
        the default, before the config is known, and set to the config's
        here; one no longer listed gets its previous handler back."""
        self._signals = tuple(signals)
        if signal.SIGTERM not in self._previous:  # not open (or not the main thread): __enter__ takes them
            return
        wanted = {signal_number(name) for name in self._signals}
        for signum in [s for s in self._previous if s != signal.SIGTERM and s not in wanted]:
            signal.signal(signum, self._previous.pop(signum))
        for signum in wanted - set(self._previous):
            self._previous[signum] = signal.signal(signum, self._on_notice)

    def _on_notice(self, signum, frame) -> None:
        if not self.received.is_set():
            self.signal_name = signal.Signals(signum).name
            if self.plan:  # said by a thread: the handler runs between two bytecodes of the main thread, which may be
                # inside a write to the same stream, whose buffer refuses a second (a "--- Logging error ---" traceback)
                self._saying = threading.Thread(
                    target=log.warning, args=("%s: %s", self.signal_name, self.plan), name="notice"
                )
                self._saying.start()
        self.received.set()

    def leave_if_received(self, where: str) -> None:
        """Where nothing has started that could save (nothing is trained, and
        no peer waits on this process yet): a SIGTERM means leave now."""
        if self.received.is_set():
            leave_preempted(
                f"preempted ({self.signal_name}) {where}: nothing was trained to save; rerun the same command to resume"
            )


def signal_number(name: str) -> int:
    """A notice signal's number from its name as cluster.notice_signals and
    Slurm's --signal write it (USR1)."""
    return int(signal.Signals[f"SIG{name}"])


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
