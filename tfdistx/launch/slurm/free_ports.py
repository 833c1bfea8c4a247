"""`python -m tfdistx.launch.slurm.free_ports BASE COUNT`: COUNT TCP ports free on
this node now, for the tasks of a Slurm step (`tfdistx job slurm`'s
script asks every node of the job, in a step of one task a node, and hands
the answers to the training step: placement.SLURM_PORTS_ENV).

TensorFlow needs every task's port in the cluster spec before any task
starts, so the ports are chosen before the step: a derived port (BASE +
64 x (job id mod 500) + the rank on the node, as a plain `srun` step's
tasks take) is taken on a node that another job shares about once in 500
pairs of jobs, and then on every try of the job; a port the node's OS
has free now is taken only if another program binds it in the seconds
before the task does, and a task that finds it taken exits 6, which the
script requeues (a new try asks again). The search starts at the derived
port, so jobs sharing a node start apart, and stays in BASE's range
(cluster.base_port and up: what a firewall admits).

`--address`: one port, printed as NODE:PORT (the agents' rendezvous on
this node). No TensorFlow here.
"""

import argparse
import errno
import os
import socket
import sys
from typing import List

from tfdistx.launch.slurm import SLURM_PORT_RANGE, slurm_first_port
from tfdistx.core.errors import EXIT_PORT_IN_USE


def free_ports(base: int, count: int, job_id: str) -> List[int]:
    """`count` ports that no socket on this host holds now, from the job's derived port up, wrapping within
    [base, base + SLURM_PORT_RANGE); each held until all are found, so none is given twice."""
    first = slurm_first_port(base, job_id)
    held, found = [], []
    try:
        for offset in range(SLURM_PORT_RANGE):
            port = base + (first - base + offset) % SLURM_PORT_RANGE
            sock = _bound(port)
            if sock is None:
                continue
            held.append(sock)
            found.append(port)
            if len(found) == count:
                return found
    finally:
        for sock in held:  # bound, never listened on: closing leaves no TIME_WAIT to block the task's bind
            sock.close()
    raise OSError(errno.EADDRINUSE, f"fewer than {count} free ports from {base} to {base + SLURM_PORT_RANGE - 1}")


def _bound(port: int):
    """A socket bound to `port` on every address (IPv4 and, where the host has it, IPv6, as TensorFlow's gRPC server
    binds), or None when something holds the port."""
    for family in (socket.AF_INET6, socket.AF_INET):
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # the IPv4 port too
            sock.bind(("::" if family == socket.AF_INET6 else "", port))
            return sock
        except OSError as error:
            sock.close()
            if error.errno == errno.EADDRINUSE:
                return None
            if family == socket.AF_INET:
                raise
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tfdistx.launch.slurm.free_ports", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("base", type=int, help="cluster.base_port")
    parser.add_argument("count", type=int, nargs="?", default=1)
    parser.add_argument("--address", action="store_true", help="print NODE:PORT (one port) instead of NODE PORT...")
    args = parser.parse_args(argv)
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()  # as SLURM_JOB_NODELIST names it
    try:
        ports = free_ports(args.base, 1 if args.address else args.count, os.environ.get("SLURM_JOB_ID", "0"))
    except OSError as error:
        print(f"tfdistx: node {node}: {error.strerror or error}", file=sys.stderr)
        return EXIT_PORT_IN_USE
    print(f"{node}:{ports[0]}" if args.address else " ".join([node, *map(str, ports)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
