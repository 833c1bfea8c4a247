"""SIGTERM and Ctrl-C at every instant of a local cluster's start: each
ends the run in its code (42: preempted, saved where anything was trained;
130: interrupted), in one line of tfdistx's (a SIGTERM: each trainer's
notice and checkpoint lines), with no traceback, and leaves no process and
no scratch directory, whatever the launcher, its supervisor, the prefork
and the tasks were doing.

The command is started as a shell starts it in a terminal: a process group
of its own. A SIGTERM goes to the launcher alone (a scheduler's
preemption); Ctrl-C to the whole group, as a terminal sends it. Each
instant is hit by what the run shows, never by a sleep: the launcher's
first line (its supervisor and prefork starting), every task's log file
(the tasks started: importing TensorFlow when each is a fresh process,
`cluster.prefork=false`; forming the cluster when forked), the first step
line. The default run turns the two signals between the instants, one
strategy starting with each, so that each signal meets each instant once;
-m slow runs every cell.
"""

import os
import re
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import List

import pytest

from conftest import ENDLESS, free_ports, processes_of, start_tfdistx, wait_until
from tfdistx.sigterm import CTRL_C_HINT

ARGS = [*ENDLESS, "trainer.jit_compile=false"]  # never finishes: every case is stopped
STRATEGIES = {
    "multiworker": ["strategy=multiworker", "cluster=2x1"],
    "parameter_server": ["strategy=parameter_server", "cluster=ps1w2"],
    "mpi": ["strategy=multiworker", "cluster=2x1", "strategy.communication=mpi"],  # each task under its mpiexec
}
TASKS = {
    "multiworker": ["worker-0", "worker-1"],
    "parameter_server": ["chief-0", "ps-0", "worker-0", "worker-1"],
    "mpi": ["worker-0", "worker-1"],
}
TRAINERS = {"multiworker": 2, "parameter_server": 1, "mpi": 2}
# What is never said after a signal: a traceback, what Python prints of an interrupt it could not raise, an error,
# MPICH's own lines (mpiexec passing a Ctrl-C on, a process it saw killed).
NEVER = re.compile(
    r"Traceback|KeyboardInterrupt|Exception ignored|MISMATCH|^\S*\s*[EF]\d{4} |\bERROR\b|tfdistx: error|mpiexec@|"
    r"BAD TERMINATION",
    re.MULTILINE,
)
STOP_LINE = re.compile(r"^(tfdistx: |SIG[A-Z0-9]+: |preempted at step )")


class Output:
    """A process's lines as they come, read by a thread (the pipe never fills), with the index of the signal's."""

    def __init__(self, proc):
        self.lines: List[str] = []
        self.signalled_at = None
        threading.Thread(target=lambda: self.lines.extend(proc.stdout), daemon=True).start()

    def has(self, pattern: str) -> bool:
        return any(re.search(pattern, line) for line in list(self.lines))

    def after_the_signal(self) -> List[str]:
        """What was said of the stop after the signal (tfdistx's lines, a notice's), without the tasks' prefixes:
        not a task's start-up lines (its strategy, its replicas) or step lines, which may come before it stops."""
        lines = [re.sub(r"^\[\w+:\d+\] ", "", line.rstrip("\n")) for line in self.lines[self.signalled_at :]]
        # Not the note that a Ctrl-C's loop boundary is slow to come, said only then (a loaded machine's first one)
        return [line for line in lines if STOP_LINE.match(line) and line != CTRL_C_HINT]


@dataclass(frozen=True)
class Instant:
    name: str
    args: tuple  # what the run needs to be at it

    @property
    def slug(self) -> str:
        return re.sub(r"\W+", "_", self.name)

    def reached(self, output: Output, run_dir: Path, tasks: List[str]) -> bool:
        if self.name == "the launcher's first line":
            return output.has(r"^tfdistx: (WARNING: )?local cluster \(")
        if self.name == "the first step":
            return output.has(r"^\[\w+:0\] step +\d+/")
        return all((run_dir / "logs" / f"{task}.log").exists() for task in tasks)  # each task's process started


