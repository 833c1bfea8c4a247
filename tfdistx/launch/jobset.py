"""`tfdistx export jobset|trainjob [overrides]`: a JobSet (kubernetes-sigs/jobset),
or a Kubeflow Trainer v2 TrainJob with the ClusterTrainingRuntime it names,
for the composed config.

Neither writes TF_CONFIG: each pod runs `python -m tfdistx` with
`cluster.launch=jobset` and builds it from its JobSet labels and the
config's own counts (launch/jobset.py). One replicatedJob per task type
(chief, ps, worker, evaluator, dispatcher, dataworker), each one Indexed
Job with a pod per task; a TrainJob's runtime holds the same JobSet, since
Trainer v2 runs every TrainJob as one (and, having no TensorFlow runtime,
needs tfdistx's). No TensorFlow here.

Restarts: a pod that fails with a code no restart can cure (PERMANENT in
spec/errors.py, the codes the local launcher never restarts either)
fails its Job through the Job's podFailurePolicy, and the JobSet's
failurePolicy then fails the whole set; a preempted pod (exit 42, after
its checkpoint) restarts the set without counting toward maxRestarts
(RestartJobSetAndIgnoreMaxRestarts, matched on the Job's failure message);
any other failure (the cluster did not form, a lost peer, a pod killed)
fails its Job (backoffLimit 0) and the JobSet restarts every Job, up to
cluster.max_restarts times: a multi-worker cluster only resumes together,
from the checkpoint on the volume. So no exit-code offset: the codes are
listed as they are. The sidecar evaluator's pod restarts alone, in place:
its failures never reach the set's rules.

With `cluster.launch=agent` the JobSet runs an agent in each of MAX pods
(launch/agent/node.py) and the agents, not the JobSet, handle a lost pod: the
Job recreates it (an eviction or a drained node does not count toward its
backoffLimit) and its agent joins the next round, while the others go on
with MIN or more. Only a code no restart can cure fails the set; the run is
done when the keeper's pod (index 0) is. Its agents prove the run's secret
at every beat (launch/agent/run_secret.py): a Kubernetes Secret written beside
the JobSet (rendezvous_secret, a new one each export), mounted read-only in
every pod. And every JobSet comes with a NetworkPolicy (network_policy)
that admits its pods' traffic from its own pods only.
"""

import secrets
from typing import Dict, List, Optional, Sequence

from tfdistx.launch import jobset_placement as jobset
from tfdistx.launch.kubernetes import CREATED_BY, DEFAULT_MOUNT_PATH, Pods
from tfdistx.cluster.evaluator import EVALUATOR
from tfdistx.spec.errors import EXIT_PREEMPTED, PERMANENT
from tfdistx.spec.run_spec import Layout

JOBSET_API = "jobset.x-k8s.io/v1alpha2"
TRAINER_API = "trainer.kubeflow.org/v1alpha1"
CONTAINER = "tensorflow"
TRAINER_CONTAINER = "node"  # the container Trainer v2 gives the TrainJob's image, args and resources
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"  # Trainer v2's label for the replicatedJob that trains
MAX_NAME = jobset.LONGEST_NAME  # its pods' hostnames are built from the name
LAUNCH = "jobset"  # the pods' cluster.launch: each places itself by its JobSet labels (launch/jobset.py)


