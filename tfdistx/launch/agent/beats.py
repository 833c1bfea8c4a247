"""A node's agent's beats to the keeper of the rounds (round_keeper.py),
from a thread of its own, over one connection (keeper_wire.py), each
proving the run's secret: its status, and what the keeper last said. No
TensorFlow here.
"""

import random
import secrets
import socket
import threading
import time
from typing import Optional

from tfdistx.cluster.liveness import split_address
from tfdistx.launch.agent.keeper_wire import CALL_TIMEOUT_SECONDS, Link, Refused, WireError
from tfdistx.launch.agent.messages import WAITING, Beat, News, Place, Told, beat_seconds

# Each wait between beats is the interval less up to this share of it, drawn anew: agents started in the same
# second spread their beats, and none beats later than the interval (a round formed is heard as soon as before).
BEAT_JITTER = 0.25
RETRY_FIRST_SECONDS = 0.25  # a beat that failed is tried again after about this, doubled at each failure,
RETRY_SHARE_OF_LOST_BOUND = 0.2  # up to this share of lost_bound (beat_delay)


def own_address(store: str) -> str:
    """The address this node reaches the keeper from: the one its peers reach it at (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(split_address(store))
        return probe.getsockname()[0]


def beat_delay(interval: float, lost_bound: float, failures: int, silent: float = 0.0) -> float:
    """The wait before an agent's next beat. Answered (`failures` 0): the
    keeper's interval, jittered, so that agents started in the same second
    (as Slurm and a JobSet start them) spread their beats over it. After
    `failures` failed beats in a row (a busy keeper, a network blip), the
    keeper `silent` seconds so far: a back-off that starts short and
    doubles, jittered (half to whole), at most a fifth of lost_bound, and
    shorter as the silence nears lost_bound (a quarter of what is left, not
    under RETRY_FIRST_SECONDS): a node whose link comes back beats again
    before the keeper takes it for lost, whatever the back-off had grown to."""
    if failures <= 0:
        return interval * random.uniform(1 - BEAT_JITTER, 1)
    backoff = min(RETRY_FIRST_SECONDS * 2 ** (failures - 1), lost_bound * RETRY_SHARE_OF_LOST_BOUND)
    backoff = min(backoff, max(RETRY_FIRST_SECONDS, (lost_bound - silent) / 4))
    return backoff * random.uniform(0.5, 1.0)


class BeatState:
    """What an agent tells the keeper and what it has heard back, without
    the I/O (Beats does it over a socket; the benchmark's simulated agents
    over asyncio): its status, the round its tasks run in, their code, its
    worker's port; the keeper's latest news of the rounds, its place in the
    round it was placed in, why it waits, how often to beat."""

    def __init__(self, name: str, address: str, port: int = 0, lost_bound: float = 10.0, config: str = ""):
        self.name, self.address, self.port, self.lost_bound, self.config = name, address, port, lost_bound, config
        self.status, self.round, self.code = WAITING, 0, 0
        self.version = 0
        self.news: Optional[News] = None
        self.place: Optional[Place] = None
        self.wait: Optional[tuple] = None
        self.refused: Optional[str] = None  # the keeper refused this agent's config (a signed answer)
        self.interval = beat_seconds(1, lost_bound)

    def set(self, status: str, round_number: int = 0, code: int = 0, port: Optional[int] = None) -> None:
        self.status, self.round, self.code = status, round_number, code
        self.port = self.port if port is None else port

    def request(self) -> dict:
        return Beat(
            self.name, self.address, self.port, self.status, self.round, self.code, self.version, self.config
        ).fields()

    def absorb(self, fields: dict) -> None:
        """The keeper's answer (its wire fields) to the last request."""
        told = Told.read(fields)
        self.interval, self.wait, self.refused = told.beat, told.wait, told.refused
        if told.news is not None:
            self.news, self.version = told.news, max(self.version, told.version)
        if told.place is not None:
            self.place = told.place

    def placed(self) -> Optional[Place]:
        """This agent's place in the round that runs now, if it is in it."""
        news, place = self.news, self.place
        if news is None or place is None or news.why is not None or place.number != news.number:
            return None
        return place

    def closed_or_moved_on(self) -> bool:
        """The round this agent's tasks run in has closed, or another formed without it."""
        return self.news is not None and (self.news.number != self.round or self.news.why is not None)


