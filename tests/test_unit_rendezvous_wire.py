"""The agents' rendezvous over the network (launch/agent/keeper_wire.py, the
beats of launch/agent/node.py): a real keeper on loopback, real agents' beats
over real sockets. Only a beat that proves the run's secret reaches the
keeper; whatever else comes (an agent of another run, a replayed message,
an XML-RPC call, noise) is refused, said once per source address, and
never placed in a round. A network blip shorter than lost_bound changes
no round; an agent that was itself stopped says so."""

import socket
import threading
import time

import pytest

from conftest import wait_until
from tfdistx.launch.agent import keeper_wire
from tfdistx.launch.agent import run_secret
from tfdistx.launch.agent.beats import Beats
from tfdistx.cluster.launch_spec import LaunchSpec, Rounds, RoundsRecord
from tfdistx.core.run_spec import Bounds
from tfdistx.launch.agent.node import AgentMembership
from tfdistx.cluster.processes import ForwardingSignals
from tfdistx.launch.agent.messages import RUNNING, WAITING
from tfdistx.launch.agent.round_keeper import RoundKeeper, answer, listen
from tfdistx.cluster.supervisor import NoRound, Round, State
from tfdistx.core.errors import ConfigError

pytestmark = pytest.mark.unit

SECRET = b"0123456789abcdef0123456789abcdef"


class Keeper:
    """A real keeper and its server on 127.0.0.1 (a free port), with the lines it says."""

    def __init__(self, low=1, high=1, lost_bound=3.0, join_grace=0.5, below_min_timeout=60.0):
        self.said, self.rounds = [], []
        self.keeper = RoundKeeper(
            low,
            high,
            join_grace,
            lost_bound,
            below_min_timeout,
            on_round=lambda *a: self.rounds.append(a),
            say=self.said.append,
        )
        self.server = listen(self.keeper, "127.0.0.1", 0, SECRET, self.said.append)
        answer(self.server)
        self.store = f"127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()


@pytest.fixture
def kept():
    made = []
    yield lambda **bounds: made.append(Keeper(**bounds)) or made[-1]
    for keeper in made:
        keeper.close()


@pytest.fixture
def beating():
    """Beats started against a store, stopped after the test."""
    started = []

    def start(store, secret=SECRET, address="127.0.0.1", lost_bound=3.0):
        beats = Beats(store, address, secret, lost_bound)
        beats.set(WAITING, port=7001)
        started.append(beats.start())
        return beats

    yield start
    for beats in started:
        beats.close()


def raw(store: str, payload: bytes, source: str = "127.0.0.1") -> bytes:
    """What the keeper answers a client that connects from `source` and sends `payload` (all it sends back)."""
    host, port = store.split(":")
    with socket.create_connection((host, int(port)), timeout=5, source_address=(source, 0)) as sock:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def test_agents_proving_the_secret_are_placed_and_a_silent_keeper_is_noticed(kept, beating):
    keeper = kept(low=2, high=2)
    first, second = beating(keeper.store), beating(keeper.store)
    wait_until(lambda: first.placed() is not None and second.placed() is not None, 30, "both agents placed")
    assert sorted(first.placed().workers) == ["127.0.0.1:7001", "127.0.0.1:7001"]
    assert {first.placed().index, second.placed().index} == {0, 1} and keeper.said == []
    keeper.close()
    answered = first.answered
    time.sleep(1.5)  # no beat is answered now: the last answer is kept, and how long ago it came
    assert first.answered == answered and first.silent_for() >= 1.5 and first.failures >= 1


def test_a_client_without_the_run_secret_is_refused_said_once_per_address_and_never_placed(kept, beating):
    keeper = kept(low=1, high=2, join_grace=0.5)
    rogue = beating(keeper.store, secret=b"not-the-run-s-secret-at-all")
    another_rogue = beating(keeper.store, secret=b"not-the-run-s-secret-at-all")
    wait_until(lambda: rogue.trouble and another_rogue.trouble, 30, "the rogues refused")
    assert rogue.trouble == "its beat does not prove the run's secret" and rogue.placed() is None
    # Today's agents' XML-RPC call, noise, and a frame of the wrong size, from another address of this machine
    xmlrpc = b"POST /RPC2 HTTP/1.1\r\nContent-Length: 10\r\n\r\n<xml></xml>"
    assert raw(keeper.store, xmlrpc, "127.0.0.2").endswith(
        b"R" + b"a frame of the wrong size (not an agent of this run)"
    )
    assert keeper_wire.REFUSED in raw(keeper.store, b"\x00\x00\x00\x05Sabcd", "127.0.0.2")
    # A recorded beat of the run's own agent, replayed on a connection of its own: another challenge, refused
    host, port = keeper.store.split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        received = bytearray()
        while (hello := keeper_wire.take_frame(received, 1024)) is None:
            received += sock.recv(1024)
        frame = keeper_wire.Conversation(SECRET, hello).request(
            {"agent": "x", "address": "127.0.0.3", "port": 1, "status": "waiting"}
        )
    replayed = raw(keeper.store, frame, "127.0.0.3")
    assert replayed.endswith(b"its beat does not prove the run's secret")
    honest = beating(keeper.store)
    wait_until(lambda: keeper.rounds, 30, "a round of the run's own agent")
    time.sleep(1.0)  # the rogues keep beating meanwhile
    assert [members for _, members, _ in keeper.rounds] == [{"worker:0": "127.0.0.1"}] and honest.placed()
    assert list(keeper.keeper.nodes) == [honest.name]  # no rogue ever reached the keeper's decisions
    refusals = [line for line in keeper.said if line.startswith("the rendezvous refused a beat from")]
    assert refusals == [
        "the rendezvous refused a beat from 127.0.0.1: its beat does not prove the run's secret; never placed in a "
        "round (said once an address)",
        "the rendezvous refused a beat from 127.0.0.2: a frame of the wrong size (not an agent of this run); never "
        "placed in a round (said once an address)",
        "the rendezvous refused a beat from 127.0.0.3: its beat does not prove the run's secret; never placed in a "
        "round (said once an address)",
    ], keeper.said