def jobset_manifest(
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
    """The JobSet (as a dict) whose pods run `layout` (arguments as kubernetes.tfjob's)."""
    if layout.cluster.agent is not None:  # the pods say where they meet and what they prove, not the user's stand-in
        placed_here = ("cluster.launch", "cluster.agent.store", "cluster.agent.token_file")
        overrides = [o for o in overrides if o.lstrip("+").partition("=")[0] not in placed_here]
    pods = Pods(layout, "a JobSet", overrides, name, image, volume, mount_path, gpus, config_dirs, config_path)
    spec = _agents_jobset_spec(pods, name) if layout.cluster.agent is not None else _jobset_spec(pods, CONTAINER)
    return {"apiVersion": JOBSET_API, "kind": "JobSet", "metadata": _metadata(name, namespace), "spec": spec}


def jobset_and_network_policy(
    layout: Layout, overrides: List[str], name: str, image: str, namespace: str = "default", *more, **keywords
) -> List[Dict]:
    """`tfdistx export jobset`: the JobSet (arguments as jobset_manifest's), the NetworkPolicy that keeps others
    out of its pods, and under agents the Secret their beats prove."""
    return [
        jobset_manifest(layout, overrides, name, image, namespace, *more, **keywords),
        network_policy(name, namespace),
        *([rendezvous_secret(name, namespace)] if layout.cluster.agent is not None else []),
    ]


# The agents' secret: a Secret of the export's own, mounted read-only where each agent reads it.
SECRET_KEY = "token"
SECRET_VOLUME = "rendezvous-secret"
SECRET_MOUNT_PATH = "/var/run/secrets/tfdistx"


def secret_name(name: str) -> str:
    return f"{name}-rendezvous"


def rendezvous_secret(name: str, namespace: str) -> Dict:
    """The run's secret, which every agent's beat proves (launch/agent/keeper_wire.py): 256 random bits, new at each
    export. Whoever reads this manifest holds it: it is printed for `kubectl apply`, not kept anywhere else."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            **_metadata(secret_name(name), namespace),
            "annotations": {"tfdistx/what": "the agents' rendezvous secret: every beat proves it (docs/elastic.md)"},
        },
        "type": "Opaque",
        "stringData": {SECRET_KEY: secrets.token_hex(32)},
    }


def network_policy(name: str, namespace: str) -> Dict:
    """Traffic into the JobSet's pods only from the same JobSet's pods.
    TensorFlow's gRPC servers, the tf.data service and the agents' rendezvous
    have no authentication: anyone who reaches a task's port can run
    operations in it. Every port, since an agent's worker listens on a free
    one; egress left open (the dataset downloads, W&B). It takes effect where
    the cluster's network plugin enforces NetworkPolicy."""

    def own() -> Dict:  # a dict each time: YAML would print a shared one as an anchor
        return {"matchLabels": {jobset.NAME_LABEL: name}}

    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(f"{name}-tasks", namespace),
        "spec": {"podSelector": own(), "policyTypes": ["Ingress"], "ingress": [{"from": [{"podSelector": own()}]}]},
    }


def trainjob_manifests(
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
) -> List[Dict]:
    """[the ClusterTrainingRuntime, the TrainJob naming it]. The runtime is
    this run's shape (its task types and counts) with the image and args in
    every task type; the TrainJob sets the trainer step's image, args,
    numNodes and resources, which Trainer v2 lets a TrainJob override."""
    pods = Pods(layout, "a TrainJob", overrides, name, image, volume, mount_path, gpus, config_dirs, config_path)
    spec = _jobset_spec(pods, TRAINER_CONTAINER)
    trainer_step = next(job for job in spec["replicatedJobs"] if job["name"] == "worker")
    trainer_step["template"]["metadata"] = {"labels": {ANCESTOR: "trainer"}}  # the Job Trainer v2 sizes with numNodes
    workers = pods.counts["worker"]
    runtime_name = f"tfdistx-{name}"
    runtime = {
        "apiVersion": TRAINER_API,
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": runtime_name, "labels": {**CREATED_BY, "trainer.kubeflow.org/framework": "tensorflow"}},
        # numNodes and no framework policy: Trainer v2 has none for TensorFlow, and the pods need none
        "spec": {"mlPolicy": {"numNodes": workers}, "template": {"spec": spec}},
    }
    container = trainer_step["template"]["spec"]["template"]["spec"]["containers"][0]
    trainer = {
        "image": image,
        "command": list(container["command"]),
        "args": list(container["args"]),
        "numNodes": workers,
    }
    if gpus:
        trainer["resourcesPerNode"] = pods.resources()
    trainjob = {
        "apiVersion": TRAINER_API,
        "kind": "TrainJob",
        "metadata": _metadata(name, namespace),
        "spec": {
            "runtimeRef": {"name": runtime_name, "kind": "ClusterTrainingRuntime", "apiGroup": "trainer.kubeflow.org"},
            "trainer": trainer,
        },
    }
    return [runtime, trainjob]