LAUNCHER = Instant("the launcher's first line", ())  # the supervisor forked, its prefork importing TensorFlow
IMPORTING = Instant("the tasks importing TensorFlow", ("cluster.prefork=false",))
FORMING = Instant("the tasks forming the cluster", ())  # forked from the prefork: TensorFlow is imported
FIRST_STEP = Instant("the first step", ())
INSTANTS = (LAUNCHER, IMPORTING, FORMING, FIRST_STEP)
STARTED = Instant("the tasks started", ())  # under mpiexec: MPICH's passed on no signal before it had started its task
SIGNALS = (signal.SIGTERM, signal.SIGINT)


def stop_at(tmp_path, strategy: str, instant: Instant, sig: signal.Signals) -> None:
    """The run stopped by `sig` at `instant`, and what every such stop must be."""
    run_dir = tmp_path / f"{strategy}-{instant.slug}-{sig.name}"
    proc = start_tfdistx([*STRATEGIES[strategy], *ARGS, *instant.args], run_dir, foreground_job=True)
    output = Output(proc)
    try:
        wait_until(lambda: instant.reached(output, run_dir, TASKS[strategy]), 300, instant.name, [proc])
        output.signalled_at = len(output.lines)
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)  # a terminal's Ctrl-C: the whole group
        else:
            proc.send_signal(sig)  # a scheduler's SIGTERM: the command
        proc.wait(timeout=180)
    finally:
        proc.kill()
    wait_until(lambda: not processes_of(run_dir), 30, "every process of the run gone")
    said = "".join(output.lines)
    where = f"{sig.name} at {instant.name} of {strategy}:\n{said[-3000:]}"
    assert proc.returncode == (130 if sig == signal.SIGINT else 42), where
    assert not NEVER.search(said), where
    after = output.after_the_signal()
    if sig == signal.SIGINT:  # one line: the command's, or the trainers' that saved, said once
        assert len(after) == 1 and after[0].startswith("tfdistx: interrupted"), where
    else:  # the launcher's one line, or each trainer's notice and checkpoint
        assert 1 <= len(after) <= 2 * TRAINERS[strategy] and any("preempted" in line for line in after), where
    saved = re.search(r"(?:interrupted|preempted) at step (\d+): checkpoint saved", said)
    if saved:  # the trainers saved where they say, and the same command resumes there
        assert (run_dir / "checkpoints" / f"ckpt-{saved.group(1)}.index").exists(), where
    if instant is FIRST_STEP:
        assert saved, where
    assert not (run_dir / "logs" / ".scratch").exists() and not (run_dir / "FAILED").exists(), where


@pytest.mark.parametrize("strategy", ["multiworker", "parameter_server"])  # mpi's: -m slow, and its Ctrl-C below
def test_sigterm_and_ctrl_c_at_each_instant_of_a_local_clusters_start(tmp_path, strategy):
    """Each instant once, the signals turned between them (the other strategy starts with the other signal)."""
    first = 0 if strategy == "multiworker" else 1
    for n, instant in enumerate(INSTANTS):
        stop_at(tmp_path, strategy, instant, SIGNALS[(first + n) % 2])


@pytest.mark.slow
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda sig: sig.name)
@pytest.mark.parametrize("instant", INSTANTS, ids=lambda instant: instant.slug)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_signal_at_every_instant(tmp_path, strategy, instant, sig):
    stop_at(tmp_path, strategy, instant, sig)


@pytest.mark.parametrize("instant", [STARTED, pytest.param(FIRST_STEP, marks=pytest.mark.slow)], ids=lambda i: i.slug)
def test_ctrl_c_under_mpi_reaches_each_task_itself_not_its_mpiexec(tmp_path, instant):
    """strategy.communication=mpi: no line of MPICH's (mpiexec is not given the signal: its task is), and a
    Ctrl-C as the tasks start is not lost in mpiexec, which had not started its task yet."""
    stop_at(tmp_path, "mpi", instant, signal.SIGINT)