def test_an_answer_not_signed_with_the_run_secret_is_not_taken_from_a_rogue_keeper(kept):
    """An agent never takes a round from a keeper that does not prove the secret (one that bound the store's
    port first, say): its answers fail the agent's check."""
    rogue = kept()
    rogue.server.secret = b"another-run-s-secret-entirely"
    link = keeper_wire.Link(rogue.store, SECRET)
    with pytest.raises(keeper_wire.Refused):  # the rogue cannot read the agent's beat either
        link.call({"agent": "a", "address": "127.0.0.1", "port": 1, "status": "waiting"})
    conversation = keeper_wire.Conversation(SECRET, (keeper_wire.HELLO, b'{"challenge": "00ff"}'))
    conversation.request({})
    forged = b"\x00" * keeper_wire.TAG_BYTES + b'{"seq": 1, "beat": 1, "version": 9}'
    with pytest.raises(keeper_wire.WireError, match="does not prove the run's secret"):
        conversation.answer((keeper_wire.SIGNED, forged))


class _Blip:
    """A TCP relay between the agents and the keeper whose link can go down: while down, every connection
    through it is reset and new ones refused, as a switch restarting or a cable pulled and put back."""

    def __init__(self, store: str):
        self.target = store.split(":")
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.store = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.down, self.open = threading.Event(), []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.down.is_set():
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                client.close()
                continue
            server = socket.create_connection((self.target[0], int(self.target[1])))
            self.open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, a, b):
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self):
        self.down.set()
        for s in self.open:
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                s.close()
            except OSError:
                pass
        self.open = []

    def mend(self):
        self.down.clear()

    def close(self):
        self.cut()
        self.listener.close()


def test_a_blip_shorter_than_lost_bound_changes_no_round(kept, beating):
    """lost_bound 3 s and a beat a second: the link down 1.5 s (every connection reset, new ones refused); the
    agents retry with their back-off, and once it is back they beat again before the keeper loses either."""
    keeper = kept(low=2, high=2, lost_bound=3.0)
    blip = _Blip(keeper.store)
    try:
        agents = [beating(blip.store, lost_bound=3.0) for _ in range(2)]
        wait_until(lambda: all(a.placed() for a in agents), 30, "round 1")
        for a in agents:
            a.set(RUNNING, 1)
        time.sleep(1.0)
        blip.cut()
        time.sleep(1.5)
        blip.mend()
        wait_until(lambda: all(a.failures == 0 and a.silent_for() < 1 for a in agents), 10, "the agents answered again")
        time.sleep(3.5)  # past lost_bound after the blip: a member the keeper had lost would have closed the round
        assert [number for number, _, _ in keeper.rounds] == [1] and keeper.keeper.round.why is None
    finally:
        blip.close()


def test_an_agent_stopped_past_lost_bound_says_it_was_stopped_not_that_the_rendezvous_was_silent(tmp_path, capsys):
    """A process stopped (SIGSTOP, a debugger) and thawed: its supervisor's check runs before its beat thread
    has caught up. Here the beat thread never ran after its first beat, as in a process frozen since."""
    beats = Beats("127.0.0.1:9", "127.0.0.1", SECRET, lost_bound=3.0)
    beats.answered = beats.due = time.monotonic() - 20  # its last answer and its next beat's due time, 20 s ago
    spec = agents_spec(tmp_path, lost_bound=3.0, below_min_timeout=60.0)
    said = []
    membership = AgentMembership(spec, beats, lambda text, quiet=False: said.append(text))
    result = membership.check(Round([], {}), ForwardingSignals([]))
    assert result.state is State.MEMBERSHIP_CHANGED and len(said) == 1
    assert (
        said[0].startswith("this agent was stopped for 1") and "(SIGSTOP, a debugger, a suspended machine)" in said[0]
    )
    assert "no answer from the rendezvous" not in said[0]
    beats.due = time.monotonic()  # a keeper truly silent (the beat thread runs, nobody answers): said as such
    said.clear()
    membership.check(Round([], {}), ForwardingSignals([]))
    assert said[0].startswith("no answer from the rendezvous at 127.0.0.1:9 for 20s")


