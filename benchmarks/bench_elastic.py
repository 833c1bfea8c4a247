"""Elastic training's pauses (docs/elastic.md): from a host's loss to the
first step of the round without it, and from its return to the first step
of the round with it, at 2 and 4 workers.

A multiworker run of the default MLP on synthetic data, `cluster.workers=MIN:MAX`
(MIN = MAX / 2) on MAX loopback hosts listed in a file, one step a loop and
a log line a step. Once round 1 has trained, the last host is taken out of
the list and its worker killed; once round 2 has trained, it is listed
again. Each pause is wall-clock, from that edit to the chief's first step
line of the next round (polled in the run's tfdistx.log every 50 ms), and
split at the launcher's `round N:` line: before it, the wait for the
launcher to notice (the loss: its survivors stopping, then
cluster.elastic.lost_bound=1; the return: reading the list, then the
checkpoint at the next loop boundary and the tasks leaving); after it, the
new round's start (processes, TensorFlow, the cluster, the restore, the
first step). The run is then stopped with SIGTERM (it checkpoints and exits 42).

    python benchmarks/bench_elastic.py [--workers 2 4] [--repeats 3] [--quick]

`--quick`: 2 workers, one repeat (about 30 s).
"""

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from side_by_side import interruptible, killed_if_left, log_of, say_estimate, task_pid, wait_for


def measure(workers: int) -> dict:
    """One run's pauses, in seconds: lost (edit -> round line -> first step), back (the same)."""
    hosts = [f"127.0.0.{n}" for n in range(1, workers + 1)]
    with tempfile.TemporaryDirectory() as scratch:
        listed, run_dir = Path(scratch, "hosts"), Path(scratch, "run")
        listed.write_text("\n".join(hosts) + "\n")
        cmd = [
            sys.executable,
            "-m",
            "tfdistx",
            "strategy=multiworker",
            f"cluster.workers={workers // 2}:{workers}",
            f"cluster.elastic.hosts={listed}",
            "cluster.elastic.join_grace=1",
            "cluster.elastic.lost_bound=1",
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
        # TensorFlow's autograph files go to TMPDIR, and a killed
        # task removes none: in the scratch dir, removed with it.
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "TMPDIR": scratch},
        )
        with killed_if_left(proc):
            wait_for(lambda: steps_in_round(run_dir, 1) >= 5, proc, "round 1's fifth step")
            lost = time.monotonic()
            listed.write_text("\n".join(hosts[:-1]) + "\n")
            os.kill(pid_on(hosts[-1], proc.pid, run_dir), signal.SIGKILL)
            lost_said = wait_for(lambda: said(run_dir, 2), proc, "round 2's line")
            lost_trains = wait_for(lambda: steps_in_round(run_dir, 2) >= 1, proc, "round 2's first step")
            wait_for(lambda: steps_in_round(run_dir, 2) >= 5, proc, "round 2's fifth step")
            back = time.monotonic()
            listed.write_text("\n".join(hosts) + "\n")
            back_said = wait_for(lambda: said(run_dir, 3), proc, "round 3's line")
            back_trains = wait_for(lambda: steps_in_round(run_dir, 3) >= 1, proc, "round 3's first step")
            proc.send_signal(signal.SIGTERM)  # checkpoint and leave (exit 42)
            proc.wait(timeout=120)
    return {"lost": (lost_said - lost, lost_trains - lost_said), "back": (back_said - back, back_trains - back_said)}


def said(run_dir: Path, number: int) -> bool:
    return f"tfdistx: round {number}:" in log_of(run_dir)


def steps_in_round(run_dir: Path, number: int) -> int:
    _, found, after = log_of(run_dir).partition(f"tfdistx: round {number}:")
    return len(re.findall(r"^\[worker:0\] step ", after, re.M)) if found else 0


def pid_on(host: str, launcher: int, run_dir: Path) -> int:
    """The task the launcher placed on `host` in the current round (logs/rounds.json: its members, task -> host)."""
    members = json.loads((run_dir / "logs" / "rounds.json").read_text())[-1]["members"]
    task = next((task for task, at in members.items() if at == host), None)
    if task is None:
        sys.exit(f"no task on {host}: {members}")
    return task_pid(launcher, task)


def pause_arguments(description: str, what: str):
    """--workers, --repeats and --quick (2 `what`, one repeat), parsed: this benchmark's and bench_agents'."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help=f"2 {what}, one repeat")
    args = parser.parse_args()
    if args.quick:
        args.workers, args.repeats = [2], 1
    return args


def pause_cells(runs: list) -> list:
    """The medians of runs' pauses: loss -> round, round -> step, return -> round, round -> step."""
    return [statistics.median(run[kind][part] for run in runs) for kind in ("lost", "back") for part in (0, 1)]


def main() -> None:
    args = pause_arguments(__doc__.splitlines()[0], "workers")
    say_estimate(
        [(args.repeats * len(args.workers), 30 + 5 * max(args.workers), "a run that loses a host and gets it back")],
        quick=args.quick,
    )
    load = os.getloadavg()[0]
    results = {workers: [measure(workers) for _ in range(args.repeats)] for workers in args.workers}
    print(
        f"elastic pauses, seconds, median of {args.repeats} (1-min load average {load:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after)"
    )
    print(f"{'workers':<24}{'loss -> round':>16}{'round -> step':>16}{'return -> round':>18}{'round -> step':>16}")
    for workers, runs in results.items():
        cells = pause_cells(runs)
        print(
            f"{f'{workers} -> {workers - 1} -> {workers}':<24}{cells[0]:>16.1f}{cells[1]:>16.1f}{cells[2]:>18.1f}"
            f"{cells[3]:>16.1f}"
        )


if __name__ == "__main__":
    interruptible(main)
