"""What the launcher shows of a task's output: a peer's "the cluster is
going away" lines are held until that task ends, shown if it failed
without a line of tfdistx's own saying why, and dropped otherwise; the
task's log keeps every line. Real child processes, the launcher's own pump."""

import subprocess
import sys
import threading

import pytest

from tfdistx.cluster.processes import SaidOnce, pump

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