def _metadata(name: str, namespace: str) -> Dict:
    return {"name": name, "namespace": namespace, "labels": dict(CREATED_BY)}


# A Job's failure message for a pod that matched its podFailurePolicy's FailJob rule at this index (Kubernetes'
# Job controller: "Container C for pod NS/P failed with exit code N matching FailJob rule at index I").
PREEMPTED_RULE = 1
# The JobSet's rule names: its webhook admits only ^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$.
PREEMPTED, PERMANENT_EXIT, RESTART_AND_RESUME = "preempted", "permanent_exit", "restart_and_resume"
# The sidecar evaluator never fails or restarts the training: its Job restarts its pod in place, without end.
EVALUATOR_BACKOFF_LIMIT = 2**31 - 1


def _jobset_spec(pods: Pods, container_name: str) -> Dict:
    args = pods.args(LAUNCH)
    replicated = []
    for job, n in pods.counts.items():
        container = pods.container(
            container_name, job, args, env=_labels_as_env(), ports=[{"name": "tfdistx", "containerPort": jobset.PORT}]
        )
        replicated.append(
            {
                "name": job,
                "replicas": 1,
                "template": {
                    "spec": {
                        "completionMode": "Indexed",
                        "completions": n,
                        "parallelism": n,
                        **(
                            _evaluator_job(pods, container)
                            if job == EVALUATOR
                            else _training_job(pods, container, container_name)
                        ),
                    }
                },
            }
        )
    training = [job for job in pods.counts if job != EVALUATOR]
    primary = [job for job in pods.primary_jobs if job in pods.counts] or ["worker"]
    return {
        "network": {"enableDNSHostnames": True},  # <name>-<job>-0-<i>.<name>: the addresses launch/jobset.py derives
        # BlockingRecreate: every pod of an attempt is gone before the next starts, so none still holds the run dir.
        "failurePolicy": {
            "maxRestarts": pods.max_restarts,
            "restartStrategy": "BlockingRecreate",
            "rules": [
                # A preemption (exit 42: checkpointed at the signal)
                # costs nothing: it does not count toward maxRestarts.
                {
                    "name": PREEMPTED,
                    "action": "RestartJobSetAndIgnoreMaxRestarts",
                    "onJobFailureReasons": ["PodFailurePolicy"],
                    "onJobFailureMessagePatterns": [
                        f"with exit code {EXIT_PREEMPTED} matching FailJob rule at index {PREEMPTED_RULE}$"
                    ],
                    "targetReplicatedJobs": training,
                },
                {
                    "name": PERMANENT_EXIT,
                    "action": "FailJobSet",
                    "onJobFailureReasons": ["PodFailurePolicy"],
                    "targetReplicatedJobs": training,
                },
                {
                    "name": RESTART_AND_RESUME,
                    "action": "RestartJobSet",
                    "onJobFailureReasons": ["BackoffLimitExceeded"],
                    "targetReplicatedJobs": training,
                },
            ],
        },
        # The run is done when the chief (parameter servers) or every worker is: the ps tasks never end on their own.
        "successPolicy": {"operator": "All", "targetReplicatedJobs": primary},
        "replicatedJobs": replicated,
    }


