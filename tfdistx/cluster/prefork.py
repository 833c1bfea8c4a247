"""A local cluster's tasks forked from one process that imported TensorFlow once.

Each task of a local cluster is `python -m tfdistx _task ...`, and each used
to spend 2.4-3 CPU seconds importing TensorFlow and Keras before doing
anything else: a third to a half of a small run's CPU, paid again by every
task of every restart and elastic round, on the cores the other tasks need.
So the supervisor starts one *prefork* process per run: it imports what the
tasks import (`preload`, named by the training side in the launcher's spec:
this module knows no training code) and forks a child for each task asked
for. The child becomes what `python -m MODULE ARGS` would be in the task's
environment: a process group of its own, stdin from /dev/null, stdout and stderr
into the pipe the supervisor reads, SIGKILL when its parent goes, the
task's environment, MODULE run as __main__.

Nothing is started in the prefork but imports: TensorFlow's runtime, its
threads and gRPC, and CUDA (the GPUs are listed by each task, not here)
start in the task, after the fork. What differs from a fresh process:
/proc/PID/cmdline and /proc/PID/environ (the start-up block `ps e` shows)
are the prefork's; the task's own name is its command name (`ps -o comm`,
`top`: "worker:1"), and its TF_CONFIG is in its environment as TensorFlow
reads it. `cluster.prefork=false` starts each task as a fresh `python`.

A supervisor forked from a command that had imported the preload and
started no thread (as the tests' runs are: tests/conftest.py) makes the
prefork a fork of itself instead: the same imports, not done again (2.4-3
CPU seconds a run). What it holds that a fresh prefork would not is let go
first: the supervisor's end of the channel, stdin and stdout, its logging
handlers. Anywhere else (a user's command imports no TensorFlow before its
cluster starts) the prefork is a fresh interpreter.

Hand-written: multiprocessing's forkserver forks from a preloaded process
too, but gives its children no stdout of the caller's choosing and no
process group of their own, and joins every child when the caller exits (a
stopped task would hold the supervisor forever).
"""

import ctypes
import functools
import json
import logging
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Callable, Dict, List, Optional, Tuple

from tfdistx.sigterm import fork_held, held, release
from tfdistx.core.errors import EXIT_INTERRUPTED

READY_TIMEOUT_SECONDS = 300  # the imports of a loaded machine; past it, tasks start as fresh processes
ANSWER_TIMEOUT_SECONDS = 60  # for the pid of a task asked for (a fork: milliseconds)
_MESSAGE_BYTES = 1 << 20  # a request: the command and the environment, a few kB
_NAME_BYTES = 15  # the kernel's limit on a command name (prctl PR_SET_NAME)


def own_group_and_die_with_parent(parent: Optional[int] = None) -> None:
    """In a child (before exec, or right after a fork): a process group of its own, so that Ctrl-C at
    the terminal (sent to the foreground group) reaches the launcher alone, which passes it on, and a
    signal to the group reaches the task's own children too; SIGKILL if its parent dies. `parent`: the
    pid it was started by, which must still be its parent once the signal is asked for (else the child
    ends: the parent died before, and the signal would never come; its orphan held imports, a port or a
    run for nothing).

    A group, not a session (setsid): the kernel's autogroup scheduler, on in most distributions' kernels,
    shares the cores fairly between sessions, so a task in a session of its own took as large a share as
    everything else the user runs together: beside a 2x1 cluster on 2 cores, a busy program started from
    another terminal got 71-75% of a core, and 90-101% with the tasks in the command's session, where a
    local cluster takes one session's share (benchmarks/bench_neighbour.py, docs/multi-process.md)."""
    os.setpgid(0, 0)
    die_with_parent()
    if parent is not None and os.getppid() != parent:
        os._exit(1)


