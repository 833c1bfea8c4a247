"""data.service (a tf.data service beside the run's tasks), in-process
(-m unit): its config checks, the tasks placed from TF_CONFIG and Slurm,
and the TFJob's replicas. The service running under real processes, and a
straggler on it: test_data_service.py."""

import json

import pytest

from config_helpers import PREFIX, refused
from tfdistx import launch as launches
from tfdistx.launch import kubernetes
from tfdistx.core.launch_mode import LaunchMode
from tfdistx.commands.common import compose
from tfdistx.commands.plan import describe
from tfdistx.core import data_service
from tfdistx.config.schema import tasks_per_job
from tfdistx.config.resolve import layout_of


@pytest.mark.unit
@pytest.mark.parametrize(
    "override, says",
    [
        ("data.service.workers=-1", "data.service.workers=-1: tf.data service workers: a whole number from 0"),
        ("data.service.workers=two", "data.service.workers='two': tf.data service workers"),
        ("data.service.workers=65", "data.service.workers=65: tf.data service workers: a whole number from 0 (off"),
        (
            "data.service.mode=epochs",
            "data.service.mode='epochs': allowed: parallel_epochs, distributed_epoch (null: distributed_epoch)",
        ),
        ("+data.service.port=5000", "data.service.port=5000: data.service has no such key; its keys: workers, mode"),
    ],
)
def test_bad_service_values_are_refused_in_one_line(tmp_path, override, says):
    lines = refused(tmp_path, override)
    assert len(lines) == 1 and lines[0].startswith(PREFIX + says), lines


@pytest.mark.unit
def test_the_service_is_off_by_default_and_distributed_epoch_when_on(tmp_path):
    cfg = compose([f"hydra.run.dir={tmp_path}"], notes=False)
    assert data_service.settings(cfg.data) is None and data_service.job_counts(cfg.data) == {}
    cfg = compose(
        ["strategy=parameter_server", "cluster=ps1w2", "data.service.workers=3", f"hydra.run.dir={tmp_path}"],
        notes=False,
    )
    assert data_service.settings(cfg.data) == {"workers": 3, "mode": "distributed_epoch"}
    assert "data service  a tf.data service: 1 dispatcher, 3 worker(s), distributed_epoch" in describe(cfg)
    # a user's own data target keeps the pipeline's keys, the service among them
    cfg = compose(
        ["data._target_=service_plugins.indexed_arrays", "data.service.workers=1", f"hydra.run.dir={tmp_path}"],
        notes=False,
    )
    assert data_service.workers(cfg.data) == 1


def _placed(tmp_path, overrides, env):
    cfg = compose([*overrides, f"hydra.run.dir={tmp_path}"], notes=False)
    return launches.detect(layout_of(cfg), env)


PS_SERVICE = {
    "chief": ["c:1"],
    "ps": ["p:1"],
    "worker": ["w:1", "w:2"],
    "dispatcher": ["d:1"],
    "dataworker": ["dw:1", "dw:2"],
}


@pytest.mark.unit
def test_tf_config_service_tasks_are_placed_but_hidden_from_tensorflow(tmp_path):
    ps = ["strategy=parameter_server", "cluster=ps1w2", "data.service.workers=2"]
    chief = _placed(
        tmp_path, ps, {"TF_CONFIG": json.dumps({"cluster": PS_SERVICE, "task": {"type": "chief", "index": 0}})}
    )
    assert chief.is_chief and set(chief.cluster_spec) == {"chief", "ps", "worker"}
    assert chief.service == {"dispatcher": ["d:1"], "dataworker": ["dw:1", "dw:2"]}
    assert "dispatcher" not in chief.tf_config()  # what TensorFlow's resolvers read
    worker = _placed(
        tmp_path, ps, {"TF_CONFIG": json.dumps({"cluster": PS_SERVICE, "task": {"type": "dataworker", "index": 1}})}
    )
    assert worker.task_type == "dataworker" and worker.task_index == 1 and not worker.is_chief
    # a one-process strategy's trainer is the one worker; it stays a single process, fed by the service
    one = {"worker": ["w:1"], "dispatcher": ["d:1"], "dataworker": ["dw:1"]}
    trainer = _placed(
        tmp_path,
        ["data.service.workers=1"],
        {"TF_CONFIG": json.dumps({"cluster": one, "task": {"type": "worker", "index": 0}})},
    )
    assert trainer.launch is None and trainer.service["dispatcher"] == ["d:1"]
    assert _placed(tmp_path, ["data.service.workers=1"], {}).launch is LaunchMode.LOCAL  # launched beside its service
    # a cluster spec without the service the config asks for is refused in one line
    with pytest.raises(Exception) as caught:
        _placed(
            tmp_path,
            ps,
            {
                "TF_CONFIG": json.dumps(
                    {
                        "cluster": {k: v for k, v in PS_SERVICE.items() if k != "dataworker"},
                        "task": {"type": "chief", "index": 0},
                    }
                )
            },
        )
    assert "2 dataworkers" in str(caught.value)


@pytest.mark.unit
def test_slurm_ranks_after_the_training_tasks_run_the_service(tmp_path):
    ps = ["strategy=parameter_server", "cluster=ps1w2", "data.service.workers=2"]
    step = {
        "SLURM_JOB_ID": "0",
        "SLURM_STEP_NUM_TASKS": "7",
        "SLURM_STEP_NODELIST": "n1",
        "SLURM_STEP_TASKS_PER_NODE": "7",
    }
    roles = [_placed(tmp_path, ps, {**step, "SLURM_PROCID": str(rank)}) for rank in range(7)]
    assert [r.task_name for r in roles] == [
        "chief:0",
        "ps:0",
        "worker:0",
        "worker:1",
        "dispatcher:0",
        "dataworker:0",
        "dataworker:1",
    ]
    assert roles[0].service == {"dispatcher": ["n1:29404"], "dataworker": ["n1:29405", "n1:29406"]}
    assert tasks_per_job("parameter_server", 2, 1, False, 2) == 7 and tasks_per_job("one_device", 1, 0, False, 1) == 3


@pytest.mark.unit
def test_tfjob_gets_dispatcher_and_data_worker_replicas(tmp_path):
    overrides = ["strategy=one_device", "data.service.workers=2"]
    cfg = compose([*overrides, f"hydra.run.dir={tmp_path}"], notes=False)
    job = kubernetes.tfjob(layout_of(cfg), kubernetes.PodOptions(tuple(overrides), "svc", "img:1"))
    specs = job["spec"]["tfReplicaSpecs"]
    assert {k: v["replicas"] for k, v in specs.items()} == {"Worker": 1, "Dispatcher": 1, "DataWorker": 2}
    args = specs["Dispatcher"]["template"]["spec"]["containers"][0]["args"]
    assert "cluster.launch=tf_config" in args and "data.service.workers=2" in args  # every pod composes the same config


@pytest.mark.unit
def test_deterministic_runs_are_told_resume_is_not_exact(tmp_path):
    cfg = compose(["data.service.workers=2", "trainer.deterministic=true", f"hydra.run.dir={tmp_path}"], notes=False)
    assert "is not bitwise equal" in data_service.resume_warning(cfg.data, True)
    assert data_service.resume_warning(cfg.data, False) is None
    cfg = compose(
        ["data.service.workers=2", "data.service.mode=parallel_epochs", f"hydra.run.dir={tmp_path}"], notes=False
    )
    assert "neither a run nor its resume is reproducible" in data_service.resume_warning(cfg.data, True)
