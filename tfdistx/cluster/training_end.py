"""How the training ended, told by the chief to the servers before it goes.

The servers of a run (a parameter-server cluster's ps and workers, the
tf.data service's dispatcher and data workers) train nothing: they serve
until the trainers have left. Under the local launcher the supervisor then
stops them; under TF_CONFIG, Slurm or Kubernetes nothing does, and a server
could only see its trainers go silent (cluster/liveness.py), which is what
a crash looks like too: it stopped with exit 5 one `cluster.peer_timeout`
after a run that had trained to its end, and Slurm, which keeps a step's
largest code, recorded a finished job as failed.

So the chief, the one process that knows how the training ended, says so
before it leaves: one UDP datagram to each server, at the host and port
number of the server's own TCP address (TensorFlow's and the tf.data
service's servers take TCP only, so the same number is free for UDP on
every host, without a port or a key of its own), answered by the server at
once. A server that hears 0 stops serving once its trainers have left, and
exits 0; one that hears another code (a lost peer, a preemption, a failure)
stops at once with that code and one line, instead of waiting out
`cluster.peer_timeout` for a coordinator that is already gone.

Why the network, not the run directory (a `summary.json`): the run
directory is shared under Slurm only where the job's file system is, and a
TFJob's or JobSet's pods need a volume for it; every server can be reached
by the chief, since it serves it. Why not TensorFlow itself: a server's
process has no handle on what runs in its server, and the tf.data
service's tasks are in no cluster spec the chief's TensorFlow knows. A
server the datagram does not reach (a firewall that drops UDP, a datagram
lost three times) ends as before: after `cluster.peer_timeout`, exit 5.

The datagram names the cluster (a digest of its spec, which every task of
the run has alike), so that another run's chief on the same host and port
numbers is not heard. Like the servers' own ports it has no
authentication: anyone who can reach them could already run operations in
them. Hand-written on the standard library's sockets: no library does one
datagram and its answer. No TensorFlow here.
"""

import contextlib
import hashlib
import json
import selectors
import socket
import threading
import time
from typing import Dict, List, Mapping, Optional

from tfdistx.cluster.liveness import split_address
from tfdistx.cluster.placement import Placement
from tfdistx.core.errors import EXIT_INVALID_CONFIG, EXIT_PLUGIN_FAILED, ConfigError, RunFault
from tfdistx.core.strategies import StrategyRow

TELL_SECONDS = 3.0  # how long the chief tries to be heard by every server: it leaves after that whatever it heard
RESEND_SECONDS = 0.2  # a datagram is sent again this often until answered (one lost on the way)
_ENDED, _HEARD = b"tfdistx-ended", b"tfdistx-heard"


def servers_of(placement: Placement, row: StrategyRow) -> Dict[str, str]:
    """The servers the chief of this placement tells, task name -> address:
    the strategy's serving jobs (a parameter-server cluster's ps and
    workers) and the tf.data service's tasks. None for any other task."""
    if not placement.is_chief:
        return {}
    jobs = {job: addresses for job, addresses in placement.cluster_spec.items() if job in row.serving_jobs}
    return {
        f"{job}:{index}": address
        for job, addresses in {**jobs, **placement.service}.items()
        for index, address in enumerate(addresses)
    }


@contextlib.contextmanager
def told_to_the_servers(placement: Placement, row: StrategyRow):
    """While open, this process's work; as it ends, its servers (servers_of:
    none unless this is the chief) are told the code the process leaves with
    (retryable codes before `cluster.retryable_exit_offset`, which each
    server adds to its own): 0 when it returns, a RunFault's or SystemExit's
    code (42: preempted), 2 for a ConfigError, 1 for anything else. Not a
    Ctrl-C: it reaches every local task, and a terminal's user stops the others."""
    servers = servers_of(placement, row)
    if not servers:
        yield
        return
    digest = cluster_digest(placement)
    try:
        yield
    except KeyboardInterrupt:
        raise
    except RunFault as fault:
        tell(servers, digest, fault.code)
        raise
    except ConfigError:
        tell(servers, digest, EXIT_INVALID_CONFIG)
        raise
    except SystemExit as leaving:
        code = leaving.code
        tell(servers, digest, 0 if code is None else code if isinstance(code, int) else EXIT_PLUGIN_FAILED)
        raise
    except BaseException:
        tell(servers, digest, EXIT_PLUGIN_FAILED)  # the code an error no check foresaw leaves with (cli)
        raise
    tell(servers, digest, 0)


