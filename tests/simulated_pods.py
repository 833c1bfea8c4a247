"""Run a TFJob's pods on this machine the way Kubeflow's training operator
would, or a JobSet's the way its controller would.

    unshare --user --map-root-user --net --mount --fork --kill-child \
        python tests/simulated_pods.py MANIFEST.json WORKDIR \
        [--kill POD [--signal TERM] --when-exists PATH] [--timeout S]

Started inside a fresh user, network and mount namespace (so it needs no
privileges and touches nothing outside), it:

- gives every pod a network namespace of its own, on one bridge, with its
  own address (a restarted pod gets a new one, as on Kubernetes);
- makes each pod's service name (`<job>-<type>-<i>.<namespace>.svc`)
  resolve to the pod's current address, through this namespace's own
  /etc/hosts, as the operator's headless services do through DNS;
- mounts each hostPath volume at its mountPath (over a private /mnt), and
  writes each secret volume's keys as files at its mountPath (under /run);
- starts each container's command and args, with `python` standing for
  this interpreter, and TF_CONFIG in the operator's format
  (kubeflow/training-operator's pkg/controller.v1/tensorflow), so every pod listens on port 2222;
- applies restartPolicy ExitCode: a pod that exits 128-255 (or is killed)
  is recreated, up to runPolicy.backoffLimit times; 1-127 fails the job; the
  job succeeds when the chief (or worker 0 without one) exits 0, and
  cleanPodPolicy Running then deletes the rest (SIGTERM, then SIGKILL).

A JobSet (kind JobSet; a TrainJob's runtime holds one) is run the same way,
with what its controller and Kubernetes' Job controller give instead
(kubernetes-sigs/jobset's pkg/controllers, batch/v1 Job):

- pod `<jobset>-<replicatedJob>-<jobIndex>-<podIndex>`, reachable with
  `network.enableDNSHostnames` as that name `.<subdomain>` (the JobSet's
  name by default), labelled and annotated with the JobSet's name, its
  replicatedJob's, the Job's index and the restart attempt; its env's
  downward-API fields (`fieldRef: metadata.labels['...']`) read from them,
  and JOB_COMPLETION_INDEX in an Indexed Job; no TF_CONFIG;
- a pod that fails is matched against its Job's podFailurePolicy (FailJob,
  Ignore, Count on exit codes); a counted failure past backoffLimit, or
  FailJob, fails the Job, and the JobSet's failurePolicy rules (by the
  Job's failure reason and message, and the replicatedJob) fail the set or
  restart it, up to maxRestarts unless the rule ignores it: every
  pod is deleted (SIGTERM, the pod's grace, SIGKILL) and, once all are
  gone (BlockingRecreate), all are created again at new addresses;
- the set succeeds when the successPolicy's replicatedJobs have completed
  (all their pods exited 0); what still runs is then deleted.

It prints one JSON line per event (pod started, exited, restarted, killed;
the job's end), writes pod logs to WORKDIR/logs/<pod>.log, and exits 0 if
the job succeeded, 1 if not. It never outlives --timeout.
"""

import argparse
import ctypes
import json
import os
import re
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
    """A pod: its name and host name, its pod spec, and what its controller
    adds to the container's env (`env`) and its metadata (`labels`, also
    its annotations: the downward API reads either)."""

    def __init__(self, name: str, host: str, pod_spec: dict, workdir: Path, env: dict, labels: dict = None):
        self.name, self.host = name, host
        self.container = pod_spec["containers"][0]
        self.grace = pod_spec.get("terminationGracePeriodSeconds", GRACE_SECONDS)
        self.env, self.labels = env, dict(labels or {})
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
        env = {
            **os.environ,
            **{e["name"]: self.env_value(e) for e in self.container.get("env", [])},
            **self.env,
            "HOSTNAME": self.name,
            "TMPDIR": str(cwd / "tmp"),
        }  # a container's /tmp is its own (TensorFlow leaves autograph files there when killed)
        log = open(self.workdir / "logs" / f"{self.name}.log", "ab")
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", netns, *command],
            cwd=cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        log.close()
        emit(event="started", pod=self.name, address=address, restarts=self.restarts)

    def env_value(self, variable: dict) -> str:
        """A container env variable's value: given, or the downward API's field of this pod's metadata."""
        if "valueFrom" not in variable:
            return variable["value"]
        path = variable["valueFrom"]["fieldRef"]["fieldPath"]
        field = re.fullmatch(r"metadata\.(?:labels|annotations)\['([^']+)'\]", path)
        if field:
            return self.labels.get(field.group(1), "")
        return {"metadata.name": self.name}[path]

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


