"""The processes of a local cluster, and what the supervisor does to them:
each task started with its TF_CONFIG and its output pumped to the terminal
and the logs, signals passed on to the tasks, their teardown, the ports they
listen on and the loopback of the private network namespace they run in.

Public, because the launcher (launch/local/launcher.py) and the supervisor of
its rounds, whichever membership they have, all use them. No TensorFlow
here, and no training code.
"""

import ctypes
import functools
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from tfdistx.checkpoint_files import SCRATCH_ENV  # file names only: no TensorFlow
from tfdistx.core.errors import EXIT_INTERRUPTED
from tfdistx.cluster import evaluator as sidecars  # the sidecar evaluator's task
from tfdistx.cluster.prefork import Prefork, own_group_and_die_with_parent, runs_tfdistx_under, takes_held_signals
from tfdistx.loggers.progress import RELAY_ENV, relayed_status  # its wire format: plain Python, no TensorFlow
from tfdistx.sigterm import CTRL_C_HINT, STOP_SIGNALS, held, release, signal_number

POLL_SECONDS = 0.1  # between looks at the tasks a teardown waits for
# in the tasks' log directory: each task's scratch (its checkpoints, if not the chief), removed as it ends
SCRATCH_DIR = ".scratch"


class Task:
    """One process of the cluster, which can be started again in its place."""

    def __init__(
        self,
        job: str,
        index: int,
        cluster: dict,
        command: List[str],
        log_dir: Path,
        run_log: Optional[str],
        refusals: "SaidOnce",
        env: Dict[str, str],
    ):
        self.job, self.name = job, f"{job}:{index}"
        self.refusals = refusals  # shared by the cluster's tasks
        self.scratch = log_dir / SCRATCH_DIR / f"{job}-{index}"
        self.env = {
            **os.environ,
            **env,
            "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": job, "index": index}}),
            SCRATCH_ENV: str(self.scratch),
            "TFDISTX_LOCAL_TASK": "1",
        }  # rendezvous.py: no exposure warning, the launcher gave its own
        self.command, self.log_path, self.run_log = command, log_dir / f"{job}-{index}.log", run_log
        self.succeeded = threading.Event()  # set once the cluster's primary tasks have all exited 0
        self.proc, self.pumps = None, []

    def start(self, prefork: Optional[Prefork] = None) -> None:
        """Forked by `prefork` (TensorFlow imported once, cluster/prefork.py) if
        given and able, else a fresh process: the same task either way."""
        self.proc = prefork.spawn(self.command, self.env, self.name) if prefork is not None else None
        if self.proc is None:
            # tfdistx's own command takes the held signals when its handlers are set (cli.main), under mpiexec
            # too (which passes them on to it held); another takes them as it starts, as a fresh process would.
            launched = runs_tfdistx_under(self.command)
            ours = launched or takes_held_signals(self.command)
            with held():  # not even the moment before its exec meets the supervisor's handlers
                self.proc = (_Launched if launched else subprocess.Popen)(
                    self.command,
                    env=self.env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    preexec_fn=functools.partial(_starting, os.getpid(), ours),
                )
        thread = threading.Thread(
            target=pump,
            args=(self.proc, self.name, self.log_path, self.run_log, self.succeeded, self.refusals),
            daemon=True,
        )
        thread.start()
        self.pumps.append(thread)
        self.stopped_since = None

    def clear_scratch(self) -> None:
        """Once the task has ended: its scratch goes, whether it left on its own or was killed."""
        shutil.rmtree(self.scratch, ignore_errors=True)

    def stopped_for(self) -> float:
        """Seconds this task has been seen stopped (state T in /proc), else 0."""
        try:
            state = Path(f"/proc/{self.proc.pid}/stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            state = ""
        if state not in ("T", "t"):
            self.stopped_since = None
            return 0.0
        self.stopped_since = self.stopped_since or time.monotonic()
        return time.monotonic() - self.stopped_since


class _Launched(subprocess.Popen):
    """A task whose tfdistx process another launcher starts (`mpiexec -n 1 python -m tfdistx _task ...`,
    strategy.communication=mpi). The signals passed on to it go to that process (a descendant with the task's
    scratch dir in its environment), not to the launcher: MPICH's mpiexec says so in lines of its own
    ("Sending Ctrl-C to processes as requested"), and loses a signal that comes before it has started its
    process, which then trains on. One that comes before the process is there is given to it once it is
    (`poll`, which the supervisor calls as it watches and tears down); the launcher gets the stop signals
    held, never takes them, and ends with its process."""

    def __init__(self, command, env: Dict[str, str], **kwargs):
        super().__init__(command, env=env, **kwargs)
        self._scratch, self._inner, self._pending = f"{SCRATCH_ENV}={env[SCRATCH_ENV]}".encode(), None, []

    def send_signal(self, sig) -> None:
        self._pending.append(sig)
        self._deliver()

    def poll(self):
        code = super().poll()
        if code is None and self._pending:
            self._deliver()
        return code

    def _deliver(self) -> None:
        self._inner = self._inner or self._find_inner()
        while self._inner is not None and self._pending:
            try:
                os.kill(self._inner, self._pending.pop(0))
            except ProcessLookupError:
                self._pending.clear()

    def _find_inner(self) -> Optional[int]:
        """The tfdistx process among the launcher's descendants, once it has started."""
        children = [self.pid]
        while children:
            pid = children.pop()
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
                # Itself, not the launcher's proxy, whose command line names it too (hydra_pmi_proxy ... python -m ...)
                if takes_held_signals(argv) and self._scratch in Path(f"/proc/{pid}/environ").read_bytes():
                    return pid
                for thread in Path(f"/proc/{pid}/task").iterdir():
                    children += [int(child) for child in (thread / "children").read_text().split()]
            except OSError:  # gone meanwhile
                continue
        return None


def _starting(parent: int, takes_them_itself: bool) -> None:
    """A fresh task's preexec_fn: its own group, dying with the supervisor; the stop signals still held unless
    the command will not take them itself, which gets them now, at their defaults."""
    own_group_and_die_with_parent(parent)
    if not takes_them_itself:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        release()


def causes_first(tasks: List[Task]) -> List[Task]:
    """The tasks, those killed by a signal first: when a ps is killed, the
    coordinator exits 5 on losing it within the same poll, and the line that
    says why the cluster stopped should name the ps, not the coordinator."""
    return sorted(tasks, key=lambda task: (task.proc.poll() or 0) >= 0)  # False (killed) sorts first


def teardown(
    tasks: List[Task],
    primary: List[str],
    grace: float,
    signalled: bool,
    hurry: Callable[[], Optional[float]] = lambda: None,
) -> None:
    """Stop every task: SIGKILL whatever is left after `grace` seconds, or
    by the time `hurry()` names once it names one (a second Ctrl-C).

    After a signal from outside, the tasks already have it (SIGINT: stop, or
    checkpoint and stop once training; SIGTERM: checkpoint and stop) and are
    only waited for. Otherwise (a task
    failed, or the primaries finished) the others get a moment to leave on
    their own (a preempted peer's workers exit 42 together), then SIGTERM.
    The tasks that only serve the trainers (a ps, a parameter-server worker,
    the tf.data service) stop serving once no trainer is left (they hold
    nothing to save): the trainers and the sidecar evaluator are waited for.
    """
    deadline = time.monotonic() + grace
    procs = [task.proc for task in tasks]
    waited = [task.proc for task in tasks if task.job in primary or sidecars.is_sidecar(task.job)]
    if not signalled:
        _wait_all(procs, time.monotonic() + 1.0)
        for proc in procs:
            if proc.poll() is None:
                signal_group(proc, signal.SIGTERM)
    _wait_all(waited, deadline, hurry)
    for task in tasks:
        signal_group(task.proc, signal.SIGKILL)  # also reaps any grandchildren
        task.proc.wait()
        task.clear_scratch()


def _wait_all(procs, deadline: float, hurry: Callable[[], Optional[float]] = lambda: None) -> None:
    """Until every one of `procs` has exited, or `deadline` (sooner if `hurry()` names a time). Each is polled
    at every look: a task under another launcher is given then a signal that came before it had started."""
    while True:
        running = [proc for proc in procs if proc.poll() is None]
        hurried = hurry()
        left = (deadline if hurried is None else min(deadline, hurried)) - time.monotonic()
        if not running or left <= 0:
            return
        time.sleep(min(left, POLL_SECONDS))


def shell_code(code: int) -> int:
    """A child killed by signal N reports -N; a shell would say 128 + N."""
    return 128 - code if code < 0 else code


class ForwardingSignals:
    """While inside, SIGINT, SIGTERM and SIGHUP are passed on to the children
    (SIGINT: Ctrl-C, the user's stop; SIGTERM is a scheduler's preemption notice,
    which TensorFlow's coordination service catches) and remembered.
    `notices`: the signals that mean what SIGTERM does (cluster.notice_signals,
    USR1 by default: sigterm.py), passed on and remembered as a SIGTERM, so
    that a USR1 to the launcher is a preemption of the whole cluster.

    Each process in `procs` gets every signal received once, in order,
    whenever it joined: one started after a signal came gets it as it joins
    (a task started as Ctrl-C came stops too), and none gets one twice (two
    are a second Ctrl-C: stop at once). `hurried_at`: when a second Ctrl-C
    came (time.monotonic), else None."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, procs, notices: Sequence[str] = ()):
        self.previous = {}
        self.received: List[int] = []
        self.notices = tuple(signal_number(name) for name in notices)
        self.hurried_at: Optional[float] = None
        self._procs: list = []
        self._given: Dict[int, tuple] = {}  # id(proc) -> (proc, how many of `received` it was given)
        self.procs = procs

    @property
    def procs(self) -> list:
        return self._procs

    @procs.setter
    def procs(self, procs) -> None:
        """The processes signals are passed on to from now on; a new one gets at once those received before."""
        self._procs = list(procs)
        for proc in self._procs:
            self._catch_up(proc)

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`; True as soon as a signal has come."""
        deadline = time.monotonic() + seconds
        while not self.received and time.monotonic() < deadline:
            time.sleep(0.1)
        return bool(self.received)

    @property
    def ctrl_c(self) -> bool:
        """Whether the stop is Ctrl-C's (the first signal that came)."""
        return bool(self.received) and self.received[0] == signal.SIGINT

    def _forward(self, signum, frame):
        signum = signal.SIGTERM if signum in self.notices else signum
        if signum == signal.SIGINT and signal.SIGINT in self.received and self.hurried_at is None:
            self.hurried_at = time.monotonic()
        self.received.append(signum)
        for proc in self._procs:
            self._catch_up(proc)

    def _catch_up(self, proc) -> None:
        """`proc` given every signal received that it has not had. Each is claimed before it is sent: this
        handler may run again in the middle (a signal between two bytecodes), and goes on from the next."""
        while self._given.get(id(proc), (proc, 0))[1] < len(self.received):
            index = self._given.get(id(proc), (proc, 0))[1]
            self._given[id(proc)] = (proc, index + 1)  # the process held with its count: its id is not given again
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGINT if self.received[index] == signal.SIGINT else signal.SIGTERM)
                except ProcessLookupError:
                    pass

    def __enter__(self):
        for sig in (*self.SIGNALS, *self.notices):
            self.previous[sig] = signal.signal(sig, self._forward)
        return self

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def signal_group(proc, sig) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# TensorFlow's C++ log (glog: `E0000 00:00:1764190403.460497  4567 ring_alg.cc:291] ...`) of a collective or an
# RPC that failed because a peer is gone: `Aborting RingReduce with UNAVAILABLE`, a cancelled receive ...
_TF_CPP_LOST_PEER = (
    r"^[EWF]\d{4} \S+\s+\d+ \S+:\d+\] .*"
    r"(UNAVAILABLE|CANCELLED|DEADLINE_EXCEEDED|ABORTED|Aborting|Connection reset|Socket closed|connection refused)"
)
# TensorFlow errors known to be harmless, kept in the task's own log but not
# shown: the coordinator's eval loop releases a remote function handle, which
# TF 2.21 has not implemented (every evaluation of a parameter-server run) ...
_ALWAYS_HARMLESS = re.compile(r"Failed to clear function handle cache: UNIMPLEMENTED")
# ... and, once the run has succeeded, peers noticing that the cluster is going away.
# TensorFlow's C++ log of a collective aborted because a peer is lost (its
# cause is the one line tfdistx prints; a multi-line message's task list).
# A parameter-server coordinator whose worker is gone (an elastic run's dropped worker) says the last of these at each
# loop.
_HARMLESS_ONCE_DONE = re.compile(
    r"coordination service|unhealthy|heartbeat|Failed to send RPC|leader task|Error received from peer|"
    r"This could happen if the remote target has been disconnected from the client|"
    r"Additional GRPC error information|failed to connect to all addresses|The tasks have crashed|"
    r"Collective ops is aborted|StartAbort|The error could be from a previous operation|"
    r"^/job:\w+/replica:\d+/task:\d+\s*$|" + _TF_CPP_LOST_PEER
)


