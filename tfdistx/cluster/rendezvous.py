"""Wait, for a bounded time, until every peer of this task is listening.

TensorFlow forms a multi-worker cluster inside the strategy's constructor
(`context.ensure_initialized`), which waits for a missing peer forever while
holding the GIL: no Python thread can time it out, and the coordination
service's `cluster_register_timeout_in_ms` did not fire in TF 2.21 (measured:
12 minutes with 8 s asked). So the tasks meet first, by plain TCP, before
TensorFlow starts: each listens on its own port (never accepting, so the
kernel's backlog answers and closing leaves no TIME_WAIT to block
TensorFlow's bind), and connects to each peer until all answer. A peer that
has already moved on answers through TensorFlow's own server on that port.

Binding first also turns "port already in use" into one line naming the
port and the task, instead of TensorFlow's "Could not start gRPC server".

No TensorFlow here.
"""

import errno
import os
import socket
import sys
import time
from typing import Dict, Optional, Tuple

from tfdistx.cluster.placement import Placement
from tfdistx.core.errors import EXIT_CLUSTER_DID_NOT_FORM, EXIT_PORT_IN_USE, RunFault
from tfdistx.sigterm import SigtermNotice

POLL_SECONDS = 0.5
LOCAL_CLUSTER_ENV = "TFDISTX_LOCAL_TASK"  # set by launch.py for the tasks it starts


def meet_peers(placement: Placement, timeout: float, wait: bool = True, notice: Optional[SigtermNotice] = None) -> None:
    """Claim this task's port, and (if `wait`) return once every other task
    of the cluster answers; after `timeout` seconds, a RunFault naming those
    that did not. Tasks that only serve (a parameter-server cluster's ps and
    workers) claim their port and do not wait: the coordinator waits for them.
    A SIGTERM (`notice`) while some have not answered ends the wait with the
    preemption code: nobody can have gone on to wait for this task in
    TensorFlow, since nobody has met them all."""
    me = _address(placement.cluster_spec[placement.task_type][placement.task_index])
    listener = _listen(me[1], placement)
    if not os.environ.get(LOCAL_CLUSTER_ENV):  # the launcher's own tasks are isolated, or it has warned
        print(
            f"tfdistx: WARNING: task {placement.task_name} listens on port {me[1]} on ALL of this host's interfaces "
            f"(TensorFlow's gRPC server, no authentication), whatever host {placement.launch} names: firewall it",
            file=sys.stderr,
            flush=True,
        )
    try:
        if not wait:
            return
        missing = _peers(placement)
        deadline = time.monotonic() + timeout
        while missing:
            missing = {name: address for name, address in missing.items() if not _answers(address)}
            if not missing:
                break
            if notice is not None:
                notice.leave_if_received("while the cluster was forming")
            if time.monotonic() >= deadline:
                where = ", ".join(f"{name} at {host}:{port}" for name, (host, port) in missing.items())
                raise RunFault(
                    f"the cluster did not form within cluster.startup_timeout={timeout:g}s: no answer from {where} "
                    "(was every task started, with the same cluster?)",
                    EXIT_CLUSTER_DID_NOT_FORM,
                )
            time.sleep(POLL_SECONDS)
    finally:
        listener.close()


def _peers(placement: Placement) -> Dict[str, Tuple[str, int]]:
    return {
        f"{job}:{index}": _address(address)
        for job, addresses in placement.cluster_spec.items()
        for index, address in enumerate(addresses)
        if (job, index) != (placement.task_type, placement.task_index)
    }


def _listen(port: int, placement: Placement) -> socket.socket:
    # TensorFlow's server binds every interface, whatever host TF_CONFIG names.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("", port))
        sock.listen(64)
    except OSError as error:
        sock.close()
        if error.errno != errno.EADDRINUSE:
            raise
        address = placement.cluster_spec[placement.task_type][placement.task_index]
        raise RunFault(
            f"{placement.address_from}={address!r}: task {placement.task_name} cannot listen on port {port}: "
            f"it is already in use on this host (exit {EXIT_PORT_IN_USE}: a restart may find it free)",
            EXIT_PORT_IN_USE,
        ) from None
    return sock


def _answers(address: Tuple[str, int]) -> bool:
    try:
        with socket.create_connection(address, timeout=2):
            return True
    except OSError:
        return False


def _address(address: str) -> Tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)