def starting_a_prefork(parent: int) -> None:
    """Popen's preexec_fn for a fresh prefork: its own group, dying with `parent`, and the signals a
    scheduler sends every process of a job ignored from its first instruction (serve)."""
    own_group_and_die_with_parent(parent)
    for sig in _A_SCHEDULERS:
        signal.signal(sig, signal.SIG_IGN)


def die_with_parent() -> None:
    """In a child: get SIGKILL if its parent dies, so that no task outlives
    its supervisor (before exec, or right after a fork)."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _set_name(name: str) -> None:
    PR_SET_NAME = 15
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, name.encode()[:_NAME_BYTES], 0, 0, 0)


# The module whose command line takes the stop signals its starter held (cli.main: sigterm.release) once its
# handlers are set; any other starts as a fresh python would, with them at their defaults.
TAKES_HELD_SIGNALS = "tfdistx"


def takes_held_signals(command: List[str]) -> bool:
    """Whether `command` is `python -m tfdistx ...`, which takes the signals held for it (sigterm.held)."""
    return can_fork(command) and command[2] == TAKES_HELD_SIGNALS


def runs_tfdistx_under(command: List[str]) -> bool:
    """Whether `command` starts `python -m tfdistx ...` under a launcher of its own (`mpiexec -n 1 python -m
    tfdistx ...`), which passes its blocked signals on to it (measured with MPICH 4: the held mask reaches the
    process its proxy starts)."""
    return not can_fork(command) and any(takes_held_signals(command[i:]) for i in range(1, len(command)))


def can_fork(command: List[str]) -> bool:
    """A task command the prefork can run: `python -m MODULE ...` with this interpreter."""
    return len(command) >= 3 and command[0] == sys.executable and command[1] == "-m"


class _Signalled:
    """What Popen gives of signalling a child, for a class with its `pid` and `poll()`."""

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # as Popen: never a pid already reaped (and the kernel may give again)
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkedProcess(_Signalled):
    """A task forked by the prefork, with what the supervisor uses of
    subprocess.Popen: pid, stdout, returncode, poll, wait, send_signal."""

    def __init__(self, prefork: "Prefork", pid: int, stdout, command: List[str]):
        self.pid, self.stdout, self.args = pid, stdout, command
        self.returncode: Optional[int] = None
        self._prefork = prefork

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            self.returncode = self._prefork.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        if self._prefork.wait_for_exit(self.pid, timeout) is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.poll()


class ForkedChild(_Signalled):
    """A child this process forked (`fork`), with what its callers use of subprocess.Popen."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: nothing more to learn
                pid, status = self.pid, 1 << 8
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        if timeout is None and self.returncode is None:
            try:
                self.returncode = os.waitstatus_to_exitcode(
                    os.waitpid(self.pid, 0)[1]
                )  # a signal's handler runs, then it waits on
            except ChildProcessError:
                self.returncode = 1
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.05)
        return self.returncode


def fork(run: Callable[[], int]) -> ForkedChild:
    """`run()` in a child of this process, its exit code the child's: the
    same process image, without a fresh interpreter's imports. The child
    dies with this process (no orphan holds a run), and takes the default
    action of each signal this process handles in Python (as a fresh process
    would, until it sets its own). It begins with the stop signals held
    (sigterm.held): `run` sets its handlers, then takes them
    (sigterm.release); one sent meanwhile waits for them, where it would
    have met this process's handlers, copied into the child and
    acting on this process's state (a signal the launcher's copy then
    passed on to no one), or the default that ends the process."""
    for stream in (sys.stdout, sys.stderr):  # else what is buffered is written twice, by each side
        stream.flush()
    parent = os.getpid()
    pid = fork_held()
    if pid:
        return ForkedChild(pid)

    def child() -> int:
        die_with_parent()
        if os.getppid() != parent:  # the parent died before the signal was asked for: it will not come
            return 1
        for sig in signal.valid_signals():
            if callable(signal.getsignal(sig)) and signal.getsignal(sig) is not signal.default_int_handler:
                signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        return run()

    _end_as_python_would(child)


