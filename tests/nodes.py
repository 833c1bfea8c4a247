"""A test bed of nodes: each its own network namespace with its own address
on a bridge, as machines on a switch. Made without privileges where the OS
allows user namespaces (as the local launcher's isolation): a holder
process owns a user and network namespace with the bridge (10.77.0.1/24);
each node is a network namespace inside it, joined to the bridge by a veth
pair, at 10.77.0.(N + 1). A node is cut off by setting its link down (a
partition: TCP neither resets nor answers) and joined again by setting it up.

Every process started here runs in its node's namespace; `close` kills the
holders, and the namespaces, links and bridge go with them.
"""

import os
import signal
import subprocess
import time
from typing import List

SUBNET = "10.77.0"


def can_make_nodes() -> bool:
    try:
        return (
            subprocess.run(
                ["unshare", "--user", "--map-root-user", "--net", "ip", "link", "add", "b0", "type", "bridge"],
                capture_output=True,
                timeout=10,
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


class Nodes:
    def __init__(self, count: int):
        self.holder = subprocess.Popen(
            ["unshare", "--user", "--map-root-user", "--net", "sleep", "infinity"], start_new_session=True
        )
        self.nodes: List[subprocess.Popen] = []
        self.started: List[subprocess.Popen] = []
        self._wait_for_namespace(self.holder.pid)
        self._outer("ip", "link", "add", "br0", "type", "bridge")
        self._outer("ip", "addr", "add", f"{SUBNET}.1/24", "dev", "br0")
        self._outer("ip", "link", "set", "br0", "up")
        self._outer("ip", "link", "set", "lo", "up")
        for n in range(1, count + 1):
            node = subprocess.Popen(
                [*self._enter(self.holder.pid), "unshare", "--net", "sleep", "infinity"], start_new_session=True
            )
            self._wait_for_namespace(node.pid)
            self.nodes.append(node)
            self._outer("ip", "link", "add", f"n{n}", "type", "veth", "peer", "name", f"n{n}in")
            self._outer("ip", "link", "set", f"n{n}in", "netns", str(node.pid))
            self._outer("ip", "link", "set", f"n{n}", "master", "br0")
            self._outer("ip", "link", "set", f"n{n}", "up")
            for command in (
                ["ip", "addr", "add", f"{self.address(n)}/24", "dev", f"n{n}in"],
                ["ip", "link", "set", f"n{n}in", "up"],
                ["ip", "link", "set", "lo", "up"],
            ):
                subprocess.run([*self._enter(node.pid), *command], check=True, capture_output=True)

    @staticmethod
    def address(n: int) -> str:
        return f"{SUBNET}.{n + 1}"

    def start(self, n: int, command: List[str], **popen) -> subprocess.Popen:
        """`command` on node n (from 1), in a session of its own."""
        proc = subprocess.Popen([*self._enter(self.nodes[n - 1].pid), *command], start_new_session=True, **popen)
        self.started.append(proc)
        return proc

    def cut(self, n: int) -> None:
        self._outer("ip", "link", "set", f"n{n}", "down")

    def join(self, n: int) -> None:
        self._outer("ip", "link", "set", f"n{n}", "up")

    def close(self) -> None:
        for proc in [*self.started, *self.nodes, self.holder]:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()

    # -- namespaces --------------------------------------------------------------

    @staticmethod
    def _enter(pid: int) -> List[str]:
        return ["nsenter", f"--target={pid}", "--user", "--net", "--preserve-credentials"]

    def _outer(self, *command: str) -> None:
        subprocess.run([*self._enter(self.holder.pid), *command], check=True, capture_output=True)

    @staticmethod
    def _wait_for_namespace(pid: int) -> None:
        """Until `pid` runs `sleep`: nsenter and unshare exec what they run, so
        the holder's pid is the sleep's once its namespaces are made."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if open(f"/proc/{pid}/comm").read().strip() == "sleep":
                    return
            except OSError:
                pass
            time.sleep(0.02)
        raise RuntimeError(f"namespace holder {pid} did not start")

    def __enter__(self) -> "Nodes":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