class SaidOnce:
    """The refusal lines (`tfdistx: invalid config: ...`) the cluster's tasks
    have shown: each task checks the config it shares with the others and
    refuses it in the same line, which the terminal needs once; and the
    line of a Ctrl-C (`tfdistx: interrupted ...`), which every trainer that
    saved says alike, and which is then the command's one line, and the one
    a slow boundary has them say as they wait for it; and a task's last
    word (LAST_WORD) that another task said alike. Each task's log keeps
    its own. Each task has its own pump thread, hence the lock."""

    def __init__(self):
        self.lines, self.lock = set(), threading.Lock()

    def first(self, line: str) -> bool:
        key = next((prefix for prefix in (INTERRUPTED, CTRL_C_HINT) if line.startswith(prefix)), line)
        with self.lock:
            new = key not in self.lines
            self.lines.add(key)
            return new

    @property
    def interrupted(self) -> bool:
        """Whether a task has said the Ctrl-C line."""
        with self.lock:
            return INTERRUPTED in self.lines


class _StatusLine:
    """The chief's status line (loggers/progress.py: its step, steps/s, time left), relayed as lines of its own
    and drawn here, under the run's lines, on a terminal, as a single process draws it: a line shown above it
    clears it first and draws it again under itself. One a process: its tasks' pumps and its own lines share
    the terminal."""

    def __init__(self):
        self.text, self.lock = "", threading.Lock()

    def show(self, text: str) -> None:
        with self.lock:
            if text or self.text:
                sys.stdout.write("\r\033[K" + text)
                sys.stdout.flush()
            self.text = text

    def above(self, write: Callable[[], None]) -> None:
        with self.lock:
            if self.text:
                sys.stdout.write("\r\033[K")
                sys.stdout.flush()
            write()
            if self.text:
                sys.stdout.write(self.text)
                sys.stdout.flush()


