"""In-process (-m unit): Ctrl-C as the command line's notice takes it, the
signals a starter holds for the process it forks until that process's own
handlers are set, and how a local cluster's supervisor passes signals on
(every signal once to every task, whenever it joined), with real child
processes. The whole of it, at every instant of a real cluster's start, is
tests/test_signals.py's."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import wait_until
from engine_helpers import train
from tfdistx.cluster.prefork import Prefork, fork
from tfdistx.cluster.processes import ForwardingSignals
from tfdistx import sigterm
from tfdistx.sigterm import SigtermNotice, quiet_after_ctrl_c, release

pytestmark = pytest.mark.unit

RUN = ["trainer.steps=40", "trainer.steps_per_loop=10", "trainer.log_every=10", "checkpoint.every_steps=0"]


def saved(run_dir) -> list:
    return sorted(int(p.name[5:-6]) for p in (run_dir / "checkpoints").glob("ckpt-*.index"))


def test_ctrl_c_stops_at_once_where_nothing_could_be_saved_and_is_a_notice_to_save_once_training():
    with SigtermNotice(plan="", ctrl_c=True) as notice:
        with pytest.raises(KeyboardInterrupt):  # composing, importing, forming the cluster: stop now, as Python would
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(10)
        notice.saves = True  # a trainer in its loop
        os.kill(os.getpid(), signal.SIGINT)
        assert notice.received.wait(5) and notice.interrupted and notice.code == 130
        with pytest.raises(KeyboardInterrupt):  # Ctrl-C again: stop at once
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(10)


def test_ctrl_c_in_the_loop_saves_at_the_boundary_then_exits_130_in_one_line(tmp_path, capsys):
    """The command line's run (cli.main opens the notice): Ctrl-C at step 20's boundary is saved there, as a
    SIGTERM is, and the run exits 130 saying so in one line; a rerun resumes from it."""
    run_dir = tmp_path / "run"
    with SigtermNotice(plan="", ctrl_c=True), pytest.raises(SystemExit) as leaving:
        train(run_dir, *RUN, "+callbacks.c._target_=user_plugins.InterruptsAt", "+callbacks.c.step=20")
    assert leaving.value.code == 130 and saved(run_dir) == [20]
    said = [line for line in capsys.readouterr().err.splitlines() if "interrupted" in line]
    assert said == ["tfdistx: interrupted at step 20: checkpoint saved; rerun the same command to resume"], said
    train(run_dir, *RUN)
    assert json.loads((run_dir / "summary.json").read_text())["resumed_from_step"] == 20


def test_a_boundary_slow_to_come_after_ctrl_c_is_said_to_be_waited_for(tmp_path, capsys, monkeypatch):
    """No silent wait: a loop call of many slow steps, a slow save (here a callback holding the boundary)."""
    monkeypatch.setattr(sigterm, "CTRL_C_HINT_SECONDS", 0.2)
    run_dir = tmp_path / "run"
    with SigtermNotice(plan="", ctrl_c=True), pytest.raises(SystemExit) as leaving:
        train(
            run_dir,
            *RUN,
            "+callbacks.c._target_=user_plugins.InterruptsAt",
            "+callbacks.c.step=20",
            "+callbacks.c.hold=2",
        )
    said = capsys.readouterr().err.splitlines()
    assert leaving.value.code == 130 and saved(run_dir) == [20]
    assert [line for line in said if "Ctrl-C" in line or "interrupted" in line] == [
        sigterm.CTRL_C_HINT,
        "tfdistx: interrupted at step 20: checkpoint saved; rerun the same command to resume",
    ], said


def test_a_second_ctrl_c_stops_at_once_without_waiting_for_the_boundary(tmp_path):
    run_dir = tmp_path / "run"
    with SigtermNotice(plan="", ctrl_c=True), pytest.raises(KeyboardInterrupt):
        train(
            run_dir,
            *RUN,
            "+callbacks.c._target_=user_plugins.InterruptsAt",
            "+callbacks.c.step=20",
            "+callbacks.c.times=2",
        )
    assert 20 not in saved(run_dir)


def _recorder(tmp_path, name: str) -> subprocess.Popen:
    """A child that writes down each SIGINT and SIGTERM it gets, and says when it is ready for them."""
    code = (
        "import signal, sys, time, pathlib\n"
        f"log = pathlib.Path({str(tmp_path / name)!r})\n"
        "def note(signum, frame):\n"
        "    with log.open('a') as file: file.write(signal.Signals(signum).name + '\\n')\n"
        "signal.signal(signal.SIGINT, note); signal.signal(signal.SIGTERM, note)\n"
        f"pathlib.Path({str(tmp_path / (name + '.ready'))!r}).touch()\n"
        "time.sleep(120)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code])
    wait_until((tmp_path / f"{name}.ready").exists, 60, f"{name} ready", [child])
    return child


def _got(tmp_path, name: str, count: int) -> list:
    path = tmp_path / name
    wait_until(lambda: path.exists() and len(path.read_text().split()) >= count, 30, f"{name}'s {count} signals")
    return path.read_text().split()


def test_every_process_is_given_every_signal_once_whenever_it_joined_and_a_second_ctrl_c_hurries(tmp_path):
    """The supervisor's passing on: a task started after a SIGTERM came gets it as it joins (it would have
    trained on), one there before gets it once (two Ctrl-Cs are a second Ctrl-C: stop at once)."""
    first = _recorder(tmp_path, "first")
    later = None
    try:
        with ForwardingSignals([first]) as signals:
            os.kill(os.getpid(), signal.SIGTERM)
            assert signals.wait(5) and _got(tmp_path, "first", 1) == ["SIGTERM"]
            later = _recorder(tmp_path, "later")
            signals.procs = [first, later]
            assert _got(tmp_path, "later", 1) == ["SIGTERM"]
            os.kill(os.getpid(), signal.SIGINT)
            assert _got(tmp_path, "first", 2)[1:] == _got(tmp_path, "later", 2)[1:] == ["SIGINT"]
            assert signals.hurried_at is None  # the first Ctrl-C (after a SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)  # a second, once the first was taken (a person's two, not one)
            wait_until(lambda: signals.hurried_at is not None, 5, "the second Ctrl-C")
        for name in ("first", "later"):
            assert _got(tmp_path, name, 3) == ["SIGTERM", "SIGINT", "SIGINT"]
    finally:
        for child in (first, later):
            if child is not None:
                child.kill()
                child.wait()


def test_a_forked_child_takes_a_signal_sent_before_its_handlers_were_set(tmp_path):
    """Not the parent's handlers, copied into it (the launcher's passed it on to no one), nor the default that
    ends it (143): the supervisor forked from the launcher, a task from the prefork."""
    started, go, got = tmp_path / "started", tmp_path / "go", tmp_path / "got"

    def child() -> int:
        started.touch()
        while not go.exists():
            time.sleep(0.01)
        signal.signal(signal.SIGTERM, lambda signum, frame: got.write_text("SIGTERM"))
        release()
        time.sleep(0.5)
        return 0

    proc = fork(child)
    try:
        wait_until(started.exists, 30, "the child")
        proc.send_signal(signal.SIGTERM)  # before its handler is set
        go.touch()
        assert proc.wait(timeout=30) == 0 and got.read_text() == "SIGTERM"
    finally:
        proc.kill()


def test_a_prefork_closed_while_it_imports_ends_at_once_and_says_nothing(tmp_path, capfd):
    """A run that stops as it starts (Ctrl-C, a keeper's exit 9) closes its prefork while it still imports:
    it is ended, not waited for until its imports are done, when it found its channel closed (BrokenPipeError)."""
    (tmp_path / "slow_import.py").write_text("import time\ntime.sleep(3)\n")
    prefork = Prefork(["slow_import"], str(tmp_path), env={**os.environ, "PYTHONPATH": str(tmp_path)})
    prefork.close()
    assert not Path(f"/proc/{prefork.pid}").exists()  # ended, and reaped
    time.sleep(4)  # what it would have said once its imports were done (no condition to wait on: it is gone)
    assert "Traceback" not in capfd.readouterr().err


class _RaisesWhenCollected:
    def __init__(self, error: BaseException):
        self.error = error

    def __del__(self):
        raise self.error


def test_what_python_cannot_raise_after_ctrl_c_is_not_printed_and_anything_else_is(monkeypatch):
    """An interrupt landing in a destructor ("Exception ignored in ...", pybind11's MISMATCH from a TensorFlow
    server's __del__) after Ctrl-C says nothing: the command's one line does. Before it, Python's own words."""
    printed = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: printed.append(str(unraisable.exc_value)))
    with quiet_after_ctrl_c():
        _RaisesWhenCollected(RuntimeError("a real fault"))  # collected at once: unraisable, Python's to print
        _RaisesWhenCollected(KeyboardInterrupt())
        sigterm.CTRL_C.set()
        _RaisesWhenCollected(RuntimeError("MISMATCH of original and normalized active exception types"))
    assert printed == ["a real fault"]
