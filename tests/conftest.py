"""Shared helpers: run tfdistx the way a user does, as a real process."""

import atexit
import getpass
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


# A test process ends without Python's teardown, as the command line's does (commands/ending.py): the
# in-process runs' runners, held until the process ends (engine_helpers.RUNNERS), hold input pipelines,
# and destroying them as the interpreter finalizes waited on tf.data's threads: measured, 14-32 s between
# a pytest process's last exit function and its end, after 4 tests of test_unit_engine.py; each xdist
# worker ended 10-13 s after its last test, and the run waits for both. Registered here, before the
# exit functions of what is imported later (TensorFlow's, tmp dirs'), so it runs after them; the logs are
# flushed, and the process ends with the session's exit status. Not before a session has finished (a usage
# error ends as pytest ends it).
_SESSION = []


def _end_without_teardown():
    if not _SESSION:
        return
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(int(_SESSION[0].exitstatus))


atexit.register(_end_without_teardown)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    _SESSION[:] = [session]


class Run:
    def __init__(self, proc: subprocess.CompletedProcess, run_dir: Path):
        self.proc, self.dir = proc, run_dir
        self.returncode, self.stdout, self.stderr = proc.returncode, proc.stdout, proc.stderr

    @property
    def summary(self) -> dict:
        return json.loads((self.dir / "summary.json").read_text())

    @property
    def metrics(self) -> list:
        return [json.loads(line) for line in (self.dir / "metrics.jsonl").read_text().splitlines()]

    def __repr__(self):
        return f"<Run rc={self.returncode}\nstdout:\n{self.stdout[-3000:]}\nstderr:\n{self.stderr[-3000:]}>"


def files(run_dir: Path) -> dict:
    """Every file of a run but its log (which each attempt appends to)."""
    return {
        p.relative_to(run_dir): p.read_bytes()
        for p in run_dir.rglob("*")
        if p.is_file() and p.name not in ("tfdistx.log", ".lock")
    }


def steps_logged(run_dir: Path) -> list:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def start_tfdistx(
    args,
    run_dir: Path = None,
    env=None,
    cwd=None,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    foreground_job: bool = False,
) -> subprocess.Popen:
    """`python -m tfdistx ARGS hydra.run.dir=RUN_DIR`, started (run_dir None:
    ARGS alone, for a command that takes no run dir, or a run in the default
    outputs/ of `cwd`); by default its output, stdout and stderr together, on
    a pipe. The caller ends it. With wait_until, the way a test starts a
    process and waits for what it does: no sleep stands in for a condition.
    `foreground_job`: in a process group of its own, as a shell starts a
    command in a terminal (a Ctrl-C there is SIGINT to the whole group:
    os.killpg(proc.pid, signal.SIGINT))."""
    run_dir_arg = [] if run_dir is None else [f"hydra.run.dir={run_dir}"]
    return subprocess.Popen(
        [sys.executable, "-m", "tfdistx", *args, *run_dir_arg],
        env=tfdistx_env(**(env or {})),
        stdout=stdout,
        stderr=stderr,
        text=True,
        cwd=cwd,
        process_group=0 if foreground_job else None,
    )


def wait_until(done, timeout: float, what: str, procs=()) -> None:
    """Poll `done()` until it is true. AssertionError naming `what` after
    `timeout` seconds, or at once when one of `procs` ended first."""
    deadline = time.monotonic() + timeout
    while not done():
        ended = [proc.returncode for proc in procs if proc.poll() is not None]
        if ended or time.monotonic() > deadline:
            raise AssertionError(
                f"{what}: not within {timeout:g}s" + (f" (a process exited with {ended[0]})" if ended else "")
            )
        time.sleep(0.1)


