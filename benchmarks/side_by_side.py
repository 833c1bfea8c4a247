"""What every benchmark here shares: contenders side by side, the time it
will take, `--quick`, and leaving nothing behind when interrupted.

Contenders run alternately (A B C A B C ...) rather than A A A B B B, which
spreads the noise of a shared machine over all of them; the 1-minute load
average is printed so a reader can judge how quiet the run was.

Before it starts, a benchmark prints an estimate of its time from its plan
(`say_estimate`: runs x expected seconds a run, calibrated on this project's
2-core machine). `--quick` runs fewer repeats, steps and candidates, in under
2 minutes each; its numbers are rough (`QUICK_NOTE`).

Interrupted (Ctrl-C, or SIGTERM from a scheduler or `timeout`), a benchmark
unwinds (`interruptible`): the child running at the time is killed with its
whole process tree (`run`; a local cluster's tasks included), then the
`with tempfile.TemporaryDirectory()` blocks exit and delete their
directories. A second signal during that unwinding is ignored, so it cannot
stop the deletion half way.
"""

import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, Iterable, Optional, Tuple

POLL_SECONDS = 0.05  # how often a benchmark looks at a run's files
PATIENCE_SECONDS = 600  # the longest any one run, or any stage of one, is waited for

QUICK_NOTE = (
    "--quick: fewer repeats, steps and candidates; its numbers are rough (a check that the benchmark works, "
    "and a first look), not measurements to quote"
)


def compare(
    contenders: Dict[str, Callable[[], float]], repeats: int, title: str, ours: str = "tfdistx"
) -> Dict[str, float]:
    """Print each contender's median and tfdistx's speed relative to it; returns the medians."""
    return table(contenders, repeats, title, f"{ours} / it", lambda medians, name: medians[ours] / medians[name])


