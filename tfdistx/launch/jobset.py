"""cluster.launch=jobset: a pod of a JobSet (kubernetes-sigs/jobset) learns
its place here, and `tfdistx job jobset|trainjob` writes the manifests: a
JobSet, or a Kubeflow Trainer v2 TrainJob with the ClusterTrainingRuntime
it names (it runs on a JobSet, and places its pods alike), for the
composed config.

Neither writes TF_CONFIG: each pod runs `python -m tfdistx` with
`cluster.launch=jobset` and builds it from its JobSet labels and the
config's own counts (`place`, below). One replicatedJob per task type
(chief, ps, worker, evaluator, dispatcher, dataworker), each one Indexed
Job with a pod per task; a TrainJob's runtime holds the same JobSet, since
Trainer v2 runs every TrainJob as one (and, having no TensorFlow runtime,
needs tfdistx's). No TensorFlow here.

Restarts: a pod that fails with a code no restart can cure (PERMANENT in
core/errors.py, the codes the local launcher never restarts either)
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

Placement: JobSet writes no TF_CONFIG. It labels and annotates every pod with its
JobSet's name, its replicatedJob's name and its Job's index, and, with
`network.enableDNSHostnames`, makes every pod reachable at
`<jobset>-<replicatedJob>-<jobIndex>-<podIndex>.<subdomain>` (the subdomain
is the JobSet's name unless the manifest sets one). The manifests tfdistx
writes (below) run each task type as one replicatedJob of one
Indexed Job with a pod per task, and hand the labels to the container
through the downward API as the variables below; Kubernetes itself sets
JOB_COMPLETION_INDEX, the pod's index in its Job. So a pod is the task
`<replicatedJob>:<pod index>`, and every address follows from the config's
own counts, which is why a pod that does not fit them is refused.

No TensorFlow here.
"""

import re
import secrets
from dataclasses import replace
from typing import Dict, List, Mapping

from tfdistx.cluster import data_service
from tfdistx.cluster.evaluator import EVALUATOR
from tfdistx.cluster.placement import Placement, scheduled_tasks
from tfdistx.launch.base import Job, Launch
from tfdistx.launch.kubernetes import CREATED_BY, PodOptions, Pods
from tfdistx.core.errors import EXIT_PREEMPTED, PERMANENT, ConfigError
from tfdistx.core.launch_mode import LaunchMode
from tfdistx.core.run_spec import Layout

PORT = 2222  # every pod has an address of its own: one port for all, the TFJob's
# The pod's labels, as the manifest's downward API names them in the container.
NAME_ENV, REPLICATED_JOB_ENV, JOB_INDEX_ENV = "JOBSET_NAME", "JOBSET_REPLICATED_JOB", "JOBSET_JOB_INDEX"
POD_INDEX_ENV = "JOB_COMPLETION_INDEX"  # Kubernetes' own, in every pod of an Indexed Job
NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
POD_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
DOWNWARD_API = {NAME_ENV: NAME_LABEL, REPLICATED_JOB_ENV: REPLICATED_JOB_LABEL, JOB_INDEX_ENV: JOB_INDEX_LABEL}
_DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
# A pod's hostname is <jobset>-<replicatedJob>-0-<index>: with the longest, "-dataworker-0-99", still a DNS label.
LONGEST_NAME = 63 - len("-dataworker-0-99")


def in_jobset(env: Mapping[str, str]) -> bool:
    """Auto-detection: the manifest gave this pod its JobSet's name."""
    return bool(env.get(NAME_ENV))


def hostname(jobset: str, job: str, index: int, subdomain: str = "") -> str:
    """Task `job:index`'s name: pod `index` of the replicatedJob's one Job (job index 0)."""
    return f"{jobset}-{job}-0-{index}.{subdomain or jobset}"


def cluster_spec(jobset: str, counts: Mapping[str, int]) -> Dict[str, List[str]]:
    return {job: [f"{hostname(jobset, job, i)}:{PORT}" for i in range(n)] for job, n in counts.items() if n}