def metric_lines(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def processes_of(run_dir: Path, task: str = None) -> list:
    """Pids of the live processes (zombies left out) whose command line names
    `run_dir`: a run's launcher, its supervisor, its prefork and every task
    of its local cluster. `task` ("worker:1", or a type alone: "ps"): only
    the processes of that task, which the launcher names in their TF_CONFIG
    (a fresh process's environment) or, forked by the prefork, by their
    command name (cluster/prefork.py)."""
    wanted = named = None
    if task:
        task_type, _, index = task.partition(":")
        wanted = (f'"task": {{"type": "{task_type}"' + (f', "index": {index}}}' if index else "")).encode()
        named = re.compile(re.escape(task_type) + ":" + (re.escape(index) if index else r"\d+") + "$")
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if (
                str(run_dir).encode() not in (proc / "cmdline").read_bytes()
                or (proc / "stat").read_text().rpartition(")")[2].split()[0] == "Z"
                or (
                    wanted
                    and wanted not in (proc / "environ").read_bytes()
                    and not named.match((proc / "comm").read_text().strip())
                )
            ):
                continue
        except OSError:  # gone meanwhile, or not ours
            continue
        pids.append(int(proc.name))
    return pids


def task_pid(run_dir: Path, task: str) -> int:
    """The process of `task` ("worker:1", "dispatcher") of the local cluster writing `run_dir`."""
    pids = processes_of(run_dir, task)
    assert pids, f"no process of task {task} of {run_dir}"
    return pids[0]


def tfdistx_env(**extra) -> dict:
    env = dict(os.environ)
    # tests/ on the path so runs can name the user plug-ins in tests/user_plugins.py
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]).strip(os.pathsep)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    for key, value in extra.items():  # None removes a variable
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


@pytest.fixture
def tfdistx(tmp_path):
    """Run `python -m tfdistx ARGS` with its run dir in tmp_path; returns a
    Run. The process is forked from this pytest process's prefork (below)
    unless `fresh`, or unless its environment differs where a fork would not
    be what a fresh start is."""

    def run(*args, run_dir=None, env=None, timeout=600, cwd=None, fresh=False) -> Run:
        run_dir = tmp_path / "run" if run_dir is None else run_dir  # "": hydra.run.dir= given empty
        cmd = [sys.executable, "-m", "tfdistx", *args, f"hydra.run.dir={run_dir}"]
        run_dir = Path(run_dir)
        proc = run_command(cmd, env=tfdistx_env(**(env or {})), cwd=cwd or tmp_path, timeout=timeout, fresh=fresh)
        return Run(proc, run_dir)

    return run


# Every `python -m tfdistx` a test runs spent 2.4-3 CPU seconds importing TensorFlow and Keras before it did
# anything the test asked: about a quarter of the process tests' CPU (98 one-process runs, 486 CPU s, in one
# default run). As TensorFlow's own multi-process tests reuse a pool of processes "to avoid the expensive
# initialization cost of TensorFlow in new processes", each pytest process starts one prefork (the local
# cluster's, cluster/prefork.py: it imports what a task imports, then forks) and runs `python -m tfdistx`
# forked from it: a real process of its own (its session, environment, working directory, stdout and stderr),
# the CLI run as __main__ from its start. What a fork cannot be: a process whose environment changes what is
# read at import (the module path, TensorFlow's and CUDA's variables), a console script, an interactive
# terminal. Those, and the tests that ask for `fresh=True` (what a fresh start itself prints or does), start
# fresh. The local clusters' own tasks are forked by their own prefork, as for a user.
_PREFORK = []
_IMPORT_TIME = re.compile(r"PYTHON|TF_(?!CONFIG$)|XLA_|CUDA_|KERAS_|LD_|OMP_|MALLOC")


def _prefork(env: dict):
    if not _PREFORK:
        from tfdistx.cluster.prefork import Prefork
        from tfdistx.commands.execute import TASK_PRELOAD

        _PREFORK.append((Prefork(list(TASK_PRELOAD), "tests", env=env), env))
    return _PREFORK[0]


