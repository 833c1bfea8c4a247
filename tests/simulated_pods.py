"""Run a TFJob's pods on this machine the way Kubeflow's training operator would.

    unshare --user --map-root-user --net --mount --fork --kill-child \
        python tests/simulated_pods.py TFJOB.json WORKDIR [--kill POD [--signal TERM] --when-exists PATH] [--timeout S]

Started inside a fresh user, network and mount namespace (so it needs no
privileges and touches nothing outside), it:

- gives every pod a network namespace of its own, on one bridge, with its
  own address (a restarted pod gets a new one, as on Kubernetes);
- makes each pod's service name (`<job>-<type>-<i>.<namespace>.svc`)
  resolve to the pod's current address, through this namespace's own
  /etc/hosts, as the operator's headless services do through DNS;
- mounts each hostPath volume at its mountPath (over a private /mnt);
- starts each container's command and args, with `python` standing for
  this interpreter, and TF_CONFIG in the operator's format
  (kubeflow/training-operator's pkg/controller.v1/tensorflow), so every pod listens on port 2222;
- applies restartPolicy ExitCode: a pod that exits 128-255 (or is killed)
  is recreated, up to runPolicy.backoffLimit times; 1-127 fails the job; the
  job succeeds when the chief (or worker 0 without one) exits 0, and
  cleanPodPolicy Running then deletes the rest (SIGTERM, then SIGKILL).

It prints one JSON line per event (pod started, exited, restarted, killed;
the job's end), writes pod logs to WORKDIR/logs/<pod>.log, and exits 0 if
the job succeeded, 1 if not. It never outlives --timeout.
"""

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PORT = 2222
GRACE_SECONDS = 30  # Kubernetes' default terminationGracePeriodSeconds, where the pod spec sets none
SUBNET = "10.233"  # addresses exist only inside this network namespace


def sh(*args):
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)


def emit(**event):
    print(json.dumps({"t": round(time.monotonic() - STARTED, 1), **event}), flush=True)


class Pod:
    def __init__(self, job: str, rtype: str, index: int, spec: dict, cluster: dict, namespace: str, workdir: Path):
        self.rtype, self.index = rtype.lower(), index
        self.name = f"{job}-{self.rtype}-{index}"
        self.host = f"{self.name}.{namespace}.svc"
        self.container = spec["template"]["spec"]["containers"][0]
        self.grace = spec["template"]["spec"].get("terminationGracePeriodSeconds", GRACE_SECONDS)
        self.tf_config = json.dumps({"cluster": cluster, "task": {"type": self.rtype, "index": index}, "environment": "cloud"})
        self.workdir = workdir
        self.proc = None
        self.address = None
        self.restarts = 0
        self.done = None  # exit code once it has ended for good

    def start(self) -> None:
        """Create the pod at self.address (already in /etc/hosts) and start its container."""
        address = self.address
        netns = self.name
        subprocess.run(["ip", "netns", "delete", netns], stderr=subprocess.DEVNULL)
        sh("ip", "netns", "add", netns)
        host_end = f"v{abs(hash((self.name, self.restarts))) % 10**8}"
        sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", netns)
        sh("ip", "link", "set", host_end, "master", "br0", "up")
        sh("ip", "-n", netns, "addr", "add", f"{address}/16", "dev", "eth0")
        sh("ip", "-n", netns, "link", "set", "eth0", "up")
        sh("ip", "-n", netns, "link", "set", "lo", "up")
        command = [sys.executable if part == "python" else part for part in self.container.get("command", [])]
        command += list(self.container.get("args", []))
        cwd = self.workdir / "pods" / self.name
        (cwd / "tmp").mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **{e["name"]: e["value"] for e in self.container.get("env", [])},
               "TF_CONFIG": self.tf_config, "HOSTNAME": self.name,
               "TMPDIR": str(cwd / "tmp")}  # a container's /tmp is its own (TensorFlow leaves autograph files there when killed)
        log = open(self.workdir / "logs" / f"{self.name}.log", "ab")
        self.proc = subprocess.Popen(["ip", "netns", "exec", netns, *command], cwd=cwd, env=env, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent)
        log.close()
        emit(event="started", pod=self.name, address=address, restarts=self.restarts)

    def signal(self, sig: int) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass


def _has_content(path: Path) -> bool:
    """A file written, not only opened (metrics.jsonl is opened before the first step)."""
    try:
        return path.stat().st_size > 0
    except OSError:
        return False


def _die_with_parent():
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode  # killed by signal N: 128 + N, as the kubelet reports