def place_pod(env: Mapping[str, str], counts: Mapping[str, int]) -> Placement:
    """This pod's place, from its env and the config's tasks per job (`counts`, with the evaluator's
    when there is one). A pod the config has no place for is refused in one
    line naming the label and what the config allows."""
    jobset = env.get(NAME_ENV, "")
    if not jobset:
        raise ConfigError.for_key(
            "cluster.launch",
            LaunchMode.JOBSET,
            f"this pod has no {NAME_ENV} (the manifest's downward API gives it the "
            f"label {NAME_LABEL}): write the manifest with `tfdistx job jobset`",
        )
    check_name(
        NAME_LABEL, jobset, LONGEST_NAME
    )  # every address is built from it: a bad one would wait for peers that never answer
    wanted = {job: n for job, n in counts.items() if n}
    job = env.get(REPLICATED_JOB_ENV, "")
    if job not in wanted:
        raise ConfigError.for_key(
            REPLICATED_JOB_LABEL,
            job,
            f"the config's cluster has the replicatedJobs {', '.join(wanted)}: make cluster= match the manifest",
        )
    if env.get(JOB_INDEX_ENV, "0") != "0":
        raise ConfigError.for_key(
            JOB_INDEX_LABEL,
            env[JOB_INDEX_ENV],
            "allowed: 0 (tfdistx runs each task type as one Indexed Job with a pod per task: replicas: 1)",
        )
    raw = env.get(POD_INDEX_ENV, "")
    if not raw.isdigit() or int(raw) >= wanted[job]:
        raise ConfigError.for_key(
            POD_INDEX_LABEL, raw, f"the config's cluster has {wanted[job]} {job} task(s): allowed 0..{wanted[job] - 1}"
        )
    tf_cluster = cluster_spec(
        jobset, {name: n for name, n in wanted.items() if name != EVALUATOR}
    )  # not in the cluster (cluster/evaluator.py)
    training, service = data_service.split(tf_cluster)
    return Placement(LaunchMode.JOBSET, training, job, int(raw), service, address_from="the JobSet's address")


def check_name(key: str, value: str, longest: int) -> None:
    """A Kubernetes object's name, as a DNS label (a JobSet's, a TFJob's, a namespace)."""
    if not _DNS_LABEL.fullmatch(value) or len(value) > longest:
        raise ConfigError.for_key(
            key,
            value,
            f"must be a DNS label: lowercase letters, digits and '-', starting with a letter, "
            f"at most {longest} characters",
        )


JOBSET_API = "jobset.x-k8s.io/v1alpha2"
TRAINER_API = "trainer.kubeflow.org/v1alpha1"
CONTAINER = "tensorflow"
TRAINER_CONTAINER = "node"  # the container Trainer v2 gives the TrainJob's image, args and resources
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"  # Trainer v2's label for the replicatedJob that trains
MAX_NAME = LONGEST_NAME  # its pods' hostnames are built from the name


def jobset_manifest(layout: Layout, options: PodOptions) -> Dict:
    """The JobSet (as a dict) whose pods run `layout`."""
    if layout.cluster.agent is not None:  # the pods say where they meet and what they prove, not the user's stand-in
        placed_here = ("cluster.launch", "cluster.agent.store", "cluster.agent.token_file")
        overrides = tuple(o for o in options.overrides if o.lstrip("+").partition("=")[0] not in placed_here)
        options = replace(options, overrides=overrides)
    pods = Pods(layout, "a JobSet", options)
    spec = _agents_jobset_spec(pods) if layout.cluster.agent is not None else _jobset_spec(pods, CONTAINER)
    return {
        "apiVersion": JOBSET_API,
        "kind": "JobSet",
        "metadata": _metadata(options.name, options.namespace),
        "spec": spec,
    }


def jobset_and_network_policy(layout: Layout, options: PodOptions) -> List[Dict]:
    """`tfdistx job jobset`: the JobSet, the NetworkPolicy that keeps others out of its pods, and under agents the
    Secret their beats prove."""
    return [
        jobset_manifest(layout, options),
        network_policy(options.name, options.namespace),
        *([rendezvous_secret(options.name, options.namespace)] if layout.cluster.agent is not None else []),
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
        return {"matchLabels": {NAME_LABEL: name}}

    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(f"{name}-tasks", namespace),
        "spec": {"podSelector": own(), "policyTypes": ["Ingress"], "ingress": [{"from": [{"podSelector": own()}]}]},
    }


