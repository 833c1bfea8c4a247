"""`tfdistx export tfjob [overrides]`: a Kubeflow TFJob for the composed config.

Every pod runs `python -m tfdistx` with the same overrides, so it composes
the config this command composed and checked; Kubeflow's training operator
gives each pod its TF_CONFIG, which places it (`cluster.launch=tf_config`).
The replica types and counts come from the strategy table, like a local
cluster's tasks. No TensorFlow here.

Restarts: the operator's `restartPolicy: ExitCode` retries exit codes
128-255 and treats 1-127 as permanent. tfdistx's codes that a restart can
cure (RETRYABLE in spec/errors.py: preempted, the cluster did not form, a
lost peer, ...) are below 128, so the pods run with
`cluster.retryable_exit_offset=128`, which moves just those above 127; the
others (PERMANENT there: a bad config, a full disk, ...) stay permanent.
OnFailure would also retry a bad config, forever.
"""

import math
import re
from typing import Dict, List, Optional, Sequence

from tfdistx.cluster.evaluator import EVALUATOR
from tfdistx.spec import data_service
from tfdistx.spec.overrides import given_value
from tfdistx.spec.paths import CONFIG_PATH_ENV
from tfdistx.spec.errors import RETRYABLE_EXIT_OFFSET_FOR_KUBERNETES, ConfigError
from tfdistx.spec.run_spec import Layout

API_VERSION = "kubeflow.org/v1"
LAUNCH = "tf_config"  # the pods' cluster.launch: the operator's TF_CONFIG places each
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


def tfjob(
    layout: Layout,
    overrides: List[str],
    name: str,
    image: str,
    namespace: str = "default",
    volume: Optional[str] = None,
    mount_path: str = DEFAULT_MOUNT_PATH,
    gpus: bool = False,
    config_dirs: Sequence[str] = (),
    config_path: Optional[str] = None,
) -> Dict:
    """The TFJob (as a dict) whose pods run the run laid out as `layout`, composed from `overrides`
    and the user's config dirs: `config_dirs` given as `--config-dir`, and
    `config_path` the TFDISTX_CONFIG_PATH, both as the user gave them (each
    pod composes with them, read in its own file system)."""
    pods = Pods(layout, "a TFJob", overrides, name, image, volume, mount_path, gpus, config_dirs, config_path)
    # Exit codes a restart can cure move above 127, where restartPolicy ExitCode retries them.
    args = pods.args(LAUNCH, RETRYABLE_EXIT_OFFSET_FOR_KUBERNETES)
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
        "metadata": {"name": name, "namespace": namespace, "labels": dict(CREATED_BY)},
        "spec": {
            # backoffLimit: pod restarts before the job is failed, as cluster.max_restarts bounds the local launcher's.
            # cleanPodPolicy Running: the ps tasks and workers a coordinator used are deleted when it is done.
            "runPolicy": {"backoffLimit": pods.max_restarts, "cleanPodPolicy": "Running"},
            "tfReplicaSpecs": replica_specs,
        },
    }