def run_command(cmd, env: dict, cwd=None, timeout: float = None, fresh: bool = False) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, capture_output=True, text=True, ...), forked from the prefork where it can be."""
    forked = None if fresh else _run_forked(cmd, env, cwd, timeout)
    return forked or subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)


def _run_forked(cmd, env: dict, cwd, timeout: float):
    """`cmd` run to its end forked from the prefork, as run_command returns it; None where a fork would not
    be a fresh start (not `python -m tfdistx`, or an environment that changes what is read at import), or the
    prefork cannot serve (a fresh process then says what is wrong)."""
    if cmd[:3] != [sys.executable, "-m", "tfdistx"]:
        return None
    prefork, its_env = _prefork(tfdistx_env())
    if any(_IMPORT_TIME.match(key) for key in set(env) | set(its_env) if env.get(key) != its_env.get(key)):
        return None
    import io

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = prefork.spawn(cmd, env, "tfdistx", cwd=str(cwd) if cwd else None, outputs=(out.fileno(), err.fileno()))
        if proc is None:
            return None
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        text = [
            io.TextIOWrapper(io.BytesIO((file.seek(0), file.read())[1])).read() for file in (out, err)
        ]  # as text=True reads
    return subprocess.CompletedProcess(cmd, proc.returncode, *text)


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    """In-process (the unit config tests): configs(*overrides) is a fresh copy
    of the config the command line composes for them, composed once per module."""
    from config_helpers import config_factory  # deferred: only the tests that ask compose configs

    return config_factory(tmp_path_factory.mktemp("unit-config") / "run")


@pytest.fixture(scope="session")
def topology_whole(tmp_path_factory):
    """The topology probe's run that never stopped (test_unit_topology_resume.py):
    trained once a session, for its in-process tests and the real clusters'
    of test_topology_resume.py alike."""
    from test_unit_topology_resume import train_whole  # deferred: only the tests that ask train it

    return train_whole(tmp_path_factory.mktemp("whole") / "run")


def refused_in_one_line(run, *phrases) -> str:
    """Exit 2, no traceback, and one `invalid config` line holding every
    phrase (TensorFlow's own start-up chatter aside); returns that line."""
    assert run.returncode == 2 and "Traceback" not in run.stderr, run
    lines = [line for line in run.stderr.splitlines() if line.startswith("tfdistx: invalid config:")]
    assert len(lines) == 1 and all(p in lines[0] for p in phrases), run
    return lines[0]


def free_ports(n: int) -> list:
    """n loopback ports free right now (held together, so they differ)."""
    sockets = [socket.socket() for _ in range(n)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def workers_tf_config(ports, index: int) -> str:
    """A TF_CONFIG for a cluster of workers on these loopback ports, as worker `index`."""
    return json.dumps(
        {"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]}, "task": {"type": "worker", "index": index}}
    )


# Short real runs: few steps, small batches, the built-in synthetic data.
# A quick run trains without XLA (on one device, auto compiles the step: about 1.1 of a quick run's 5-6 CPU
# seconds), as the unit layer's quick runs do: XLA's claims (whole steps a call, bitwise equal, resumed) are
# test_unit_fastest_step.py's and test_unit_compute.py's; the default run (test_training.py) and the kill
# tests' long runs (test_fault_tolerance.LONG) keep the default, auto. Nor does a quick run export (about
# 0.45 CPU s of a quick 2x1 run's 6.6, more on one device): a test whose claim is the export, or a command
# that reads it, asks for it (`EXPORTED`), as the unit layer's quick runs do.
QUICK = [
    "trainer.steps=40",
    "trainer.steps_per_loop=10",
    "trainer.log_every=20",
    "trainer.eval_every=0",
    "data.batch_size=32",
    "data.train_examples=512",
    "data.eval_examples=128",
    "logger.tensorboard=false",
    "trainer.jit_compile=false",
    "checkpoint.export=false",
]
EXPORTED = "checkpoint.export=true"  # after QUICK: the run's SavedModel, as a user's run writes it
# A run long enough never to finish, a line every 10 steps, so a signal or a kill lands mid-run (the
# preemption and signal tests; each adds its own bounds).
ENDLESS = [
    "trainer.steps=1000000",
    "trainer.steps_per_loop=10",
    "trainer.log_every=10",
    "trainer.eval_every=0",
    "checkpoint.every_steps=100000",
    "data.batch_size=32",
    "data.train_examples=512",
    "data.eval_examples=64",
    "logger.tensorboard=false",
    "cluster.max_restarts=0",
]


def whole_and_resumed(tfdistx, tmp_path, args, stop_at=30, steps=60):
    """The same run twice: whole, and stopped at `stop_at` then resumed to
    `steps` in one run dir; both must succeed. Returns (whole, resumed)."""
    whole = tfdistx(*args, f"trainer.steps={steps}", run_dir=tmp_path / "whole")
    first = tfdistx(*args, f"trainer.steps={stop_at}", run_dir=tmp_path / "split")
    resumed = tfdistx(*args, f"trainer.steps={steps}", run_dir=tmp_path / "split")
    for run in (whole, first, resumed):
        assert run.returncode == 0, run
    assert resumed.summary["resumed_from_step"] == stop_at
    return whole, resumed


# pytest removes the tmp_path dirs of passing tests (tmp_path_retention_policy)
# but leaves their parent, /tmp/pytest-of-USER: removed too when this session
# made it and nothing (a failed test's dir) is left in it.
_SYSTEM_TMP = tempfile.gettempdir()
_PYTEST_TMP_ROOT = Path(_SYSTEM_TMP) / f"pytest-of-{getpass.getuser()}"
_PYTEST_TMP_ROOT_WAS_THERE = _PYTEST_TMP_ROOT.exists()

# TensorFlow writes its autograph files (and Python their __pycache__) into the
# temp dir and removes only the files, at exit; a task a test kills removes
# nothing. So this process and every one the tests start use a temp dir of
# this session's, removed at its end. tmp_path stays in the system's (a failed
# test's is kept to look at).
os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", _SYSTEM_TMP)
_SCRATCH = tempfile.mkdtemp(prefix="tfdistx-tests-")
os.environ["TMPDIR"] = tempfile.tempdir = _SCRATCH
atexit.register(shutil.rmtree, _SCRATCH, True)  # also when pytest stops before pytest_unconfigure (a usage error)


def layout_problems(tests) -> list:
    """What breaks the suite's layout among `tests`, (node id, file name,
    marked unit) each: a unit test lives in a test_unit_*.py file, and such
    a file holds unit tests only, so that `-m unit` and the file names say
    the same (test_unit_layout.py)."""
    problems = []
    for nodeid, file, unit in tests:
        if unit and not file.startswith("test_unit_"):
            problems.append(f"{nodeid}: marked unit, in a file not named test_unit_*.py")
        elif not unit and file.startswith("test_unit_"):
            problems.append(f"{nodeid}: not marked unit, in a test_unit_*.py file")
    return problems


LAYOUT_PROBLEMS = pytest.StashKey[list]()


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: every collected test is held to the layout
def pytest_collection_modifyitems(config, items):
    """The layout_problems of every test collected, kept for
    test_unit_layout.py to report (a failing test, where an error here would
    crash pytest-xdist's workers without a word). `system` tests change the
    machine (Slurm's packages, /etc, daemons) or read files outside the
    checkout: they run only when asked for with `-m system`, and otherwise
    show as skipped, with the reason."""
    config.stash[LAYOUT_PROBLEMS] = layout_problems(
        (item.nodeid, item.path.name, item.get_closest_marker("unit") is not None) for item in items
    )
    if "system" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(
        reason="a system test (installs or starts system services, or needs files outside the checkout): "
        "run with pytest -m system"
    )
    for item in items:
        if "system" in item.keywords:
            item.add_marker(skip)


def pytest_unconfigure(config):
    shutil.rmtree(_SCRATCH, ignore_errors=True)
    if _PYTEST_TMP_ROOT_WAS_THERE:
        return
    for leftover in (_PYTEST_TMP_ROOT / "pytest-current",):  # pytest's symlink to the last basetemp
        if leftover.is_symlink() and not leftover.exists():
            leftover.unlink()
    try:
        _PYTEST_TMP_ROOT.rmdir()
    except OSError:
        pass  # a failed test's files are kept to look at


# Where a run's time goes (docs/development.md: Where the time goes): with
# TFDISTX_TEST_TIMES=FILE, each test appends a JSON line to FILE: its node id,
# its pytest worker, when it started and ended (seconds since the epoch), and
# the CPU seconds it spent in this process and in the processes it started
# and waited for (not a run forked by the prefork above: the prefork reaps it).
# A test whose wall time is far above its CPU seconds waited on something, or
# for the cores; one whose CPU seconds are high did work.
_TIMES = os.environ.get("TFDISTX_TEST_TIMES")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not _TIMES:
        yield
        return
    import resource

    children = lambda: sum(getattr(resource.getrusage(resource.RUSAGE_CHILDREN), f) for f in ("ru_utime", "ru_stime"))  # noqa: E731
    started, own, spawned = time.time(), time.process_time(), children()
    yield
    line = {
        "test": item.nodeid,
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        "start": round(started, 2),
        "end": round(time.time(), 2),
        "cpu": round(time.process_time() - own, 2),
        "children_cpu": round(children() - spawned, 2),
    }
    with open(_TIMES, "a") as file:
        file.write(json.dumps(line) + "\n")
