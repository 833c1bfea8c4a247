"""cluster.evaluator=true: a sidecar evaluator task beside a multi-process
cluster (tfdistx/engine/sidecar.py; its place: tfdistx/cluster/evaluator.py).

Real processes and real checkpoints. The default run holds one real run (a
multiworker 2x1 cluster with its evaluator: every checkpoint is evaluated,
with the numbers `tfdistx evaluate` gives, and the evaluator is gone at the
end); where it is placed under TF_CONFIG, Slurm and a TFJob is checked
in-process (-m unit) in test_unit_sidecar_evaluator.py; an evaluator killed
mid-run, one over a finished run placed by TF_CONFIG, and a TFJob's pods
with their Evaluator are slow.
"""

import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from config_helpers import compose_ok
from conftest import processes_of, run_command, start_tfdistx, task_pid, tfdistx_env, wait_until
from tfdistx.launch.kubernetes import PodOptions, tfjob
from tfdistx.config.resolve import layout_of

QUICK = [
    "trainer.steps=40",
    "trainer.steps_per_loop=10",
    "trainer.log_every=20",
    "trainer.eval_every=0",
    "data.batch_size=32",
    "data.train_examples=512",
    "data.eval_examples=128",
]
# A checkpoint every 10 steps, all kept: every one is still there for the evaluator, which starts TensorFlow
# more slowly than this short run trains.
EVERY_CHECKPOINT = ["cluster.evaluator=true", "checkpoint.every_steps=10", "checkpoint.max_to_keep=10"]


def sidecar_lines(run_dir: Path) -> list:
    lines = [json.loads(line) for line in (run_dir / "evaluations.jsonl").read_text().splitlines()]
    return [line for line in lines if line.get("sidecar")]


def checkpoint_steps(run_dir: Path) -> list:
    return sorted(int(p.name[len("ckpt-") : -len(".index")]) for p in (run_dir / "checkpoints").glob("ckpt-*.index"))


def scalars(event_dir: Path) -> dict:
    """tag -> {step: value} of the TensorBoard event files in `event_dir`, read
    with TensorBoard's own protos (no TensorFlow in the test process)."""
    from tensorboard.compat.proto import event_pb2
    from tensorboard.util import tensor_util

    found = {}
    for path in event_dir.glob("events.out.tfevents.*"):
        data, at = path.read_bytes(), 0
        while at + 12 <= len(data):  # TFRecord framing: length, its crc, the record, its crc
            (length,) = struct.unpack("<Q", data[at : at + 8])
            event = event_pb2.Event.FromString(data[at + 12 : at + 12 + length])
            at += 12 + length + 4
            for value in event.summary.value:
                found.setdefault(value.tag, {})[event.step] = float(tensor_util.make_ndarray(value.tensor))
    return found


def test_the_sidecar_evaluator_evaluates_each_checkpoint_as_tfdistx_evaluate_does_and_ends_with_the_run(
    tfdistx, tmp_path
):
    """Multiworker 2x1 and its evaluator (measured ~25 s for the run and ~9 s for
    the one `tfdistx evaluate` here): one evaluations.jsonl line per checkpoint,
    marked as the sidecar's, with exactly the metrics `tfdistx evaluate --step N`
    gives (the same one-device evaluation of the same checkpoint); eval/ scalars
    in tensorboard/eval; and no process of the run left at the end."""
    run = tfdistx("strategy=multiworker", "cluster=2x1", *QUICK, *EVERY_CHECKPOINT)
    assert run.returncode == 0, run
    lines = sidecar_lines(run.dir)
    assert [line["step"] for line in lines] == checkpoint_steps(run.dir) == [10, 20, 30, 40], lines
    assert all(line["checkpoint"] == f"ckpt-{line['step']}" for line in lines)
    assert processes_of(run.dir) == []  # the evaluator stopped by itself, and the launcher left nothing behind
    assert "training goes on without it" not in run.stderr and "did not finish" not in run.stderr, run
    assert "training is done; 4 checkpoint(s) evaluated" in (run.dir / "logs" / "evaluator-0.log").read_text()

    board = scalars(run.dir / "tensorboard" / "eval")
    assert sorted(board["eval/loss"]) == [10, 20, 30, 40]
    assert board["eval/accuracy"][40] == pytest.approx(lines[-1]["eval/accuracy"])

    evaluated = run_command(
        [
            sys.executable,
            "-m",
            "tfdistx",
            "evaluate",
            str(run.dir),
            "--step",
            "20",
            "strategy=one_device",
            "cluster=local",
        ],
        env=tfdistx_env(),
        timeout=300,
    )
    assert evaluated.returncode == 0, evaluated.stderr
    record = json.loads(evaluated.stdout)
    sidecar = next(line for line in lines if line["step"] == 20)
    assert {k: v for k, v in record.items()} == {
        k: v for k, v in sidecar.items() if k not in ("sidecar", "evaluated_at")
    }


@pytest.mark.system
def test_the_tfjob_with_an_evaluator_is_valid_for_the_operator(tmp_path):
    from test_kubernetes import CRD, unknown_fields  # the operator's CRD beside the checkout
    import jsonschema
    import yaml

    if not CRD.is_file():
        pytest.skip(f"the training operator's CRD is not beside the checkout ({CRD})")
    crd = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    overrides = ["strategy=multiworker", "cluster=2x1", "cluster.evaluator=true"]
    manifest = tfjob(
        layout_of(compose_ok(tmp_path / "run", *overrides)),
        PodOptions(tuple(overrides), "job", "tfdistx:test", volume="pvc:runs"),
    )
    jsonschema.validate(manifest, crd)
    assert unknown_fields(manifest, crd) == []


