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

import ctypes
import json
import logging
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
from typing import Dict, List, Optional

from tfdistx.cluster import evaluator as sidecars  # the sidecar evaluator's task
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
    isolated = isolate is not False and _can_isolate()
    if isolated:
        supervisor = ["unshare", "--user", "--map-root-user", "--net", *supervisor, "--isolated"]
        print(f"tfdistx: local cluster ({describe_jobs(counts)}) in a private network namespace: loopback only", flush=True)
    elif isolate:
        os.unlink(spec_path)
        raise ConfigError.one("cluster.isolate", True, "this machine does not allow a private network namespace (unshare --user --net failed)")
    else:
        print(f"tfdistx: WARNING: local cluster ({describe_jobs(counts)}) is NOT isolated: its TensorFlow gRPC servers listen on all "
              "interfaces without authentication while it runs. Allow unprivileged user namespaces, or firewall the ports.", file=sys.stderr, flush=True)
    with _forwarding_signals([]) as forwarding:
        if notice is not None and notice.received.is_set():
            os.unlink(spec_path)
            notice.leave_if_received("before the cluster started")
        proc = subprocess.Popen(supervisor, preexec_fn=_die_with_parent)
        forwarding.procs = [proc]
        if forwarding.received:  # came while it was starting
            proc.send_signal(signal.SIGTERM)
        code = proc.wait()
    os.unlink(spec_path)
    return _exit_code(code)


def supervise(spec: dict, isolated: bool) -> int:
    """Inside the namespace: run the cluster, restarting it up to
    `max_restarts` times when its tasks fail or are preempted (exit 42).

    Tasks of the jobs in `restart_alone` (a parameter-server cluster's
    workers, whose work the coordinator reschedules) are restarted on their
    own instead, from the same budget.
    """
    if isolated:
        _loopback_up()
    restarts = _Budget(spec.get("max_restarts", 0))
    with _forwarding_signals([]) as signals:
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
                return _exit_code(-signals.received[0])


class _Budget:
    def __init__(self, total: int):
        self.total, self.used = total, 0

    def take(self) -> bool:
        if self.used >= self.total:
            return False
        self.used += 1
        return True


class _Task:
    """One process of the cluster, which can be started again in its place."""

    def __init__(self, job: str, index: int, cluster: dict, command: List[str], log_dir: Path, run_log: Optional[str],
                 refusals: "_SaidOnce", env: Dict[str, str]):
        self.job, self.name = job, f"{job}:{index}"
        self.refusals = refusals  # shared by the cluster's tasks
        self.env = {**os.environ, **env, "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": job, "index": index}}),
                    "TFDISTX_LOCAL_TASK": "1"}  # rendezvous.py: no exposure warning, the launcher gave its own
        self.command, self.log_path, self.run_log = command, log_dir / f"{job}-{index}.log", run_log
        self.succeeded = threading.Event()  # set once the cluster's primary tasks have all exited 0
        self.proc, self.pumps = None, []

    def start(self) -> None:
        self.proc = subprocess.Popen(self.command, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent)
        pump = threading.Thread(target=_pump, args=(self.proc, self.name, self.log_path, self.run_log, self.succeeded, self.refusals),
                                daemon=True)
        pump.start()
        self.pumps.append(pump)
        self.stopped_since = None

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


