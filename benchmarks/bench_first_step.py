"""Time to the first step, and what a restart costs, with a local cluster's
tasks forked from one process that imported TensorFlow once
(`cluster.prefork=true`, the default; cluster/prefork.py) and started as
fresh `python -m tfdistx _task ...` processes (`cluster.prefork=false`).

1. From the start of the command to the first line of the run dir's
   metrics.jsonl (polled every 50 ms), for one_device (the default
   strategy), multiworker 2x1 and parameter_server ps1w2, each cluster with
   cluster.prefork=true and =false. Each run is the default MLP on
   synthetic data, a short fixed run of `--steps` steps (one a loop, a log
   line a step, no checkpoints but the final one, no TensorBoard), left to
   end by itself: so the end-to-end wall time and the CPU seconds of the
   whole command (its process tree: launcher, supervisor, prefork, tasks;
   resource.getrusage(RUSAGE_CHILDREN) before and after the wait) are
   recorded too. Ratios are against one_device.
2. A restart: multiworker 2x1, `cluster.max_restarts=1`,
   `checkpoint.every_steps=5`. Once the chief has logged step 7 (so the
   step-5 checkpoint is written), worker:1 is SIGKILLed (found under the
   launcher by its command name, "worker:1", when forked, or by the
   TF_CONFIG in its environment when fresh). Measured from the kill to the
   first `[worker:0] step` line in the run's tfdistx.log after the
   launcher's `restart 1 of 1` line (the log is only appended to, unlike
   metrics.jsonl, whose lines past the restored step are dropped on
   resume), split at that line: before it, the survivor stopping and the
   teardown; after it, the 1 s back-off the line announces, then the new
   round (processes, TensorFlow, the cluster, the restore, the first trace
   and step). The run
   is then stopped with SIGTERM (it checkpoints and exits 42). Ratios are
   prefork=false / prefork=true.

    python benchmarks/bench_first_step.py [--repeats 3] [--steps 20] [--quick] [--against REV]

`--against REV`: this checkout against another revision of tfdistx (a
git worktree of REV in a temporary directory, on PYTHONPATH for its runs):
part 1 for one_device, 2x1 and ps1w2 (prefork=true) and part 2, each of
this checkout beside the same of REV, alternating. For a change to what a
run does before its first step (REV: the commit before it).

`--quick`: one repeat (64 s at load average 3; rough numbers).
Contenders alternate (side_by_side.table); a run dir and TMPDIR per run in
a temporary directory, deleted after; interrupted, the run under way is
killed with its process tree.
"""

import argparse
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from side_by_side import (
    PATIENCE_SECONDS,
    interruptible,
    killed_if_left,
    log_of,
    replay,
    say_estimate,
    table,
    task_pid,
    tree_env,
    wait_for,
    worktree,
)

HERE = Path(__file__).resolve().parent
COMMON = ["data=synthetic", "trainer.steps_per_loop=1", "trainer.log_every=1", "logger.tensorboard=false"]
FIRST = {
    "one_device": [],
    "multiworker 2x1, prefork=true": ["strategy=multiworker", "cluster=2x1", "cluster.prefork=true"],
    "multiworker 2x1, prefork=false": ["strategy=multiworker", "cluster=2x1", "cluster.prefork=false"],
    "parameter_server ps1w2, prefork=true": ["strategy=parameter_server", "cluster=ps1w2", "cluster.prefork=true"],
    "parameter_server ps1w2, prefork=false": ["strategy=parameter_server", "cluster=ps1w2", "cluster.prefork=false"],
}


def start(args, scratch: str, run_dir: Path, tree: Path = HERE.parent) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tfdistx", *COMMON, *args, f"hydra.run.dir={run_dir}"]
    return subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env=tree_env(scratch, tree),
        cwd=scratch,
    )


