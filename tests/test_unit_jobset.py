"""A pod of a JobSet (or a Trainer v2 TrainJob) builds its TF_CONFIG from
its JobSet labels and the config's counts (launch/jobset.py), in-process
(-m unit): the env the manifest's downward API gives is a dict, so every
case is a pod placed where the manifest puts it, or one the config has no
place for and the one line it gets. Also what `job jobset|trainjob`
writes that the pods rely on (launch/jobset.py)."""

import json

import pytest

from config_helpers import PREFIX
from test_unit_config_cluster import placed, refused_line
from tfdistx import launch as launches
from tfdistx.launch import jobset as jobset_manifest
from tfdistx.launch.kubernetes import PodOptions
from tfdistx.core.launch_mode import LaunchMode
from tfdistx.core.errors import ConfigError
from tfdistx.config.resolve import layout_of


def pod(jobset="mw", job="worker", index=0, job_index="0", **more) -> dict:
    """A pod's env as the manifest's downward API and Kubernetes give it."""
    return {
        "JOBSET_NAME": jobset,
        "JOBSET_REPLICATED_JOB": job,
        "JOBSET_JOB_INDEX": job_index,
        "JOB_COMPLETION_INDEX": str(index),
        **more,
    }


@pytest.mark.unit
@pytest.mark.parametrize(
    "base, env, spec, task, chief",
    [
        (
            ("strategy=multiworker", "cluster=2x1"),
            pod(index=1),
            {"worker": ["mw-worker-0-0.mw:2222", "mw-worker-0-1.mw:2222"]},
            "worker:1",
            False,
        ),
        # found without cluster.launch=jobset: the JobSet's name in the env
        (
            ("strategy=multiworker", "cluster=2x1", "cluster.launch=auto"),
            pod(),
            {"worker": ["mw-worker-0-0.mw:2222", "mw-worker-0-1.mw:2222"]},
            "worker:0",
            True,
        ),
        (
            ("strategy=parameter_server", "cluster=ps1w2"),
            pod("ps", "chief"),
            {
                "chief": ["ps-chief-0-0.ps:2222"],
                "ps": ["ps-ps-0-0.ps:2222"],
                "worker": ["ps-worker-0-0.ps:2222", "ps-worker-0-1.ps:2222"],
            },
            "chief:0",
            True,
        ),
        # the sidecar evaluator is placed, and is in no task's cluster spec
        (
            ("strategy=multiworker", "cluster=2x1", "cluster.evaluator=true"),
            pod(job="evaluator"),
            {"worker": ["mw-worker-0-0.mw:2222", "mw-worker-0-1.mw:2222"]},
            "evaluator:0",
            False,
        ),
    ],
)
def test_a_jobset_pod_is_placed_by_its_labels(configs, base, env, spec, task, chief):
    where = placed(configs(*base, "cluster.launch=jobset"), env)
    assert (where.launch, where.cluster_spec, where.task_name, where.is_chief) == (LaunchMode.JOBSET, spec, task, chief)
    if task != "evaluator:0":
        assert json.loads(where.tf_config()) == {
            "cluster": spec,
            "task": {"type": where.task_type, "index": where.task_index},
        }


@pytest.mark.unit
def test_the_tf_data_service_runs_as_replicated_jobs_of_its_own(configs):
    cfg = configs("strategy=multiworker", "cluster=2x1", "data.service.workers=2")
    where = launches.detect(layout_of(cfg), pod(job="dataworker", index=1))
    assert where.task_name == "dataworker:1" and where.cluster_spec == {
        "worker": ["mw-worker-0-0.mw:2222", "mw-worker-0-1.mw:2222"]
    }
    assert where.service == {
        "dispatcher": ["mw-dispatcher-0-0.mw:2222"],
        "dataworker": ["mw-dataworker-0-0.mw:2222", "mw-dataworker-0-1.mw:2222"],
    }


@pytest.mark.unit
def test_tf_config_wins_over_the_jobset_labels_when_both_are_set(configs):
    env = {
        **pod(),
        "TF_CONFIG": json.dumps({"cluster": {"worker": ["h:1", "h:2"]}, "task": {"type": "worker", "index": 1}}),
    }
    assert placed(configs("strategy=multiworker", "cluster=2x1"), env).launch is LaunchMode.TF_CONFIG