STATUS_LINE = _StatusLine()


def relay_env() -> Dict[str, str]:
    """What a task's environment gets when this process's standard output is a terminal: its chief sends its
    status line to be drawn here (loggers/progress.py)."""
    try:
        return {RELAY_ENV: "1"} if sys.stdout.isatty() else {}
    except (AttributeError, ValueError):  # a closed or file-less stream
        return {}


REFUSAL = "tfdistx: invalid config:"
# A task's last word: one line of tfdistx's own that names the code it exits with. Tasks that share a
# config and a machine end alike (data not downloaded, a run directory in use): the terminal needs it once.
LAST_WORD = re.compile(r"tfdistx: .*\(exit \d+")
INTERRUPTED = "tfdistx: interrupted"  # the line a trainer says once it saved on Ctrl-C (engine/preemption.py)


def pump(
    proc, name: str, log_path: Path, run_log_path: Optional[str], succeeded: threading.Event, refusals: SaidOnce
) -> None:
    """Copy a task's output to its log file, and prefixed by its name to the
    terminal and to the run's log (the whole run in one file, as the terminal
    shows it; appends of whole lines do not interleave), less known noise
    and a refusal another task has shown."""
    with open(log_path, "ab") as logfile, open(run_log_path or os.devnull, "ab") as run_log:

        def show(text: str) -> None:
            prefixed = f"[{name}] {text}"
            run_log.write(prefixed.encode())
            run_log.flush()
            STATUS_LINE.above(lambda: (sys.stdout.write(prefixed), sys.stdout.flush()))

        # A peer's last lines as the chief leaves (worker:1 seeing the coordination
        # service's leader go) come before anyone knows whether the run succeeded:
        # held until this task ends, and shown only if it failed without saying
        # why in a line of tfdistx's own (a lost peer's one line names it).
        held, explained, drew = [], False, False
        for line in iter(proc.stdout.readline, b""):
            text = line.decode(errors="replace")
            status = relayed_status(text)
            if status is not None:  # the chief's status line, for the terminal alone: no log holds it
                STATUS_LINE.show(status)
                drew = bool(status)
                continue
            logfile.write(line)
            logfile.flush()
            if _ALWAYS_HARMLESS.search(text) or (succeeded.is_set() and _HARMLESS_ONCE_DONE.search(text)):
                continue
            said_alike = text.startswith((REFUSAL, INTERRUPTED, CTRL_C_HINT)) or LAST_WORD.match(text)
            if said_alike and not refusals.first(text):
                continue
            if _HARMLESS_ONCE_DONE.search(text) and not text.startswith("tfdistx:"):  # tfdistx's own lines are news
                held.append(text)
                continue
            explained = explained or (text.startswith("tfdistx: ") and not text.lower().startswith("tfdistx: warning"))
            show(text)
        if drew:  # the chief ended without taking it away
            STATUS_LINE.show("")
        if held and proc.wait() not in (0, EXIT_INTERRUPTED) and not explained:  # Ctrl-C explains itself
            for text in held:
                show(text)


