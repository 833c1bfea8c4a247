"""Partitions bounded everywhere: a cluster placed by hand under TF_CONFIG,
one task per node of the test bed (tests/nodes.py), and one node's link cut
for good mid-run (TCP neither resets nor answers). Whichever task was cut
off (a worker, a parameter server, the coordinator, the tf.data service's
dispatcher or data worker), every task of the cluster, the cut one
included, ends within its bound (cluster.peer_timeout, here 8 s, after the
cut, plus start-up and teardown) with its exit code, the survivors say in
one line whom they lost, and no process is left.

Every cell ends in exit 5 on every task: a fixed cluster under TF_CONFIG
stops, to be restarted from its newest checkpoint by whatever placed it
(an agent on every node re-forms instead: test_agents.py)."""

import json
import subprocess
import sys
import time

import pytest

from conftest import processes_of, tfdistx_env, wait_until
from nodes import Nodes, can_make_nodes

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not can_make_nodes(), reason="this machine does not allow unprivileged network namespaces"),
]

PORT = 23456  # every node its own namespace: the same port on each
PEER_TIMEOUT = 8
BOUND = 60  # seconds from the cut to the last task's end: peer_timeout, a probe's own wait, the teardown
RUN = [
    "data=synthetic",
    "model=mlp",
    "trainer.steps=100000",
    "trainer.steps_per_loop=10",
    "trainer.log_every=10",
    "trainer.eval_every=0",
    "checkpoint.every_steps=50",
    "checkpoint.export=false",
    "logger.tensorboard=false",
    "trainer.jit_compile=false",
    f"cluster.peer_timeout={PEER_TIMEOUT}",
    "cluster.startup_timeout=120",
    "cluster.launch=tf_config",
]

# strategy args, the jobs (job -> how many; one node each, in this order), the task whose node is cut,
# and each task's exit code (None: whatever it is, within the bound: a survivor that may finish first).
CELLS = {
    "multiworker, a worker cut off": (
        ["strategy=multiworker", "cluster=2x1"],
        {"worker": 2},
        "worker:1",
        {"worker:0": 5, "worker:1": 5},
    ),
    "multiworker, the chief cut off": (
        ["strategy=multiworker", "cluster=2x1"],
        {"worker": 2},
        "worker:0",
        {"worker:0": 5, "worker:1": 5},
    ),
    # Beside the training, never blocking it: the workers train to the end (400 steps). The evaluator needs no network
    # (it reads the checkpoints from the run directory, on this test bed's one disk): it ends with the training.
    "sidecar evaluator cut off": (
        ["strategy=multiworker", "cluster=2x1", "cluster.evaluator=true", "trainer.steps=400"],
        {"worker": 2, "evaluator": 1},
        "evaluator:0",
        {"worker:0": 0, "worker:1": 0, "evaluator:0": 0},
    ),
    # The coordinator waits on the cut worker's steps (TensorFlow schedules around a dead worker, not a silent one):
    # it stops, and its servers after it.
    "parameter server, a worker cut off": (
        ["strategy=parameter_server", "cluster=ps1w2"],
        {"chief": 1, "ps": 1, "worker": 2},
        "worker:1",
        {"chief": 5, "ps:0": 5, "worker:0": 5, "worker:1": 5},
    ),
    "parameter server, the ps cut off": (
        ["strategy=parameter_server", "cluster=ps1w2"],
        {"chief": 1, "ps": 1, "worker": 2},
        "ps:0",
        {"chief": 5, "ps:0": 5, "worker:0": 5, "worker:1": 5},
    ),
    "parameter server, the coordinator cut off": (
        ["strategy=parameter_server", "cluster=ps1w2"],
        {"chief": 1, "ps": 1, "worker": 2},
        "chief",
        {"chief": 5, "ps:0": 5, "worker:0": 5, "worker:1": 5},
    ),
    "tf.data service, the dispatcher cut off": (
        ["strategy=multiworker", "cluster=2x1", "data.service.workers=1"],
        {"worker": 2, "dispatcher": 1, "dataworker": 1},
        "dispatcher",
        {"worker:0": 5, "worker:1": 5, "dispatcher": 5, "dataworker:0": 5},
    ),
    "tf.data service, a data worker cut off": (
        ["strategy=multiworker", "cluster=2x1", "data.service.workers=1"],
        {"worker": 2, "dispatcher": 1, "dataworker": 1},
        "dataworker:0",
        {"worker:0": 5, "worker:1": 5, "dispatcher": 5, "dataworker:0": 5},
    ),
}


def name(job: str, index: int, jobs: dict) -> str:
    return job if job in ("chief", "dispatcher") and jobs[job] == 1 else f"{job}:{index}"


@pytest.mark.parametrize("cell", list(CELLS))
def test_a_partitioned_node_ends_every_task_within_its_bound(tmp_path, cell):
    strategy, jobs, cut, codes = CELLS[cell]
    places = [(job, index) for job, n in jobs.items() for index in range(n)]
    run_dir = tmp_path / "run"
    with Nodes(len(places)) as nodes:
        cluster = {}
        for n, (job, index) in enumerate(places, start=1):
            cluster.setdefault(job, []).append(f"{Nodes.address(n)}:{PORT}")
        tasks = {}
        for n, (job, index) in enumerate(places, start=1):
            env = tfdistx_env(TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": job, "index": index}}))
            out = open(tmp_path / f"{job}-{index}.txt", "w")
            tasks[name(job, index, jobs)] = (
                n,
                out.name,
                nodes.start(
                    n,
                    [sys.executable, "-m", "tfdistx", *RUN, *strategy, f"hydra.run.dir={run_dir}"],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                ),
            )
        procs = [proc for _, _, proc in tasks.values()]
        wait_until(lambda: _steps(run_dir) >= 20, 300, "training", procs)
        nodes.cut(tasks[cut][0])
        cut_at = time.monotonic()
        ended = {}
        while len(ended) < len(tasks) and time.monotonic() - cut_at < BOUND + 30:
            for task, (_, _, proc) in tasks.items():
                if task not in ended and proc.poll() is not None:
                    ended[task] = (proc.returncode, time.monotonic() - cut_at)
            time.sleep(0.2)
        outputs = {task: open(path).read() for task, (_, path, _) in tasks.items()}
        assert set(ended) == set(tasks), (ended, {t: o[-1500:] for t, o in outputs.items() if t not in ended})
        late = {task: seconds for task, (_, seconds) in ended.items() if seconds > BOUND}
        assert not late, (late, ended)
        got = {task: code for task, (code, _) in ended.items()}
        assert got == codes, (got, {t: o[-1500:] for t, o in outputs.items()})
        for task, output in outputs.items():
            if codes[task] == 5 and task != cut:
                assert "lost contact with" in output, (task, output[-2000:])
        named = cut if ":" in cut else f"{cut}:0"
        if set(got.values()) == {5}:  # a survivor says whom it lost
            assert any(f"lost contact with {named}" in output for task, output in outputs.items() if task != cut), (
                outputs
            )
    wait_until(lambda: not processes_of(run_dir), 30, "no process left")


def _steps(run_dir) -> int:
    metrics = run_dir / "metrics.jsonl"
    return len(metrics.read_text().splitlines()) * 10 if metrics.exists() else 0