def first_step(args, steps: int, tree: Path = HERE.parent) -> dict:
    """One short run: seconds to metrics.jsonl's first line, to the end, and the CPU seconds of its whole tree."""
    with tempfile.TemporaryDirectory() as scratch:
        run_dir = Path(scratch, "run")
        metrics = run_dir / "metrics.jsonl"
        cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        proc = start([*args, f"trainer.steps={steps}", "checkpoint.every_steps=0"], scratch, run_dir, tree)
        with killed_if_left(proc):
            first = (
                wait_for(lambda: metrics.exists() and b"\n" in metrics.read_bytes(), proc, "its first step") - started
            )
            code = proc.wait(timeout=PATIENCE_SECONDS)
            ended = time.monotonic() - started
        if code:
            sys.exit(f"a run ({' '.join(args) or 'one_device'}) ended with exit code {code}:\n{tail(run_dir)}")
        cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu_after.ru_utime + cpu_after.ru_stime) - (cpu_before.ru_utime + cpu_before.ru_stime)
    return {"first step": first, "end": ended, "cpu": cpu}


def restart(prefork: bool, tree: Path = HERE.parent) -> dict:
    """One restart of a 2x1 run: seconds from worker:1's SIGKILL to
    the `restart 1 of 1` line, and from it to the first step."""
    with tempfile.TemporaryDirectory() as scratch:
        run_dir = Path(scratch, "run")
        proc = start(
            [
                "strategy=multiworker",
                "cluster=2x1",
                f"cluster.prefork={str(prefork).lower()}",
                "cluster.max_restarts=1",
                "checkpoint.every_steps=5",
                "checkpoint.export=false",
                "trainer.steps=1000000",
            ],
            scratch,
            run_dir,
            tree,
        )
        with killed_if_left(proc):
            wait_for(lambda: last_step(log_of(run_dir)) >= 7, proc, "step 7")
            victim = task_pid(proc.pid, "worker:1")
            killed = time.monotonic()
            os.kill(victim, signal.SIGKILL)
            said = wait_for(lambda: "restart 1 of 1" in log_of(run_dir), proc, "the restart line")
            trains = wait_for(lambda: steps_after_restart(log_of(run_dir)) >= 1, proc, "a step after the restart")
            proc.send_signal(signal.SIGTERM)  # checkpoint and leave (exit 42)
            proc.wait(timeout=120)
    return {
        "kill -> restart line": said - killed,
        "restart line -> step": trains - said,
        "kill -> step": trains - killed,
    }


def tail(run_dir: Path) -> str:
    return log_of(run_dir)[-3000:]


def last_step(log: str) -> int:
    steps = re.findall(r"^\[worker:0\] step\s+(\d+)", log, re.M)
    return int(steps[-1]) if steps else 0


def steps_after_restart(log: str) -> int:
    _, found, after = log.partition("restart 1 of 1")
    return len(re.findall(r"^\[worker:0\] step ", after, re.M)) if found else 0