def _end_as_python_would(body: Callable[[], Optional[int]]) -> None:
    """`body()` to this forked process's end, as a Python process ends: SystemExit's code (a message in it
    printed, and 1), a traceback and 1 for anything else. Then its streams flushed and os._exit: nothing of
    what the parent process left here is torn down."""
    code = 1
    try:
        code = body() or 0
    except SystemExit as leaving:
        code = leaving.code if isinstance(leaving.code, int) else 0 if leaving.code is None else 1
        if not isinstance(leaving.code, (int, type(None))):
            print(leaving.code, file=sys.stderr)
    except KeyboardInterrupt:  # Ctrl-C passed on by its supervisor, which says it once: quietly, as a shell says it
        code = EXIT_INTERRUPTED
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def imported_here(preload: List[str]) -> bool:
    """Whether a fork of this process could be the prefork: `preload` imported, and no thread but this one
    (/proc counts TensorFlow's threads, which Python does not see: none means its runtime has not started,
    which a fork could not take along). Asked in the process itself: in a child forked from it, every
    thread but the forking one is gone, and the answer would be yes whatever the runtime's state."""
    return (
        bool(preload)
        and all(name.partition(":")[0] in sys.modules for name in preload)
        and len(os.listdir("/proc/self/task")) == 1
    )


def _serve_as_forked(channel: socket.socket, supervisors_end: socket.socket, preload: List[str]) -> int:
    """In a child forked to be the prefork: what the fresh prefork would be (its own process group, no stdin or
    stdout, no logging handler of the parent's), then `serve`. Its other open files stay open: what the
    imports opened is among them (gRPC's eventfd: closed, a task's first RPC fails)."""
    os.setpgid(0, 0)
    supervisors_end.close()  # else the channel never closes when the supervisor goes
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    for handlers in [logging.root.handlers] + [
        getattr(each, "handlers", []) for each in logging.root.manager.loggerDict.values()
    ]:
        handlers.clear()  # a task sets its own (commands/task.py), as in a fresh process
    return serve(channel, preload)