def _run_cluster_once(spec: dict, signals: "_forwarding_signals", restarts: _Budget) -> int:
    """Start every task on fresh ports, stream their output, wait for the end."""
    counts, log_dir = spec["counts"], Path(spec["log_dir"])
    ports = _free_ports(sum(counts.values()))
    cluster = {job: [f"127.0.0.1:{ports.pop()}" for _ in range(n)] for job, n in counts.items() if n}
    refusals = _SaidOnce()  # every task refuses a bad config alike: its line is shown once
    env = spec.get("task_env", {})
    tasks = [_Task(job, index, cluster, spec["command"], log_dir, spec.get("run_log"), refusals, env) for job, addresses in cluster.items()
             for index in range(len(addresses))]
    # Sidecars (the evaluator) get the cluster's TF_CONFIG with their own task type, and no address in it.
    tasks += [_Task(job, index, cluster, spec["command"], log_dir, spec.get("run_log"), refusals, env)
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
    _teardown(tasks, spec["primary"], grace=spec.get("preemption_grace", 60) if preempted else QUICK_GRACE_SECONDS,
              signalled=bool(signals.received))
    if signals.received:  # the tasks' own verdict if they gave one (42: checkpointed), else 128 + signal
        own = [t.proc.returncode for t in tasks if t.proc.returncode not in (0, -signal.SIGKILL) and not sidecars.is_sidecar(t.job)]
        code = _exit_code(own[0] if own else -signals.received[0])
    for task in tasks:
        for pump in task.pumps:
            pump.join(timeout=5)
    return code


def _wait(tasks: List[_Task], primary: List[str], restart_alone: List[str], signals: "_forwarding_signals", restarts: _Budget,
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
        for task in _causes_first(tasks):
            if task.stopped_for() > stopped_limit:
                print(f"tfdistx: task {task.name} has been stopped for more than {stopped_limit:g}s "
                      "(cluster.stopped_task_timeout): treating it as lost", file=sys.stderr, flush=True)
                _signal_group(task.proc, signal.SIGKILL)
                task.proc.wait()
            code = task.proc.poll()
            if sidecars.is_sidecar(task.job):  # never restarted, never stops the cluster: said once if it failed
                if code not in (None, 0) and task.name not in sidecars_ended:
                    sidecars.report_exit(task.name, _exit_code(code))
                if code is not None:
                    sidecars_ended.add(task.name)
                continue
            if code not in (None, 0, *NEVER_RESTART) and task.job in restart_alone and restarts.take():
                print(f"tfdistx: task {task.name} exited with code {_exit_code(code)}; restarting it alone "
                      f"(restart {restarts.used} of {restarts.total})", file=sys.stderr, flush=True)
                task.start()
                signals.procs = [t.proc for t in tasks]
                code = None
            elif code not in (None, 0):
                print(f"tfdistx: task {task.name} exited with code {_exit_code(code)}; stopping the cluster", file=sys.stderr, flush=True)
                return _exit_code(code)
            if task.job in primary and code is None:
                primaries_done = False
        if primaries_done:
            return 0
        time.sleep(0.2)


def _causes_first(tasks: List[_Task]) -> List[_Task]:
    """The tasks, those killed by a signal first: when a ps is killed, the
    coordinator exits 5 on losing it within the same poll, and the line that
    says why the cluster stopped should name the ps, not the coordinator."""
    return sorted(tasks, key=lambda task: (task.proc.poll() or 0) >= 0)  # False (killed) sorts first


def _teardown(tasks: List[_Task], primary: List[str], grace: float, signalled: bool) -> None:
    """Stop every task: SIGKILL whatever is left after `grace` seconds.

    After a signal from outside, the tasks already have it (SIGINT: stop;
    SIGTERM: checkpoint and stop) and are only waited for. Otherwise (a task
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
                _signal_group(proc, signal.SIGTERM)
    _wait_all(waited, deadline)
    for proc in procs:
        _signal_group(proc, signal.SIGKILL)  # also reaps any grandchildren
        proc.wait()


def _wait_all(procs, deadline: float) -> None:
    for proc in procs:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            pass


def _exit_code(code: int) -> int:
    """A child killed by signal N reports -N; a shell would say 128 + N."""
    return 128 - code if code < 0 else code


class _forwarding_signals:
    """While inside, SIGINT, SIGTERM and SIGHUP are passed on to the children
    (SIGINT stops a task at once; SIGTERM is a scheduler's preemption notice,
    which TensorFlow's coordination service catches) and remembered."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, procs):
        self.procs, self.previous = procs, {}
        self.received: List[int] = []

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`; True as soon as a signal has come."""
        deadline = time.monotonic() + seconds
        while not self.received and time.monotonic() < deadline:
            time.sleep(0.1)
        return bool(self.received)

    def _forward(self, signum, frame):
        self.received.append(signum)
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)
                except ProcessLookupError:
                    pass

    def __enter__(self):
        for sig in self.SIGNALS:
            self.previous[sig] = signal.signal(sig, self._forward)
        return self

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def _signal_group(proc, sig) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# TensorFlow's C++ log (glog: `E0000 00:00:1764190403.460497  4567 ring_alg.cc:291] ...`) of a collective or an
# RPC that failed because a peer is gone: `Aborting RingReduce with UNAVAILABLE`, a cancelled receive ...
_TF_CPP_LOST_PEER = (r"^[EWF]\d{4} \S+\s+\d+ \S+:\d+\] .*"
                     r"(UNAVAILABLE|CANCELLED|DEADLINE_EXCEEDED|ABORTED|Aborting|Connection reset|Socket closed|connection refused)")
# TensorFlow errors known to be harmless, kept in the task's own log but not
# shown: the coordinator's eval loop releases a remote function handle, which
# TF 2.21 has not implemented (every evaluation of a parameter-server run) ...
_ALWAYS_HARMLESS = re.compile(r"Failed to clear function handle cache: UNIMPLEMENTED")
# ... and, once the run has succeeded, peers noticing that the cluster is going away.
# TensorFlow's C++ log of a collective aborted because a peer is lost (its
# cause is the one line tfdistx prints; a multi-line message's task list).
# A parameter-server coordinator whose worker is gone (an elastic run's dropped worker) says the last of these at each loop.
_HARMLESS_ONCE_DONE = re.compile(r"coordination service|unhealthy|heartbeat|Failed to send RPC|leader task|Error received from peer|"
                                 r"This could happen if the remote target has been disconnected from the client|"
                                 r"Additional GRPC error information|failed to connect to all addresses|The tasks have crashed|"
                                 r"Collective ops is aborted|StartAbort|The error could be from a previous operation|"
                                 r"^/job:\w+/replica:\d+/task:\d+\s*$|" + _TF_CPP_LOST_PEER)


class _SaidOnce:
    """The refusal lines (`tfdistx: invalid config: ...`) the cluster's tasks
    have shown: each task checks the config it shares with the others and
    refuses it in the same line, which the terminal needs once. Each task
    has its own pump thread, hence the lock."""

    def __init__(self):
        self.lines, self.lock = set(), threading.Lock()

    def first(self, line: str) -> bool:
        with self.lock:
            new = line not in self.lines
            self.lines.add(line)
            return new


REFUSAL = "tfdistx: invalid config:"


def _pump(proc, name: str, log_path: Path, run_log_path: Optional[str], succeeded: threading.Event, refusals: _SaidOnce) -> None:
    """Copy a task's output to its log file, and prefixed by its name to the
    terminal and to the run's log (the whole run in one file, as the terminal
    shows it; appends of whole lines do not interleave), less known noise
    and a refusal another task has shown."""
    with open(log_path, "ab") as logfile, open(run_log_path or os.devnull, "ab") as run_log:
        def show(text: str) -> None:
            prefixed = f"[{name}] {text}"
            run_log.write(prefixed.encode())
            run_log.flush()
            sys.stdout.write(prefixed)
            sys.stdout.flush()

        # A peer's last lines as the chief leaves (worker:1 seeing the coordination
        # service's leader go) come before anyone knows whether the run succeeded:
        # held until this task ends, and shown only if it failed without saying
        # why in a line of tfdistx's own (a lost peer's one line names it).
        held, explained = [], False
        for line in iter(proc.stdout.readline, b""):
            logfile.write(line)
            logfile.flush()
            text = line.decode(errors="replace")
            if _ALWAYS_HARMLESS.search(text) or (succeeded.is_set() and _HARMLESS_ONCE_DONE.search(text)):
                continue
            if text.startswith(REFUSAL) and not refusals.first(text):
                continue
            if _HARMLESS_ONCE_DONE.search(text) and not text.startswith("tfdistx:"):  # tfdistx's own lines are news
                held.append(text)
                continue
            explained = explained or (text.startswith("tfdistx: ") and not text.lower().startswith("tfdistx: warning"))
            show(text)
        if held and proc.wait() != 0 and not explained:
            for text in held:
                show(text)


def _die_with_parent() -> None:
    """In the child, before exec: get SIGKILL if the parent dies, so no task outlives its launcher."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _can_isolate() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--net", "true"], capture_output=True)
    return probe.returncode == 0


def _loopback_up() -> None:
    """`ip link set lo up`, without needing iproute2: a new namespace starts with lo down."""
    SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
    import fcntl

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def _free_ports(n: int) -> List[int]:
    sockets = []
    try:
        for _ in range(n):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


if __name__ == "__main__":
    spec_path = sys.argv[1]
    sys.exit(supervise(json.loads(Path(spec_path).read_text()), isolated="--isolated" in sys.argv[2:]))