def cluster_digest(placement: Placement) -> str:
    """The same on every task of one cluster (its spec and service, as TF_CONFIG or Slurm gave them)."""
    spec = json.dumps({"cluster": placement.cluster_spec, "service": placement.service}, sort_keys=True)
    return hashlib.sha256(spec.encode()).hexdigest()[:16]


def tell(servers: Mapping[str, str], digest: str, code: int, seconds: float = TELL_SECONDS) -> List[str]:
    """Tell each server (name -> host:port) that the training ended with
    `code`; returns those that answered, within `seconds` at most. A server
    that is gone (nothing on its port: the host says so) is not waited for."""
    message = b"%s %s %d" % (_ENDED, digest.encode(), code)
    waiting: Dict[socket.socket, str] = {}
    with selectors.DefaultSelector() as selector:
        for name, address in servers.items():
            try:
                host, port = split_address(address)
                family, kind, proto, _, where = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
                sock = socket.socket(family, kind, proto)
            except (OSError, ValueError):  # a name that does not resolve (yet): nothing to tell there
                continue
            sock.setblocking(False)
            try:
                sock.connect(where)  # connected: the host's "port unreachable" comes back as a refusal
            except OSError:
                sock.close()
                continue
            waiting[sock] = name
            selector.register(sock, selectors.EVENT_READ)
        heard: List[str] = []
        deadline, next_send = time.monotonic() + seconds, 0.0
        try:
            while waiting and time.monotonic() < deadline:
                if time.monotonic() >= next_send:
                    for sock in list(waiting):
                        try:
                            sock.send(message)
                        except OSError:  # refused (nothing listens there) or unreachable: not waited for
                            _forget(sock, waiting, selector)
                    next_send = time.monotonic() + RESEND_SECONDS
                for key, _ in selector.select(timeout=max(0.0, min(next_send, deadline) - time.monotonic())):
                    sock = key.fileobj
                    try:
                        answer = sock.recv(64)
                    except OSError:
                        _forget(sock, waiting, selector)
                        continue
                    if answer == b"%s %s" % (_HEARD, digest.encode()):
                        heard.append(waiting[sock])
                        _forget(sock, waiting, selector)
        finally:
            for sock in list(waiting):
                _forget(sock, waiting, selector)
    return sorted(heard)


def _forget(sock: socket.socket, waiting: dict, selector) -> None:
    selector.unregister(sock)
    waiting.pop(sock)
    sock.close()


class Hearing:
    """A server's ear for the chief's word (`tell`): while open (a context
    manager), a daemon thread on UDP at `address`'s port, on every
    interface; `code` is None until the chief has said how the training
    ended, then that code (`heard` is set). Where the port cannot be
    bound, nothing is heard, and the server ends as it did without it."""

    def __init__(self, address: str, digest: str):
        self.port, self.digest = split_address(address)[1], digest
        self.code: Optional[int] = None
        self.heard = threading.Event()
        self._sock: Optional[socket.socket] = None
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> "Hearing":
        self._sock = _bound(self.port)
        if self._sock is not None:
            self._thread = threading.Thread(target=self._run, name="tfdistx-training-end", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._sock is not None:
            self._sock.close()  # the thread's recv fails, and it ends

    def _run(self) -> None:
        prefix = b"%s %s " % (_ENDED, self.digest.encode())
        while True:
            try:
                message, sender = self._sock.recvfrom(128)
            except OSError:  # closed
                return
            if not message.startswith(prefix) or not message[len(prefix) :].isdigit():
                continue  # not this cluster's chief
            try:
                self._sock.sendto(b"%s %s" % (_HEARD, self.digest.encode()), sender)
            except OSError:
                pass  # the chief resends, or leaves after TELL_SECONDS: the code is what counts
            if self.code is None:
                self.code = int(message[len(prefix) :])
                self.heard.set()


def _bound(port: int) -> Optional[socket.socket]:
    """A UDP socket on `port` of every interface (IPv6 and IPv4 where the host has both), or None."""
    for family, where in ((socket.AF_INET6, ("::", port)), (socket.AF_INET, ("", port))):
        try:
            sock = socket.socket(family, socket.SOCK_DGRAM)
        except OSError:
            continue
        try:
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(where)
            return sock
        except OSError:
            sock.close()
    return None