class Prefork:
    """The supervisor's side: the prefork process, the tasks it forked and their exit codes."""

    def __init__(self, preload: List[str], log_dir: str, env: Optional[Dict[str, str]] = None, fork_this: bool = False):
        """`log_dir`: the run's, named in the command line the prefork and its tasks show (`ps`); `env`: the
        prefork's environment (the caller's by default), which its imports and its tasks' `sys.path` see.
        `fork_this`: the prefork is a fork of this process, which has imported `preload` (`imported_here`,
        asked before any thread started: in this process, or in the one this process was forked from)."""
        self._socket, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # Its own process group: Ctrl-C at the terminal reaches the supervisor, which passes it on to the tasks (not to
        # this).
        if fork_this and env is None:
            self._proc = fork(lambda: _serve_as_forked(theirs, self._socket, preload))
        else:
            with held():  # not even the moment before its preexec_fn runs meets this process's handlers
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "tfdistx.cluster.prefork", str(theirs.fileno()), log_dir, *preload],
                    pass_fds=(theirs.fileno(),),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    preexec_fn=functools.partial(starting_a_prefork, os.getpid()),
                    env=env,
                )
        theirs.close()
        self._exits: Dict[int, int] = {}
        self._started: List[object] = []  # the replies to requests, in order ({"started": pid} or {"error": ...})
        self._changed = threading.Condition()
        self._ready: Optional[bool] = None  # None: not known yet
        self._gone = False
        self._lock = threading.Lock()  # one request at a time
        threading.Thread(target=self._read, daemon=True, name="prefork").start()

    def _read(self) -> None:
        while True:
            try:
                message = self._socket.recv(_MESSAGE_BYTES)
            except OSError:
                message = b""
            with self._changed:
                if not message:  # the prefork is gone, and its children with it (their parent-death signal)
                    self._gone, self._ready = True, bool(self._ready)
                    self._changed.notify_all()
                    return
                reply = json.loads(message)
                if "ready" in reply:
                    self._ready = True
                elif "exited" in reply:
                    self._exits[reply["exited"]] = reply["code"]
                else:
                    self._started.append(reply)
                self._changed.notify_all()

    def ready(self) -> bool:
        """Whether tasks can be forked (the imports done); False: start them as fresh processes."""
        with self._changed:
            self._changed.wait_for(lambda: self._ready is not None, READY_TIMEOUT_SECONDS)
            return bool(self._ready) and not self._gone

    def wait_ready(self, seconds: float) -> bool:
        """Whether it is known within `seconds` if tasks can be forked (ready, or gone): a caller that
        must stay free to stop (its supervisor, given Ctrl-C) waits in such slices."""
        with self._changed:
            return self._changed.wait_for(lambda: self._ready is not None or self._gone, seconds)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def spawn(
        self,
        command: List[str],
        env: Dict[str, str],
        name: str,
        cwd: Optional[str] = None,
        outputs: Optional[Tuple[int, int]] = None,
    ) -> Optional[ForkedProcess]:
        """`command` (`python -m MODULE ARGS`) as a forked task named `name`, in `cwd` (the prefork's by
        default); None if the prefork cannot. Its stdout and stderr go together into a pipe (the
        ForkedProcess's `stdout`), or to the two open files `outputs` (then `stdout` is None)."""
        if not self.ready():
            return None
        read_end, write_end = os.pipe() if outputs is None else (None, None)
        try:
            with self._lock:
                request = json.dumps({"argv": command[2:], "env": env, "name": name, "cwd": cwd}).encode()
                socket.send_fds(self._socket, [request], [write_end] if outputs is None else list(outputs))
                with self._changed:
                    if not self._changed.wait_for(lambda: self._started or self._gone, ANSWER_TIMEOUT_SECONDS):
                        # A fork is milliseconds: a prefork this silent is stopped or stuck. No wait is unbounded: it
                        # goes (with the tasks it forked, restarted as fresh processes) rather than hold the supervisor.
                        self._proc.kill()
                        self._changed.wait_for(lambda: self._gone)
                    reply = self._started.pop(0) if self._started else {"error": "the prefork is gone"}
        except OSError:
            reply = {"error": "the prefork is gone"}
        finally:
            if write_end is not None:
                os.close(write_end)
        if "started" not in reply:
            if read_end is not None:
                os.close(read_end)
            return None
        return ForkedProcess(self, reply["started"], None if read_end is None else os.fdopen(read_end, "rb"), command)

    def exit_code(self, pid: int) -> Optional[int]:
        with self._changed:
            if pid not in self._exits and self._gone:
                self._exits[pid] = -signal.SIGKILL  # what the parent-death signal did to it
            return self._exits.get(pid)

    def wait_for_exit(self, pid: int, timeout: Optional[float]) -> Optional[int]:
        with self._changed:
            self._changed.wait_for(lambda: pid in self._exits or self._gone, timeout)
        return self.exit_code(pid)

    def close(self) -> None:
        """Stop the prefork (its tasks have ended: the supervisor's teardown): it leaves once its socket closes.
        One still importing has nothing else: it is ended at once, not waited for until its imports are done
        (it would then find its channel closed)."""
        with self._changed:
            importing = self._ready is None and not self._gone
        if importing:
            self._proc.kill()
        try:
            self._socket.shutdown(
                socket.SHUT_RDWR
            )  # close() alone neither wakes the reader thread nor tells the prefork
        except OSError:
            pass
        self._socket.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