def test_the_run_secret_is_made_once_mode_0600_by_the_first_agent_or_read_from_the_token_file(tmp_path):
    made = run_secret.of_run(str(tmp_path / "run"), None)
    path = tmp_path / "run" / run_secret.SECRET_FILE
    assert len(made) == 64 and path.stat().st_mode & 0o777 == 0o600
    assert run_secret.of_run(str(tmp_path / "run"), None) == made  # the next agents read the one made
    assert [p.name for p in path.parent.iterdir()] == ["rendezvous.key"]  # nothing left beside it
    given = tmp_path / "token"
    given.write_text("  a-secret-of-the-user-s-own \n")
    assert run_secret.of_run(str(tmp_path / "run"), str(given)) == b"a-secret-of-the-user-s-own"
    given.write_text("short")
    with pytest.raises(ConfigError, match=r"cluster.agent.token_file='.*token': .*token holds 5 character\(s\)"):
        run_secret.of_run(str(tmp_path / "run"), str(given))
    with pytest.raises(ConfigError, match=r"missing: cannot be read \(No such file or directory\)"):
        run_secret.of_run(str(tmp_path / "run"), str(tmp_path / "missing"))


def test_a_busy_keeper_costs_no_connection_and_no_round(kept, beating):
    """The keeper stalls 1.2 s (its lock held: every beat waits, as behind a long decision on a loaded node)
    with a call timeout of 1 s: the agents' beats time out, their late answers are read and set aside on the
    same connections, and no agent opens another, nor is lost."""
    keeper = kept(low=2, high=2, lost_bound=3.0)
    agents = [beating(keeper.store, lost_bound=3.0) for _ in range(2)]
    wait_until(lambda: all(a.placed() for a in agents), 30, "round 1")
    for a in agents:
        a.set(RUNNING, 1)
    wait_until(lambda: all(a.link.sock is not None and a.failures == 0 for a in agents), 10, "running beats")
    ports = [a.link.sock.getsockname()[1] for a in agents]
    with keeper.keeper.lock:
        time.sleep(1.2)
    wait_until(lambda: all(a.failures == 0 and a.silent_for() < 1 for a in agents), 10, "answered again")
    assert [a.link.sock.getsockname()[1] for a in agents] == ports  # the same connections
    assert len(keeper.server.connections) == 2 and [n for n, _, _ in keeper.rounds] == [1]


def test_an_agent_not_placed_says_why_once_and_one_of_another_config_stops_with_exit_2(kept, beating, tmp_path):
    """MAX 1: a second agent waits for a place, says why once, and takes it when the first agent ends; an
    agent whose config is not the run's (its digest) is refused and stops with exit 2, in one line."""
    keeper = kept(low=1, high=1)
    keeper.keeper.config = "a" * 64
    first = beating(keeper.store)
    wait_until(lambda: first.placed() is not None, 30, "the first agent placed")
    first.set(RUNNING, 1)
    spec = agents_spec(tmp_path, lost_bound=3.0, below_min_timeout=60.0)
    said, formed = [], []
    second = Beats(keeper.store, "127.0.0.1", SECRET, 3.0, config="a" * 64).start()
    waiting = AgentMembership(spec, second, lambda text, quiet=False: said.append(text))
    thread = threading.Thread(target=lambda: formed.append(waiting.form("started", ForwardingSignals([]))))
    thread.start()
    try:
        wait_until(lambda: said, 30, "the second agent says why it waits")
        time.sleep(1.5)  # beats meanwhile: said once
        first.set("ended", 1)  # the first agent's end: its place is free
        thread.join(timeout=30)
        assert formed and formed[0].hosts == {"worker:0": "127.0.0.1"} and waiting.index == 0
        assert said == [
            "not placed: round 1 runs with its most workers (cluster.workers=1); another agent at 127.0.0.1 is in "
            "it (a second agent for one node waits): this agent waits for a place, until a member is lost or the "
            "run ends",
            "round 2: this node (127.0.0.1) runs worker:0 of 1",
        ]
        other = Beats(keeper.store, "127.0.0.1", SECRET, 3.0, config="b" * 64).start()
        refused = []
        with pytest.raises(NoRound) as stopped:
            AgentMembership(spec, other, lambda text, quiet=False: refused.append(text)).form(
                "started", ForwardingSignals([])
            )
        assert stopped.value.code == 2 and len(refused) == 1
        assert refused[0].startswith(f"the rendezvous at {keeper.store} refused this agent: its config is not")
        assert refused[0].endswith("stopping (exit 2)")
        other.close()
    finally:
        second.close()


def agents_spec(tmp_path, lost_bound: float, below_min_timeout: float) -> LaunchSpec:
    """A node's agent's spec with the bounds given (the rest of the rendezvous is the test's own)."""
    record = RoundsRecord(str(tmp_path / "rounds.json"), str(tmp_path), str(tmp_path / "metrics.jsonl"))
    bounds = Bounds(1, 2, join_grace=1.0, lost_bound=lost_bound, below_min_timeout=below_min_timeout)
    return LaunchSpec(("true",), str(tmp_path), None, ("worker",), rounds=Rounds(bounds, record))