def trainjob_manifests(layout: Layout, options: PodOptions) -> List[Dict]:
    """[the ClusterTrainingRuntime, the TrainJob naming it]. The runtime is
    this run's shape (its task types and counts) with the image and args in
    every task type; the TrainJob sets the trainer step's image, args,
    numNodes and resources, which Trainer v2 lets a TrainJob override."""
    pods = Pods(layout, "a TrainJob", options)
    spec = _jobset_spec(pods, TRAINER_CONTAINER)
    trainer_step = next(job for job in spec["replicatedJobs"] if job["name"] == "worker")
    trainer_step["template"]["metadata"] = {"labels": {ANCESTOR: "trainer"}}  # the Job Trainer v2 sizes with numNodes
    workers = pods.counts["worker"]
    runtime_name = f"tfdistx-{options.name}"
    runtime = {
        "apiVersion": TRAINER_API,
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": runtime_name, "labels": {**CREATED_BY, "trainer.kubeflow.org/framework": "tensorflow"}},
        # numNodes and no framework policy: Trainer v2 has none for TensorFlow, and the pods need none
        "spec": {"mlPolicy": {"numNodes": workers}, "template": {"spec": spec}},
    }
    container = trainer_step["template"]["spec"]["template"]["spec"]["containers"][0]
    trainer = {
        "image": options.image,
        "command": list(container["command"]),
        "args": list(container["args"]),
        "numNodes": workers,
    }
    if options.gpus:
        trainer["resourcesPerNode"] = pods.resources()
    trainjob = {
        "apiVersion": TRAINER_API,
        "kind": "TrainJob",
        "metadata": _metadata(options.name, options.namespace),
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
    args = pods.args(LaunchMode.JOBSET)  # each pod places itself by its JobSet labels (`place`)
    replicated = []
    for job, n in pods.counts.items():
        container = pods.container(
            container_name, job, args, env=_labels_as_env(), ports=[{"name": "tfdistx", "containerPort": PORT}]
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
        "network": {"enableDNSHostnames": True},  # <name>-<job>-0-<i>.<name>: the addresses `place` derives
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


def _agents_jobset_spec(pods: Pods) -> Dict:
    """An agent in each of MAX pods of one Indexed Job (`worker`): pod 0's
    keeps the rounds, at its DNS name on PORT."""
    workers = pods.counts["worker"]
    name = pods.options.name
    store = f"{hostname(name, 'worker', 0)}:{PORT}"
    token_file = f"{SECRET_MOUNT_PATH}/{SECRET_KEY}"
    args = [*pods.args(LaunchMode.AGENT), f"cluster.agent.store={store}", f"cluster.agent.token_file={token_file}"]
    container = pods.container(CONTAINER, "worker", args, ports=[{"name": "rendezvous", "containerPort": PORT}])
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
    """The JobSet labels `place` places the pod by, through the downward API."""
    return [
        {"name": env, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{label}']"}}}
        for env, label in DOWNWARD_API.items()
    ]


class JobSetLaunch(Launch):
    mode = LaunchMode.JOBSET
    detect_order = 20
    placed_where = "the JobSet"
    jobs = (
        Job(
            "jobset",
            "a JobSet (jobset.x-k8s.io/v1alpha2, kubernetes-sigs/jobset) and the NetworkPolicy that admits its pods' "
            "traffic from its own pods only",
            "tfdistx.commands.kubernetes:jobset",
        ),
        Job(
            "trainjob",
            "a Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1) and the ClusterTrainingRuntime it names",
            "tfdistx.commands.kubernetes:trainjob",
        ),
    )

    def detected(self, env: Mapping[str, str]) -> bool:
        """The manifest gave this pod its JobSet's name."""
        return in_jobset(env)

    def place(self, layout: Layout, env: Mapping[str, str], training: bool) -> Placement:
        return place_pod(env, scheduled_tasks(layout, training))


LAUNCH = JobSetLaunch()