def yield_the_cores(nice: int) -> None:
    """This process and all it starts (the prefork, the tasks, the sidecars) at a lower priority:
    `cluster.nice`. In a forked child only (a session leader cannot start a new session).

    Linux's autogroup scheduler (on in most distributions' kernels) shares the cores between sessions
    first, and a process's own nice weighs only inside its session. So the run leaves the command's
    session (the user's terminal: niced, it would stay so after the run) for one of its own, whose
    autogroup gets the nice; the process's nice too, which is what counts where autogroup is off. Alone
    on the machine the run is as fast; beside other work it yields: two unit-test files took 387 s beside
    a 2x1 training at nice 0, 104 s at nice 10 and 69 s at 19, against 70 s alone (docs/multi-process.md)."""
    os.setsid()
    os.nice(nice)
    for _ in range(20):  # the kernel takes one autogroup change in 100 ms, machine-wide (EAGAIN)
        try:
            Path("/proc/self/autogroup").write_text(f"{nice}\n")
            return
        except FileNotFoundError:  # a kernel without autogroup: the process's nice is what counts
            return
        except BlockingIOError:
            time.sleep(0.05)
    print(
        f"tfdistx: WARNING: the local cluster's session could not be niced ({nice}): the kernel kept refusing; "
        "its processes are niced alone",
        file=sys.stderr,
        flush=True,
    )


