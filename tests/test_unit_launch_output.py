"""What the launcher shows of a task's output: a peer's "the cluster is
going away" lines are held until that task ends, shown if it failed
without a line of tfdistx's own saying why, and dropped otherwise; the
task's log keeps every line. Real child processes, the launcher's own pump."""

import subprocess
import sys
import threading

import pytest

from tfdistx.cluster.processes import SaidOnce, pump
from tfdistx.loggers.progress import STATUS_MARK

pytestmark = pytest.mark.unit

LINES = (
    "step 10/10\\n"
    "E0000 coordination_service_agent.cc] StartAbort UNAVAILABLE: the leader task was preempted/died\\n"
    "E0000 00:00:1764190403.460497    4567 ring_alg.cc:291] Aborting RingReduce with UNAVAILABLE: Socket closed\\n"
    "/job:worker/replica:0/task:0\\n"
)
WHY = "tfdistx: lost contact with worker:0 of the cluster, heartbeat\\n"


@pytest.mark.parametrize("code, says_why, shown", [(0, True, False), (1, True, False), (1, False, True)])
def test_a_peers_going_away_lines_are_shown_only_if_it_failed_unexplained(tmp_path, capsys, code, says_why, shown):
    lines = LINES + (WHY if says_why else "")
    proc = subprocess.Popen(
        [sys.executable, "-c", f"import sys; sys.stdout.write('{lines}'); sys.exit({code})"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    pump(proc, "worker:1", tmp_path / "worker-1.log", str(tmp_path / "run.log"), threading.Event(), SaidOnce())
    out = capsys.readouterr().out
    assert (
        "[worker:1] step 10/10" in out and ("[worker:1] tfdistx: lost contact" in out) == says_why
    )  # tfdistx's own lines always
    assert ("/job:worker/replica:0/task:0" in out) == shown  # a stray line of a TensorFlow message's task list
    assert ("Aborting RingReduce" in out) == shown  # TensorFlow's C++ log of the collective the lost peer aborted
    assert ("StartAbort" in out) == shown and ("StartAbort" in (tmp_path / "run.log").read_text()) == shown
    assert "StartAbort" in (tmp_path / "worker-1.log").read_text()


def test_the_chiefs_relayed_status_line_is_drawn_under_the_tasks_lines_and_kept_out_of_every_log(tmp_path, capsys):
    """A local cluster on a terminal: the chief sends its status line as lines of its own (loggers/progress.py);
    the launcher draws it in place, a task's line clears it and draws it again under itself, and the chief's
    closing takes it away. No log holds it."""
    status = STATUS_MARK + "step 10/100  1s elapsed\n"
    lines = status + "step 10/100  loss 1.5\n" + STATUS_MARK + "\n"
    proc = subprocess.Popen(
        [sys.executable, "-c", f"import sys; sys.stdout.write({lines!r})"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    pump(proc, "worker:0", tmp_path / "worker-0.log", str(tmp_path / "run.log"), threading.Event(), SaidOnce())
    out = capsys.readouterr().out
    assert out == (
        "\r\x1b[Kstep 10/100  1s elapsed"  # drawn
        + "\r\x1b[K[worker:0] step 10/100  loss 1.5\n"  # cleared for the line
        + "step 10/100  1s elapsed"  # and drawn again under it
        + "\r\x1b[K"  # taken away
    ), repr(out)
    for log in ("worker-0.log", "run.log"):
        assert (tmp_path / log).read_text() == ("[worker:0] " if log == "run.log" else "") + "step 10/100  loss 1.5\n"


def test_a_last_word_every_task_says_alike_is_shown_once_and_each_tasks_log_keeps_it(tmp_path, capsys):
    """Tasks that share a config end alike (data not downloaded: exit 10 from each): the terminal and the
    run's log show the line once, under the first task that said it; a task's last word of its own is shown."""
    alike = "tfdistx: data=mnist is not downloaded to /data/mnist/3.0.1 (exit 10)\n"
    own = {"worker:0": alike, "worker:1": alike, "worker:2": "tfdistx: lost contact with worker:0 (exit 5: ...)\n"}
    said = SaidOnce()
    for name, line in own.items():
        proc = subprocess.Popen(
            [sys.executable, "-c", f"import sys; sys.stdout.write({line!r}); sys.exit(10)"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        pump(proc, name, tmp_path / f"{name}.log", str(tmp_path / "run.log"), threading.Event(), said)
        proc.wait()
    out = capsys.readouterr().out
    assert out.count("is not downloaded") == 1 and "[worker:0] tfdistx: data=mnist" in out
    assert "[worker:2] tfdistx: lost contact" in out
    assert (tmp_path / "run.log").read_text().count("is not downloaded") == 1
    assert all("is not downloaded" in (tmp_path / f"{name}.log").read_text() for name in ("worker:0", "worker:1"))
