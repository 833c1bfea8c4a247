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
(an agent on every node re-forms instead: test_agents.py). A worker of a
parameter-server cluster cut at a checkpoint step, where the coordinator
waited with its interpreter held (cluster/held.py), has a cell of its own,
with the bound the docs give: cluster.peer_timeout + 10 s."""

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
    run_dir = tmp_path / "run"
    with Nodes(sum(jobs.values())) as nodes:
        tasks = start_cluster(nodes, tmp_path, [*RUN, *strategy], jobs)
        procs = [proc for _, _, proc in tasks.values()]
        wait_until(lambda: _steps(run_dir) >= 20, 300, "training", procs)
        nodes.cut(tasks[cut][0])
        ended, outputs = ends(tasks, time.monotonic(), BOUND)
        got = {task: code for task, (code, _) in ended.items()}
        assert got == codes, (got, {t: o[-1500:] for t, o in outputs.items()})
        for task, output in outputs.items():  # each says why it stopped: whom it lost, or what its chief told it
            if codes[task] == 5 and task != cut:
                assert "lost contact with" in output or "the training ended with exit code 5" in output, (
                    task,
                    output[-2000:],
                )
        named = cut if ":" in cut else f"{cut}:0"
        if set(got.values()) == {5}:  # a survivor says whom it lost
            assert any(f"lost contact with {named}" in output for task, output in outputs.items() if task != cut), (
                outputs
            )
    wait_until(lambda: not processes_of(run_dir), 30, "no process left")


def test_a_worker_cut_at_a_checkpoint_step_ends_every_parameter_server_task_within_its_bound(tmp_path):
    """ps1w2, worker:0's link cut as the chief logs a checkpoint step, before it saves (a callback holds each record
    a second: user_plugins.Pace). The coordinator's save traces a function that TensorFlow registers on every worker,
    waiting on the cut one with the interpreter held (cluster/held.py): it stopped there for good, without a line, and
    its ps and worker:1 with it. Every task now ends within cluster.peer_timeout + 10 s of the cut, in one line each:
    the coordinator naming the cut worker, the servers it told, the cut worker its lost coordinator."""
    run_dir, every = tmp_path / "run", 50
    jobs = {"chief": 1, "ps": 1, "worker": 2}
    args = [
        *RUN,
        "strategy=parameter_server",
        "cluster=ps1w2",
        f"checkpoint.every_steps={every}",
        "+callbacks.pace._target_=user_plugins.Pace",
        "+callbacks.pace.seconds=1",
    ]
    with Nodes(sum(jobs.values())) as nodes:
        tasks = start_cluster(nodes, tmp_path, args, jobs)
        procs = [proc for _, _, proc in tasks.values()]
        # after a first checkpoint: the save that waits is a later one (the first was before the cut)
        wait_until(lambda: _last_step(run_dir) >= 2 * every, 300, "a second checkpoint step logged", procs)
        nodes.cut(tasks["worker:0"][0])
        cut_at, logged = time.monotonic(), _last_step(run_dir)
        assert logged % every == 0 and not (run_dir / "checkpoints" / f"ckpt-{logged}.index").exists(), logged
        ended, outputs = ends(tasks, cut_at, PEER_TIMEOUT + 10)
        assert {task: code for task, (code, _) in ended.items()} == {task: 5 for task in tasks}, (ended, outputs)
        said = {task: [line for line in output.splitlines() if _said(line)] for task, output in outputs.items()}
        assert all(len(lines) == 1 for lines in said.values()), said
        assert said["chief"][0].startswith("tfdistx: lost contact with worker:0 of the cluster"), said
        assert said["worker:0"][0].startswith("tfdistx: lost contact with chief:0"), said
        for server in ("ps:0", "worker:1"):
            assert said[server][0].startswith("tfdistx: the training ended with exit code 5"), said
    wait_until(lambda: not processes_of(run_dir), 30, "no process left")


def start_cluster(nodes: Nodes, tmp_path, args: list, jobs: dict) -> dict:
    """One task per node (jobs: job -> how many, in this order), each started by hand with its TF_CONFIG: task name
    -> (its node, its output file, its process)."""
    places = [(job, index) for job, n in jobs.items() for index in range(n)]
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
                [sys.executable, "-m", "tfdistx", *args, f"hydra.run.dir={tmp_path / 'run'}"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            ),
        )
    return tasks


def ends(tasks: dict, cut_at: float, bound: float):
    """({task: (exit code, seconds from the cut)}, {task: its output}) once every task has ended, each within `bound`
    seconds of the cut (waited 30 s more, to say which did not)."""
    ended = {}
    while len(ended) < len(tasks) and time.monotonic() - cut_at < bound + 30:
        for task, (_, _, proc) in tasks.items():
            if task not in ended and proc.poll() is not None:
                ended[task] = (proc.returncode, time.monotonic() - cut_at)
        time.sleep(0.2)
    outputs = {task: open(path).read() for task, (_, path, _) in tasks.items()}
    assert set(ended) == set(tasks), (ended, {t: o[-1500:] for t, o in outputs.items() if t not in ended})
    late = {task: seconds for task, (_, seconds) in ended.items() if seconds > bound}
    assert not late, (late, ended)
    return ended, outputs


def _said(line: str) -> bool:
    """A line of tfdistx's own about how the task ended (not the exposure warning every placed task gives)."""
    return line.startswith("tfdistx: ") and not line.lower().startswith(("tfdistx: warning", "tfdistx: note:"))


def _last_step(run_dir) -> int:
    metrics = run_dir / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.exists() else []
    return json.loads(lines[-1])["step"] if lines and lines[-1].endswith("}") else 0


def _steps(run_dir) -> int:
    metrics = run_dir / "metrics.jsonl"
    return len(metrics.read_text().splitlines()) * 10 if metrics.exists() else 0