def against(args, tree: Path) -> None:
    """Part 1 (prefork=true) and part 2 of this checkout and of `tree` (REV's), alternating."""
    rev = args.against
    say_estimate(
        [
            (args.repeats * 2, 10, "one_device to its end"),
            (args.repeats * 4, 16, "a local cluster to its end"),
            (args.repeats * 2, 30, "a 2x1 run restarted once"),
        ],
        quick=args.quick,
    )
    chosen = ["one_device", "multiworker 2x1, prefork=true", "parameter_server ps1w2, prefork=true"]
    runs = {
        f"{name}{suffix}": (FIRST[name], where)
        for name in chosen
        for suffix, where in (("", HERE.parent), (" @ REV", tree))
    }
    measured = {name: [] for name in runs}

    def measure(name):
        def once():
            measured[name].append(first_step(*runs[name][:1], args.steps, runs[name][1]))
            return measured[name][-1]["first step"]

        return once

    def vs_rev(medians, name):
        mine = name.removesuffix(" @ REV")
        return medians[f"{mine} @ REV"] / medians[mine]

    print(
        f"Part 1, this checkout against REV = {rev}: {args.steps} steps of the default MLP on synthetic data, one a "
        "loop",
        flush=True,
    )
    table(
        {name: measure(name) for name in runs},
        args.repeats,
        "command -> first line of metrics.jsonl",
        "REV / this",
        vs_rev,
        unit="s",
    )
    table(
        replay(measured, "end"),
        args.repeats,
        f"command -> its end ({args.steps} steps)",
        "REV / this",
        vs_rev,
        unit="s",
    )
    table(replay(measured, "cpu"), args.repeats, "CPU seconds of the whole command", "REV / this", vs_rev, unit="s")

    print(f"\nPart 2, this checkout against REV = {rev}: multiworker 2x1, worker:1 SIGKILLed after step 7", flush=True)
    trees = {"2x1 restarted": HERE.parent, "2x1 restarted @ REV": tree}
    restarts = {name: [] for name in trees}

    def restarted(name):
        def once():
            restarts[name].append(restart(True, trees[name]))
            return restarts[name][-1]["kill -> step"]

        return once

    table(
        {name: restarted(name) for name in trees},
        args.repeats,
        "SIGKILL of worker:1 -> the first step after the restart",
        "REV / this",
        vs_rev,
        unit="s",
    )
    table(
        replay(restarts, "restart line -> step"), args.repeats, "restart line -> step", "REV / this", vs_rev, unit="s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="the steps of a run of the first part")
    parser.add_argument("--quick", action="store_true", help="one repeat")
    parser.add_argument(
        "--against", metavar="REV", help="this checkout against tfdistx at git revision REV, side by side"
    )
    args = parser.parse_args()
    if args.quick:
        args.repeats = 1
    if args.against:
        with tempfile.TemporaryDirectory() as where:
            with worktree(args.against, Path(where, "tree")) as tree:
                against(args, tree)
        return
    say_estimate(
        [
            (args.repeats, 10, "one_device to its end"),
            (args.repeats * 4, 16, "a local cluster to its end"),
            (args.repeats * 2, 30, "a 2x1 run restarted once"),
        ],
        quick=args.quick,
    )

    measured = {name: [] for name in FIRST}

    def measure(name):
        def once():
            measured[name].append(first_step(FIRST[name], args.steps))
            return measured[name][-1]["first step"]

        return once

    print(f"Part 1: {args.steps} steps of the default MLP on synthetic data, one a loop, a log line each", flush=True)
    table(
        {name: measure(name) for name in FIRST},
        args.repeats,
        "command -> first line of metrics.jsonl",
        "vs one_device",
        lambda medians, name: medians[name] / medians["one_device"],
        unit="s",
    )
    print("(the next two tables are the same runs; their load averages are read after them)")
    table(
        replay(measured, "end"),
        args.repeats,
        f"command -> its end ({args.steps} steps, final checkpoint and export)",
        "vs one_device",
        lambda medians, name: medians[name] / medians["one_device"],
        unit="s",
    )
    table(
        replay(measured, "cpu"),
        args.repeats,
        "CPU seconds of the whole command (user + system, every process)",
        "vs one_device",
        lambda medians, name: medians[name] / medians["one_device"],
        unit="s",
    )

    print(
        "\nPart 2: multiworker 2x1, worker:1 SIGKILLed after step 7, cluster.max_restarts=1, a checkpoint every 5 "
        "steps",
        flush=True,
    )
    restarts = {name: [] for name in ("prefork=true", "prefork=false")}

    def restarted(name):
        def once():
            restarts[name].append(restart(name == "prefork=true"))
            return restarts[name][-1]["kill -> step"]

        return once

    table(
        {name: restarted(name) for name in restarts},
        args.repeats,
        "SIGKILL of worker:1 -> the first step after the restart",
        "false / true",
        lambda medians, name: medians["prefork=false"] / medians[name],
        unit="s",
    )
    print("(the same restarts, split at the launcher's `restart 1 of 1 in 1s` line: the back-off is after it)")
    for key in ("kill -> restart line", "restart line -> step"):
        table(
            replay(restarts, key),
            args.repeats,
            key,
            "false / true",
            lambda medians, name: medians["prefork=false"] / medians[name],
            unit="s",
        )


if __name__ == "__main__":
    interruptible(main)
