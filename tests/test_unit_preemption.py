"""In-process: the SIGTERM notice, the liveness probe that bounds every wait
on a frozen task, and the naming of the peers a collective's error says
are lost (on error texts TensorFlow 2.21 gave in real clusters)."""

import os
import signal
import socket
import threading
import time

import pytest

from tfdistx.cluster import liveness
from tfdistx.sigterm import SigtermNotice

pytestmark = pytest.mark.unit


def test_sigterm_is_a_notice_while_open_and_the_old_handler_comes_back():
    before = signal.getsignal(signal.SIGTERM)
    with SigtermNotice(plan="") as notice:
        os.kill(os.getpid(), signal.SIGTERM)
        assert notice.received.wait(5)
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_notice_received_before_anything_started_leaves_with_the_preemption_code(capsys):
    with SigtermNotice(plan="") as notice:
        notice.leave_if_received("while nothing was received")  # no signal: nothing happens
        os.kill(os.getpid(), signal.SIGTERM)
        assert notice.received.wait(5)
        with pytest.raises(SystemExit) as leaving:
            notice.leave_if_received("while the cluster was forming")
    assert leaving.value.code == 42
    assert "preempted (SIGTERM) while the cluster was forming: nothing was trained to save" in capsys.readouterr().err


def test_usr1_is_a_notice_by_default_named_as_itself_and_the_config_can_give_it_back(capsys):
    """Slurm's time-limit notice (sbatch --signal=B:USR1@N, passed on by srun) is a SIGTERM in every way:
    it sets the one `received` every phase reads; cluster.notice_signals=[] leaves USR1 as it was."""
    before = signal.getsignal(signal.SIGUSR1)
    with SigtermNotice(plan="") as notice:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert notice.received.wait(5)
        with pytest.raises(SystemExit) as leaving:
            notice.leave_if_received("while the cluster was forming")
    assert leaving.value.code == 42 and "preempted (SIGUSR1) while the cluster was forming" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGUSR1) is before
    with SigtermNotice(plan="") as notice:
        notice.listen(["USR2"])  # the composed config's, after the default taken at the process's start
        assert signal.getsignal(signal.SIGUSR1) is before and signal.getsignal(signal.SIGUSR2) is not signal.SIG_DFL
        os.kill(os.getpid(), signal.SIGUSR2)
        assert notice.received.wait(5) and notice.signal_name == "SIGUSR2"
        notice.listen([])
        assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL


@pytest.fixture
def dispatcher():
    """A real gRPC server: a tf.data service dispatcher on a free port."""
    import tensorflow as tf

    server = tf.data.experimental.service.DispatchServer(tf.data.experimental.service.DispatcherConfig(port=0))
    yield server.target.rpartition("//")[2]
    server.stop()


@pytest.fixture
def frozen():
    """A port whose process accepts connections and never speaks: what the
    kernel does for a process stopped with SIGSTOP."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    yield f"127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def test_a_grpc_server_answers_and_a_frozen_or_closed_port_does_not(dispatcher, frozen):
    assert liveness.answers(dispatcher)
    assert liveness.answers(f"grpc://{dispatcher}")  # as tf.data names it
    started = time.monotonic()
    assert not liveness.answers(frozen, timeout=0.5)
    assert time.monotonic() - started < 5
    host, port = frozen.rsplit(":", 1)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    address = f"127.0.0.1:{closed.getsockname()[1]}"
    closed.close()
    assert not liveness.answers(address, timeout=0.5)


def test_the_watch_names_only_the_task_that_stopped_answering(dispatcher, frozen):
    lost = []
    found = threading.Event()

    def on_lost(names):
        lost.extend(names)
        found.set()

    with liveness.Watch(
        {"dispatcher:0": dispatcher, "dataworker:0": frozen}, timeout=1.0, on_lost=on_lost, interval=0.2
    ):
        assert found.wait(30)
    assert lost == ["dataworker:0"]


def test_a_watch_of_tasks_waited_on_counts_silence_only_while_the_caller_is_stuck(frozen):
    """The coordinator's watch of its workers (engine/preemption.watching_servers):
    a silent worker ends the run only while no step is being done."""
    lost, stuck = [], threading.Event()
    with liveness.Watch({"worker:1": frozen}, timeout=0.5, on_lost=lost.extend, interval=0.1, waited_on=stuck.is_set):
        time.sleep(2.0)
        assert lost == []  # silent for 2 s, but the steps went on: TensorFlow scheduled around it
        stuck.set()
        deadline = time.monotonic() + 10
        while not lost and time.monotonic() < deadline:
            time.sleep(0.1)
    assert lost == ["worker:1"]


def test_a_port_nothing_listens_on_is_refused_and_a_frozen_or_live_one_is_not(dispatcher, frozen):
    """What tells a synchronous task that a peer's process is gone (its host up): the refusal, at once."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    address = f"127.0.0.1:{closed.getsockname()[1]}"
    closed.close()
    assert liveness.refused(address)
    assert not liveness.refused(dispatcher) and not liveness.refused(frozen)