def can_isolate() -> bool:
    """Whether this user may make a private user and network namespace here:
    util-linux's `unshare` asked (a few milliseconds), or, on a machine
    without it, a fresh interpreter making one as the supervisor does
    (enter_private_network: the same system call, no binary needed; not a
    fork of this process, whose threads may hold the loader's lock)."""
    if shutil.which("unshare"):
        probe = ["unshare", "--user", "--map-root-user", "--net", "true"]
    else:
        probe = [
            sys.executable,
            "-c",
            "from tfdistx.cluster.processes import enter_private_network, loopback_up; "
            "enter_private_network(); loopback_up()",
        ]
    try:
        return subprocess.run(probe, capture_output=True, timeout=60).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def enter_private_network() -> None:
    """This process into a new user and network namespace, as `unshare --user --map-root-user --net` puts the
    command it runs: root inside is this user outside, and the network has only a loopback (down: loopback_up).
    A single-threaded process only (a forked child): the kernel refuses a new user namespace to a threaded one.
    ctypes, because os.unshare is Python 3.12's."""
    CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
    uid, gid = os.geteuid(), os.getegid()
    if ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"unshare(CLONE_NEWUSER | CLONE_NEWNET): {os.strerror(error)}")
    for name, line in (
        ("setgroups", "deny"),
        ("uid_map", f"0 {uid} 1"),
        ("gid_map", f"0 {gid} 1"),
    ):  # setgroups first, or gid_map is refused
        with open(f"/proc/self/{name}", "w") as file:
            file.write(line)


def loopback_up() -> None:
    """`ip link set lo up`, without needing iproute2: a new namespace starts with lo down."""
    SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
    import fcntl

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def free_ports(n: int, host: str = "127.0.0.1", taken: Sequence[int] = ()) -> List[int]:
    """`n` ports free on `host` ("": every interface, which a TensorFlow server binds), none of them
    `taken`: held open together while chosen, so that no two are the same."""
    sockets: List[socket.socket] = []
    try:
        ports: List[int] = []
        while len(ports) < n:
            sock = socket.socket()
            sockets.append(sock)
            sock.bind((host, 0))
            if sock.getsockname()[1] not in taken:
                ports.append(sock.getsockname()[1])
        return ports
    finally:
        for sock in sockets:
            sock.close()
