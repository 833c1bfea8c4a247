"""A bound on the time TensorFlow may hold this process's interpreter while
it waits on a peer that does not answer.

Some of TensorFlow's calls wait on a remote task while holding Python's
global interpreter lock: a parameter-server coordinator that traces a new
function registers it on every worker of the cluster and waits for each
one's answer (EagerContext::MaybeRegisterFunctionRemotely, with no
deadline), and every checkpoint it saves traces one (functional_saver
retraces its save for a checkpoint spread over several tasks). A worker cut
off by the network never answers, so the coordinator stopped at its first
checkpoint step after the cut, for good and without a line: the threads
that watch its peers (cluster/liveness.py) are Python threads, and none of
them could run again.

So the bound is kept outside the interpreter: two POSIX timers of the C
library (timer_create, SIGEV_THREAD), whose expiry runs a C function in a
thread of the library's own, without the interpreter. A Python thread
pushes both back every second, which it can do only while the interpreter
runs. When it has not run for `seconds` the first fires: `system()` starts
a small Python process (this module's `_say_and_tell`) that tells the
run's servers how it ended (cluster/training_end.py) and prints the task's
one line, naming the peers that do not answer (it asks them, as
cluster/liveness.py does); a few seconds later the second calls `_exit`
with the lost-peer code. By then the servers were told, and they end with
it instead of waiting out their own `cluster.peer_timeout`.

Hand-written on ctypes and the C library (Linux, glibc or musl): Python's
own watchdog (faulthandler.dump_traceback_later) runs without the
interpreter too, but can only end the process with exit 1, the code of a
failure no restart cures. Where the C library has no such timers, there is
no bound (a line at debug level says so). No TensorFlow here.
"""

import ctypes
import ctypes.util
import json
import logging
import shlex
import sys
import threading
from typing import List, Mapping, Optional

log = logging.getLogger(__name__)

PUSH_SECONDS = 1.0  # how often the deadline is pushed back while the interpreter runs
# After the line and the word to the servers start, how long before the process ends: time for a Python process to
# start and to tell the servers (training_end.TELL_SECONDS at most).
TELL_MARGIN_SECONDS = 5.0

_CLOCK_MONOTONIC, _SIGEV_THREAD = 1, 2


class _Sigval(ctypes.Union):
    _fields_ = [("sival_int", ctypes.c_int), ("sival_ptr", ctypes.c_void_p)]


class _SigevThread(ctypes.Structure):
    _fields_ = [("function", ctypes.c_void_p), ("attribute", ctypes.c_void_p)]


class _SigevUnion(ctypes.Union):
    _fields_ = [("pad", ctypes.c_int * 12), ("tid", ctypes.c_int), ("thread", _SigevThread)]


class _Sigevent(ctypes.Structure):  # struct sigevent, 64 bytes on Linux
    _fields_ = [("value", _Sigval), ("signo", ctypes.c_int), ("notify", ctypes.c_int), ("un", _SigevUnion)]


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("interval", _Timespec), ("value", _Timespec)]


def _timers():
    """(libc, timer_create, timer_settime, timer_delete), or None where the C library has no POSIX timers."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        owner = libc if hasattr(libc, "timer_create") else ctypes.CDLL(ctypes.util.find_library("rt") or "librt.so.1")
        return libc, owner.timer_create, owner.timer_settime, owner.timer_delete
    except (OSError, AttributeError):
        return None


class HeldDeadline:
    """While open (a context manager), this process ends with `code` when
    its interpreter has been held `seconds` in a row: first `servers`
    (name -> address) are told `told` (training_end.tell: the code before
    cluster.retryable_exit_offset) and `line` is printed on stderr, naming
    (`{who}`) those of `peers` (name -> address) that do not answer then,
    both from a process of its own; then the process ends."""

    def __init__(
        self,
        seconds: float,
        line: str,
        code: int,
        servers: Mapping[str, str],
        digest: str,
        told: int,
        peers: Mapping[str, str],
    ):
        self.seconds, self.code = seconds, code
        words = json.dumps([line, dict(servers), digest, told, dict(peers)])
        # The command system() runs when the first deadline passes, every value in it shell-quoted.
        self._command = ctypes.create_string_buffer(
            shlex.join(
                [sys.executable, "-c", "from tfdistx.cluster.held import _say_and_tell; _say_and_tell()", words]
            ).encode()
        )
        self._timers: List[ctypes.c_void_p] = []
        self._events: List[_Sigevent] = []  # kept alive while the timers may fire
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._c = _timers()

    def __enter__(self) -> "HeldDeadline":
        if self._c is None:
            log.debug("no POSIX timers in this C library: TensorFlow's hold on the interpreter is not bounded")
            return self
        libc, timer_create, _, _ = self._c
        for function, says in ((libc.system, True), (libc._exit, False)):
            event = _Sigevent()
            event.notify = _SIGEV_THREAD
            if says:  # system(command)
                event.value.sival_ptr = ctypes.cast(self._command, ctypes.c_void_p).value
            else:  # _exit(code)
                event.value.sival_int = self.code
            event.un.thread.function = ctypes.cast(function, ctypes.c_void_p).value
            timer = ctypes.c_void_p()
            if timer_create(_CLOCK_MONOTONIC, ctypes.byref(event), ctypes.byref(timer)) != 0:
                self._delete()
                log.debug(
                    "timer_create failed (errno %d): TensorFlow's hold on the interpreter is not bounded",
                    ctypes.get_errno(),
                )
                return self
            self._events.append(event)
            self._timers.append(timer)
        self._push()
        self._thread = threading.Thread(target=self._run, name="tfdistx-held-deadline", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=PUSH_SECONDS + 1)
        self._delete()

    def _run(self) -> None:
        while not self._stop.wait(PUSH_SECONDS):
            self._push()

    def _push(self) -> None:
        """Both deadlines from now: the line and the word to the servers, then the end."""
        _, _, timer_settime, _ = self._c
        for timer, after in zip(self._timers, (self.seconds, self.seconds + TELL_MARGIN_SECONDS)):
            spec = _Itimerspec()
            spec.value.tv_sec, spec.value.tv_nsec = int(after), int((after % 1) * 1e9)
            timer_settime(timer, 0, ctypes.byref(spec), None)

    def _delete(self) -> None:
        if self._c is None:
            return
        for timer in self._timers:
            self._c[3](timer)
        self._timers = []


def _say_and_tell() -> None:
    """In a process of its own (the held one cannot run Python): the servers
    told, and meanwhile the peers asked, to name those that do not answer."""
    from concurrent.futures import ThreadPoolExecutor

    from tfdistx.cluster.liveness import answers
    from tfdistx.cluster.training_end import tell

    line, servers, digest, code, peers = json.loads(sys.argv[1])
    with ThreadPoolExecutor(max_workers=len(peers) + 1) as pool:
        telling = pool.submit(tell, servers, digest, code)
        answered = dict(zip(peers, pool.map(answers, peers.values())))
        silent = [name for name, yes in sorted(answered.items()) if not yes]
        print(line.format(who=", ".join(silent) or "a peer"), file=sys.stderr, flush=True)
        telling.result()
