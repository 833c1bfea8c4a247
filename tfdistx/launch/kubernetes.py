"""What every pod of a run's Kubernetes manifests has (`Pods`, from the
Layout and one record of the user's `PodOptions`), and the TFJob
(`tfdistx job tfjob`); the JobSet and the TrainJob are launch/jobset.py's.

Every pod runs `python -m tfdistx` with the same overrides, so it composes
the config the command composed and checked; Kubeflow's training operator
gives each pod of a TFJob its TF_CONFIG, which places it
(`cluster.launch=tf_config`). The replica types and counts come from the
strategy table, like a local cluster's tasks. No TensorFlow here.

Restarts: the operator's `restartPolicy: ExitCode` retries exit codes
128-255 and treats 1-127 as permanent. tfdistx's codes that a restart can
cure (RETRYABLE in core/errors.py: preempted, the cluster did not form, a
lost peer, ...) are below 128, so the pods run with
`cluster.retryable_exit_offset=128`, which moves just those above 127; the
others (PERMANENT there: a bad config, a full disk, ...) stay permanent.
OnFailure would also retry a bad config, forever.
"""

import math
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from tfdistx.cluster.evaluator import EVALUATOR
from tfdistx.core import data_service
from tfdistx.core.overrides import given_value
from tfdistx.core.paths import CONFIG_PATH_ENV
from tfdistx.core.errors import RETRYABLE_EXIT_OFFSET_FOR_KUBERNETES, ConfigError
from tfdistx.core.launch_mode import LaunchMode
from tfdistx.core.run_spec import Layout

API_VERSION = "kubeflow.org/v1"
PORT = 2222  # the operator's default, taken from the container port named tfjob-port
CONTAINER = "tensorflow"  # the operator's default container name
REPLICA_TYPES = {
    "chief": "Chief",
    "ps": "PS",
    "worker": "Worker",
    EVALUATOR: "Evaluator",
}  # TF_CONFIG job -> TFJob replica type
# data.service's tasks: the operator puts them in TF_CONFIG as
# `dispatcher` and `dataworker` (cluster/data_service.py takes them out)
REPLICA_TYPES.update({data_service.DISPATCHER: "Dispatcher", data_service.WORKER: "DataWorker"})
VOLUME_NAME = "tfdistx-runs"
DEFAULT_MOUNT_PATH = "/mnt/tfdistx"
# The operator names services <job>-<replica type>-<index>: the longest, "-worker-NNN", must stay a DNS label.
MAX_NAME = 63 - len("-worker-999")
CREATED_BY = {"app.kubernetes.io/created-by": "tfdistx"}
_DNS_SUBDOMAIN = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)  # a claim's name (RFC 1123)
# An OCI image reference, as the container runtimes parse it (distribution/reference's grammar, v0.5:
# name [":" tag] ["@" digest], the name [domain[:port] "/"] path-component ["/" path-component]*). Written out here:
# no maintained Python package parses it, and a pod with any other image never starts.
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = (
    r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[0-9a-fA-F:]+\])"
)
_IMAGE = re.compile(
    rf"(?P<name>(?:{_DOMAIN}(?::[0-9]+)?/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    r"(?::[\w][\w.-]{0,127})?"  # tag
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?",  # digest
    re.ASCII,
)
IMAGE_NAME_MAX = 255  # distribution/reference's NameTotalLengthMax
# What --mount-path may hold: it becomes the pods' hydra.run.dir override, which Hydra parses (a space, a quote,
# `,`, `$`, brackets mean something there), besides the volume's mountPath.
_MOUNT_PATH = re.compile(r"/[A-Za-z0-9._/-]*", re.ASCII)


@dataclass(frozen=True)
class PodOptions:
    """What the user says of a run's pods, whichever manifest holds them (`tfdistx job tfjob|jobset|trainjob`)."""

    overrides: Tuple[str, ...]  # the run's, as every pod composes them
    name: str  # the manifest's; also the run dir's on the volume
    image: str
    namespace: str = "default"
    volume: Optional[str] = None  # pvc:CLAIM or hostPath:/PATH (volume_source); None: each pod's own run dir
    mount_path: str = DEFAULT_MOUNT_PATH
    gpus: bool = False  # each training pod asks for cluster.devices_per_worker GPUs
    # The user's config dirs, as given (`--config-dir`, and TFDISTX_CONFIG_PATH): each pod composes with them, read
    # in its own file system.
    config_dirs: Tuple[str, ...] = ()
    config_path: Optional[str] = None
    # Between the SIGTERM of a deletion (eviction, preemption) and SIGKILL (terminationGracePeriodSeconds); None:
    # cluster.preemption_grace, in whole seconds.
    grace_seconds: Optional[int] = None


def tfjob(layout: Layout, options: PodOptions) -> Dict:
    """The TFJob (as a dict) whose pods run the run laid out as `layout`."""
    pods = Pods(layout, "a TFJob", options)
    # Exit codes a restart can cure move above 127, where restartPolicy ExitCode retries them.
    args = pods.args(LaunchMode.TF_CONFIG, RETRYABLE_EXIT_OFFSET_FOR_KUBERNETES)
    replica_specs = {}
    for job, replicas in pods.counts.items():
        container = pods.container(CONTAINER, job, args, ports=[{"name": "tfjob-port", "containerPort": PORT}])
        replica_specs[REPLICA_TYPES[job]] = {
            "replicas": replicas,
            "restartPolicy": "ExitCode",
            "template": {"spec": pods.spec(container)},
        }
    return {
        "apiVersion": API_VERSION,
        "kind": "TFJob",
        "metadata": {"name": options.name, "namespace": options.namespace, "labels": dict(CREATED_BY)},
        "spec": {
            # backoffLimit: pod restarts before the job is failed, as cluster.max_restarts bounds the local launcher's.
            # cleanPodPolicy Running: the ps tasks and workers a coordinator used are deleted when it is done.
            "runPolicy": {"backoffLimit": pods.max_restarts, "cleanPodPolicy": "Running"},
            "tfReplicaSpecs": replica_specs,
        },
    }


class Pods:
    """What every pod of a run has, whichever kind of manifest holds it (a
    TFJob here, a JobSet or TrainJob in jobset.py): its tasks per
    job, its command and args, environment, volume and grace period."""

    def __init__(self, layout: Layout, kind: str, options: PodOptions):
        topo, row = layout.cluster, layout.strategy.row
        if row.not_in_tfjob:
            raise ConfigError.for_key(
                "strategy", layout.strategy.name, f"cannot be exported as {kind}: {row.not_in_tfjob}"
            )
        counts = layout.training_jobs()  # a one-process strategy: one pod
        if topo.evaluator:  # the sidecar evaluator's pod: its task type is "evaluator"
            counts = {**counts, EVALUATOR: 1}
        service = layout.service_jobs()
        self.max_restarts = topo.max_restarts
        self.counts: Dict[str, int] = {**counts, **service}
        self.primary_jobs = row.primary_jobs  # the jobs whose end is the run's end
        self.placed = needs_placing(layout)
        self.options = options
        self.run_dir = f"{options.mount_path}/{options.name}" if options.volume else None
        self.env = [{"name": "PYTHONUNBUFFERED", "value": "1"}]  # kubectl logs shows each line as it is written
        if options.config_path:
            self.env.append({"name": CONFIG_PATH_ENV, "value": options.config_path})
        self.gpus_per_worker = int(topo.devices_per_worker or 1)
        # Between the SIGTERM of a deletion (eviction, preemption) and SIGKILL: the trainers checkpoint in it,
        # the servers wait for them (Kubernetes' default, 30 s, is shorter than cluster.preemption_grace's).
        self.grace = options.grace_seconds if options.grace_seconds is not None else math.ceil(topo.preemption_grace)

    def args(self, launch: LaunchMode, exit_offset: int = 0) -> List[str]:
        """The container's args: the config dirs, then pod_args."""
        return [arg for directory in self.options.config_dirs for arg in ("--config-dir", directory)] + pod_args(
            self.options.overrides, launch if self.placed else None, self.run_dir, exit_offset
        )

    def container(
        self, name: str, job: str, args: List[str], env: Sequence[Dict] = (), ports: Sequence[Dict] = ()
    ) -> Dict:
        container = {
            "name": name,
            "image": self.options.image,
            "command": ["python", "-m", "tfdistx"],
            "args": list(args),  # a list of its own per container: YAML would print shared ones as anchors
            "env": [dict(variable) for variable in [*self.env, *env]],  # objects of their own per container, as args
            "ports": [dict(port) for port in ports],
        }
        if self.options.gpus and job == "worker":  # a parameter-server cluster's coordinator and ps tasks run no steps
            container["resources"] = self.resources()
        if self.options.volume:
            container["volumeMounts"] = [{"name": VOLUME_NAME, "mountPath": self.options.mount_path}]
        return container

    def resources(self) -> Dict:
        return {"limits": {"nvidia.com/gpu": self.gpus_per_worker}}

    def spec(self, container: Dict, **more) -> Dict:
        """The pod spec around `container` (`more`: keys of the kind's own)."""
        pod = {"containers": [container], **more, "terminationGracePeriodSeconds": self.grace}
        if self.options.volume:
            pod["volumes"] = [{"name": VOLUME_NAME, **volume_source(self.options.volume)}]
        return pod


def needs_placing(layout: Layout) -> bool:
    """Whether the pods learn their place (a cluster.launch of their own): a one-process strategy without the
    tf.data service is one pod that needs no placing."""
    return layout.strategy.row.multi_process or bool(layout.service_jobs())


def pod_args(
    overrides: Sequence[str], launch: Optional[LaunchMode], run_dir: Optional[str], exit_offset: int = 0
) -> List[str]:
    """The pod's overrides: the user's, then what placing it needs: how it
    learns its place (`launch`; None: a one-process run, nothing to place),
    the exit-code offset its restart policy wants, the run dir on the volume."""
    args = list(overrides)
    if launch:
        args.append(
            f"cluster.launch={launch}"
        )  # a pod that was not placed says so, instead of launching a local cluster
    if exit_offset:
        args.append(f"cluster.retryable_exit_offset={exit_offset}")
    if run_dir and given_value("hydra.run.dir", overrides) is None:
        args.append(f"hydra.run.dir={run_dir}")  # one run dir on the shared volume: a restarted pod resumes from it
    return args


def check_image(option: str, image: str) -> None:
    """An image reference a container runtime can pull, else ConfigError naming `option`."""
    m = _IMAGE.fullmatch(image)
    if not m or len(m["name"]) > IMAGE_NAME_MAX:
        raise ConfigError.for_key(
            option,
            image,
            "an OCI image reference, [REGISTRY[:PORT]/]REPOSITORY[:TAG][@DIGEST] "
            "(lowercase repository; e.g. registry.example.com/tfdistx:0.1)",
        )


def check_mount_path(option: str, path: str) -> str:
    """An absolute path the pods' hydra.run.dir can carry as it is; returned without a trailing '/'."""
    if not path.startswith("/"):
        raise ConfigError.for_key(option, path, "must be an absolute path")
    if not _MOUNT_PATH.fullmatch(path):
        raise ConfigError.for_key(
            option,
            path,
            "an absolute path of letters, digits, '.', '_', '-' and '/' "
            "(it is the pods' hydra.run.dir, which Hydra parses)",
        )
    return path.rstrip("/") or "/"


def volume_source(spec: str) -> Dict:
    """`pvc:CLAIM` (or just CLAIM) or `hostPath:/PATH` -> the pod volume's source."""
    kind, _, value = spec.partition(":") if ":" in spec else ("pvc", "", spec)
    if (
        kind == "pvc" and value and not (_DNS_SUBDOMAIN.fullmatch(value) and len(value) <= 253)
    ):  # else no pod would start
        raise ConfigError.for_key(
            "--volume",
            spec,
            "a claim's name: lowercase letters, digits, '-' and '.', starting and ending "
            "with a letter or digit, at most 253 characters",
        )
    if kind == "pvc" and value:
        return {"persistentVolumeClaim": {"claimName": value}}
    if kind == "hostPath" and value.startswith("/"):
        return {"hostPath": {"path": value, "type": "DirectoryOrCreate"}}
    raise ConfigError.for_key("--volume", spec, "allowed: pvc:CLAIM_NAME (or CLAIM_NAME) or hostPath:/ABSOLUTE/PATH")
