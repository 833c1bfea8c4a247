"""The agents' rendezvous at scale (cluster.launch=agent, docs/elastic.md):
one keeper (launch/agent/round_keeper.py, in a process of its own) and 8 to
4,096 simulated agents (tests/simulated_agents.py: no TensorFlow, up to
1,024 agents a process, each its own real socket, beating at its real
interval), all started within one second, as Slurm and a JobSet start a
job's agents.

For each count: the time from the last agent's first beat to the round
formed at the keeper (every agent is in it: MAX of them, so join_grace
plays no part), and to the last agent told it is in it; each beat's round
trip, median and p99; the connection errors (refused, reset, timed out);
the keeper's CPU per second while the round runs (its process's user and
system time over `--steady` seconds, from /proc). Then 10% of the agents
(at least one) are killed at once (SIGKILL to their process): the time
to the next round, and how much of it is beyond lost_bound + join_grace
(the bounds the keeper waits by design: a silent node is lost after
lost_bound, and a round below MAX waits join_grace for more).

    python benchmarks/bench_rendezvous.py [--agents 8 16 64 256 1024 4096] [--against REV] [--quick]

`--against REV`: the keeper and agents' wire of git revision REV (a git
worktree of it, first on PYTHONPATH for its keeper), measured beside this
checkout's, alternating. The machine's load average is printed beside
each figure: on a busy machine every figure is worse.
"""

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from side_by_side import interruptible, say_estimate, worktree

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from simulated_agents import Simulation  # noqa: E402 (the tests' own simulated agents)

DEFAULT_AGENTS = (8, 16, 64, 256, 1024, 4096)
PATIENCE_SECONDS = 120  # for a round to form, beyond the bounds


def percentile(values, fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(fraction * len(ordered)) - 1)] if ordered else float("nan")


def wait_round(sim: Simulation, seconds: float, after: float = 0.0, workers: int = 0) -> float:
    """When the keeper formed the first round after `after` with at least `workers` workers (its clock), or nan
    if none did within `seconds`."""
    deadline = time.monotonic() + seconds

    def found():
        return [t for n, t in sorted(sim.rounds.items()) if t > after and sim.workers.get(n, 0) >= workers]

    while not found() and time.monotonic() < deadline and sim.keeper.poll() is None:
        time.sleep(0.05)
    return (found() or [float("nan")])[0]


def measure(agents: int, args, tree) -> dict:
    killed = max(1, round(agents / 10))
    with tempfile.TemporaryDirectory() as scratch:
        load_before = os.getloadavg()[0]
        with Simulation(
            agents,
            killed,
            low=max(1, agents - killed),
            scratch=Path(scratch),
            join_grace=args.join_grace,
            lost_bound=args.lost_bound,
            tree=tree,
        ) as sim:
            formed = wait_round(sim, PATIENCE_SECONDS, workers=agents)  # the first with every agent
            cpu = float("nan")
            if not math.isnan(formed):
                time.sleep(max(0.0, formed + 2.0 - time.monotonic()))  # every agent told, and running
                start, cpu_start = time.monotonic(), sim.keeper_cpu()
                time.sleep(args.steady)
                cpu = (sim.keeper_cpu() - cpu_start) / (time.monotonic() - start)
            next_round = float("nan")
            if not math.isnan(formed):
                killed_at = sim.kill()
                patience = args.lost_bound + args.join_grace + PATIENCE_SECONDS
                next_round = wait_round(sim, patience, after=killed_at) - killed_at
            figures = sim.figures()
            keeper_errors = sim.keeper_errors()
        load_after = os.getloadavg()[0]
    last_ready = max(figures["first_beat"].values())
    full = min((n for n, t in sim.rounds.items() if t == formed), default=None)
    told = [rounds[full] for rounds in figures["placed"].values() if full in rounds]
    latencies = figures["latencies"]
    return {
        "wire": sim.wire,
        "formed": formed - last_ready,
        "told": (max(told) - last_ready) if len(told) == agents else float("nan"),
        "told_count": len(told),
        "p50": statistics.median(latencies) if latencies else float("nan"),
        "p99": percentile(latencies, 0.99),
        "beats": len(latencies),
        "errors": sum(figures["errors"].values()),
        "error_kinds": dict(figures["errors"]),
        "cpu": cpu,
        "next": next_round,
        "beyond": next_round - args.lost_bound - args.join_grace,
        "load": (load_before, load_after),
        "workers": dict(sim.workers),
        "keeper_errors": keeper_errors,
    }


def show(label: str, agents: int, cell: dict) -> None:
    ms = lambda s: f"{1000 * s:.1f}"  # noqa: E731
    told = f"{cell['told']:.2f}" if cell["told_count"] == agents else f"{cell['told_count']}/{agents} told"
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(cell["error_kinds"].items()))
    rounds = " -> ".join(str(w) for _, w in sorted(cell["workers"].items()))
    if cell["keeper_errors"]:
        kinds = "; ".join(filter(None, [kinds, f"{cell['keeper_errors']} tracebacks from the keeper"]))
    print(
        f"{label:<22}{agents:>7}{cell['formed']:>10.2f}{told:>14}{ms(cell['p50']):>9}{ms(cell['p99']):>9}"
        f"{cell['errors']:>8}{100 * cell['cpu']:>9.1f}%{cell['next']:>9.2f}{cell['beyond']:>9.2f}"
        f"   load {cell['load'][0]:.1f}->{cell['load'][1]:.1f}; rounds of {rounds or 'none'} workers"
        f"{'; ' + kinds if kinds else ''}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, nargs="+", default=list(DEFAULT_AGENTS))
    parser.add_argument("--against", metavar="REV", help="also measure the keeper of git revision REV, alternating")
    parser.add_argument("--lost-bound", type=float, default=10.0, help="cluster.elastic.lost_bound (default 10)")
    parser.add_argument("--join-grace", type=float, default=10.0, help="cluster.elastic.join_grace (default 10)")
    parser.add_argument(
        "--steady", type=float, default=10.0, help="seconds the keeper's CPU is read while a round runs"
    )
    parser.add_argument("--quick", action="store_true", help="8 and 256 agents, short bounds: checks that it works")
    args = parser.parse_args()
    if args.quick:
        args.agents, args.lost_bound, args.join_grace, args.steady = [8, 256], 3.0, 1.0, 3.0
    trees = ["this checkout"] + ([args.against] if args.against else [])
    per_cell = 6 + args.steady + args.lost_bound + args.join_grace
    say_estimate(
        [(len(trees) * len(args.agents), per_cell, "a keeper and its agents, a round and the next")], args.quick
    )
    print(
        f"lost_bound {args.lost_bound:g} s, join_grace {args.join_grace:g} s; the agents start within 1 s; "
        f"10% killed at once; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start"
    )
    print(
        f"{'keeper':<22}{'agents':>7}{'formed s':>10}{'all told s':>14}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'errors':>8}{'CPU':>10}{'next s':>9}{'beyond':>9}"
    )
    with tempfile.TemporaryDirectory() as where:
        with worktree(args.against, Path(where) / "against") if args.against else _nothing() as other:
            for agents in args.agents:
                for label in trees:
                    tree = other if label != "this checkout" else None
                    cell = measure(agents, args, tree)
                    show(f"{label} ({cell['wire']})", agents, cell)
    print(
        "formed: from the last agent's first beat to the round at the keeper; all told: to the last agent that "
        "learned it is in it; CPU: the keeper's, % of one core while the round runs; next: from the kill to the "
        "next round; beyond: next less lost_bound and join_grace"
    )


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    interruptible(main)
