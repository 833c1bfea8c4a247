"""cluster.evaluator=true: where the sidecar evaluator task is placed under
TF_CONFIG, Slurm and a TFJob, and a one-process strategy refusing it,
in-process (-m unit), no TensorFlow; and the evaluator's loop over a run
that ended before it looked, on real TensorFlow. Its real runs:
test_sidecar_evaluator.py."""

import json

import pytest

from config_helpers import compose_ok, refused
from tfdistx import launch as launches
from tfdistx.cluster.placement import Placement
from tfdistx.core.launch_mode import LaunchMode
from tfdistx.launch.kubernetes import PodOptions, tfjob
from tfdistx.config import schema
from tfdistx.config.resolve import layout_of


@pytest.mark.unit
def test_a_one_process_strategy_refuses_a_sidecar_evaluator_in_one_line(tmp_path):
    for overrides in (["cluster.evaluator=true"], ["strategy=mirrored", "cluster=1x2", "cluster.evaluator=true"]):
        lines = refused(tmp_path / "run", *overrides)
        assert len(lines) == 1 and "cluster.evaluator=True" in lines[0] and "one process" in lines[0], lines
        assert "strategy=multiworker or strategy=parameter_server" in lines[0]
    for overrides in (["strategy=multiworker", "cluster=2x1"], ["strategy=parameter_server", "cluster=ps1w2"]):
        assert compose_ok(tmp_path / "run", *overrides, "cluster.evaluator=true").cluster.evaluator is True


def _placed(cfg, env):
    return launches.detect(layout_of(cfg), env)


@pytest.mark.unit
def test_under_tf_config_the_evaluator_is_outside_the_cluster_spec_every_task_sees(tmp_path):
    """As Kubeflow's operator writes it, every pod's TF_CONFIG lists the
    evaluator too: no training task keeps it in its spec (nobody waits for
    it), and the evaluator's own task is placed outside the cluster, writing
    none of the chief's files."""
    cfg = compose_ok(tmp_path / "run", "strategy=parameter_server", "cluster=ps1w2", "cluster.evaluator=true")
    cluster = {
        "chief": ["j-chief-0:2222"],
        "ps": ["j-ps-0:2222"],
        "worker": ["j-worker-0:2222", "j-worker-1:2222"],
        "evaluator": ["j-evaluator-0:2222"],
    }
    for task_type, index in (("chief", 0), ("worker", 1), ("evaluator", 0)):
        env = {
            "TF_CONFIG": json.dumps(
                {"cluster": cluster, "task": {"type": task_type, "index": index}, "environment": "cloud"}
            )
        }
        placed = _placed(cfg, env)
        assert "evaluator" not in placed.cluster_spec and "evaluator" not in json.loads(placed.tf_config())["cluster"]
        assert (placed.task_type, placed.is_chief) == (task_type, task_type == "chief")
    # TensorFlow's own form (the evaluator not in the cluster at all) places it the same way
    env = {
        "TF_CONFIG": json.dumps(
            {"cluster": {k: v for k, v in cluster.items() if k != "evaluator"}, "task": {"type": "evaluator"}}
        )
    }
    assert _placed(cfg, env).task_name == "evaluator:0"
    with pytest.raises(Exception, match="at most one evaluator"):
        _placed(cfg, {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "evaluator", "index": 1}})})


@pytest.mark.unit
def test_under_slurm_the_evaluator_is_the_steps_last_task(tmp_path):
    cfg = compose_ok(tmp_path / "run", "strategy=multiworker", "cluster=2x1", "cluster.evaluator=true")
    step = {
        "SLURM_JOB_ID": "0",
        "SLURM_STEP_NUM_TASKS": "3",
        "SLURM_STEP_NODELIST": "n1",
        "SLURM_STEP_TASKS_PER_NODE": "3",
    }
    worker = _placed(cfg, {**step, "SLURM_PROCID": "1"})
    assert worker.cluster_spec == {"worker": ["n1:29400", "n1:29401"]} and worker.task_name == "worker:1"
    evaluator = _placed(cfg, {**step, "SLURM_PROCID": "2"})
    assert (
        evaluator.task_name == "evaluator:0"
        and evaluator.cluster_spec == worker.cluster_spec
        and not evaluator.is_chief
    )
    with pytest.raises(Exception, match="srun -n 3"):  # a step without its task
        _placed(cfg, {**step, "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "2"})
    # the Slurm sweep launcher's tasks_per_node counts it (conf/hydra/launcher/tfdistx_slurm.yaml)
    assert (
        schema.tasks_per_job("parameter_server", 2, 1, True) == 5
        and schema.tasks_per_job("parameter_server", 2, 1) == 4
    )


@pytest.mark.unit
def test_the_tfjob_has_an_evaluator_replica_only_when_asked(tmp_path):
    overrides = ["strategy=parameter_server", "cluster=ps1w2", "cluster.evaluator=true"]
    manifest = tfjob(
        layout_of(compose_ok(tmp_path / "run", *overrides)),
        PodOptions(tuple(overrides), "job", "tfdistx:test", volume="pvc:runs", gpus=True),
    )
    replicas = manifest["spec"]["tfReplicaSpecs"]
    assert list(replicas) == ["Chief", "PS", "Worker", "Evaluator"]
    evaluator = replicas["Evaluator"]
    assert evaluator["replicas"] == 1 and evaluator["restartPolicy"] == "ExitCode"
    container = evaluator["template"]["spec"]["containers"][0]
    assert "cluster.evaluator=true" in container["args"] and "cluster.launch=tf_config" in container["args"]
    assert "hydra.run.dir=/mnt/tfdistx/job" in container["args"]  # the run dir the chief writes its checkpoints to
    assert "resources" not in container  # --gpus: the training workers' GPUs; the evaluator asks for none
    plain = tfjob(
        layout_of(compose_ok(tmp_path / "run", *overrides[:2])), PodOptions(tuple(overrides[:2]), "job", "tfdistx:test")
    )
    assert "Evaluator" not in plain["spec"]["tfReplicaSpecs"]


@pytest.mark.unit
def test_an_evaluator_that_starts_after_training_ended_evaluates_the_checkpoints_left_and_stops(tmp_path):
    """Under load the evaluator may reach its first look only after the
    chief has written its last checkpoint and summary.json: it evaluates
    every checkpoint still there, the final one last (those max_to_keep
    rotated away are gone), and stops by itself."""
    import threading
    import time

    from engine_helpers import train
    from tfdistx.engine import sidecar
    from tfdistx.sigterm import SigtermNotice

    run = train(tmp_path / "run", "trainer.steps=50", "checkpoint.every_steps=10")  # max_to_keep 3: 30, 40 and 50 left
    with SigtermNotice() as notice:
        training = sidecar.Training(Placement(LaunchMode.TF_CONFIG, {}, "evaluator"), run.spec.cluster)
        evaluator = threading.Thread(target=sidecar.Sidecar(run.spec, time.time(), training, notice).run, daemon=True)
        evaluator.start()
        evaluator.join(timeout=300)
    assert not evaluator.is_alive(), "the evaluator went on waiting after training had ended"
    lines = [json.loads(line) for line in (run.dir / "evaluations.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if line.get("sidecar")] == [30, 40, 50]