class Beats:
    """The agent's beats to the keeper at `store`, from a thread, over one
    connection it keeps (launch/agent/keeper_wire.py), each proving the run's
    `secret`: its status, and what the keeper last said (`news`, `place`)
    with when it came (`answered`). A beat that fails is tried again with a
    jittered back-off (beat_delay); a status set is beaten at once."""

    def __init__(self, store: str, address: str, secret: bytes, lost_bound: float = 10.0, config: str = ""):
        # Named apart from any other agent, on this host or started here before: a restarted agent is a new member.
        self.store, self.address, self.name = store, address, f"{address}/{secrets.token_hex(4)}"
        self.lost_bound = lost_bound
        self.state = BeatState(self.name, address, lost_bound=lost_bound, config=config)
        self.call_timeout = min(CALL_TIMEOUT_SECONDS, lost_bound / 3)
        # A connection that answered nothing this long is opened again: a cut link leaves it dead without a word,
        # and TCP's own retransmissions back off past the bound, where a new connection's first try comes within
        # a second. Not sooner: a busy keeper's answer comes late on it, and a new one only adds a handshake.
        self.link = Link(store, secret, stale_after=max(1.5 * self.call_timeout, lost_bound / 4))
        self.failures = 0
        self.trouble: Optional[str] = None  # why the last beat failed, when the keeper refused it
        # the agent starts as if just answered: it waits lost_bound before it says otherwise
        self.answered = time.monotonic()
        self.due = time.monotonic()  # when the beat thread is next due to beat
        self.stalled = (0.0, 0.0)  # the last time the beat thread woke far later than due: (due, woke)
        self.lock, self.stop, self.woken = threading.Lock(), threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run, name="beats", daemon=True)

    def start(self) -> "Beats":
        self.thread.start()
        return self

    def set(self, status: str, round_number: int = 0, code: int = 0, port: Optional[int] = None) -> None:
        """A new status, beaten at once (from the beat thread: the caller does not wait for the keeper)."""
        with self.lock:
            self.state.set(status, round_number, code, port)
        self.woken.set()

    def wake(self) -> None:
        """Beat now rather than at the next interval."""
        self.woken.set()

    def close(self) -> None:
        """No more beats: the thread ends (a beat under way finishes first, within its timeout), the
        connection is closed."""
        self.stop.set()
        self.woken.set()
        if self.thread.is_alive():
            self.thread.join(timeout=self.call_timeout + 1)
        self.link.close()

    @property
    def status(self) -> tuple:
        with self.lock:
            return self.state.status, self.state.round, self.state.code, self.state.port

    def news(self) -> Optional[News]:
        with self.lock:
            return self.state.news

    def placed(self) -> Optional[Place]:
        with self.lock:
            return self.state.placed()

    def wait_line(self) -> Optional[tuple]:
        with self.lock:
            return self.state.wait

    def refused(self) -> Optional[str]:
        with self.lock:
            return self.state.refused

    def beat(self) -> bool:
        """One beat, from the beat thread; whether the keeper answered."""
        with self.lock:
            request = self.state.request()
        try:
            fields = self.link.call(request, self.call_timeout)
        except Refused as refused:
            self.trouble, self.failures = str(refused), self.failures + 1
            return False
        except (OSError, WireError, ValueError):
            self.failures += 1
            return False
        with self.lock:
            try:
                self.state.absorb(fields)
            except (KeyError, TypeError, ValueError):
                self.failures += 1
                return False
            self.answered, self.failures, self.trouble = time.monotonic(), 0, None
        return True

    def silent_for(self) -> float:
        return time.monotonic() - self.answered

    def frozen_for(self) -> float:
        """How long this process itself did not run (SIGSTOP, a debugger, a suspended machine) since the
        keeper last answered, as its beat thread saw it: woken that much later than due, or still not woken."""
        now = time.monotonic()
        late_now = now - self.due - self.call_timeout  # the beat thread should have run by now
        due, woke = self.stalled
        late_before = woke - due if woke >= self.answered else 0.0
        return max(0.0, late_now, late_before)

    def _run(self) -> None:
        self.woken.wait()  # the first beat once a status is set: its worker's port with it
        self.woken.clear()
        self.due = time.monotonic()
        while not self.stop.is_set():
            self.beat()
            with self.lock:
                interval = self.state.interval
            delay = beat_delay(interval, self.lost_bound, self.failures, self.silent_for())
            self.due = time.monotonic() + delay
            self.woken.wait(delay)
            self.woken.clear()
            woke = time.monotonic()
            if woke - self.due > max(self.lost_bound / 2, self.call_timeout + 1):
                self.stalled = (self.due, woke)
            self.due = woke