def write_hosts(hosts: Path, pods) -> None:
    lines = ["127.0.0.1 localhost"] + [f"{p.address} {p.host} {p.name}" for p in pods if p.address]
    with open(hosts, "w") as f:  # the same inode: /etc/hosts is bound to it
        f.write("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("manifest")
    parser.add_argument("workdir")
    parser.add_argument("--kill", help="pod name to signal once, when --when-exists appears with content")
    parser.add_argument("--signal", default="KILL", help="KILL (a lost pod) or TERM (a pod evicted: preemption)")
    parser.add_argument("--when-exists")
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    tfjob = json.loads(Path(args.manifest).read_text())
    workdir = Path(args.workdir)
    (workdir / "logs").mkdir(parents=True, exist_ok=True)
    name, namespace = tfjob["metadata"]["name"], tfjob["metadata"].get("namespace", "default")
    specs = tfjob["spec"]["tfReplicaSpecs"]
    backoff_limit = tfjob["spec"].get("runPolicy", {}).get("backoffLimit", 6)

    # The pod network: one bridge, no way out of this namespace.
    sh("ip", "link", "set", "lo", "up")
    sh("ip", "link", "add", "br0", "type", "bridge")
    sh("ip", "link", "set", "br0", "up")
    sh("mount", "-t", "tmpfs", "tmpfs", "/run")  # for `ip netns` (/run/netns), private to this namespace
    hosts = workdir / "hosts"
    hosts.write_text("")
    sh("mount", "--bind", str(hosts), "/etc/hosts")
    _mount_volumes(next(iter(specs.values()))["template"]["spec"])

    cluster = {rtype.lower(): [f"{name}-{rtype.lower()}-{i}.{namespace}.svc:{PORT}" for i in range(spec["replicas"])]
               for rtype, spec in specs.items()}
    pods = [Pod(name, rtype, i, spec, cluster, namespace, workdir) for rtype, spec in specs.items() for i in range(spec["replicas"])]
    primary = next(p for p in pods if p.rtype == ("chief" if "Chief" in specs else "worker") and p.index == 0)
    addresses = (f"{SUBNET}.{n // 250}.{n % 250 + 2}" for n in range(10**4))
    for pod in pods:
        pod.address = next(addresses)
    write_hosts(hosts, pods)
    for pod in pods:
        pod.start()

    restarts, killed, status = 0, False, None
    deadline = time.monotonic() + args.timeout
    while status is None:
        time.sleep(0.2)
        if args.kill and not killed and args.when_exists and _has_content(Path(args.when_exists)):
            victim = next(p for p in pods if p.name == args.kill)
            victim.signal(getattr(signal, f"SIG{args.signal}"))
            killed = True
            emit(event="killed", pod=victim.name, signal=args.signal)
        for pod in pods:
            if pod.done is not None or pod.proc.poll() is None:
                continue
            code = exit_code(pod.proc.returncode)
            emit(event="exited", pod=pod.name, code=code)
            if code == 0:
                pod.done = 0
                if pod is primary:
                    status = "Succeeded"
            elif 128 <= code <= 255 and restarts < backoff_limit:
                restarts += 1
                pod.restarts += 1
                time.sleep(1)  # the operator deletes the pod and creates a new one
                pod.address = next(addresses)
                write_hosts(hosts, pods)
                pod.start()
            else:
                pod.done = code
                status = f"Failed: {pod.name} exited {code}" + (" (past backoffLimit)" if code >= 128 else " (permanent)")
        if status is None and time.monotonic() > deadline:
            status = f"Failed: timeout after {args.timeout:g}s"
    # cleanPodPolicy Running: delete what still runs (SIGTERM, the pod's grace, SIGKILL).
    for pod in pods:
        pod.signal(signal.SIGTERM)
    deleted = time.monotonic()
    for pod in pods:
        while pod.proc.poll() is None and time.monotonic() < deleted + pod.grace:
            time.sleep(0.1)
        pod.signal(signal.SIGKILL)
        pod.proc.wait()
    emit(event="job", status=status, restarts=restarts)
    return 0 if status == "Succeeded" else 1


def _mount_volumes(pod_spec: dict) -> None:
    """hostPath volumes at their mountPath, under a private tmpfs at the mount path's top directory."""
    sources = {v["name"]: v["hostPath"]["path"] for v in pod_spec.get("volumes", []) if "hostPath" in v}
    tops = set()
    for mount in pod_spec["containers"][0].get("volumeMounts", []):
        if mount["name"] not in sources:
            continue
        top = "/" + mount["mountPath"].strip("/").split("/")[0]
        if top not in tops:
            sh("mount", "-t", "tmpfs", "tmpfs", top)
            tops.add(top)
        os.makedirs(mount["mountPath"], exist_ok=True)
        os.makedirs(sources[mount["name"]], exist_ok=True)
        sh("mount", "--bind", sources[mount["name"]], mount["mountPath"])


STARTED = time.monotonic()

if __name__ == "__main__":
    sys.exit(main())
