"""SIGTERM (and USR1, cluster.notice_signals) as a notice to save and leave, from a training process's start.

Schedulers announce preemption with SIGTERM (Slurm, Kubernetes, spot VMs)
and kill a few seconds later; Slurm's notice before a job's time limit is
the signal `sbatch --signal` names (USR1 in the script `tfdistx job
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

Ctrl-C (SIGINT) is the user's stop, taken by the same notice in the
command line's training processes (`ctrl_c`): while nothing could be saved
(composing, importing TensorFlow, forming the cluster, after the training
loop) it stops the process at once, as Python's KeyboardInterrupt does,
and the command ends with 130 and one line; once a trainer is in its loop
(or a server its trainers need serves), the first Ctrl-C is a notice like
SIGTERM's, whose checkpoint is saved at the next loop boundary before the
process exits with 130, and a second Ctrl-C stops at once
(docs/preemption.md). What Python would print of an interrupt that lands
in a destructor or a C callback is not printed: the command's one line
says it (`quiet_after_ctrl_c`).

A process that starts another, forked or exec'd, holds these signals
(`held`) across the start: the child begins with them blocked, so that one
sent to it before its own handlers are in place is kept pending, neither
lost nor met by a default that kills, and it takes them (`release`) once
its handlers are set (cli.main, the supervisor).

No TensorFlow here: it is installed before TensorFlow is imported.
"""

import contextlib
import logging
import os
import signal
import sys
import threading
from typing import Dict, Iterator, Optional, Sequence

from tfdistx.core.errors import DEFAULT_NOTICE_SIGNALS, EXIT_INTERRUPTED, EXIT_PREEMPTED, interrupted

log = logging.getLogger(__name__)

# What a process holds across the start of another (`held`): Ctrl-C, the notices (SIGTERM, cluster.notice_signals'
# USR1 and USR2) and a closed terminal's SIGHUP, every signal a tfdistx process takes over from Python's default.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
# Set once Ctrl-C has reached this process (by a notice's handler, or by commands/common.one_line_errors'): what
# follows, an error or a destructor's complaint, is the interrupt's, and the command's one line says it.
CTRL_C = threading.Event()
_OPEN = []  # the notice open in this process (one at most: a notice opened inside it is that one)
# A first Ctrl-C whose loop boundary has not come after this long is said to be waited for: no silent wait (a loop
# call of many slow steps, a slow save). Most boundaries come well before it, and the one line is the exit's.
CTRL_C_HINT_SECONDS = 5
CTRL_C_HINT = (
    f"tfdistx: Ctrl-C: saving at the next loop boundary, then exiting with {EXIT_INTERRUPTED}; "
    "Ctrl-C again stops at once"
)


