"""The hosts an elastic run's workers may run on (cluster.elastic.hosts or
.discover), which of them a round takes, and when a change of the list
counts (Settled). No TensorFlow here."""

import ipaddress
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

DISCOVER_TIMEOUT_SECONDS = 30
ALLOWED = (
    "a loopback address of this machine, 127.0.0.N (the local launcher starts every task here, on a port of its own "
    "choosing)"
)


def why_not_a_host(host: str) -> Optional[str]:
    """Why the local launcher cannot start a task on `host` (a line of the
    list); None when it can. A task's address is `host:PORT` in its
    TF_CONFIG, and every task runs on this machine (in its private network
    namespace, where every 127.0.0.N is this machine): a host is a loopback
    IPv4 address, written without a port."""
    try:
        address = ipaddress.IPv4Address(host)
    except ValueError:
        name, colon, port = host.rpartition(":")
        if colon and port.isdigit() and why_not_a_host(name) is None:
            return f"a host, not host:port, is expected: {ALLOWED}"
        return f"not an IPv4 address: {ALLOWED}"
    if not address.is_loopback:
        return f"not an address of this machine: {ALLOWED}"
    return None


class HostList:
    """The hosts, read from a file or a discovery command each time it is
    asked (one host a line; blank lines and # comments skipped). A command
    that fails or hangs keeps the last list, said once (`say`)."""

    def __init__(self, path: Optional[str], command: Optional[str], say: Callable[[str], None] = None):
        self.path, self.command, self.last, self.failing = path, command, [], False
        self.say = say or (lambda text: print(f"tfdistx: {text}", file=sys.stderr, flush=True))
        self.noted = set()  # the bad or repeated lines already said: the list is read about once a second

    @property
    def where(self) -> str:
        return self.path if self.path is not None else f"`{self.command}`"

    def read(self) -> List[str]:
        try:
            if self.path is not None:
                text = Path(self.path).read_text()
            else:
                done = subprocess.run(
                    self.command, shell=True, capture_output=True, text=True, timeout=DISCOVER_TIMEOUT_SECONDS
                )
                if done.returncode != 0:
                    raise OSError(f"exit code {done.returncode}: {done.stderr.strip()[:200]}")
                text = done.stdout
        except (OSError, subprocess.TimeoutExpired) as error:
            if not self.failing:
                self.say(
                    f"cannot read the hosts from {self.where} ({error}): keeping the last list, "
                    f"{', '.join(self.last) or 'empty'}"
                )
            self.failing = True
            return list(self.last)
        self.failing = False
        hosts = []
        for line in text.splitlines():
            host = line.split("#", 1)[0].strip()
            if not host:
                continue
            why = why_not_a_host(host)
            if why is not None:  # left out, said once: a typo in a list re-read while the run goes on must not end it
                self._note(host, f"warning: {self.where}: host {host!r} left out: {why}")
            elif host in hosts:
                self._note(host, f"warning: {self.where}: host {host} is listed more than once: one worker runs there")
            else:
                hosts.append(host)
        self.last = hosts
        return hosts

    def _note(self, host: str, text: str) -> None:
        if (host, text) not in self.noted:
            self.noted.add((host, text))
            self.say(text)


class Settled:
    """The hosts whose change has held: a host newly listed counts once it
    has stayed listed `bound` seconds (cluster.elastic.lost_bound), and a
    host that counts stops counting once it has stayed unlisted as long, so
    that a host flapping in and out of the list changes no round. The first
    list read counts as it is (the first round forms at once)."""

    def __init__(self, bound: float, clock: Callable[[], float] = time.monotonic):
        self.bound, self.clock = bound, clock
        self.since: Dict[str, Tuple[bool, float]] = {}  # host -> (listed at the last read, since when)
        self.hosts: Optional[List[str]] = (
            None  # the hosts that count, in the list's order (those on their way out last)
        )

    def update(self, listed: List[str]) -> List[str]:
        now = self.clock()
        for host in {*listed, *self.since}:
            if self.since.get(host, (None,))[0] != (host in listed):
                self.since[host] = (host in listed, now)
        if self.hosts is None:
            self.hosts = list(listed)
            return list(listed)
        held = {host for host, (_, since) in self.since.items() if now - since >= self.bound}
        self.hosts = [host for host in listed if host in self.hosts or host in held] + [
            host for host in self.hosts if host not in listed and host not in held
        ]
        return list(self.hosts)


def choose(listed: List[str], chief: Optional[str], most: int) -> List[str]:
    """A round's hosts: the chief's first (it writes the run: it stays, and
    without it no round forms), then the others in list order, at most `most`."""
    if chief is not None and chief not in listed:
        return []
    first = chief or (listed[0] if listed else None)
    return ([first] + [host for host in listed if host != first])[:most] if first else []
