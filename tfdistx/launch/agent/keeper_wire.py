"""The wire between the agents and the keeper of their rendezvous
(launch/agent/node.py's beats, launch/agent/round_keeper.py's decisions): one TCP
connection per agent, kept open, carrying small framed messages that each
prove the run's secret, served by one thread for every agent.

Why this transport, of the three at hand:
- the standard library's XML-RPC server (what the keeper used to be served
  by) makes a thread and a connection per call and listens with a backlog
  of 5: a thousand agents started in the same second were reset or waited
  out TCP's SYN retransmission (p99 1-2.3 s), and the keeper's own work per
  second grew with the square of the agents (docs/performance.md);
- gRPC (grpcio, which TensorFlow installs) would serve every agent from a
  completion queue and reconnect with back-off by itself, but its Python
  server is a thread pool in a process that forks (the agent forks its
  node's tasks, cluster/prefork.py; grpcio supports fork only behind an
  environment switch and with some pollers), its messages want generated
  code or hand-made serializers anyway, and it is not a dependency tfdistx
  declares: it would come and go with TensorFlow's pins;
- asyncio, in the standard library: one event loop in one thread answers
  every connection, with a backlog sized for MAX agents, and the keeper's
  decisions run on a tick of the same loop (no lock contention with the
  beats). The wire is a few lines of framing (below) that both sides share.
So asyncio. The agents' side is a blocking socket in the agent's beat
thread (Link), one request at a time.

A frame is 4 bytes of length (big-endian), then a kind byte and the body:
- HELLO, from the keeper as a connection opens: a fresh random challenge;
- SIGNED: a 32-byte HMAC-SHA256 tag, then a JSON object. An agent's tag
  covers b"agent", the connection's challenge and the JSON (which holds the
  agent's own nonce for the connection and a sequence number that must
  grow); the keeper's covers b"keeper", the challenge, that nonce, the
  request's sequence number (8 bytes, first in its body) and its JSON. The secret never crosses the
  wire; a recorded message replayed on another connection fails (another
  challenge), on the same one (a sequence number not above the last), or
  to an agent (another nonce);
- REFUSED, from the keeper: why it refused a request (not signed: an agent
  only says it, and goes on trying; it never stops for it).
The messages are authenticated, not encrypted: an eavesdropper sees the
agents' addresses and statuses, and can neither join nor answer.

No TensorFlow here.
"""

import asyncio
import hmac
import json
import os
import resource
import secrets
import socket
import threading
import time
from typing import Callable, Dict, Optional, Set, Tuple

HELLO, SIGNED, REFUSED = b"H", b"S", b"R"
WIRE_VERSION = 1
TAG_BYTES = 32
MAX_REQUEST_BYTES = 64 * 1024  # an agent's beat: a few hundred bytes
MAX_ANSWER_BYTES = 64 * 1024 * 1024  # a round of thousands of workers' addresses, once a round
CALL_TIMEOUT_SECONDS = 2.0  # one beat's round trip at most: a cut link is a timeout, not a hang
# A connection that proved nothing this long after its last frame is closed: a half-open one left by a cut link
# (its agent reconnected since), or one that never spoke.
IDLE_CLOSE_SECONDS = 60.0
SOONEST_TICK_SECONDS = 0.0  # a change's tick comes at least this long after the last (and ten times its cost)
MOST_REFUSERS_SAID = 1024  # source addresses whose refusal is said, once each; beyond, one line says so


class WireError(Exception):
    """A frame that is not the keeper's (bad tag, bad form) or a refusal: the connection is dropped."""


class Refused(WireError):
    """The keeper refused this agent's request, and said why."""


def _frame(kind: bytes, body: bytes) -> bytes:
    return (len(body) + 1).to_bytes(4, "big") + kind + body


def _tag(secret: bytes, *parts: bytes) -> bytes:
    return hmac.digest(secret, b"".join(parts), "sha256")  # the one-shot C digest: HMAC-SHA256


def _json(value) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


# -- the agent's side ------------------------------------------------------------------------------------------


class Conversation:
    """One connection's messages, seen from an agent (no I/O: Link and the simulated agents do it): built from
    the keeper's hello, it signs each request and checks each answer."""

    def __init__(self, secret: bytes, hello: Tuple[bytes, bytes]):
        kind, body = hello
        if kind == REFUSED:
            raise Refused(body.decode(errors="replace"))
        try:
            fields = json.loads(body) if kind == HELLO else None
            self.challenge = bytes.fromhex(fields["challenge"])
        except (ValueError, TypeError, KeyError):
            raise WireError("not the rendezvous' hello") from None
        self.secret, self.nonce, self.seq = secret, secrets.token_hex(16), 0

    def request(self, fields: dict) -> bytes:
        """The frame of a request carrying `fields`."""
        self.seq += 1
        payload = _json({**fields, "nonce": self.nonce, "seq": self.seq})
        return _frame(SIGNED, _tag(self.secret, b"agent", self.challenge, payload) + payload)

    def answer(self, frame: Tuple[bytes, bytes]) -> Optional[dict]:
        """The keeper's answer to the last request, checked; None if it answers an earlier one (late: a busy
        keeper's, after that request timed out); WireError if it is not the keeper's."""
        kind, body = frame
        if kind == REFUSED:
            raise Refused(body.decode(errors="replace"))
        tag, payload = body[:TAG_BYTES], body[TAG_BYTES:]
        if kind != SIGNED or not hmac.compare_digest(
            tag, _tag(self.secret, b"keeper", self.challenge, self.nonce.encode(), payload)
        ):
            raise WireError("an answer that does not prove the run's secret")
        answered = int.from_bytes(payload[:8], "big")
        if answered < self.seq:
            return None
        if answered != self.seq:
            raise WireError("an answer to a request not made")
        fields = json.loads(payload[8:])
        if not isinstance(fields, dict):
            raise WireError("an answer that is not one")
        return fields


def take_frame(buffer: bytearray, most: int) -> Optional[Tuple[bytes, bytes]]:
    """(kind, body) of the first whole frame in `buffer`, taken out of it; None until one is whole. WireError
    for a frame of no size or beyond `most` bytes (not a frame of the wire)."""
    if len(buffer) < 4:
        return None
    size = int.from_bytes(buffer[:4], "big")
    if not 0 < size <= most:
        raise WireError(f"a frame of {size} bytes")
    if len(buffer) < 4 + size:
        return None
    kind, body = bytes(buffer[4:5]), bytes(buffer[5 : 4 + size])
    del buffer[: 4 + size]
    if not kind:
        raise WireError("an empty frame")
    return kind, body


class Link:
    """An agent's connection to the keeper at `store` ("host:port"), opened when first needed and kept.
    `call` sends one request and returns the keeper's answer; it raises OSError or WireError when none came
    in time. A busy keeper's late answer does not cost the connection (a new one would only add a handshake
    to what the keeper must do): the next request goes on it, and the late answer is read and set aside. A
    connection that has answered nothing for `stale_after` seconds is taken for dead (a cut link leaves no
    trace on it) and opened again."""

    def __init__(self, store: str, secret: bytes, stale_after: float = 3 * CALL_TIMEOUT_SECONDS):
        host, _, port = store.rpartition(":")
        self.address = (host.strip("[]"), int(port))
        self.secret, self.stale_after = secret, stale_after
        self.sock: Optional[socket.socket] = None
        self.conversation: Optional[Conversation] = None
        self.buffer = bytearray()
        self.unanswered_since: Optional[float] = None  # the first request still without its answer

    def call(self, fields: dict, timeout: float = CALL_TIMEOUT_SECONDS) -> dict:
        started = time.monotonic()
        if self.unanswered_since is not None and started - self.unanswered_since > self.stale_after:
            self.close()
        # The call works on its own references: `close` from another thread (an agent leaving while a beat
        # waits) then only closes the socket under it, which ends the call with an OSError, as a cut link would.
        sock, conversation, buffer = self.sock, self.conversation, self.buffer
        try:
            if sock is None or conversation is None:
                sock = socket.create_connection(self.address, timeout=timeout)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.sock, self.buffer = sock, bytearray()
                buffer = self.buffer
                conversation = self.conversation = Conversation(
                    self.secret, _read_frame(sock, buffer, started + timeout)
                )
            sock.settimeout(timeout)
            sock.sendall(conversation.request(fields))
            if self.unanswered_since is None:
                self.unanswered_since = started
            while True:
                answer = conversation.answer(_read_frame(sock, buffer, started + timeout))
                if answer is not None:
                    self.unanswered_since = None
                    return answer
        except (socket.timeout, TimeoutError):
            raise  # the connection is kept: a late answer is read before the next one
        except BaseException:
            if self.sock is sock:  # not one a concurrent close (and a later call) replaced
                self.close()
            raise

    def close(self) -> None:
        sock = self.sock
        self.sock = self.conversation = self.unanswered_since = None
        self.buffer = bytearray()
        if sock is not None:
            sock.close()


def _read_frame(sock: socket.socket, buffer: bytearray, deadline: float) -> Tuple[bytes, bytes]:
    """The next whole frame, read into `buffer` (a frame cut by a timeout is finished by the next call)."""
    while (frame := take_frame(buffer, MAX_ANSWER_BYTES)) is None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no answer in time")
        sock.settimeout(left)
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise ConnectionResetError("the rendezvous closed the connection")
        buffer += chunk
    return frame


# -- the keeper's side -----------------------------------------------------------------------------------------


class _Connection(asyncio.Protocol):
    """One agent's connection at the keeper: frames in, each checked and answered at once (the keeper's beat
    takes microseconds and no lock anyone holds long: no thread, no task per call)."""

    def __init__(self, server: "KeeperServer"):
        self.server = server
        self.buffer = bytearray()
        self.transport: Optional[asyncio.Transport] = None
        self.challenge = os.urandom(16)
        self.nonce: Optional[str] = None
        self.seq = 0
        self.peer = "?"
        self.heard = time.monotonic()

    def connection_made(self, transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if peer else "?"
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.connections.add(self)
        transport.write(_frame(HELLO, _json({"wire": WIRE_VERSION, "challenge": self.challenge.hex()})))

    def connection_lost(self, exc) -> None:
        self.server.connections.discard(self)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while not self.transport.is_closing():
            try:
                frame = take_frame(self.buffer, MAX_REQUEST_BYTES)
            except WireError:
                return self._refuse("a frame of the wrong size (not an agent of this run)")
            if frame is None:
                return
            self._request(*frame)

    def _request(self, kind: bytes, body: bytes) -> None:
        secret = self.server.secret
        tag, payload = body[:TAG_BYTES], body[TAG_BYTES:]
        if kind != SIGNED or not hmac.compare_digest(tag, _tag(secret, b"agent", self.challenge, payload)):
            return self._refuse("its beat does not prove the run's secret")
        try:
            fields = json.loads(payload)
            nonce, seq = fields["nonce"], fields["seq"]
        except (ValueError, TypeError, KeyError):
            return self._refuse("a beat that is not one")
        if not isinstance(seq, int) or not self.seq < seq < 2**63 or (self.nonce is not None and nonce != self.nonce):
            return self._refuse("a beat replayed")
        self.nonce, self.seq, self.heard = str(nonce), seq, time.monotonic()
        try:
            answer = self.server.handler(fields, self.peer)
        except ValueError as error:  # the right secret, a wrong message: a bug, or another version of tfdistx
            return self._refuse(f"a beat this keeper cannot read ({error})")
        out = seq.to_bytes(8, "big") + answer
        self.transport.write(_frame(SIGNED, _tag(secret, b"keeper", self.challenge, self.nonce.encode(), out) + out))
        self.server.after_request()

    def _refuse(self, why: str) -> None:
        self.server.refused(self.peer, why)
        self.transport.write(_frame(REFUSED, why.encode()))
        self.transport.close()


class KeeperServer:
    """The keeper's server, bound at construction (OSError if the address cannot be: not this host's, or
    another agent here keeps the rounds); `answer()` serves from a thread of its own, where `tick` also runs
    every `tick_seconds`, and soon after a request when `changed()` says it changed something (a status, a
    new agent: a round may form or close at once, not a tick later); `shutdown()` stops it.
    `handler(fields, peer)`: an agent's request (its secret proven) -> the answer, a JSON object's encoding
    (the keeper builds it from parts it encoded once: a round's thousands of addresses are not encoded again
    for each agent); ValueError if the request cannot be read. `say`: the keeper's own lines."""

    def __init__(
        self,
        host: str,
        port: int,
        secret: bytes,
        handler: Callable[[dict, str], bytes],
        tick: Callable[[], None],
        tick_seconds: float,
        most_agents: int,
        say: Callable[[str], None] = lambda text: None,
        changed: Callable[[], bool] = lambda: False,
    ):
        self.secret, self.handler, self.tick, self.tick_seconds, self.say = secret, handler, tick, tick_seconds, say
        self.changed = changed
        self.soon: Optional[asyncio.TimerHandle] = None  # the tick asked for by a change, if one is pending
        self.tick_cost, self.ticked = 0.0, 0.0  # the last tick's duration, and when it ended
        self.swept = 0.0
        self.connections: Set[_Connection] = set()
        self.refusers: Dict[str, str] = {}  # source address -> why, said once each
        backlog, short = backlog_for(most_agents)
        self.loop = asyncio.new_event_loop()
        try:
            self.server = self.loop.run_until_complete(
                self.loop.create_server(lambda: _Connection(self), host, port, backlog=backlog, reuse_address=True)
            )
        except BaseException:
            self.loop.close()
            raise
        for line in filter(None, [short, open_files_for(most_agents)]):  # said by the node that keeps the rounds
            say(line)
        self.server_address = self.server.sockets[0].getsockname()
        self.thread = threading.Thread(target=self._serve, name="round keeper", daemon=True)

    def refused(self, peer: str, why: str) -> None:
        """A refused request: said once per source address (a scanner from many: at most MOST_REFUSERS_SAID)."""
        if peer in self.refusers or len(self.refusers) > MOST_REFUSERS_SAID:  # what is kept stays bounded
            return
        self.refusers[peer] = why
        if len(self.refusers) <= MOST_REFUSERS_SAID:
            self.say(
                f"the rendezvous refused a beat from {peer}: {why}; never placed in a round (said once an address)"
            )
        elif len(self.refusers) == MOST_REFUSERS_SAID + 1:
            self.say(f"the rendezvous refused beats from more than {MOST_REFUSERS_SAID} addresses: no more are said")

    def answer(self) -> None:
        self.thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._every_tick)
        self.loop.run_forever()

    def _every_tick(self) -> None:
        self.loop.call_later(self.tick_seconds, self._every_tick)
        self._tick()
        now = time.monotonic()
        if now - self.swept > 1.0:
            self.swept = now
            for connection in [c for c in self.connections if now - c.heard > IDLE_CLOSE_SECONDS]:
                connection.transport.close()

    def after_request(self) -> None:
        """A tick soon when the request changed something: at most a tenth of the loop's time in ticks (a tick
        walks every agent once: the gap after one grows with its cost), and never later than the next one."""
        if self.soon is not None or not self.changed():
            return
        gap = min(self.tick_seconds, max(SOONEST_TICK_SECONDS, 10 * self.tick_cost))
        self.soon = self.loop.call_at(max(self.loop.time(), self.ticked + gap), self._tick)

    def _tick(self) -> None:
        if self.soon is not None:
            self.soon.cancel()
            self.soon = None
        started = self.loop.time()
        self.tick()
        self.ticked = self.loop.time()
        self.tick_cost = self.ticked - started

    def shutdown(self) -> None:
        """Stop serving: every connection closed, the port free."""
        if self.loop.is_closed():
            return

        def stop():
            self.server.close()
            for connection in list(self.connections):
                connection.transport.abort()  # its socket closed by a callback this queues, before the stop's
            self.loop.call_soon(self.loop.stop)

        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(stop)
            self.thread.join(timeout=10)
        else:  # never served: the loop runs just long enough to close what it holds
            self.loop.call_soon(stop)
            self.loop.run_forever()
        self.loop.close()

    server_close = shutdown  # the name socketserver gives the second half of stopping


def backlog_for(most_agents: int) -> Tuple[int, Optional[str]]:
    """A listen backlog every agent fits in when all connect at once (and some room for restarted ones), and
    a line to say if the kernel caps it below MAX (net.core.somaxconn: the rest retry, a second or more later)."""
    backlog = most_agents + max(64, most_agents // 4)
    try:
        with open("/proc/sys/net/core/somaxconn") as f:
            cap = int(f.read())
    except (OSError, ValueError):
        return backlog, None
    if cap >= most_agents:
        return backlog, None
    return backlog, (
        f"net.core.somaxconn is {cap}, below the {most_agents} agents that may connect to the rendezvous at "
        f"once: those beyond it retry (a second or more later); raise it (sysctl -w net.core.somaxconn="
        f"{backlog}) on this node for a faster start"
    )


def open_files_for(most_agents: int) -> Optional[str]:
    """A descriptor per agent's connection: the process's soft limit raised to what MAX agents need, up to its
    hard limit (1,024 is a common soft limit); a line to say if even that is too low."""
    needed = most_agents + 256  # and the agent's own: its tasks' pipes, logs, the prefork's channel
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return None
    raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
    if raised >= needed:
        return None
    return (
        f"this process may open {raised} files (ulimit -Hn), fewer than the {needed} that {most_agents} "
        "agents' connections need: raise it for the node that keeps the rounds"
    )