class TFJobOperator:
    """Kubeflow's training operator: TF_CONFIG, restartPolicy ExitCode, backoffLimit."""

    def __init__(self, tfjob: dict, workdir: Path, network):
        name, namespace = tfjob["metadata"]["name"], tfjob["metadata"].get("namespace", "default")
        specs = tfjob["spec"]["tfReplicaSpecs"]
        self.backoff_limit = tfjob["spec"].get("runPolicy", {}).get("backoffLimit", 6)
        self.network = network
        cluster = {
            rtype.lower(): [f"{name}-{rtype.lower()}-{i}.{namespace}.svc:{PORT}" for i in range(spec["replicas"])]
            for rtype, spec in specs.items()
        }
        self.pods = []
        for rtype, spec in specs.items():
            for i in range(spec["replicas"]):
                task = {"cluster": cluster, "task": {"type": rtype.lower(), "index": i}, "environment": "cloud"}
                self.pods.append(
                    Pod(
                        f"{name}-{rtype.lower()}-{i}",
                        f"{name}-{rtype.lower()}-{i}.{namespace}.svc",
                        spec["template"]["spec"],
                        workdir,
                        {"TF_CONFIG": json.dumps(task)},
                    )
                )
        self.primary = f"{name}-{'chief' if 'Chief' in specs else 'worker'}-0"
        self.pod_spec = next(iter(specs.values()))["template"]["spec"]
        self.restarts = 0

    def exited(self, pod: Pod, code: int):
        """The job's status once `pod` has exited `code` (None: it goes on)."""
        if code == 0:
            pod.done = 0
            return "Succeeded" if pod.name == self.primary else None
        if 128 <= code <= 255 and self.restarts < self.backoff_limit:
            self.restarts += 1
            time.sleep(1)  # the operator deletes the pod and creates a new one
            self.network.recreate([pod])
            return None
        pod.done = code
        return f"Failed: {pod.name} exited {code}" + (" (past backoffLimit)" if code >= 128 else " (permanent)")


