"""An agent on every node (cluster.launch=agent, launch/agent/node.py), on a
test bed of real network namespaces (tests/nodes.py): each node its own
address on a bridge, its own agent started on its own, no tfdistx process
above them, the run directory shared as a cluster's file system is. A node
is lost by cutting its link (a partition: nothing resets, nothing answers)
or by killing its agent."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import QUICK, metric_lines, processes_of, steps_logged, tfdistx_env, wait_until
from engine_helpers import train
from nodes import Nodes, can_make_nodes
from test_elastic import ARGS, BATCH, EVERY, STEPS, rounds, steps_said_in_round, workers
from test_unit_topology_resume import model_values, seen_counts
from test_data_service import BATCH as SERVICE_BATCH, STEPS as SERVICE_STEPS, probe_args as service_probe_args
from test_data_split import seen_counts as service_seen_counts

pytestmark = pytest.mark.skipif(
    not can_make_nodes(), reason="this machine does not allow unprivileged network namespaces"
)

STORE_PORT = 29555
BOUNDS = ["cluster.elastic.join_grace=2", "cluster.elastic.lost_bound=3", "cluster.elastic.below_min_timeout=60"]


def start_agents(nodes: Nodes, tmp_path, count: int, *args, base=ARGS, strategy="multiworker") -> list:
    """An agent on each of nodes 1..count, the same command on each (`base`: the probe's run, paced); node 1 keeps
    the rounds."""
    command = [
        sys.executable,
        "-m",
        "tfdistx",
        *base,
        f"strategy={strategy}",
        "cluster.launch=agent",
        f"cluster.agent.store={Nodes.address(1)}:{STORE_PORT}",
        *BOUNDS,
        "+callbacks.pace._target_=user_plugins.Pace",
        "+callbacks.pace.seconds=0.5",
        *args,
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    return [
        nodes.start(
            n, command, env=tfdistx_env(), stdout=open(tmp_path / f"node{n}.txt", "w"), stderr=subprocess.STDOUT
        )
        for n in range(1, count + 1)
    ]


def worker_at(round_: dict, n: int) -> int:
    """The index of node n's worker in a round of the rounds file."""
    return next(
        int(task.partition(":")[2]) for task, address in round_["members"].items() if address == Nodes.address(n)
    )


def output(tmp_path, n: int) -> str:
    return (tmp_path / f"node{n}.txt").read_text()


def all_ended(agents, timeout: float, tmp_path) -> None:
    try:
        for agent in agents:
            agent.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        for agent in agents:
            os.killpg(agent.pid, signal.SIGKILL)
        raise AssertionError(
            "an agent did not end: " + "\n".join(output(tmp_path, n)[-2000:] for n in range(1, len(agents) + 1))
        )


@pytest.fixture
def nodes():
    with Nodes(4) as made:
        yield made


def test_agents_on_four_nodes_lose_a_partitioned_node_go_on_and_grow_back(nodes, tmp_path):
    """2:4 multiworker across four nodes: a node's link is cut mid-run (for
    good, as far as the run can tell; not worker:0's, which must stay where
    it is), the three others form a round and go on from the newest
    checkpoint; the link comes back, its agent joins again and the run grows
    to four. Every step logged once, the examples trained (counted by the
    probe model) and the final weights those of an uninterrupted run."""
    run_dir = tmp_path / "run"
    agents = start_agents(nodes, tmp_path, 4, "cluster.workers=2:4")
    wait_until(lambda: max(steps_said_in_round(run_dir, 1), default=0) >= 2 * EVERY, 300, "round 1 trains", agents)
    # The agents are numbered in the order they reached the rendezvous: worker:0 may be on any node.
    cut = 4 if rounds(run_dir)[0]["members"]["worker:0"] != Nodes.address(4) else 3
    nodes.cut(cut)
    wait_until(lambda: steps_said_in_round(run_dir, 2), 300, "round 2 trains", agents)
    nodes.join(cut)
    all_ended(agents, 300, tmp_path)
    assert [agent.returncode for agent in agents] == [0, 0, 0, 0], [output(tmp_path, n)[-3000:] for n in range(1, 5)]

    said = rounds(run_dir)
    assert [workers(r["members"]) for r in said] == [4, 3, 4], said
    lost = Nodes.address(cut)
    assert (
        re.fullmatch(rf"lost worker:\d at {re.escape(lost)}", said[1]["reason"])
        and said[2]["reason"] == f"{lost} joined"
    ), said
    assert lost not in said[1]["members"].values() and said[0]["members"]["worker:0"] == said[1]["members"]["worker:0"]
    log = (run_dir / "tfdistx.log").read_text()
    assert re.search(
        rf"^tfdistx: round 2: 4 -> 3 workers \(lost worker:\d at {re.escape(lost)}\), resuming from step \d+$",
        log,
        re.M,
    ), log
    assert "no answer from the rendezvous" in output(tmp_path, cut), output(tmp_path, cut)[
        -3000:
    ]  # the cut node said why it stopped
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["step"] == STEPS and summary["workers"] == 4 and summary["rounds"] == said
    assert steps_logged(run_dir) == list(range(EVERY, STEPS + 1, EVERY))  # each step once, none lost

    whole = train(
        tmp_path / "whole", *ARGS, "strategy=one_device", sizes=[]
    )  # one example order on every synchronous topology
    seen = seen_counts(run_dir)
    assert seen.sum() == STEPS * BATCH
    np.testing.assert_array_equal(seen, seen_counts(whole.dir))
    for mine, reference in zip(model_values(run_dir, 1), model_values(whole.dir, 1)):
        np.testing.assert_allclose(mine, reference, rtol=1e-4, atol=1e-6)
    wait_until(lambda: not processes_of(run_dir), 30, "every agent and task gone")


def test_parameter_servers_under_agents_lose_a_partitioned_worker_node_and_grow_back(nodes, tmp_path):
    """ps1w3 at 2:3 across three nodes: the chief and the ps run on the node
    that keeps the rounds (node 1), a worker on each node. A worker node's
    link is cut mid-run: the two others form a round and go on from the
    newest checkpoint; the link comes back and the run grows to three
    workers again. Every step logged once and trained on one batch once
    (asynchronous: which worker trains a step is timing's, so the examples
    are counted in total), every agent exits 0, nothing left running."""
    run_dir = tmp_path / "run"
    agents = start_agents(nodes, tmp_path, 3, "cluster=ps1w3", "cluster.workers=2:3", strategy="parameter_server")
    wait_until(lambda: max(steps_said_in_round(run_dir, 1), default=0) >= 2 * EVERY, 300, "round 1 trains", agents)
    nodes.cut(3)
    wait_until(lambda: steps_said_in_round(run_dir, 2), 300, "round 2 trains", agents)
    nodes.join(3)
    all_ended(agents, 300, tmp_path)
    assert [agent.returncode for agent in agents] == [0, 0, 0], [output(tmp_path, n)[-3000:] for n in range(1, 4)]

    said = rounds(run_dir)
    assert [workers(r["members"]) for r in said] == [3, 2, 3], said
    assert all(r["members"]["chief:0"] == r["members"]["ps:0"] == Nodes.address(1) for r in said), said
    lost = Nodes.address(3)
    assert (
        re.fullmatch(rf"lost worker:\d at {re.escape(lost)}", said[1]["reason"])
        and said[2]["reason"] == f"{lost} joined"
    ), said
    assert "no answer from the rendezvous" in output(tmp_path, 3), output(tmp_path, 3)[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["step"] == STEPS and summary["rounds"] == said
    assert steps_logged(run_dir) == list(range(EVERY, STEPS + 1, EVERY))  # each step once, none lost
    assert seen_counts(run_dir).sum() == STEPS * BATCH  # every step one batch, once
    wait_until(lambda: not processes_of(run_dir), 30, "every agent and task gone")


@pytest.mark.slow  # the default run's test above loses a node the same way; this one is the fixed size's wait
def test_a_fixed_run_whose_node_is_cut_off_waits_for_it_and_resumes_bitwise(nodes, tmp_path):
    """2x1 (not elastic) on two nodes: node 2 is cut off mid-run; node 1
    cannot train alone, so no round forms until node 2 is back, and then the
    run resumes from the newest checkpoint and finishes: every step once, and
    the weights bit for bit those of a local 2x1 run never interrupted."""
    run_dir = tmp_path / "run"
    agents = start_agents(nodes, tmp_path, 2, "cluster=2x1")
    wait_until(lambda: max(steps_said_in_round(run_dir, 1), default=0) >= 2 * EVERY, 300, "round 1 trains", agents)
    nodes.cut(2)
    wait_until(
        lambda: (
            "tfdistx: round 1: this node" in output(tmp_path, 2)
            and "no answer from the rendezvous" in output(tmp_path, 2)
        ),
        120,
        "node 2 stops its task",
        agents,
    )
    nodes.join(2)
    all_ended(agents, 300, tmp_path)
    assert [agent.returncode for agent in agents] == [0, 0], [output(tmp_path, n)[-3000:] for n in (1, 2)]
    said = rounds(run_dir)
    assert [workers(r["members"]) for r in said] == [2, 2] and said[1]["first_step"] > 1, said
    assert said[1]["reason"] == f"lost worker:{worker_at(said[0], 2)} at {Nodes.address(2)}, back", said
    assert steps_logged(run_dir) == list(range(EVERY, STEPS + 1, EVERY))
    assert seen_counts(run_dir).sum() == STEPS * BATCH

    local = tmp_path / "local"
    done = subprocess.run(
        [sys.executable, "-m", "tfdistx", *ARGS, "strategy=multiworker", "cluster=2x1", f"hydra.run.dir={local}"],
        env=tfdistx_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for mine, reference in zip(model_values(run_dir, 1), model_values(local, 1)):
        np.testing.assert_array_equal(mine, reference)
    wait_until(lambda: not processes_of(run_dir), 30, "every agent and task gone")


# the keeper's node runs the servers as under parameter servers (the default run's test above); the service's claim is
# test_data_service.py's
@pytest.mark.slow
def test_a_fixed_run_of_agents_on_the_tf_data_service_runs_it_on_the_stores_node(nodes, tmp_path):
    """2x1 on two nodes with data.service.workers=1: the keeper's node runs
    the dispatcher and the data worker beside its worker, both trainers read
    from them, and each example of the epoch is trained at most once."""
    run_dir = tmp_path / "run"
    agents = start_agents(nodes, tmp_path, 2, "cluster=2x1", "data.service.workers=1", base=service_probe_args())
    all_ended(agents, 300, tmp_path)
    assert [agent.returncode for agent in agents] == [0, 0], [output(tmp_path, n)[-3000:] for n in (1, 2)]
    said = rounds(run_dir)
    assert len(said) == 1 and said[0]["members"]["dispatcher:0"] == said[0]["members"]["dataworker:0"] == Nodes.address(
        1
    ), said
    assert json.loads((run_dir / "summary.json").read_text())["step"] == SERVICE_STEPS
    seen = service_seen_counts(run_dir)
    assert seen.sum() == SERVICE_STEPS * SERVICE_BATCH and seen.max() <= 1
    wait_until(lambda: not processes_of(run_dir), 30, "every agent and task gone")


@pytest.mark.slow  # the default run's test above loses a node by a cut link; this one, by its own preemption
def test_a_preempted_node_checkpoints_with_the_others_who_go_on_without_it(nodes, tmp_path):
    """2:3 on three nodes: SIGTERM to node 3's agent (its node preempted) checkpoints every worker at one
    step (42), node 3's agent leaves with 42, and the two others form the next round from that checkpoint
    and finish: every step logged once, steps x batch examples trained."""
    run_dir = tmp_path / "run"
    agents = start_agents(nodes, tmp_path, 3, "cluster.workers=2:3", "data.batch_size=24")
    wait_until(lambda: max(steps_said_in_round(run_dir, 1), default=0) >= 2 * EVERY, 300, "round 1 trains", agents)
    agents[2].send_signal(signal.SIGTERM)
    all_ended(agents, 300, tmp_path)
    assert [agent.returncode for agent in agents] == [0, 0, 42], [output(tmp_path, n)[-3000:] for n in range(1, 4)]
    said = rounds(run_dir)
    assert [workers(r["members"]) for r in said] == [3, 2] and Nodes.address(3) not in said[1]["members"].values(), said
    assert "preempted at step" in output(tmp_path, 3) and said[1]["first_step"] > 1
    assert steps_logged(run_dir) == list(range(EVERY, STEPS + 1, EVERY))
    assert seen_counts(run_dir).sum() == STEPS * BATCH
    wait_until(lambda: not processes_of(run_dir), 30, "every agent and task gone")


@pytest.mark.slow  # the local launcher's twin runs by default (test_fault_tolerance.py): the same supervisor decides
def test_under_agents_a_killed_peer_costs_a_slow_models_run_at_most_one_loop(nodes, tmp_path):
    """2x1 on two nodes, a model whose every step takes 0.1 s (user_plugins.slow_model), checkpoints only at the end:
    worker:1's process SIGKILLed while the chief is slower than the round's teardown (held stopped 3 s). The keeper
    closes the round for both nodes; the chief's agent lets its call fail and the chief save the last loop boundary
    before it stops the round, and the restart resumes from that boundary, not from step 0."""
    run_dir = tmp_path / "run"
    agents = start_agents(
        nodes,
        tmp_path,
        2,
        "cluster=2x1",
        "model._target_=user_plugins.slow_model",
        "trainer.steps_per_loop=5",
        "trainer.log_every=5",
        "checkpoint.every_steps=0",
        "cluster.max_restarts=1",
        base=QUICK,
    )
    wait_until(lambda: metric_lines(run_dir) >= 2, 300, "two loops", agents)
    (chief,), (peer,) = processes_of(run_dir, "worker:0"), processes_of(run_dir, "worker:1")
    os.kill(chief, signal.SIGSTOP)
    last_logged = steps_logged(run_dir)[-1]  # the chief writes the metrics: none can come while it is stopped
    os.kill(peer, signal.SIGKILL)
    time.sleep(3)  # not a wait for anything: a chief slower than the teardown's second is what is tested
    with contextlib.suppress(ProcessLookupError):  # stopped with the round, the chief is gone
        os.kill(chief, signal.SIGCONT)
    all_ended(agents, 300, tmp_path)
    assert [agent.returncode for agent in agents] == [0, 0], [output(tmp_path, n)[-3000:] for n in (1, 2)]
    said = rounds(run_dir)
    assert [r["reason"] for r in said] == ["started", "restart after exit code 137"], said
    # at most one loop lost: the one the loss cut short, or the one just logged (the peer lost in the all-reduce that
    # follows a loop's line, before the chief kept that boundary)
    assert said[1]["first_step"] - 1 >= last_logged - 5, (said, last_logged)
    assert steps_logged(run_dir) == list(range(5, 41, 5))
    wait_until(lambda: not processes_of(run_dir), 30, "every agent and task gone")


def test_a_failing_worker_restarts_the_round_from_every_agents_budget_and_then_the_run_stops_with_its_code(
    nodes, tmp_path
):
    """2x1 on two nodes, the worker:1 of every round exiting 7 at its start (user_plugins.crashing_on_worker_1):
    its node's failure closes the round for both agents, which start it again once (cluster.max_restarts=1),
    then both stop with its code, in a bounded time, leaving no process, and the run marked failed."""
    run_dir = tmp_path / "run"
    agents = start_agents(
        nodes,
        tmp_path,
        2,
        "cluster=2x1",
        "cluster.max_restarts=1",
        "data._target_=user_plugins.crashing_on_worker_1",
        base=QUICK,
    )
    all_ended(agents, 180, tmp_path)
    assert [agent.returncode for agent in agents] == [7, 7], [output(tmp_path, n)[-3000:] for n in (1, 2)]
    said = rounds(run_dir)
    assert [r["reason"] for r in said] == ["started", "restart after exit code 7"] and said[0]["members"] == said[1][
        "members"
    ], said
    assert all(
        "giving up: the cluster stopped after 1 restart(s) (cluster.max_restarts=1); last exit code 7"
        in output(tmp_path, n)
        for n in (1, 2)
    ), [output(tmp_path, n)[-2000:] for n in (1, 2)]
    assert (run_dir / "FAILED").read_text() == "exit code 7\n"  # as `tfdistx report` shows a failed run
    wait_until(lambda: not processes_of(run_dir), 30, "every agent and task gone")


# the sidecar's evaluations are the default run's under the local launcher (test_sidecar_evaluator.py); here, its place
@pytest.mark.slow
def test_a_fixed_run_of_agents_runs_the_sidecar_evaluator_on_the_stores_node(nodes, tmp_path):
    """2x1 on two nodes with cluster.evaluator=true: the agent that keeps the
    rounds (node 1, the store's) runs the sidecar evaluator beside its worker,
    the other agent none; one evaluations.jsonl line per checkpoint, marked as
    the sidecar's; both agents exit 0 and leave no process."""
    from test_sidecar_evaluator import EVERY_CHECKPOINT, checkpoint_steps, sidecar_lines

    run_dir = tmp_path / "run"
    agents = start_agents(nodes, tmp_path, 2, "cluster=2x1", *EVERY_CHECKPOINT, base=QUICK)
    all_ended(agents, 300, tmp_path)
    assert [agent.returncode for agent in agents] == [0, 0], [output(tmp_path, n)[-3000:] for n in (1, 2)]
    lines = sidecar_lines(run_dir)
    assert [line["step"] for line in lines] == checkpoint_steps(run_dir) == [10, 20, 30, 40], lines
    assert "and the sidecar evaluator" in output(tmp_path, 1) and "sidecar evaluator" not in output(tmp_path, 2)
    evaluator_log = run_dir / "logs" / f"node-{Nodes.address(1)}" / "evaluator-0.log"
    assert "training is done; 4 checkpoint(s) evaluated" in evaluator_log.read_text()
    wait_until(lambda: not processes_of(run_dir), 30, "every agent and task gone")