# -- slow: the evaluator's failure, TF_CONFIG's evaluator over a finished run, a TFJob's pods --


@pytest.mark.slow
def test_a_killed_evaluator_neither_stops_nor_fails_the_run(tmp_path):
    """SIGKILL to the evaluator of a ps1w2 run while it trains: one line says
    so, nothing is restarted, and the run finishes with exit 0. It leaves
    no scratch directory behind: it only reads, so it never made one."""
    run_dir, scratch = tmp_path / "run", tmp_path / "tmp"
    scratch.mkdir()
    args = [
        "strategy=parameter_server",
        "cluster=ps1w2",
        "cluster.evaluator=true",
        "trainer.steps=3000",
        "trainer.steps_per_loop=10",
        "trainer.log_every=100",
        "trainer.eval_every=0",
        "data.batch_size=32",
        "data.train_examples=512",
        "data.eval_examples=128",
        "checkpoint.every_steps=100",
    ]
    proc = start_tfdistx(args, run_dir, env={"TMPDIR": str(scratch)}, cwd=tmp_path, stderr=subprocess.PIPE)
    try:
        log = run_dir / "logs" / "evaluator-0.log"
        wait_until(
            lambda: log.is_file() and "sidecar evaluator: evaluating" in log.read_text(),
            180,
            "the evaluator's first evaluation",
            [proc],
        )
        pid = task_pid(run_dir, "evaluator")
        assert not (run_dir / "summary.json").exists()  # killed while the run trains
        os.kill(pid, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["step"] == 3000
    said = [line for line in stderr.splitlines() if "sidecar evaluator" in line and "exited" in line]
    assert said == [
        "tfdistx: the sidecar evaluator (evaluator:0) exited with code 137; training goes on without it "
        "(its log: logs/evaluator-0.log)"
    ], stderr[-3000:]
    assert "restart" not in stderr
    assert processes_of(run_dir) == []
    assert not list(scratch.glob("tfdistx-*evaluator*")), sorted(scratch.iterdir())


@pytest.mark.slow
def test_an_evaluator_placed_by_tf_config_evaluates_a_finished_runs_checkpoints_and_skips_a_damaged_one(
    tfdistx, tmp_path
):
    """The process a scheduler starts with TF_CONFIG task type "evaluator"
    (the operator's format: the cluster's addresses, which nobody answers
    here) talks to no task: it evaluates the run's checkpoints, skips one it
    cannot read with a line, stops after the final one and exits 0."""
    args = ["strategy=multiworker", "cluster=2x1", *QUICK, "checkpoint.every_steps=10", "checkpoint.max_to_keep=10"]
    trained = tfdistx(*args)
    assert trained.returncode == 0, trained
    data = next((trained.dir / "checkpoints").glob("ckpt-20.data-*"))
    data.write_bytes(data.read_bytes()[:16])  # cut short, as a full disk leaves a file
    tf_config = {
        "cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"], "evaluator": ["127.0.0.1:3"]},
        "task": {"type": "evaluator", "index": 0},
        "environment": "cloud",
    }
    started = time.monotonic()
    evaluator = tfdistx(*args, "cluster.evaluator=true", env={"TF_CONFIG": json.dumps(tf_config)})
    assert evaluator.returncode == 0, evaluator
    assert time.monotonic() - started < 120
    assert [line["step"] for line in sidecar_lines(trained.dir)] == [10, 30, 40]
    assert "ckpt-20 cannot be read" in evaluator.stdout + evaluator.stderr
    assert (
        json.loads((trained.dir / "summary.json").read_text())["process"] == "worker:0"
    )  # the chief's summary, untouched


@pytest.mark.slow
def test_a_tfjob_with_an_evaluator_pod_succeeds_and_its_evaluations_are_on_the_volume(tmp_path):
    """The exported TFJob's pods, run as the operator would (tests/simulated_pods.py,
    every pod's TF_CONFIG listing the evaluator): the job succeeds when the
    chief does, and the Evaluator pod has written its lines into the run dir,
    the final checkpoint's last: cleanPodPolicy Running deletes it (SIGTERM)
    once the chief is done, and it evaluates the newest checkpoint first."""
    from test_kubernetes import _can_simulate, run_tfjob

    why = _can_simulate()
    if why:
        pytest.skip(why)
    volume, events, logs = run_tfjob(
        tmp_path,
        "ev",
        [
            "strategy=parameter_server",
            "cluster=ps1w2",
            *QUICK,
            "trainer.steps=400",
            "checkpoint.every_steps=50",
            "checkpoint.max_to_keep=10",
            "cluster.evaluator=true",
        ],
        kill="none",
        when="never",
    )
    assert events[-1]["status"] == "Succeeded"
    assert "sidecar evaluator: evaluating" in logs["ev-evaluator-0"]
    lines = sidecar_lines(volume / "ev")
    assert lines and all(line["checkpoint"] == f"ckpt-{line['step']}" for line in lines)
    assert lines[-1]["step"] == 400, [line["step"] for line in lines]
