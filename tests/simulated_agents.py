"""Simulated agents against one real keeper of the agents' rendezvous
(launch/agent/round_keeper.py), for its benchmark (benchmarks/bench_rendezvous.py)
and its test (tests/test_rendezvous.py): no TensorFlow, no worker, many
agents in one process, each beating over its own real socket at its real
beat interval and doing on the wire what an agent's beats do
(launch/agent/node.py): it beats `waiting`, takes its place when a round
formed with it (`running` at once, as an agent that starts its worker
does), and goes back to `waiting` when the round it runs in closes.

    python tests/simulated_agents.py keeper --high N ...   # a keeper, in the tree first on PYTHONPATH
    python tests/simulated_agents.py agents --store HOST:PORT --count K ...

Two wires, whichever the keeper's tree speaks: `xmlrpc`, the standard
library's XML-RPC over a new HTTP connection a beat (a keeper before the
rendezvous for a thousand nodes: its agents beat once a second, without
jitter), and `wire`, the framed, signed messages of launch/agent/keeper_wire.py
over one connection an agent, its requests and schedule those of Beats
itself (launch/agent/node.py's BeatState and beat_delay).

`Simulation` starts a keeper process and processes of agents (one process
for the agents it kills together, as a rack lost at once), reads the
keeper's rounds as they form, and gathers every agent's figures: when it
first beat, when it learned of each round with it, each beat's round trip,
and every connection error.
"""

import argparse
import asyncio
import contextlib
import faulthandler
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import xmlrpc.client
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve()
WAITING, RUNNING = "waiting", "running"
XMLRPC_BEAT_SECONDS, XMLRPC_TIMEOUT_SECONDS = 1.0, 2.0  # what agents beat with over XML-RPC
AGENTS_PER_PROCESS = 1024


# -- the keeper's process ------------------------------------------------------------------------------------