class JobSetController:
    """kubernetes-sigs/jobset's controller over Kubernetes' Job controller (the module's docstring)."""

    def __init__(self, jobset: dict, workdir: Path, network):
        name, spec = jobset["metadata"]["name"], jobset["spec"]
        subdomain = spec.get("network", {}).get("subdomain") or name
        self.network = network
        self.policy = spec.get("failurePolicy", {})
        self.success = spec.get("successPolicy", {"operator": "All"})
        self.pods, self.jobs = [], {}  # jobs: (replicatedJob, job index) -> its Job spec
        for global_index, (rjob, index) in enumerate(
            (r["name"], j) for r in spec["replicatedJobs"] for j in range(r.get("replicas", 1))
        ):
            job = next(r for r in spec["replicatedJobs"] if r["name"] == rjob)["template"]["spec"]
            self.jobs[(rjob, index)] = dict(job, failed=0)
            for pod_index in range(job.get("parallelism", 1)):
                labels = {
                    "jobset.sigs.k8s.io/jobset-name": name,
                    "jobset.sigs.k8s.io/replicatedjob-name": rjob,
                    "jobset.sigs.k8s.io/job-index": str(index),
                    "jobset.sigs.k8s.io/job-global-index": str(global_index),
                    "jobset.sigs.k8s.io/restart-attempt": "0",
                    "batch.kubernetes.io/job-completion-index": str(pod_index),
                }
                env = {"JOB_COMPLETION_INDEX": str(pod_index)} if job.get("completionMode") == "Indexed" else {}
                pod = Pod(
                    f"{name}-{rjob}-{index}-{pod_index}",
                    f"{name}-{rjob}-{index}-{pod_index}.{subdomain}",
                    job["template"]["spec"],
                    workdir,
                    env,
                    labels,
                )
                pod.job = (rjob, index)
                self.pods.append(pod)
        self.pod_spec = spec["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]  # its volumes are every pod's
        self.restarts = self.counted_restarts = (
            0  # every restart (the pods' restart-attempt), and those toward maxRestarts
        )

    def exited(self, pod: Pod, code: int):
        job = self.jobs[pod.job]
        if code == 0:
            pod.done = 0
            targets = self.success.get("targetReplicatedJobs") or list({rjob for rjob, _ in self.jobs})
            complete = [all(p.done == 0 for p in self.pods if p.job[0] == rjob) for rjob in targets]
            return "Succeeded" if (all if self.success["operator"] == "All" else any)(complete) else None
        action, index = _pod_failure_action(job.get("podFailurePolicy", {}), pod.container["name"], code)
        message = ""
        if action == "Ignore":
            self.network.recreate([pod])
            return None
        if action == "FailJob":
            reason = "PodFailurePolicy"
            # Kubernetes' Job controller's message for it (pkg/controller/job/pod_failure_policy.go)
            message = (
                f"Container {pod.container['name']} for pod default/{pod.name} failed with exit code {code} matching "
                f"FailJob rule at index {index}"
            )
        else:
            job["failed"] += 1
            if job["failed"] <= job.get("backoffLimit", 6):
                self.network.recreate([pod])
                return None
            reason = "BackoffLimitExceeded"
        rule = next(
            (
                r
                for r in self.policy.get("rules", [])
                if reason in (r.get("onJobFailureReasons") or [reason])
                and (
                    not r.get("onJobFailureMessagePatterns")
                    or any(re.search(m, message) for m in r["onJobFailureMessagePatterns"])
                )
                and pod.job[0] in (r.get("targetReplicatedJobs") or [pod.job[0]])
            ),
            {"action": "RestartJobSet", "name": "default"},
        )
        emit(
            event="job failed",
            job=f"{pod.job[0]}-{pod.job[1]}",
            reason=reason,
            rule=rule["name"],
            action=rule["action"],
        )
        if rule["action"] == "FailJobSet":
            return f"Failed: {pod.name} exited {code}: {reason}, rule {rule['name']}"
        counted = "IgnoreMaxRestarts" not in rule["action"]
        if counted and self.counted_restarts >= self.policy.get("maxRestarts", 0):
            return f"Failed: {pod.name} exited {code}: past maxRestarts"
        self.counted_restarts += counted
        self.restarts += 1
        self.network.delete(self.pods)  # every Job and its pods, all gone before any is created again
        for each in self.pods:
            each.labels["jobset.sigs.k8s.io/restart-attempt"] = str(self.restarts)
            each.done = None
        for counted in self.jobs.values():
            counted["failed"] = 0
        emit(event="restarted", attempt=self.restarts)
        self.network.recreate(self.pods)
        return None


def _pod_failure_action(policy: dict, container: str, code: int) -> str:
    """The first podFailurePolicy rule that matches the exit code: its action and index (Count without one)."""
    for index, rule in enumerate(policy.get("rules", [])):
        on = rule.get("onExitCodes")
        if (
            on
            and on.get("containerName", container) == container
            and (code in on["values"]) == (on["operator"] == "In")
        ):
            return rule["action"], index
    return "Count", None


class Network:
    """The pods' addresses and names: a new address for every pod created, /etc/hosts rewritten."""

    def __init__(self, hosts: Path):
        self.hosts = hosts
        self.addresses = (f"{SUBNET}.{n // 250}.{n % 250 + 2}" for n in range(10**4))
        self.pods = []

    def recreate(self, pods) -> None:
        for pod in pods:
            if pod not in self.pods:
                self.pods.append(pod)
            if pod.proc:
                pod.restarts += 1
            pod.address = next(self.addresses)
        write_hosts(self.hosts, self.pods)
        for pod in pods:
            pod.start()

    def delete(self, pods) -> None:
        """SIGTERM, the pod's grace, SIGKILL; each exit is an event of its own (not a failure)."""
        for pod in pods:
            pod.signal(signal.SIGTERM)
        deleted = time.monotonic()
        for pod in pods:
            if pod.proc is None:
                continue
            while pod.proc.poll() is None and time.monotonic() < deleted + pod.grace:
                time.sleep(0.1)
            pod.signal(signal.SIGKILL)
            pod.proc.wait()
            if pod.done is None:
                emit(event="deleted", pod=pod.name, code=exit_code(pod.proc.returncode))
                pod.done = "deleted"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("manifest")
    parser.add_argument("workdir")
    parser.add_argument("--kill", help="pod name to signal once, when --when-exists appears with content")
    parser.add_argument("--signal", default="KILL", help="KILL (a lost pod) or TERM (a pod evicted: preemption)")
    parser.add_argument("--when-exists")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--secrets", help="a JSON list of the Secrets the pods' secret volumes mount")
    args = parser.parse_args()
    manifest = json.loads(Path(args.manifest).read_text())
    workdir = Path(args.workdir)
    (workdir / "logs").mkdir(parents=True, exist_ok=True)

    # The pod network: one bridge, no way out of this namespace.
    sh("ip", "link", "set", "lo", "up")
    sh("ip", "link", "add", "br0", "type", "bridge")
    sh("ip", "link", "set", "br0", "up")
    sh("mount", "-t", "tmpfs", "tmpfs", "/run")  # for `ip netns` (/run/netns), private to this namespace
    hosts = workdir / "hosts"
    hosts.write_text("")
    sh("mount", "--bind", str(hosts), "/etc/hosts")
    network = Network(hosts)
    controller = (JobSetController if manifest["kind"] == "JobSet" else TFJobOperator)(manifest, workdir, network)
    _mount_volumes(controller.pod_spec, json.loads(Path(args.secrets).read_text()) if args.secrets else [])
    network.recreate(controller.pods)

    killed, status = False, None
    deadline = time.monotonic() + args.timeout
    while status is None:
        time.sleep(0.2)
        if args.kill and not killed and args.when_exists and _has_content(Path(args.when_exists)):
            victim = next(p for p in controller.pods if p.name == args.kill)
            victim.signal(getattr(signal, f"SIG{args.signal}"))
            killed = True
            emit(event="killed", pod=victim.name, signal=args.signal)
        for pod in controller.pods:
            if status is not None or pod.done is not None or pod.proc.poll() is None:
                continue
            code = exit_code(pod.proc.returncode)
            emit(event="exited", pod=pod.name, code=code)
            status = controller.exited(pod, code)
        if status is None and time.monotonic() > deadline:
            status = f"Failed: timeout after {args.timeout:g}s"
    # What still runs is deleted (a TFJob's cleanPodPolicy Running; a finished JobSet's active Jobs).
    network.delete(controller.pods)
    emit(event="job", status=status, restarts=controller.restarts)
    return 0 if status == "Succeeded" else 1


def _mount_volumes(pod_spec: dict, secrets: list) -> None:
    """hostPath volumes at their mountPath, under a private tmpfs at the mount path's top directory; a secret
    volume's keys as files at its mountPath (under /var/run, this namespace's private tmpfs /run), its mode."""
    sources = {v["name"]: v["hostPath"]["path"] for v in pod_spec.get("volumes", []) if "hostPath" in v}
    by_name = {s["metadata"]["name"]: {**s.get("stringData", {})} for s in secrets}
    secret_volumes = {v["name"]: v["secret"] for v in pod_spec.get("volumes", []) if "secret" in v}
    tops = set()
    for mount in pod_spec["containers"][0].get("volumeMounts", []):
        if mount["name"] in secret_volumes:
            volume = secret_volumes[mount["name"]]
            where = os.path.realpath(mount["mountPath"])
            assert where.startswith("/run/"), f"a secret mounted outside /run here: {where}"
            os.makedirs(where, exist_ok=True)
            for key, value in by_name[volume["secretName"]].items():
                Path(where, key).write_text(value)
                os.chmod(Path(where, key), volume.get("defaultMode", 0o644))
            continue
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