@pytest.mark.parametrize("whose", ["keeper", pytest.param("other", marks=pytest.mark.slow)])
def test_ctrl_c_to_one_agent_is_saved_by_every_worker_and_that_agent_leaves_at_once_in_one_line(tmp_path, whose):
    """Two agents on this host (cluster.launch=agent, 2x1), Ctrl-C to one at the first step: every worker saves
    that loop boundary (the interrupted node's 130, the other's 42, the notice's all-reduce), and the agent
    leaves at once with 130 and one line. The keeper's agent, without which the run cannot go on, tells the
    other, which leaves too (the rounds' waits, beyond that, are round_keeper.py's)."""
    run_dir = tmp_path / "run"
    store = f"127.0.0.1:{free_ports(1)[0]}"
    args = [*STRATEGIES["multiworker"], *ARGS, "cluster.launch=agent", f"cluster.agent.store={store}"]
    bounds = ["cluster.elastic.join_grace=2", "cluster.elastic.lost_bound=3", "cluster.elastic.below_min_timeout=60"]
    agents = [start_tfdistx([*args, *bounds], run_dir, foreground_job=True) for _ in range(2)]
    outputs = [Output(agent) for agent in agents]
    try:
        wait_until(
            lambda: any(output.has(r"^\[worker:0\] step +\d+/") for output in outputs), 300, "the first step", agents
        )
        keeper = next(n for n, output in enumerate(outputs) if output.has("keeping the rounds"))
        stopped = keeper if whose == "keeper" else 1 - keeper
        outputs[stopped].signalled_at = len(outputs[stopped].lines)
        os.killpg(agents[stopped].pid, signal.SIGINT)
        wait_until(lambda: agents[stopped].poll() is not None, 30, "the interrupted agent's end")
        if whose == "keeper":
            wait_until(lambda: agents[1 - stopped].poll() is not None, 30, "the other agent's end")
            assert agents[1 - stopped].returncode == 130 and "the agent keeping the rounds was interrupted" in "".join(
                outputs[1 - stopped].lines
            )
    finally:
        for agent in agents:
            agent.kill()
            agent.wait()
    said = "".join(outputs[stopped].lines)
    assert agents[stopped].returncode == 130 and not NEVER.search(said), said[-3000:]
    after = outputs[stopped].after_the_signal()
    assert len(after) == 1 and after[0].startswith("tfdistx: interrupted at step"), said[-3000:]
    step = re.search(r"interrupted at step (\d+)", after[0]).group(1)
    assert (run_dir / "checkpoints" / f"ckpt-{step}.index").exists()
    wait_until(lambda: not processes_of(run_dir), 30, "every process of the run gone")


def test_an_agent_that_stops_as_it_starts_says_one_line_and_its_prefork_nothing(tmp_path):
    """The agent keeping the rounds alone, below MIN for cluster.elastic.below_min_timeout=1: exit 9 in one line,
    while its prefork still imports; the prefork is ended, not left to find its channel closed (a BrokenPipeError
    traceback, on main)."""
    store = f"127.0.0.1:{free_ports(1)[0]}"
    args = [*STRATEGIES["multiworker"], "cluster.launch=agent", f"cluster.agent.store={store}"]
    proc = start_tfdistx([*args, "cluster.elastic.below_min_timeout=1"], tmp_path / "run")
    said, _ = proc.communicate(timeout=120)
    assert proc.returncode == 9 and not NEVER.search(said), said
    assert sum("(exit 9)" in line for line in said.splitlines()) == 1, said  # the keeper's words are its own
    wait_until(lambda: not processes_of(tmp_path / "run"), 30, "every process of the run gone")