class Pods:
    """What every pod of a run has, whichever kind of manifest holds it (a
    TFJob here, a JobSet or TrainJob in jobset_manifest.py): its tasks per
    job, its command and args, environment, volume and grace period."""

    def __init__(
        self,
        layout: Layout,
        kind: str,
        overrides: List[str],
        name: str,
        image: str,
        volume: Optional[str],
        mount_path: str,
        gpus: bool,
        config_dirs: Sequence[str],
        config_path: Optional[str],
    ):
        topo, facts = layout.cluster, layout.strategy.facts
        if facts.not_in_tfjob:
            raise ConfigError.one(
                "strategy", layout.strategy.name, f"cannot be exported as {kind}: {facts.not_in_tfjob}"
            )
        counts = layout.training_jobs()  # a one-process strategy: one pod
        if topo.evaluator:  # the sidecar evaluator's pod: its task type is "evaluator"
            counts = {**counts, EVALUATOR: 1}
        service = layout.service_jobs()
        self.max_restarts = topo.max_restarts
        self.counts: Dict[str, int] = {**counts, **service}
        self.primary_jobs = facts.primary_jobs  # the jobs whose end is the run's end
        self.placed = needs_placing(layout)
        self.overrides, self.image, self.volume, self.mount_path, self.gpus = (
            list(overrides),
            image,
            volume,
            mount_path,
            gpus,
        )
        self.run_dir = f"{mount_path}/{name}" if volume else None
        self.config_dirs = list(config_dirs)
        self.env = [{"name": "PYTHONUNBUFFERED", "value": "1"}]  # kubectl logs shows each line as it is written
        if config_path:
            self.env.append({"name": CONFIG_PATH_ENV, "value": config_path})
        self.gpus_per_worker = int(topo.devices_per_worker or 1)
        # Between the SIGTERM of a deletion (eviction, preemption) and SIGKILL: the trainers checkpoint in it,
        # the servers wait for them (Kubernetes' default, 30 s, is shorter than cluster.preemption_grace's).
        self.grace = math.ceil(topo.preemption_grace)

    def args(self, launch: str, exit_offset: int = 0) -> List[str]:
        """The container's args: the config dirs, then pod_args."""
        return [arg for directory in self.config_dirs for arg in ("--config-dir", directory)] + pod_args(
            self.overrides, launch if self.placed else None, self.run_dir, exit_offset
        )

    def container(
        self, name: str, job: str, args: List[str], env: Sequence[Dict] = (), ports: Sequence[Dict] = ()
    ) -> Dict:
        container = {
            "name": name,
            "image": self.image,
            "command": ["python", "-m", "tfdistx"],
            "args": list(args),  # a list of its own per container: YAML would print shared ones as anchors
            "env": [dict(variable) for variable in [*self.env, *env]],  # objects of their own per container, as args
            "ports": [dict(port) for port in ports],
        }
        if self.gpus and job == "worker":  # a parameter-server cluster's coordinator and ps tasks run no steps
            container["resources"] = self.resources()
        if self.volume:
            container["volumeMounts"] = [{"name": VOLUME_NAME, "mountPath": self.mount_path}]
        return container

    def resources(self) -> Dict:
        return {"limits": {"nvidia.com/gpu": self.gpus_per_worker}}

    def spec(self, container: Dict, **more) -> Dict:
        """The pod spec around `container` (`more`: keys of the kind's own)."""
        pod = {"containers": [container], **more, "terminationGracePeriodSeconds": self.grace}
        if self.volume:
            pod["volumes"] = [{"name": VOLUME_NAME, **volume_source(self.volume)}]
        return pod


def needs_placing(layout: Layout) -> bool:
    """Whether the pods learn their place (a cluster.launch of their own): a one-process strategy without the
    tf.data service is one pod that needs no placing."""
    return layout.strategy.facts.multi_process or bool(layout.service_jobs())


def pod_args(overrides: List[str], launch: Optional[str], run_dir: Optional[str], exit_offset: int = 0) -> List[str]:
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
        raise ConfigError.one(
            option,
            image,
            "an OCI image reference, [REGISTRY[:PORT]/]REPOSITORY[:TAG][@DIGEST] "
            "(lowercase repository; e.g. registry.example.com/tfdistx:0.1)",
        )


def check_mount_path(option: str, path: str) -> str:
    """An absolute path the pods' hydra.run.dir can carry as it is; returned without a trailing '/'."""
    if not path.startswith("/"):
        raise ConfigError.one(option, path, "must be an absolute path")
    if not _MOUNT_PATH.fullmatch(path):
        raise ConfigError.one(
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
        raise ConfigError.one(
            "--volume",
            spec,
            "a claim's name: lowercase letters, digits, '-' and '.', starting and ending "
            "with a letter or digit, at most 253 characters",
        )
    if kind == "pvc" and value:
        return {"persistentVolumeClaim": {"claimName": value}}
    if kind == "hostPath" and value.startswith("/"):
        return {"hostPath": {"path": value, "type": "DirectoryOrCreate"}}
    raise ConfigError.one("--volume", spec, "allowed: pvc:CLAIM_NAME (or CLAIM_NAME) or hostPath:/ABSOLUTE/PATH")