class SigtermNotice:
    """While open (a context manager, in the main thread), SIGTERM, and the
    `signals` that mean the same (cluster.notice_signals: USR1 by default,
    Slurm's time-limit notice), set `received` instead of ending the
    process; the previous handlers come back on exit, so a later job of a
    sweep in the same process, or a notebook, is left as it was. `plan` is
    what the process will do about it, said once when the signal comes, or
    as it is set if the signal came before (a process that does not know yet
    what it will be, a trainer or a launcher, says nothing until it does).
    Every phase reads `received` (engine/preemption.py, serving, the sidecar
    evaluator, the rendezvous), so a USR1 is a SIGTERM everywhere a
    SIGTERM is one; `signal_name` is the first one's, for the messages.

    `ctrl_c`: SIGINT too (the command line's training processes, cli.py).
    While `saves` is false (nothing trained yet, or the loop is over), it
    raises KeyboardInterrupt, as Python would: the process stops at once,
    and the command ends with 130. Once a trainer is in its loop, or a server
    its trainers need is serving (they set `saves`), the first Ctrl-C is a
    notice, `interrupted` (exit 130, not 42, once saved), and the next one
    raises KeyboardInterrupt: stop at once.

    One notice a process: one opened while another is open is that one (the
    command line opens it first thing; the run, the task and the training
    then find it open)."""

    TRAINER = f"checkpointing at the next loop boundary, then exiting with {EXIT_PREEMPTED}"

    def __init__(self, plan: str = TRAINER, signals: Sequence[str] = DEFAULT_NOTICE_SIGNALS, ctrl_c: bool = False):
        self.received = threading.Event()
        self._plan = plan
        self._said = False
        self.signal_name = "SIGTERM"
        self.ctrl_c = ctrl_c
        self.interrupted = False  # the notice is Ctrl-C's: the process exits 130 once it has saved
        self.saves = False  # a first Ctrl-C is a notice to save (a trainer in its loop, a server it needs)
        self._signals = tuple(signals)
        self._previous: Dict[int, object] = {}
        self._saying: Optional[threading.Thread] = None
        self._waiting: Optional[threading.Timer] = None  # says a first Ctrl-C's boundary is slow to come
        self._outer: Optional["SigtermNotice"] = None

    def __enter__(self) -> "SigtermNotice":
        if _OPEN:  # the process's notice is open already: it is this one too
            self._outer = _OPEN[-1]
            return self._outer
        if threading.current_thread() is threading.main_thread():  # signal.signal works only there
            self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._on_notice)
            if self.ctrl_c:
                self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._on_ctrl_c)
            self.listen(self._signals)
        _OPEN.append(self)
        return self

    def __exit__(self, *exc) -> None:
        if self._outer is not None:
            self._outer = None
            return
        _OPEN.remove(self)
        self.acting()
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
        taken = {signal.SIGTERM, signal.SIGINT}
        for signum in [s for s in self._previous if s not in taken and s not in wanted]:
            signal.signal(signum, self._previous.pop(signum))
        for signum in wanted - set(self._previous):
            self._previous[signum] = signal.signal(signum, self._on_notice)

    @property
    def plan(self) -> str:
        return self._plan

    @plan.setter
    def plan(self, plan: str) -> None:
        self._plan = plan
        if self.received.is_set() and not self.interrupted:
            self._say(plan)

    def _on_notice(self, signum, frame) -> None:
        if not self.received.is_set():
            self.signal_name = signal.Signals(signum).name
            self.received.set()
            self._say(self._plan)

    def _on_ctrl_c(self, signum, frame) -> None:
        CTRL_C.set()
        if not self.saves or self.interrupted:  # nothing to save yet (or any more), or Ctrl-C again: stop now
            raise KeyboardInterrupt
        self.interrupted = True  # said once saved (leave), or by the launcher
        if not self.received.is_set():
            self.signal_name = "SIGINT"
        self.received.set()
        self._waiting = threading.Timer(CTRL_C_HINT_SECONDS, print, (CTRL_C_HINT,), {"file": sys.stderr, "flush": True})
        self._waiting.daemon = True  # the process ends without waiting for it (cli.end_process)
        self._waiting.start()

    def acting(self) -> None:
        """The notice is acted on (the boundary came, the process leaves): nothing more to say of waiting for it."""
        if self._waiting is not None:
            self._waiting.cancel()

    def _say(self, plan: str) -> None:
        if plan and not self._said:  # said by a thread: the handler runs between two bytecodes of the main thread,
            # which may be inside a write to the same stream, whose buffer refuses a second ("--- Logging error ---")
            self._said = True
            self._saying = threading.Thread(target=log.warning, args=("%s: %s", self.signal_name, plan), name="notice")
            self._saying.start()

    @property
    def code(self) -> int:
        """The exit code once the notice is acted on: 130 after Ctrl-C, else the preemption code."""
        return EXIT_INTERRUPTED if self.interrupted else EXIT_PREEMPTED

    def leave_if_received(self, where: str) -> None:
        """Where nothing has started that could save (nothing is trained, and
        no peer waits on this process yet): a SIGTERM means leave now."""
        if self.received.is_set():
            if self.interrupted:
                raise KeyboardInterrupt
            if self._saying is not None:  # its line first, not in the middle of this one
                self._saying.join(timeout=5)
            leave_preempted(nothing_to_save(self.signal_name, where))

    def leave(self) -> None:
        """Leave with the notice's code, having done what it asked (a server whose trainers have saved)."""
        raise SystemExit(self.code)


def nothing_to_save(signal_name: str, where: str) -> str:
    """The line of a notice that came where nothing was trained (`where`: "before the cluster started")."""
    return f"preempted ({signal_name}) {where}: nothing was trained to save; rerun the same command to resume"


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


@contextlib.contextmanager
def held() -> Iterator[None]:
    """The stop signals blocked in this thread while inside: a process forked
    or started here (from this thread) begins with them blocked, and takes
    them when its own handlers are set (`release`). One sent to this process
    meanwhile waits too, or is taken by another of its threads (the Python
    handler still runs in the main thread, after)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def fork_held() -> int:
    """os.fork(), the child beginning with the stop signals held (`held`),
    until it takes them (`release`); the parent's are as they were."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    pid = os.fork()
    if pid:  # not a `with held()`: its exit would release them in the child too
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    return pid


def release() -> None:
    """Take the stop signals its starter held (`held`): those sent meanwhile
    come now, to the handlers just set. Nothing, where none was held."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


@contextlib.contextmanager
def quiet_after_ctrl_c() -> Iterator[None]:
    """While inside: an exception Python cannot raise (in a destructor, a
    weakref's or a C library's callback: "Exception ignored in ...", and
    pybind11's "MISMATCH ... REPLACED BY KeyboardInterrupt") is not printed
    when it is Ctrl-C's, or comes after it: the command's one line says the
    process was interrupted. Anything else is printed as Python would."""
    previous = sys.unraisablehook
    CTRL_C.clear()  # this command's (an in-process caller's earlier one is not)

    def hook(unraisable) -> None:
        if CTRL_C.is_set() or interrupted(unraisable.exc_value) or "KeyboardInterrupt" in str(unraisable.exc_value):
            return
        previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous
