"""The wire between the agents and the keeper of their rendezvous
(cluster/agent.py's beats, cluster/round_keeper.py's decisions): one TCP
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
  grow); the keeper's covers b"keeper", the challenge, that nonce and its
  JSON (which echoes the sequence number). The secret never crosses the
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
import hashlib
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
MOST_REFUSERS_SAID = 1024  # source addresses whose refusal is said, once each; beyond, one line says so


class WireError(Exception):
    """A frame that is not the keeper's (bad tag, bad form) or a refusal: the connection is dropped."""


class Refused(WireError):
    """The keeper refused this agent's request, and said why."""


def _frame(kind: bytes, body: bytes) -> bytes:
    return (len(body) + 1).to_bytes(4, "big") + kind + body


def _tag(secret: bytes, *parts: bytes) -> bytes:
    return hmac.new(secret, b"".join(parts), hashlib.sha256).digest()


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

    def answer(self, frame: Tuple[bytes, bytes]) -> dict:
        """The keeper's answer to the last request, checked; WireError if it is not the keeper's."""
        kind, body = frame
        if kind == REFUSED:
            raise Refused(body.decode(errors="replace"))
        tag, payload = body[:TAG_BYTES], body[TAG_BYTES:]
        if kind != SIGNED or not hmac.compare_digest(
            tag, _tag(self.secret, b"keeper", self.challenge, self.nonce.encode(), payload)
        ):
            raise WireError("an answer that does not prove the run's secret")
        fields = json.loads(payload)
        if not isinstance(fields, dict) or fields.get("seq") != self.seq:
            raise WireError("an answer to another request")
        return fields


def _split(data: bytes) -> Tuple[bytes, bytes]:
    if not data:
        raise WireError("an empty frame")
    return data[:1], data[1:]


def read_frame(sock: socket.socket, most: int = MAX_ANSWER_BYTES) -> Tuple[bytes, bytes]:
    """(kind, body) of the next frame on a blocking socket (its timeout applies to each read)."""
    size = int.from_bytes(_read_exactly(sock, 4), "big")
    if not 0 < size <= most:
        raise WireError(f"a frame of {size} bytes")
    return _split(_read_exactly(sock, size))


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionResetError("the rendezvous closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


async def read_frame_async(reader: asyncio.StreamReader, most: int = MAX_ANSWER_BYTES) -> Tuple[bytes, bytes]:
    """read_frame, from an asyncio stream (the simulated agents of the benchmark and its test)."""
    size = int.from_bytes(await reader.readexactly(4), "big")
    if not 0 < size <= most:
        raise WireError(f"a frame of {size} bytes")
    return _split(await reader.readexactly(size))


class Link:
    """An agent's connection to the keeper at `store` ("host:port"), opened when first needed and kept;
    `call` sends one request and returns the keeper's answer, or raises (OSError, WireError) and closes
    it, to be opened again by the next call."""

    def __init__(self, store: str, secret: bytes):
        host, _, port = store.rpartition(":")
        self.address = (host.strip("[]"), int(port))
        self.secret = secret
        self.sock: Optional[socket.socket] = None
        self.conversation: Optional[Conversation] = None

    def call(self, fields: dict, timeout: float = CALL_TIMEOUT_SECONDS) -> dict:
        try:
            if self.sock is None:
                self.sock = socket.create_connection(self.address, timeout=timeout)
                self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.conversation = Conversation(self.secret, read_frame(self.sock))
            self.sock.settimeout(timeout)
            self.sock.sendall(self.conversation.request(fields))
            return self.conversation.answer(read_frame(self.sock))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock = self.conversation = None


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
        while len(self.buffer) >= 4 and not self.transport.is_closing():
            size = int.from_bytes(self.buffer[:4], "big")
            if not 0 < size <= MAX_REQUEST_BYTES:
                return self._refuse("a frame of the wrong size (not an agent of this run)")
            if len(self.buffer) < 4 + size:
                return
            kind, body = bytes(self.buffer[4:5]), bytes(self.buffer[5 : 4 + size])
            del self.buffer[: 4 + size]
            self._request(kind, body)

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
        if not isinstance(seq, int) or seq <= self.seq or (self.nonce is not None and nonce != self.nonce):
            return self._refuse("a beat replayed")
        self.nonce, self.seq, self.heard = str(nonce), seq, time.monotonic()
        try:
            answer = self.server.handler(fields, self.peer)
        except ValueError as error:  # the right secret, a wrong message: a bug, or another version of tfdistx
            return self._refuse(f"a beat this keeper cannot read ({error})")
        out = _json({**answer, "seq": seq})
        self.transport.write(_frame(SIGNED, _tag(secret, b"keeper", self.challenge, self.nonce.encode(), out) + out))

    def _refuse(self, why: str) -> None:
        self.server.refused(self.peer, why)
        self.transport.write(_frame(REFUSED, why.encode()))
        self.transport.close()


class KeeperServer:
    """The keeper's server, bound at construction (OSError if the address cannot be: not this host's, or
    another agent here keeps the rounds); `answer()` serves from a thread of its own, where `tick` also runs
    every `tick_seconds`; `shutdown()` stops it. `handler(fields, peer)`: an agent's request (its secret
    proven) -> the answer's fields; ValueError if it cannot be read. `say`: the keeper's own lines."""

    def __init__(
        self,
        host: str,
        port: int,
        secret: bytes,
        handler: Callable[[dict, str], dict],
        tick: Callable[[], None],
        tick_seconds: float,
        most_agents: int,
        say: Callable[[str], None] = lambda text: None,
    ):
        self.secret, self.handler, self.tick, self.tick_seconds, self.say = secret, handler, tick, tick_seconds, say
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
        if peer in self.refusers:
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
        self.loop.call_soon(self._tick)
        self.loop.run_forever()

    def _tick(self) -> None:
        self.loop.call_later(self.tick_seconds, self._tick)
        self.tick()
        now = time.monotonic()
        for connection in [c for c in self.connections if now - c.heard > IDLE_CLOSE_SECONDS]:
            connection.transport.close()

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