# A scheduler signals every process of a job at once (Slurm, through its cgroup: a preemption, the time
# limit's USR1), the prefork too. It has nothing to save, and its death would take its tasks with it (their
# parent-death signal) before they checkpoint (found under Slurm: USR1's default action ended it, and the
# task was SIGKILLed at its next loop boundary). So it ignores them, and ends when its supervisor's channel
# closes; each task takes Python's own dispositions back before it runs.
_A_SCHEDULERS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


def serve(channel: socket.socket, preload: List[str]) -> int:
    """The prefork process: import `preload` ("module" or "module:function"
    to call), then fork a task for each request until the supervisor's end
    of `channel` closes, and report each task's exit code."""
    for sig in _A_SCHEDULERS:
        signal.signal(sig, signal.SIG_IGN)
    release()  # its starter held them (sigterm.held): those sent meanwhile are ignored now
    try:
        for name in preload:
            module, _, function = name.partition(":")
            imported = __import__(module, fromlist=["_"])
            if function:
                getattr(imported, function)()
    except BaseException:  # the tasks, started as fresh processes instead, will say what is wrong
        traceback.print_exc()
        return 1
    try:
        channel.send(json.dumps({"ready": True}).encode())
    except OSError:  # its supervisor has gone (it stopped while this imported): nothing to serve, nothing to say
        return 0
    children, parent = set(), os.getpid()
    while True:
        _report_exits(children, channel)
        if not select.select([channel], [], [], 0.1)[0]:
            continue
        try:
            message, fds, _, _ = socket.recv_fds(channel, _MESSAGE_BYTES, 2)
        except OSError:
            message, fds = b"", []
        if not message:  # the supervisor is gone (or done): its tasks go with this process
            return 0
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = fork_held()  # the task begins with them held, and takes them once its handlers are set (cli.main)
        except OSError as error:
            for fd in fds:
                os.close(fd)
            _answer(channel, {"error": str(error)})
            continue
        if pid == 0:
            _become_task(json.loads(message), fds, channel, parent)  # never returns
        for fd in fds:
            os.close(fd)
        children.add(pid)
        _answer(channel, {"started": pid})


def _answer(channel: socket.socket, reply: dict) -> None:
    """A reply to the supervisor; one gone meanwhile reads none (its end closed: the next receive says so)."""
    try:
        channel.send(json.dumps(reply).encode())
    except OSError:
        pass


def _report_exits(children: set, channel: socket.socket) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        _answer(channel, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def _become_task(request: dict, outputs: List[int], channel: socket.socket, parent: int) -> None:
    """In the forked child: what `python -m MODULE ARGS` started by the supervisor would be.
    `outputs`: one fd for stdout and stderr, or one each."""

    def task() -> int:
        channel.close()
        own_group_and_die_with_parent(parent)
        # A fresh python's: Ctrl-C raises KeyboardInterrupt, the others end the process. Still held (serve): tfdistx's
        # command takes them once its own handlers are set (cli.main), so that none sent now is lost to this process's
        # SIG_IGN or meets a default that ends it; any other module gets them now, as a fresh python.
        for sig in _A_SCHEDULERS:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        if request["argv"][0] != TAKES_HELD_SIGNALS:
            release()
        _set_name(request["name"])
        stdin = os.open(os.devnull, os.O_RDONLY)
        os.dup2(stdin, 0)
        os.dup2(outputs[0], 1)
        os.dup2(outputs[-1], 2)
        for fd in {stdin, *outputs}:
            os.close(fd)
        if request.get("cwd"):
            os.chdir(request["cwd"])
            sys.path[0] = os.getcwd()  # `python -m` puts its working directory first on the path
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # found again from the task's own TMPDIR
        module, *args = request["argv"]
        sys.argv = [module, *args]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return 0

    _end_as_python_would(task)


if __name__ == "__main__":
    code = serve(socket.socket(fileno=int(sys.argv[1])), sys.argv[3:])  # argv[2]: the run's log dir, for `ps`
    sys.stderr.flush()
    os._exit(code)  # without Python's teardown of everything imported: nothing here needs it
