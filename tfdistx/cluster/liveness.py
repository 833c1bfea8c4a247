"""Whether another task of the cluster is alive, asked by the tasks themselves.

TensorFlow notices a peer that is gone (its connections fail), not one that
is frozen (SIGSTOP, a hung VM, a debugger): the kernel still accepts
connections on a stopped process's port, so a client such as the tf.data
service's waits for its answer forever. Only the local launcher could see
a stopped process (its state in /proc), and only on its own machine; under
TF_CONFIG, Slurm or Kubernetes nothing bounded that wait.

So a task asks the gRPC server of the one it depends on for the first
thing every gRPC server says: an HTTP/2 server answers a client's
connection preface with a SETTINGS frame at once, from its I/O threads,
however busy its computation is. No answer within a few seconds means
frozen or gone; `Watch` counts how long that has lasted, and once it has
lasted `timeout` seconds calls `on_lost` with the tasks' names.

Hand-written because gRPC's own health service is not served by
TensorFlow's servers, and the grpcio package is not a dependency of ours.
No TensorFlow here.
"""

import socket
import threading
import time
from typing import Callable, Dict, List, Mapping, Optional, Tuple

PROBE_SECONDS = 3.0  # how long one probe waits for the server's first frame
INTERVAL_SECONDS = 2.0  # between probes of the same task

# The HTTP/2 client connection preface and an empty SETTINGS frame (RFC 9113 §3.4).
_CLIENT_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_SETTINGS = 4  # the frame type a server's preface starts with


def answers(address: str, timeout: float = PROBE_SECONDS) -> bool:
    """Whether the gRPC server at host:port answers now (alive and not frozen)."""
    host, port = split_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(_CLIENT_PREFACE)
            header = b""
            while len(header) < 9:  # a frame header: length (3), type (1), flags (1), stream (4)
                chunk = sock.recv(9 - len(header))
                if not chunk:
                    return False
                header += chunk
            return header[3] == _SETTINGS
    except OSError:
        return False


def refused(address: str, timeout: float = 1.0) -> bool:
    """Whether nothing listens at host:port now: its host refuses the
    connection (the task's process is gone, its host up). A peer that does
    not answer at all (frozen, cut off, its host down) is not refused."""
    host, port = split_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


def split_address(address: str) -> Tuple[str, int]:
    """'host:port' or '[v6]:port' (a TF_CONFIG address, with or without grpc://)."""
    host, _, port = address.rpartition("//")[2].rpartition(":")
    return host.strip("[]"), int(port)


def task_hosts(cluster: Mapping[str, List[str]]) -> Dict[str, str]:
    """A TF_CONFIG cluster (job -> ["host:port", ...]) as task name -> the host it runs on."""
    return {
        f"{job}:{index}": address.rpartition(":")[0]
        for job, addresses in cluster.items()
        for index, address in enumerate(addresses)
    }


class Watch:
    """A daemon thread that probes `tasks` (name -> address) while open (a
    context manager), and calls `on_lost(names)` once, from that thread,
    when some have not answered for `timeout` seconds in a row. With
    `unseen_timeout`, a task's silence counts only once it has answered
    (it may still be starting), and one that never answers is lost after
    `unseen_timeout` seconds; `seen` holds those that answered. With
    `waited_on`, a silent task counts as lost only while `waited_on()` says
    the caller is stuck waiting (else the watch goes on)."""

    def __init__(
        self,
        tasks: Mapping[str, str],
        timeout: float,
        on_lost: Callable[[List[str]], None],
        interval: float = INTERVAL_SECONDS,
        unseen_timeout: Optional[float] = None,
        waited_on: Callable[[], bool] = lambda: True,
    ):
        self.tasks, self.timeout, self.on_lost, self.interval = dict(tasks), timeout, on_lost, interval
        self.unseen_timeout, self.waited_on = unseen_timeout, waited_on
        self.seen: set = set()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> "Watch":
        if self.tasks:
            self._thread = threading.Thread(target=self._run, name="tfdistx-liveness", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=PROBE_SECONDS + 1)

    def _run(self) -> None:
        silent_since: Dict[str, float] = {}
        started = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            for name, address in self.tasks.items():
                if answers(address):
                    self.seen.add(name)
                    silent_since.pop(name, None)
                else:
                    silent_since.setdefault(name, now)
            now = time.monotonic()
            lost = sorted(
                name
                for name, since in silent_since.items()
                if (self.unseen_timeout is None or name in self.seen) and now - since >= self.timeout
            )
            if self.unseen_timeout is not None and now - started >= self.unseen_timeout:
                lost = sorted({*lost, *(name for name in self.tasks if name not in self.seen)})
            if lost and not self._stop.is_set() and self.waited_on():
                self.on_lost(lost)
                return
            self._stop.wait(self.interval)


def wait_until_gone(tasks: Mapping[str, str], deadline: float, interval: float = 0.5) -> List[str]:
    """Block until none of `tasks` answers, or until time.monotonic() reaches
    `deadline`; returns those still answering then."""
    remaining = dict(tasks)
    while True:
        remaining = {name: address for name, address in remaining.items() if answers(address, timeout=1.0)}
        if not remaining or time.monotonic() >= deadline:
            return sorted(remaining)
        time.sleep(interval)