def test_servers_that_leave_are_waited_for_until_gone(dispatcher, frozen):
    assert liveness.wait_until_gone({"frozen": frozen}, time.monotonic() + 5) == []  # frozen counts as gone
    started = time.monotonic()
    assert liveness.wait_until_gone({"alive": dispatcher}, time.monotonic() + 1) == ["alive"]
    assert 0.9 <= time.monotonic() - started < 10


# -- which peers an error names: texts from real 3x1 and 4x1 multiworker clusters (TF 2.21) --

# worker:2 of 4 SIGKILLed: worker:1's error. Worker:0 and worker:3 relay the abort; only worker:2's socket closed.
RING_ABORT = """Collective ops is aborted by: Collective ops is aborted by: Collective ops is aborted by: Socket closed
Additional GRPC error information from remote target /job:worker/replica:0/task:2 while calling \
/tensorflow.WorkerService/RecvBuf:
:UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"Socket closed"}
Additional GRPC error information from remote target /job:worker/replica:0/task:3 while calling \
/tensorflow.WorkerService/RecvBuf:
:UNKNOWN:Error received from peer  {grpc_message:"Collective ops is aborted by: Socket closed\\n\
Additional GRPC error information from remote target /job:worker/replica:0/task:2 while calling \
/tensorflow.WorkerService/RecvBuf:\\n\
:UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:\\"Socket closed\\"}", grpc_status:14}
Additional GRPC error information from remote target /job:worker/replica:0/task:0 while calling \
/tensorflow.WorkerService/RecvBuf:
:UNKNOWN:Error received from peer  {grpc_message:"Collective ops is aborted by: \
Collective ops is aborted by: Socket closed\\n\
Additional GRPC error information from remote target /job:worker/replica:0/task:2 while calling \
/tensorflow.WorkerService/RecvBuf:\\n\
:UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:\\"Socket closed\\"}", grpc_status:14}
"""
# worker:2 of 3 stopped (SIGSTOP) past the heartbeat timeout.
HEARTBEAT = """Collective ops is aborted by: Error reported from /job:worker/task:2: The following tasks are unhealthy \
(stopped sending heartbeats):
The tasks have crashed. Check the task logs for an earlier error, or scheduler events (e.g. preemption, eviction) to \
debug further.
Additional GRPC error information from remote target /job:worker/replica:0/task:0 while calling \
/tensorflow.WorkerService/RecvBuf:
:UNKNOWN:Error received from peer  {grpc_message:"CANCELLED", grpc_status:1}"""
# worker:2 of 3 SIGKILLed before a call: its address refuses connections.
REFUSED = """Collective ops is aborted by: failed to connect to all addresses; last error: UNKNOWN: \
ipv4:127.0.0.1:54439: Failed to connect to remote host: Connection refused
Additional GRPC error information from remote target /job:worker/replica:0/task:2 while calling \
/tensorflow.WorkerService/RecvBuf:
:UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"failed to connect to all addresses; last error: \
UNKNOWN: ipv4:127.0.0.1:54439: Failed to connect to remote host: Connection refused"}"""

# worker:1 of 3 SIGKILLed while worker:0 waited for it to call: worker:0 aborted its own collectives, having found
# worker:1's port refused (engine/preemption.peers_gone_abort_the_collectives).
GONE = (
    "Collective ops is aborted by: worker:1 at ipv4:127.0.0.1:54438: Failed to connect (its process is gone: its host "
    "refuses connections to its port)"
)

# worker:1 of 2 SIGKILLed and recreated as a pod (a new process at its name) before worker:0 noticed: its error.
RESTARTED = (
    "Collective ops is aborted by: Error reported from /job:worker/task:1: /job:worker/replica:0/task:1 "
    "unexpectedly tried to connect with a different incarnation. It has likely restarted."
)


@pytest.mark.parametrize(
    "text, spec, lost",
    [
        (RESTARTED, {"worker": ["mw-worker-0.ml.svc:2222", "mw-worker-1.ml.svc:2222"]}, ["worker:1"]),
        (RING_ABORT, {"worker": ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"]}, ["worker:2"]),
        (HEARTBEAT, {}, ["worker:2"]),
        (
            "The following tasks are unhealthy (stopped sending heartbeats):\n"
            "/job:worker/replica:0/task:1\n/job:worker/replica:0/task:3\n"
            "The tasks have crashed.",
            {},
            ["worker:1", "worker:3"],
        ),
        (REFUSED, {"worker": ["127.0.0.1:54437", "127.0.0.1:54438", "127.0.0.1:54439"]}, ["worker:2"]),
        (GONE, {"worker": ["127.0.0.1:54437", "127.0.0.1:54438", "127.0.0.1:54439"]}, ["worker:1"]),
    ],
)
def test_a_lost_peer_message_names_only_the_lost(text, spec, lost):
    from tfdistx.engine.preemption import lost_tasks  # deferred: it imports TensorFlow

    assert lost_tasks(text, spec) == lost
