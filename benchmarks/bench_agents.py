"""An agent on every node (cluster.launch=agent, docs/elastic.md): the
pause from a node's partition to the first step of the round without it,
and from its return to the first step of the round with it, at 2 and 4
nodes, beside the same pauses of the local launcher's elastic rounds
(bench_elastic.py) in the same run.

Each node is a network namespace of the test bed (tests/nodes.py: its own
address on a bridge), its agent started on its own; node 1 keeps the
rounds. A multiworker run of the default MLP (784-128-10) on synthetic
data, `cluster.workers=MIN:MAX` (MIN = MAX / 2), one step a loop and a log
line a step. Once round 1 has trained, the last node's link is set down
(TCP neither resets nor answers); once round 2 has trained, it is set up
again. Each pause is wall-clock, from that change to the chief's first step
line of the next round (polled in the run's tfdistx.log), split at the
keeper's `round N:` line: before it, noticing (the partition: no beat for
cluster.elastic.lost_bound=3; the return: beating lost_bound without a gap,
then the checkpoint at the next loop boundary); after it, the new round's
start (its processes, TensorFlow, the cluster, the restore, the first step).
The local launcher's column is measured with lost_bound=1 (it reads a host
list, no beats to miss): the difference in noticing is mostly that bound.

    python benchmarks/bench_agents.py [--workers 2 4] [--repeats 3] [--quick]

`--quick`: 2 nodes, one repeat (about a minute).
"""

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_elastic import measure as measure_local, pause_arguments, pause_cells, said, steps_in_round
from side_by_side import interruptible, say_estimate, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from nodes import Nodes, can_make_nodes  # noqa: E402 (the tests' own bed of nodes)

STORE_PORT = 29555


def measure(workers: int) -> dict:
    """One run's pauses across `workers` namespace nodes, in seconds:
    lost and back, each (to the round line, to the first step)."""
    with tempfile.TemporaryDirectory() as scratch, Nodes(workers) as nodes:
        run_dir = Path(scratch, "run")
        cmd = [
            sys.executable,
            "-m",
            "tfdistx",
            "strategy=multiworker",
            f"cluster.workers={workers // 2}:{workers}",
            "cluster.launch=agent",
            f"cluster.agent.store={Nodes.address(1)}:{STORE_PORT}",
            "cluster.elastic.join_grace=1",
            "cluster.elastic.lost_bound=3",
            "data=synthetic",
            "data.batch_size=48",
            "trainer.steps=1000000",
            "trainer.steps_per_loop=1",
            "trainer.log_every=1",
            "trainer.eval_every=0",
            "checkpoint.every_steps=50",
            "checkpoint.export=false",
            "logger.tensorboard=false",
            f"hydra.run.dir={run_dir}",
        ]
        env = {**os.environ, "TMPDIR": scratch}  # TensorFlow's autograph files: removed with the scratch dir
        agents = [
            nodes.start(n, cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
            for n in range(1, workers + 1)
        ]
        keeper = agents[0]
        wait_for(lambda: steps_in_round(run_dir, 1) >= 5, keeper, "round 1's fifth step")
        lost = time.monotonic()
        nodes.cut(workers)
        lost_said = wait_for(lambda: said(run_dir, 2), keeper, "round 2's line")
        lost_trains = wait_for(lambda: steps_in_round(run_dir, 2) >= 1, keeper, "round 2's first step")
        wait_for(lambda: steps_in_round(run_dir, 2) >= 5, keeper, "round 2's fifth step")
        back = time.monotonic()
        nodes.join(workers)
        back_said = wait_for(lambda: said(run_dir, 3), keeper, "round 3's line")
        back_trains = wait_for(lambda: steps_in_round(run_dir, 3) >= 1, keeper, "round 3's first step")
        for agent in agents:  # every node preempted: each checkpoints and leaves (exit 42)
            agent.send_signal(signal.SIGTERM)
        for agent in agents:
            agent.wait(timeout=120)
    return {"lost": (lost_said - lost, lost_trains - lost_said), "back": (back_said - back, back_trains - back_said)}


def main() -> None:
    args = pause_arguments(__doc__.splitlines()[0], "nodes")
    if not can_make_nodes():
        sys.exit("this machine does not allow unprivileged network namespaces: no nodes to run agents on")
    say_estimate(
        [
            (
                2 * args.repeats * len(args.workers),
                40 + 5 * max(args.workers),
                "a run that loses a node and gets it back",
            )
        ],
        quick=args.quick,
    )
    load = os.getloadavg()[0]
    results = {}
    for workers in args.workers:
        for _ in range(args.repeats):  # alternating, so that the machine's load falls on both alike
            results.setdefault(("agents, link cut", workers), []).append(measure(workers))
            results.setdefault(("local launcher", workers), []).append(measure_local(workers))
    print(
        f"pauses of a lost and a returning node, seconds, median of {args.repeats} "
        f"(1-min load average {load:.1f} before, {os.getloadavg()[0]:.1f} after)"
    )
    print(
        f"{'':<20}{'workers':<14}{'loss -> round':>15}{'round -> step':>15}{'return -> round':>17}{'round -> step':>15}"
    )
    for (how, workers), runs in results.items():
        cells = pause_cells(runs)
        print(
            f"{how:<20}{f'{workers} -> {workers - 1} -> {workers}':<14}{cells[0]:>15.1f}{cells[1]:>15.1f}"
            f"{cells[2]:>17.1f}{cells[3]:>15.1f}"
        )


if __name__ == "__main__":
    interruptible(main)
