"""The chief's word to its servers on how the training ended
(cluster/training_end.py), on real sockets over loopback: a server hears
the code its own cluster's chief says, and answers; another cluster's chief
is not heard; a server that is gone is not waited for. Which servers a
chief tells, from its placement. The whole path (a Slurm job's every task
exiting 0) is tests/test_cluster.py's."""

import contextlib
import socket
import threading
import time

import pytest

from tfdistx.cluster.placement import Placement
from tfdistx.core.launch_mode import LaunchMode
from tfdistx.cluster.training_end import Hearing, cluster_digest, servers_of, tell
from tfdistx.core.strategies import STRATEGIES
from conftest import free_ports

pytestmark = pytest.mark.unit

PS = {"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"], "worker": ["127.0.0.1:3", "127.0.0.1:4"]}


def test_a_server_hears_its_chief_and_answers():
    (port,) = free_ports(1)
    digest = cluster_digest(Placement(LaunchMode.TF_CONFIG, PS, "ps", 0))
    with Hearing(f"127.0.0.1:{port}", digest) as ear:
        assert tell({"ps:0": f"127.0.0.1:{port}"}, digest, 0) == ["ps:0"]
        assert ear.heard.wait(5) and ear.code == 0


def test_another_clusters_chief_is_not_heard():
    (port,) = free_ports(1)
    ours = cluster_digest(Placement(LaunchMode.TF_CONFIG, PS, "ps", 0))
    theirs = cluster_digest(Placement(LaunchMode.TF_CONFIG, {**PS, "ps": ["127.0.0.1:9"]}, "ps", 0))
    with Hearing(f"127.0.0.1:{port}", ours) as ear:
        assert tell({"ps:0": f"127.0.0.1:{port}"}, theirs, 5, seconds=0.5) == []
        assert not ear.heard.is_set() and ear.code is None


def test_a_server_that_is_gone_is_not_waited_for():
    (port,) = free_ports(1)  # nothing listens there: loopback says so at once
    started = time.monotonic()
    assert tell({"ps:0": f"127.0.0.1:{port}"}, "digest", 0, seconds=30) == []
    assert time.monotonic() - started < 10


@pytest.mark.parametrize(
    "strategy, spec, service, task, told",
    [
        ("parameter_server", PS, {}, ("chief", 0), ["ps:0", "worker:0", "worker:1"]),
        ("parameter_server", PS, {}, ("worker", 0), []),  # only the chief tells
        (
            "multiworker",
            {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
            {"dispatcher": ["127.0.0.1:3"], "dataworker": ["127.0.0.1:4"]},
            ("worker", 0),
            ["dataworker:0", "dispatcher:0"],
        ),
        ("multiworker", {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, {}, ("worker", 0), []),  # no server: no word
    ],
)
def test_the_chief_tells_the_servers_of_its_run(strategy, spec, service, task, told):
    placement = Placement(LaunchMode.TF_CONFIG, spec, task[0], task[1], service)
    assert sorted(servers_of(placement, STRATEGIES[strategy])) == told


# A process whose interpreter a C call holds (ctypes.PyDLL keeps the interpreter lock through the call, as
# TensorFlow's registration of a traced function on every worker does): no Python thread of it can run.
HELD = """
import ctypes, sys
from tfdistx.cluster.held import HeldDeadline
ps, gone = sys.argv[1:]
with HeldDeadline(2, "tfdistx: lost contact with {who}: held", 5, {"ps:0": ps}, "digest", told=5,
                  peers={"ps:0": ps, "worker:0": gone}):
    ctypes.PyDLL(None).sleep(60)
"""


def test_a_process_whose_interpreter_is_held_past_its_bound_says_so_tells_its_servers_and_ends_with_5():
    """cluster/held.py: the C library's timers end it (the interpreter held, no Python thread can), in one line
    naming the peer silent last, the servers told first."""
    import subprocess
    import sys

    port, gone = free_ports(2)  # the ps answers (a gRPC server's first frame, as liveness asks); nothing is at `gone`
    with Hearing(f"127.0.0.1:{port}", "digest") as ear, _http2_server(port):
        started = time.monotonic()
        held = subprocess.run(
            [sys.executable, "-c", HELD, f"127.0.0.1:{port}", f"127.0.0.1:{gone}"],
            capture_output=True,
            text=True,
            timeout=50,
        )
        assert held.returncode == 5, held
        assert time.monotonic() - started < 40
        assert held.stderr.strip().splitlines() == ["tfdistx: lost contact with worker:0: held"], held
        assert ear.heard.is_set() and ear.code == 5


@contextlib.contextmanager
def _http2_server(port: int):
    """What liveness.answers asks of a task: a TCP port whose server sends an HTTP/2 SETTINGS frame at once."""
    listener = socket.create_server(("127.0.0.1", port))

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.sendall(bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield
    finally:
        listener.close()
