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

from side_by_side import interruptible, kill_tree, say_estimate

POLL_SECONDS = 0.05
PATIENCE_SECONDS = 600  # the longest any one stage is waited for


def measure(workers: int) -> dict:
    """One run's pauses, in seconds: lost (edit -> round line -> first step), back (the same)."""
    hosts = [f"127.0.0.{n}" for n in range(1, workers + 1)]
    with tempfile.TemporaryDirectory() as scratch:
        listed, run_dir = Path(scratch, "hosts"), Path(scratch, "run")
        listed.write_text("\n".join(hosts) + "\n")
        cmd = [sys.executable, "-m", "tfdistx", "strategy=multiworker", f"cluster.workers={workers // 2}:{workers}",
               f"cluster.elastic.hosts={listed}", "cluster.elastic.join_grace=1", "cluster.elastic.lost_bound=1",
               "data=synthetic", "data.batch_size=48", "trainer.steps=1000000", "trainer.steps_per_loop=1", "trainer.log_every=1",
               "trainer.eval_every=0", "checkpoint.every_steps=50", "checkpoint.export=false", "logger.tensorboard=false",
               f"hydra.run.dir={run_dir}"]
        # TensorFlow's autograph files go to TMPDIR, and a killed task removes none: in the scratch dir, removed with it.
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                start_new_session=True, env={**os.environ, "TMPDIR": scratch})
        try:
            wait_for(lambda: steps_in_round(run_dir, 1) >= 5, proc)
            lost = time.monotonic()
            listed.write_text("\n".join(hosts[:-1]) + "\n")
            os.kill(pid_on(hosts[-1], proc.pid), signal.SIGKILL)
            lost_said = wait_for(lambda: said(run_dir, 2), proc)
            lost_trains = wait_for(lambda: steps_in_round(run_dir, 2) >= 1, proc)
            wait_for(lambda: steps_in_round(run_dir, 2) >= 5, proc)
            back = time.monotonic()
            listed.write_text("\n".join(hosts) + "\n")
            back_said = wait_for(lambda: said(run_dir, 3), proc)
            back_trains = wait_for(lambda: steps_in_round(run_dir, 3) >= 1, proc)
            proc.send_signal(signal.SIGTERM)  # checkpoint and leave (exit 42)
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                kill_tree(proc.pid)
                proc.wait()
    return {"lost": (lost_said - lost, lost_trains - lost_said), "back": (back_said - back, back_trains - back_said)}


def wait_for(done, proc) -> float:
    """The moment `done()` became true (polled); exits if the run ended first or it took too long."""
    deadline = time.monotonic() + PATIENCE_SECONDS
    while not done():
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"the elastic run {'ended with exit code ' + str(proc.returncode) if proc.poll() is not None else 'stalled'} "
                     "before the benchmark saw what it waits for")
        time.sleep(POLL_SECONDS)
    return time.monotonic()


def log_of(run_dir: Path) -> str:
    path = run_dir / "tfdistx.log"
    return path.read_text(errors="replace") if path.exists() else ""


def said(run_dir: Path, number: int) -> bool:
    return f"tfdistx: round {number}:" in log_of(run_dir)


def steps_in_round(run_dir: Path, number: int) -> int:
    _, found, after = log_of(run_dir).partition(f"tfdistx: round {number}:")
    return len(re.findall(r"^\[worker:0\] step ", after, re.M)) if found else 0


def pid_on(host: str, launcher: int) -> int:
    """The task the launcher placed on `host` (its TF_CONFIG names it)."""
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = dict(v.split(b"=", 1) for v in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0") if b"=" in v)
        except OSError:
            continue
        if b"TFDISTX_LOCAL_TASK" in environ and b"TF_CONFIG" in environ and _under(int(entry), launcher):
            config = json.loads(environ[b"TF_CONFIG"])
            task = config["task"]
            if config["cluster"][task["type"]][task["index"]].startswith(f"{host}:"):
                return int(entry)
    sys.exit(f"no task on {host}")


def _under(pid: int, root: int) -> bool:
    while pid > 1:
        if pid == root:
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, IndexError, ValueError):
            return False
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="2 workers, one repeat")
    args = parser.parse_args()
    if args.quick:
        args.workers, args.repeats = [2], 1
    say_estimate([(args.repeats * len(args.workers), 30 + 5 * max(args.workers), "a run that loses a host and gets it back")],
                 quick=args.quick)
    load = os.getloadavg()[0]
    results = {workers: [measure(workers) for _ in range(args.repeats)] for workers in args.workers}
    print(f"elastic pauses, seconds, median of {args.repeats} (1-min load average {load:.1f} before, {os.getloadavg()[0]:.1f} after)")
    print(f"{'workers':<24}{'loss -> round':>16}{'round -> step':>16}{'return -> round':>18}{'round -> step':>16}")
    for workers, runs in results.items():
        cells = [statistics.median(run[kind][part] for run in runs) for kind in ("lost", "back") for part in (0, 1)]
        print(f"{f'{workers} -> {workers - 1} -> {workers}':<24}{cells[0]:>16.1f}{cells[1]:>16.1f}{cells[2]:>18.1f}{cells[3]:>16.1f}")


if __name__ == "__main__":
    interruptible(main)