def _agents_jobset_spec(pods: Pods, name: str) -> Dict:
    """An agent in each of MAX pods of one Indexed Job (`worker`): pod 0's
    keeps the rounds, at its DNS name on jobset.PORT."""
    workers = pods.counts["worker"]
    store = f"{jobset.hostname(name, 'worker', 0)}:{jobset.PORT}"
    token_file = f"{SECRET_MOUNT_PATH}/{SECRET_KEY}"
    args = [*pods.args("agent"), f"cluster.agent.store={store}", f"cluster.agent.token_file={token_file}"]
    container = pods.container(CONTAINER, "worker", args, ports=[{"name": "rendezvous", "containerPort": jobset.PORT}])
    container.setdefault("volumeMounts", []).append(
        {"name": SECRET_VOLUME, "mountPath": SECRET_MOUNT_PATH, "readOnly": True}
    )
    on_codes = lambda action, codes: {
        "action": action,
        "onExitCodes": {
            "containerName": CONTAINER,
            "operator": "In",  # noqa: E731
            "values": list(codes),
        },
    }
    job = {
        "completionMode": "Indexed",
        "completions": workers,
        "parallelism": workers,
        # A pod lost (killed, its node gone) is recreated and its agent
        # joins again; this many such losses, then the set restarts.
        "backoffLimit": max(pods.max_restarts, 1) * workers,
        "podFailurePolicy": {
            "rules": [
                on_codes("FailJob", PERMANENT),  # no restart cures these: the set fails
                on_codes(
                    "Ignore", [EXIT_PREEMPTED]
                ),  # its agent checkpointed with the others and left: recreated, not counted
                {
                    "action": "Ignore",
                    "onPodConditions": [{"type": "DisruptionTarget"}],
                },  # evicted, preempted, its node drained
            ]
        },
        "successPolicy": {"rules": [{"succeededIndexes": "0"}]},  # the keeper's pod ends when the training does
        "template": {"spec": pods.spec(container, restartPolicy="Never")},  # podFailurePolicy's requirement
    }
    # Readable whatever user the image runs as: the volume is this pod's containers' alone (its file mode guards
    # nothing more within the pod), and a root-owned 0400 file would be unreadable to a non-root container.
    secret_volume = {"name": SECRET_VOLUME, "secret": {"secretName": secret_name(name), "defaultMode": 0o444}}
    job["template"]["spec"].setdefault("volumes", []).append(secret_volume)
    return {
        "network": {"enableDNSHostnames": True},
        "failurePolicy": {
            "maxRestarts": pods.max_restarts,
            "restartStrategy": "BlockingRecreate",
            "rules": [
                {
                    "name": PERMANENT_EXIT,
                    "action": "FailJobSet",
                    "onJobFailureReasons": ["PodFailurePolicy"],
                    "targetReplicatedJobs": ["worker"],
                },
                {
                    "name": RESTART_AND_RESUME,
                    "action": "RestartJobSet",
                    "onJobFailureReasons": ["BackoffLimitExceeded"],
                    "targetReplicatedJobs": ["worker"],
                },
            ],
        },
        "successPolicy": {"operator": "All", "targetReplicatedJobs": ["worker"]},
        "replicatedJobs": [{"name": "worker", "replicas": 1, "template": {"spec": job}}],
    }


def _training_job(pods: Pods, container: Dict, container_name: str) -> Dict:
    """A training task's Job: any failure fails it (backoffLimit 0), and the
    JobSet's rules decide: a permanent code fails the set, a preemption
    restarts it without counting, anything else restarts it, counted."""

    def fail_job_on(codes) -> Dict:
        return {
            "action": "FailJob",
            "onExitCodes": {"containerName": container_name, "operator": "In", "values": list(codes)},
        }

    rules = [
        fail_job_on(PERMANENT),
        fail_job_on([EXIT_PREEMPTED]),
    ]  # the second at PREEMPTED_RULE: the JobSet's rule reads its index
    return {
        "backoffLimit": 0,
        "podFailurePolicy": {"rules": rules},
        "template": {"spec": pods.spec(container, restartPolicy="Never")},
    }  # podFailurePolicy's requirement


def _evaluator_job(pods: Pods, container: Dict) -> Dict:
    """The sidecar evaluator's Job: a failure restarts its container in place
    (OnFailure), never failing the Job, so the training's rules never see it."""
    return {
        "backoffLimit": EVALUATOR_BACKOFF_LIMIT,
        "template": {"spec": pods.spec(container, restartPolicy="OnFailure")},
    }


def _labels_as_env() -> List[Dict]:
    """The JobSet labels launch/jobset.py places the pod by, through the downward API."""
    return [
        {"name": env, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{label}']"}}}
        for env, label in jobset.DOWNWARD_API.items()
    ]