def serve_keeper(args) -> None:
    """A keeper of the tree first on PYTHONPATH, at 127.0.0.1:PORT: prints `listening PORT WIRE`, then
    `round NUMBER MONOTONIC MEMBERS` as each round forms, until SIGTERM."""
    from tfdistx.launch.agent import round_keeper

    wire = "wire" if hasattr(round_keeper, "KEEPER_WIRE") else "xmlrpc"

    def said(number, members, reason):
        print(f"round {number} {time.monotonic():.6f} {sum(t.startswith('worker:') for t in members)}", flush=True)

    keeper = round_keeper.RoundKeeper(
        args.low, args.high, args.join_grace, args.lost_bound, args.below_min_timeout, on_round=said
    )
    if wire == "wire":
        server = round_keeper.listen(keeper, "127.0.0.1", 0, secret=Path(args.secret).read_bytes().strip())
    else:
        server = round_keeper.listen(keeper, "127.0.0.1", 0)
    round_keeper.answer(server)
    print(f"listening {server.server_address[1]} {wire}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    stop.wait()


# -- the agents' process -------------------------------------------------------------------------------------


class Figures:
    """What the agents of one process saw."""

    def __init__(self):
        self.latencies: List[float] = []
        self.errors: Counter = Counter()
        self.first_beat: Dict[str, float] = {}
        self.placed: Dict[str, Dict[int, float]] = {}  # agent -> round number -> when it learned it is in it

    def error(self, error: BaseException) -> None:
        self.errors[type(error).__name__] += 1

    def as_json(self) -> dict:
        return {
            "latencies": self.latencies,
            "errors": dict(self.errors),
            "first_beat": self.first_beat,
            "placed": self.placed,
        }


async def xmlrpc_agent(name: str, host: str, port: int, figures: Figures, stop: asyncio.Event) -> None:
    """An agent of a keeper served by the standard library's XML-RPC server: a new connection each beat
    (a fresh ServerProxy), a 2 s socket timeout, a beat a second and one at once when its status changes."""
    address, worker_port = "127.0.0.1", random.randrange(20000, 60000)
    status, number = WAITING, 0
    request_line = f"POST /RPC2 HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: text/xml\r\n".encode()
    while not stop.is_set():
        body = xmlrpc.client.dumps((name, address, worker_port, status, number, 0), "beat", allow_none=True).encode()
        started = time.monotonic()
        figures.first_beat.setdefault(name, started)
        answer = None
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), XMLRPC_TIMEOUT_SECONDS)
            try:
                writer.write(request_line + b"Content-Length: %d\r\n\r\n" % len(body) + body)
                reply = await asyncio.wait_for(reader.read(), XMLRPC_TIMEOUT_SECONDS)
            finally:
                writer.close()
            head, _, payload = reply.partition(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.") or b" 200 " not in head.split(b"\r\n", 1)[0]:
                raise ConnectionError(f"answered {head[:40]!r}")
            (answer,), _ = xmlrpc.client.loads(payload)
            figures.latencies.append(time.monotonic() - started)
        except (OSError, asyncio.TimeoutError, xmlrpc.client.Error, ValueError) as error:
            figures.error(error)
        changed = False
        current = (answer or {}).get("round")
        if current:
            if current["why"] is None and current["number"] > number and name in current["members"]:
                status, number, changed = RUNNING, current["number"], True
                figures.placed.setdefault(name, {})[number] = time.monotonic()
            elif status == RUNNING and (current["why"] is not None or current["number"] != number):
                status, changed = WAITING, True
        if not changed:
            await asyncio.sleep(XMLRPC_BEAT_SECONDS)


class _Connection(asyncio.Protocol):
    """One of a WireAgent's connections: its events passed on while it is the agent's current one; a stale
    one (a connect that timed out, then came through) is closed."""

    def __init__(self, agent: "WireAgent", generation: int):
        self.agent, self.generation, self.transport = agent, generation, None

    def _current(self) -> bool:
        if self.agent.generation == self.generation:
            return True
        if self.transport is not None:
            self.transport.abort()
        return False

    def connection_made(self, transport) -> None:
        self.transport = transport
        if self._current():
            self.agent.transport = transport

    def data_received(self, data: bytes) -> None:
        if self._current():
            self.agent.data_received(data)

    def connection_lost(self, exc) -> None:
        if self.agent.generation == self.generation:
            self.agent.connection_lost(exc)


class WireAgent:
    """An agent of a keeper that speaks launch/agent/keeper_wire.py: Beats' own state (BeatState) and schedule
    (beat_delay), its connection kept and opened again after a failure, as callbacks on the process's event
    loop (no task or timer object per beat beyond the next beat's: a thousand agents a process stay light, so
    that what is measured is the keeper)."""

    def __init__(self, name: str, host: str, port: int, secret: bytes, lost_bound: float, figures: Figures):
        from tfdistx.launch.agent import beats as agent
        from tfdistx.launch.agent import keeper_wire

        self.agent, self.wire = agent, keeper_wire
        self.name, self.host, self.port, self.secret, self.lost_bound = name, host, port, secret, lost_bound
        self.figures = figures
        self.state = agent.BeatState(name, "127.0.0.1", random.randrange(20000, 60000), lost_bound=lost_bound)
        self.timeout = min(keeper_wire.CALL_TIMEOUT_SECONDS, lost_bound / 3)
        self.loop = asyncio.get_running_loop()
        self.transport: Optional[asyncio.Transport] = None
        self.conversation = None
        self.buffer = bytearray()
        self.failures, self.answered, self.started = 0, time.monotonic(), 0.0
        self.deadline: Optional[asyncio.TimerHandle] = None
        self.stopped = False
        self.generation = 0  # which connection is the current one
        self.unanswered_since: Optional[float] = None  # as Link's: a connection silent too long is opened again
        self.stale_after = max(1.5 * self.timeout, lost_bound / 4)

    def beat(self) -> None:
        """One beat: over the connection kept, or a new one first (its hello, then the beat)."""
        if self.stopped:
            return
        self.started = time.monotonic()
        self.figures.first_beat.setdefault(self.name, self.started)
        if self.unanswered_since is not None and self.started - self.unanswered_since > self.stale_after:
            self._drop()
        self.deadline = self.loop.call_later(self.timeout, self._late)
        if self.conversation is not None:
            self.unanswered_since = self.unanswered_since or self.started
            self.transport.write(self.conversation.request(self.state.request()))
            return
        self.generation += 1
        generation = self.generation
        connecting = self.loop.create_task(
            self.loop.create_connection(lambda: _Connection(self, generation), self.host, self.port)
        )

        def connected(done):
            if not done.cancelled() and done.exception() is not None and self.generation == generation:
                self._failed(done.exception())

        connecting.add_done_callback(connected)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        try:
            while (frame := self.wire.take_frame(self.buffer, self.wire.MAX_ANSWER_BYTES)) is not None:
                if self.conversation is None:  # the hello: the beat goes now
                    self.conversation = self.wire.Conversation(self.secret, frame)
                    self.unanswered_since = self.unanswered_since or time.monotonic()
                    self.transport.write(self.conversation.request(self.state.request()))
                elif (answer := self.conversation.answer(frame)) is not None:  # not a late one, set aside
                    self._answered(answer)
        except (self.wire.WireError, ValueError, KeyError, TypeError) as error:
            self._failed(error)

    def _answered(self, answer: dict) -> None:
        self.deadline.cancel()
        now = time.monotonic()
        self.figures.latencies.append(now - self.started)
        self.failures, self.answered, self.unanswered_since = 0, now, None
        state = self.state
        state.absorb(answer)
        placed = state.placed()
        if placed is not None and placed.number > state.round:  # it starts its worker: running, said at once
            state.set(RUNNING, placed.number)
            self.figures.placed.setdefault(self.name, {})[placed.number] = now
            return self.beat()
        if state.status == RUNNING and state.closed_or_moved_on():  # its worker stopped: waiting, said at once
            state.set(WAITING)
            return self.beat()
        self.loop.call_later(self.agent.beat_delay(state.interval, self.lost_bound, 0), self.beat)

    def connection_lost(self, exc) -> None:
        self._failed(exc or ConnectionResetError("the keeper closed the connection"))

    def _late(self) -> None:
        """No answer in time: counted, the connection kept (Link's way), the next try after the back-off."""
        self.deadline = None
        self._again(TimeoutError("no answer in time"))

    def _failed(self, error: BaseException) -> None:
        """A beat that failed: counted, the connection dropped, the next try after the back-off."""
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None
        self._drop()
        self._again(error)

    def _drop(self) -> None:
        transport, self.transport, self.conversation, self.unanswered_since = self.transport, None, None, None
        self.generation += 1  # whatever the old connection still does is not this agent's
        self.buffer.clear()
        if transport is not None:
            transport.abort()

    def _again(self, error: BaseException) -> None:
        if self.stopped:
            return
        self.figures.error(error)
        self.failures += 1
        silent = time.monotonic() - self.answered
        self.loop.call_later(
            self.agent.beat_delay(self.state.interval, self.lost_bound, self.failures, silent), self.beat
        )

    def stop(self) -> None:
        self.stopped = True
        if self.transport is not None:
            self.transport.abort()


async def run_agents(args) -> Figures:
    figures = Figures()
    host, port = args.store.rsplit(":", 1)
    secret = Path(args.secret).read_bytes().strip() if args.secret else b""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    wire_agents = []

    async def xmlrpc(i: int):
        await asyncio.sleep(max(0.0, args.start_at - time.monotonic()) + random.uniform(0, args.spread))
        await xmlrpc_agent(f"{args.name}-{i}", host, int(port), figures, stop)

    if args.wire == "xmlrpc":
        tasks = [asyncio.ensure_future(xmlrpc(i)) for i in range(args.count)]
    else:
        tasks = []
        for i in range(args.count):
            wire_agents.append(WireAgent(f"{args.name}-{i}", host, int(port), secret, args.lost_bound, figures))
            delay = max(0.0, args.start_at - time.monotonic()) + random.uniform(0, args.spread)
            loop.call_later(delay, wire_agents[-1].beat)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    # SIGUSR1: the figures so far, written whole (before the process is killed with its agents)
    loop.add_signal_handler(signal.SIGUSR1, lambda: _write(Path(args.out), figures))
    await stop.wait()
    for agent in wire_agents:
        agent.stop()
    for task in tasks:
        task.cancel()
    if tasks:  # Python 3.11's wait_for can swallow a cancel that meets its own end: waited a while, not forever
        await asyncio.wait(tasks, timeout=5)
    return figures


def _write(out: Path, figures: Figures) -> None:
    part = out.with_suffix(".part")
    part.write_text(json.dumps(figures.as_json()))
    os.replace(part, out)


def agents_main(args) -> None:
    faulthandler.register(signal.SIGUSR2)  # where a process that does not stop is stuck
    _write(Path(args.out), asyncio.run(run_agents(args)))


# -- the simulation, from the benchmark's or the test's process ---------------------------------------------


class Simulation:
    """A keeper (of `tree`'s tfdistx: None, this checkout's) and `agents` simulated agents, `killed` of them
    in a process of their own; `low` to `agents` workers a round. Use as a context manager: nothing is left
    running after it."""

    def __init__(
        self,
        agents: int,
        killed: int,
        low: int,
        scratch: Path,
        join_grace: float,
        lost_bound: float,
        tree: Optional[Path] = None,
        spread: float = 1.0,
    ):
        self.agents, self.killed, self.scratch, self.tree, self.spread = agents, killed, Path(scratch), tree, spread
        self.low, self.join_grace, self.lost_bound = low, join_grace, lost_bound
        self.rounds: Dict[int, float] = {}  # number -> when the keeper formed it (its monotonic clock)
        self.workers: Dict[int, int] = {}  # number -> its workers
        self.keeper: Optional[subprocess.Popen] = None
        self.groups: List[subprocess.Popen] = []
        self.outs: List[Path] = []
        self.started_at = 0.0

    def __enter__(self) -> "Simulation":
        secret = self.scratch / "secret"
        secret.write_text(os.urandom(32).hex())
        secret.chmod(0o600)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(self.tree or ""), str(HERE.parent.parent)])),
        }
        self.keeper = subprocess.Popen(
            [
                sys.executable,
                str(HERE),
                "keeper",
                f"--low={self.low}",
                f"--high={self.agents}",
                f"--join-grace={self.join_grace}",
                f"--lost-bound={self.lost_bound}",
                "--below-min-timeout=600",
                f"--secret={secret}",
            ],
            stdout=subprocess.PIPE,
            stderr=open(self.scratch / "keeper.err", "w"),  # noqa: SIM115 (the keeper's own, kept till it ends)
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
            start_new_session=True,
        )
        first = self.keeper.stdout.readline().split()
        if not first or first[0] != "listening":
            self.__exit__(None, None, None)
            raise RuntimeError(f"the keeper did not start: {first}")
        self.port, self.wire = int(first[1]), first[2]
        threading.Thread(target=self._read_rounds, daemon=True).start()
        own = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parent.parent)]))}
        self.started_at = time.monotonic() + 1.0  # every process up by then: the agents start within `spread` of it
        sizes = [self.killed] if self.killed else []
        rest = self.agents - self.killed
        while rest > 0:
            sizes.append(min(rest, AGENTS_PER_PROCESS))
            rest -= sizes[-1]
        for n, size in enumerate(sizes):
            out = self.scratch / f"agents-{n}.json"
            self.outs.append(out)
            self.groups.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        str(HERE),
                        "agents",
                        f"--store=127.0.0.1:{self.port}",
                        f"--wire={self.wire}",
                        f"--count={size}",
                        f"--name=g{n}",
                        f"--secret={secret}",
                        f"--start-at={self.started_at}",
                        f"--spread={self.spread}",
                        f"--out={out}",
                        f"--lost-bound={self.lost_bound}",
                    ],
                    stdin=subprocess.DEVNULL,
                    env=own,
                    start_new_session=True,
                )
            )
        return self

    def _read_rounds(self) -> None:
        for line in self.keeper.stdout:
            words = line.split()
            if words and words[0] == "round":
                self.workers[int(words[1])] = int(words[3])
                self.rounds[int(words[1])] = float(words[2])

    def _written(self, group: subprocess.Popen, out: Path) -> None:
        """Ask a process of agents for its figures so far (SIGUSR1), and wait until they are written whole."""
        out.unlink(missing_ok=True)
        group.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 30
        while not out.exists() and time.monotonic() < deadline and group.poll() is None:
            time.sleep(0.02)

    def snapshot(self) -> dict:
        """Every process's figures so far, the agents going on."""
        for group, out in zip(self.groups, self.outs):
            if group.poll() is None:
                self._written(group, out)
        return self._together()

    def kill(self) -> float:
        """SIGKILL the process of the agents to kill, all at once (their figures so far kept first); when."""
        if not self.killed:
            raise RuntimeError("no agents to kill")
        self._written(self.groups[0], self.outs[0])
        self.groups[0].kill()
        self.groups[0].wait()
        return time.monotonic()

    def keeper_errors(self) -> int:
        """The tracebacks the keeper's process wrote (today's XML-RPC server prints one per call it could not
        answer: a caller that timed out and left)."""
        path = self.scratch / "keeper.err"
        return path.read_text(errors="replace").count("Traceback") if path.exists() else 0

    def keeper_cpu(self) -> float:
        """The keeper process's CPU seconds so far (user and system)."""
        fields = Path(f"/proc/{self.keeper.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def figures(self) -> dict:
        """Stop the agents still running; every process's figures together."""
        for group in self.groups:
            if group.poll() is None:
                group.terminate()
                group.wait(timeout=60)
        return self._together()

    def _together(self) -> dict:
        together = {"latencies": [], "errors": Counter(), "first_beat": {}, "placed": {}}
        for out in self.outs:
            if out.exists():
                part = json.loads(out.read_text())
                together["latencies"] += part["latencies"]
                together["errors"].update(part["errors"])
                together["first_beat"].update(part["first_beat"])
                together["placed"].update(
                    {agent: {int(k): v for k, v in rounds.items()} for agent, rounds in part["placed"].items()}
                )
        return together

    def __exit__(self, *exc) -> None:
        for proc in [*self.groups, self.keeper]:
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if self.keeper is not None and self.keeper.stdout:
            self.keeper.stdout.close()


def main(argv) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    keeper = sub.add_parser("keeper")
    keeper.add_argument("--low", type=int, required=True)
    keeper.add_argument("--high", type=int, required=True)
    keeper.add_argument("--join-grace", type=float, default=10)
    keeper.add_argument("--lost-bound", type=float, default=10)
    keeper.add_argument("--below-min-timeout", type=float, default=600)
    keeper.add_argument("--secret")
    agents = sub.add_parser("agents")
    agents.add_argument("--store", required=True)
    agents.add_argument("--wire", choices=("xmlrpc", "wire"), required=True)
    agents.add_argument("--count", type=int, required=True)
    agents.add_argument("--name", required=True)
    agents.add_argument("--secret")
    agents.add_argument("--start-at", type=float, default=0.0)
    agents.add_argument("--spread", type=float, default=1.0)
    agents.add_argument("--out", required=True)
    agents.add_argument("--lost-bound", type=float, default=10)
    args = parser.parse_args(argv)
    if args.what == "keeper":
        serve_keeper(args)
    else:
        agents_main(args)


if __name__ == "__main__":
    main(sys.argv[1:])
