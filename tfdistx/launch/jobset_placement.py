"""A pod of a JobSet (or of a Kubeflow Trainer v2 TrainJob, which runs on
one) learns its place here: `cluster.launch=jobset`.

JobSet writes no TF_CONFIG. It labels and annotates every pod with its
JobSet's name, its replicatedJob's name and its Job's index, and, with
`network.enableDNSHostnames`, makes every pod reachable at
`<jobset>-<replicatedJob>-<jobIndex>-<podIndex>.<subdomain>` (the subdomain
is the JobSet's name unless the manifest sets one). The manifests tfdistx
writes (jobset_manifest.py) run each task type as one replicatedJob of one
Indexed Job with a pod per task, and hand the labels to the container
through the downward API as the variables below; Kubernetes itself sets
JOB_COMPLETION_INDEX, the pod's index in its Job. So a pod is the task
`<replicatedJob>:<pod index>`, and every address follows from the config's
own counts, which is why a pod that does not fit them is refused. No
TensorFlow here.
"""

import re
from typing import Dict, List, Mapping

from tfdistx.cluster import data_service
from tfdistx.cluster.evaluator import EVALUATOR
from tfdistx.spec.errors import ConfigError

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


def place(env: Mapping[str, str], counts: Mapping[str, int]):
    """(cluster spec, task type, task index, service jobs) of this pod, from
    its env and the config's tasks per job (`counts`, with the evaluator's
    when there is one). A pod the config has no place for is refused in one
    line naming the label and what the config allows."""
    jobset = env.get(NAME_ENV, "")
    if not jobset:
        raise ConfigError.one(
            "cluster.launch",
            "jobset",
            f"this pod has no {NAME_ENV} (the manifest's downward API gives it the "
            f"label {NAME_LABEL}): export the manifest with `tfdistx export jobset`",
        )
    check_name(
        NAME_LABEL, jobset, LONGEST_NAME
    )  # every address is built from it: a bad one would wait for peers that never answer
    wanted = {job: n for job, n in counts.items() if n}
    job = env.get(REPLICATED_JOB_ENV, "")
    if job not in wanted:
        raise ConfigError.one(
            REPLICATED_JOB_LABEL,
            job,
            f"the config's cluster has the replicatedJobs {', '.join(wanted)}: make cluster= match the manifest",
        )
    if env.get(JOB_INDEX_ENV, "0") != "0":
        raise ConfigError.one(
            JOB_INDEX_LABEL,
            env[JOB_INDEX_ENV],
            "allowed: 0 (tfdistx runs each task type as one Indexed Job with a pod per task: replicas: 1)",
        )
    raw = env.get(POD_INDEX_ENV, "")
    if not raw.isdigit() or int(raw) >= wanted[job]:
        raise ConfigError.one(
            POD_INDEX_LABEL, raw, f"the config's cluster has {wanted[job]} {job} task(s): allowed 0..{wanted[job] - 1}"
        )
    spec = cluster_spec(
        jobset, {name: n for name, n in wanted.items() if name != EVALUATOR}
    )  # not in the cluster (cluster/evaluator.py)
    training, service = data_service.split(spec)
    return training, job, int(raw), service


def check_name(key: str, value: str, longest: int) -> None:
    """A Kubernetes object's name, as a DNS label (a JobSet's, a TFJob's, a namespace)."""
    if not _DNS_LABEL.fullmatch(value) or len(value) > longest:
        raise ConfigError.one(
            key,
            value,
            f"must be a DNS label: lowercase letters, digits and '-', starting with a letter, "
            f"at most {longest} characters",
        )