@pytest.mark.unit
@pytest.mark.parametrize(
    "base, env, line",
    [
        (
            ("strategy=multiworker", "cluster=2x1"),
            pod(job="ps"),
            "jobset.sigs.k8s.io/replicatedjob-name='ps': the config's cluster has the replicatedJobs worker: make "
            "cluster= match the manifest",
        ),
        (
            ("strategy=parameter_server", "cluster=ps1w2"),
            pod(job="evaluator"),
            "jobset.sigs.k8s.io/replicatedjob-name='evaluator': the config's cluster has the replicatedJobs chief, "
            "ps, worker: make cluster= match the manifest",
        ),
        (
            ("strategy=multiworker", "cluster=2x1"),
            pod(index=2),
            "batch.kubernetes.io/job-completion-index='2': the config's cluster has 2 worker task(s): allowed 0..1",
        ),
        (
            ("strategy=multiworker", "cluster=2x1"),
            pod(index=""),
            "batch.kubernetes.io/job-completion-index='': the config's cluster has 2 worker task(s): allowed 0..1",
        ),
        (
            ("strategy=multiworker", "cluster=2x1"),
            pod(job_index="1"),
            "jobset.sigs.k8s.io/job-index='1': allowed: 0 (tfdistx runs each task type as one Indexed Job with a pod "
            "per task: replicas: 1)",
        ),
        (
            ("strategy=multiworker", "cluster=2x1"),
            pod(jobset=""),
            "cluster.launch='jobset': this pod has no JOBSET_NAME (the manifest's downward API gives it the label "
            "jobset.sigs.k8s.io/jobset-name): write the manifest with `tfdistx job jobset`",
        ),
    ],
)
def test_a_pod_the_config_has_no_place_for_is_one_line(configs, base, env, line):
    assert refused_line(configs(*base, "cluster.launch=jobset"), env) == PREFIX + line


# -- what the manifests give the pods ------------------------------------------


def containers(spec: dict) -> dict:
    return {job["name"]: job["template"]["spec"]["template"]["spec"]["containers"][0] for job in spec["replicatedJobs"]}


@pytest.mark.unit
def test_every_jobset_pod_gets_the_labels_it_is_placed_by(configs):
    cfg = configs("strategy=parameter_server", "cluster=ps1w2", "cluster.evaluator=true", "data.service.workers=1")
    manifest = jobset_manifest.jobset_manifest(
        layout_of(cfg), PodOptions(("strategy=parameter_server", "cluster=ps1w2"), "ps", "img")
    )
    for job, container in containers(manifest["spec"]).items():
        given = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"] if "valueFrom" in e}
        assert given == {
            "JOBSET_NAME": "metadata.labels['jobset.sigs.k8s.io/jobset-name']",
            "JOBSET_REPLICATED_JOB": "metadata.labels['jobset.sigs.k8s.io/replicatedjob-name']",
            "JOBSET_JOB_INDEX": "metadata.labels['jobset.sigs.k8s.io/job-index']",
        }, job
        assert "cluster.launch=jobset" in container["args"] and not any(
            "retryable_exit_offset" in a for a in container["args"]
        )
    assert list(containers(manifest["spec"])) == ["chief", "ps", "worker", "evaluator", "dispatcher", "dataworker"]
    assert manifest["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["chief"]}


@pytest.mark.unit
def test_a_trainjob_overrides_the_runtime_s_trainer_step_with_the_same_pod(configs):
    cfg = configs("strategy=multiworker", "cluster=4x8")
    runtime, trainjob = jobset_manifest.trainjob_manifests(
        layout_of(cfg), PodOptions(("strategy=multiworker", "cluster=4x8"), "mw", "img", gpus=True)
    )
    (step,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert step["template"]["metadata"] == {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}}
    container = step["template"]["spec"]["template"]["spec"]["containers"][0]
    assert container["name"] == "node"  # the container Trainer v2 overrides
    trainer = trainjob["spec"]["trainer"]
    assert (trainer["image"], trainer["command"], trainer["args"]) == (
        container["image"],
        container["command"],
        container["args"],
    )
    assert (
        trainer["numNodes"] == 4 == runtime["spec"]["mlPolicy"]["numNodes"] == step["template"]["spec"]["parallelism"]
    )
    assert trainer["resourcesPerNode"] == container["resources"] == {"limits": {"nvidia.com/gpu": 8}}
    assert trainjob["spec"]["runtimeRef"] == {
        "name": runtime["metadata"]["name"],
        "kind": "ClusterTrainingRuntime",
        "apiGroup": "trainer.kubeflow.org",
    }


@pytest.mark.unit
@pytest.mark.parametrize("name", ["Bad_Name!", "mw.x", "a" * 48])
def test_a_pod_whose_jobset_name_makes_no_address_is_a_bad_config_naming_the_label(configs, name):
    """Every task's address is built from the JobSet's name: a name that is
    no DNS label would have the pods wait startup_timeout for peers that
    never answer (exit 4, retried); refused at once instead (exit 2)."""
    with pytest.raises(ConfigError) as caught:
        placed(configs("strategy=multiworker", "cluster=2x1", "cluster.launch=jobset"), pod(jobset=name))
    (line,) = caught.value.lines()
    assert line.startswith(f"tfdistx: invalid config: jobset.sigs.k8s.io/jobset-name={name!r}: must be a DNS label"), (
        line
    )