def table(
    contenders: Dict[str, Callable[[], float]],
    repeats: int,
    title: str,
    ratio_name: str,
    ratio: Callable[[Dict[str, float], str], float],
    unit: str = "examples/s",
) -> Dict[str, float]:
    samples = {name: [] for name in contenders}
    load_before = os.getloadavg()[0]
    for repeat in range(repeats):
        for name, run in contenders.items():
            started = time.monotonic()
            samples[name].append(run())
            print(
                f"  repeat {repeat + 1}: {name}: {samples[name][-1]:,.2f} {unit} ({time.monotonic() - started:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    medians = {name: statistics.median(values) for name, values in samples.items()}
    print(f"{title}, median of {repeats} (1-min load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after)")
    print(f"{'contender':<42}{unit:>12}{ratio_name:>16}")
    for name, value in medians.items():
        print(f"{name:<42}{value:>12,.2f}{ratio(medians, name):>15.2f}x")
    return medians


# -- the time it will take ---------------------------------------------------------


def replay(samples: Dict[str, list], key: str) -> Dict[str, Callable[[], float]]:
    """Contenders for `table` that hand back, in order, `key` of samples already measured
    (dicts, a list per contender): another table of the same runs."""
    queues = {name: [sample[key] for sample in runs] for name, runs in samples.items()}
    return {name: (lambda queue=queue: queue.pop(0)) for name, queue in queues.items()}


def say_estimate(plan: Iterable[Tuple[int, float, str]], quick: bool = False) -> float:
    """Print, before anything runs, how long the benchmark will take: `plan`
    is [(runs, expected seconds each, what)]. Returns the seconds estimated."""
    plan = [(n, seconds, what) for n, seconds, what in plan if n]
    total = sum(n * seconds for n, seconds, _ in plan)
    parts = " + ".join(f"{n} x ~{seconds:.0f} s ({what})" for n, seconds, what in plan)
    print(
        f"Estimated time: about {duration(total)}. An estimate from the plan, {parts}, at the speeds measured on a "
        f"quiet 2-core machine ({os.cpu_count()} cores here, load average {os.getloadavg()[0]:.1f}); a busier one "
        "takes longer.",
        flush=True,
    )
    if quick:
        print(QUICK_NOTE, flush=True)
    return total


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


# -- leaving nothing behind --------------------------------------------------------


def interruptible(main: Callable[[], Optional[int]]) -> None:
    """Run `main` so that Ctrl-C and SIGTERM unwind it (see the module's
    docstring); exit 130 (SIGINT) or 143 (SIGTERM) with one line."""
    received = []

    def interrupt(signum, frame):
        # The unwinding that follows kills the child and deletes the temp dirs: let nothing stop it.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        received.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    started = time.monotonic()
    try:
        main()
    except KeyboardInterrupt:
        signum = received[0] if received else signal.SIGINT
        print(
            f"interrupted ({signal.Signals(signum).name}) after {duration(time.monotonic() - started)}: the running "
            "child was killed and the temporary directories deleted",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(128 + signum)
    print(f"took {duration(time.monotonic() - started)}", file=sys.stderr, flush=True)


def run(cmd, *, env=None, check: bool = True, timeout: Optional[float] = None, cwd=None) -> subprocess.CompletedProcess:
    """`cmd` in a session of its own, its output captured (text). On any
    exception here (an interrupt, a timeout) the child's whole process tree
    is killed before the exception goes on. `check`: a failure exits with
    the command and the end of its output."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        kill_tree(proc.pid)
        proc.wait()
        raise
    if check and proc.returncode:
        sys.exit(f"failed (exit {proc.returncode}): {' '.join(map(str, cmd))}\n{out[-2000:]}{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


# -- a run the benchmark watches -----------------------------------------------------


def wait_for(done: Callable[[], bool], proc, what: str) -> float:
    """The moment `done()` became true (polled); exits naming `what` if the run ended first or it took too long."""
    deadline = time.monotonic() + PATIENCE_SECONDS
    while not done():
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit(
                f"the run {'ended with exit code ' + str(proc.returncode) if proc.poll() is not None else 'stalled'} "
                f"before {what}"
            )
        time.sleep(POLL_SECONDS)
    return time.monotonic()


def log_of(run_dir: Path) -> str:
    """The run's tfdistx.log (the launcher's lines and its tasks'), '' before it exists."""
    path = run_dir / "tfdistx.log"
    return path.read_text(errors="replace") if path.exists() else ""


def task_pid(launcher: int, task: str) -> int:
    """The process of `task` ("worker:1") of the launcher's local cluster: a forked one
    (cluster.prefork) by its command name, a fresh one by the TF_CONFIG in its environment."""
    task_type, _, index = task.partition(":")
    wanted = f'"task": {{"type": "{task_type}", "index": {index}}}'.encode()
    for pid in sorted(descendants(launcher)):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == task:
                return pid
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if b"TFDISTX_LOCAL_TASK" in environ and wanted in environ:
            return pid
    sys.exit(f"no process of {task} under the launcher {launcher}")


def tree_env(scratch: str, tree: Path) -> dict:
    """The environment of a run of the tfdistx in checkout `tree` (first on PYTHONPATH, before the installed
    one). TensorFlow's autograph files go to TMPDIR, and a killed task removes none: the run's scratch dir."""
    return {
        **os.environ,
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "TMPDIR": scratch,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")])),
    }


@contextlib.contextmanager
def worktree(rev: str, where: Path):
    """A git worktree of `rev` (of this checkout's repository) at `where`, removed after: another
    revision of tfdistx to run side by side, first on PYTHONPATH for its runs."""
    repo = Path(__file__).resolve().parent.parent
    subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", "--quiet", str(where), rev], check=True)
    try:
        yield where
    finally:
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(where)], check=False)


@contextlib.contextmanager
def killed_if_left(proc):
    """Inside: what the benchmark does with a running `proc`; whatever of it is left after, failed or not, is killed."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
            proc.wait()


def descendants(root: int) -> set:
    """`root` and every process under it, from /proc's parent links."""
    parents = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            parents[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, IndexError, ValueError):
            pass
    tree, added = {root}, {root}
    while added:
        added = {pid for pid, ppid in parents.items() if ppid in tree} - tree
        tree |= added
    return tree


def kill_tree(root: int) -> None:
    """SIGKILL `root` and everything under it, a local cluster's tasks in
    sessions of their own included. The tree is frozen first (SIGSTOP):
    killed, a parent's children would move to init and out of sight, and a
    running process could fork while it is looked at."""
    frozen = set()
    for _ in range(5):
        found = {pid for pid in descendants(root) if pid not in frozen}
        if not found:
            break
        for pid in found:
            _signal(pid, signal.SIGSTOP)
        frozen |= found
    for pid in frozen:
        _signal(pid, signal.SIGKILL)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass
