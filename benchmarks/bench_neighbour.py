"""What a local cluster leaves to the rest of the machine: the CPU share of
a busy neighbour (a shell loop in a session of its own, as a program started
from another terminal is) beside a training multiworker 2x1 cluster.

Linux's autogroup scheduler (on in most distributions' kernels:
/proc/sys/kernel/sched_autogroup_enabled) shares the cores fairly between
sessions first, then between the processes of each session. A cluster whose
every task is in a session of its own so takes one share per task; in the
command's session, one share for the whole run. On 2 cores beside a 2x1
cluster, a neighbour's fair share is then 100% of a core (against 67% when
the two tasks each count as a session).

`cluster.nice=N` moves the cluster into a session of its own whose autogroup
is niced: beside it, the neighbour gets the cores first; alone, the cluster
trains as fast (cluster/processes.yield_the_cores).

Each sample: the default MLP on synthetic data, trained until the run's
first record plus 2 s; its steps/s alone over the next 6 s (from
metrics.jsonl's records); then the neighbour starts, and 3 s later the CPU
time of the neighbour and of the cluster's processes (the launcher's tree)
is read from /proc over 6 s. The run is then stopped with SIGTERM (it
checkpoints and exits 42). Contenders alternate (side_by_side.table).

    python benchmarks/bench_neighbour.py [--repeats 3] [--against REV | --nice N] [--quick]

`--against REV`: this checkout beside tfdistx at git revision REV (a git
worktree of REV in a temporary directory, first on PYTHONPATH for its runs).
`--nice N`: this checkout's cluster at cluster.nice=0 beside the same at N.
`--busy N`: the neighbour is N busy loops in its session (default 1). One
loop wants one core, which on 2 cores it gets beside any cluster; a
neighbour that wants every core (`--busy 2` here: a test suite, a build)
shows what `cluster.nice` changes.
"""

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from side_by_side import (
    PATIENCE_SECONDS,
    descendants,
    interruptible,
    killed_if_left,
    replay,
    say_estimate,
    table,
    tree_env,
    wait_for,
    worktree,
)

HERE = Path(__file__).resolve().parent
RUN = [
    "strategy=multiworker",
    "cluster=2x1",
    "data=synthetic",
    "trainer.steps=100000000",
    "trainer.log_every=100",
    "logger.tensorboard=false",
    "checkpoint.every_steps=0",
    "checkpoint.export=false",
]
SETTLE, WARM, WINDOW = 2.0, 3.0, 6.0  # after the first record; after the neighbour starts; the measured window (s)
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_ticks(pids) -> int:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, IndexError, ValueError):
            pass
    return total


def last_step(metrics: Path) -> int:
    lines = metrics.read_bytes().splitlines()
    return json.loads(lines[-1])["step"] if lines else 0


def sample(tree: Path, overrides=(), busy: int = 1) -> dict:
    """One run beside one neighbour: {"alone": steps/s before the
    neighbour, "neighbour": % of a core, "cluster": % of a core}."""
    with tempfile.TemporaryDirectory() as scratch:
        run_dir = Path(scratch, "run")
        proc = subprocess.Popen(
            [sys.executable, "-m", "tfdistx", *RUN, *overrides, f"hydra.run.dir={run_dir}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=tree_env(scratch, tree),
            cwd=scratch,
        )
        with killed_if_left(proc):
            metrics = run_dir / "metrics.jsonl"
            wait_for(lambda: metrics.exists() and metrics.stat().st_size > 0, proc, "the first record")
            time.sleep(SETTLE)
            first = time.monotonic(), last_step(metrics)
            time.sleep(WINDOW)
            alone = (last_step(metrics) - first[1]) / (time.monotonic() - first[0])
            loops = " ".join(["(while :; do :; done) &"] * (busy - 1) + ["while :; do :; done"])
            neighbour = subprocess.Popen(["sh", "-c", loops], start_new_session=True)
            with killed_if_left(neighbour):
                time.sleep(WARM)
                cluster, busy_pids = descendants(proc.pid), descendants(neighbour.pid)
                before = cpu_ticks(busy_pids), cpu_ticks(cluster)
                time.sleep(WINDOW)
                after = cpu_ticks(busy_pids), cpu_ticks(cluster)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=PATIENCE_SECONDS)
    share = lambda i: 100.0 * (after[i] - before[i]) / TICKS / WINDOW  # noqa: E731
    return {"alone": alone, "neighbour": share(0), "cluster": share(1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    against = parser.add_mutually_exclusive_group()  # one contender beside this checkout
    against.add_argument(
        "--against", metavar="REV", help="this checkout against tfdistx at git revision REV, side by side"
    )
    against.add_argument(
        "--nice", type=int, metavar="N", help="the cluster at cluster.nice=0 against cluster.nice=N, side by side"
    )
    parser.add_argument("--busy", type=int, default=1, metavar="N", help="the neighbour: N busy loops (default 1)")
    parser.add_argument("--quick", action="store_true", help="one repeat")
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    autogroup = Path("/proc/sys/kernel/sched_autogroup_enabled")
    print(
        f"{os.cpu_count()} cores; autogroup scheduler: "
        f"{autogroup.read_text().strip() if autogroup.exists() else 'absent'}"
    )
    with tempfile.TemporaryDirectory() as where:
        trees = {"this checkout": (HERE.parent, [])}
        if args.against:
            trees[f"@ {args.against}"] = (Path(where, "tree"), [])
        elif args.nice:
            trees[f"cluster.nice={args.nice}"] = (HERE.parent, [f"cluster.nice={args.nice}"])
        say_estimate([(repeats * len(trees), 25, "a 2x1 run beside a neighbour")], quick=args.quick)
        with worktree(args.against, trees[f"@ {args.against}"][0]) if args.against else contextlib.nullcontext():
            measured = {name: [] for name in trees}

            def measure(name):
                def once():
                    measured[name].append(sample(*trees[name], busy=args.busy))
                    return measured[name][-1]["neighbour"]

                return once

            ratio = lambda medians, name: medians[name] / medians["this checkout"]
            table(
                {name: measure(name) for name in trees},
                repeats,
                "a busy neighbour's CPU beside a 2x1 cluster",
                "/ this checkout",
                ratio,
                unit="% of a core",
            )
            table(
                replay(measured, "cluster"),
                repeats,
                "the cluster's CPU beside it",
                "/ this checkout",
                ratio,
                unit="% of a core",
            )
            table(
                replay(measured, "alone"),
                repeats,
                "the cluster's steps/s alone, before the neighbour",
                "/ this checkout",
                ratio,
                unit="steps/s",
            )


if __name__ == "__main__":
    interruptible(main)
