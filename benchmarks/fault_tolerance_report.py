"""The cost of fault tolerance, measured on real processes (issue 4, item 7).

The default 784-128-10 MLP on MNIST-shaped synthetic data (`data=synthetic`
defaults: global batch 128), Adam, `steps_per_loop=100`, `log_every=100`,
TensorBoard off, each run in its own temporary `hydra.run.dir`. Two
topologies: one process (`strategy=one_device`) and a local 2-worker cluster
(`strategy=multiworker cluster=2x1`, started by tfdistx's launcher). Every
line the runs print is stamped with the time it arrives here; the times below
are differences of those stamps (log lines arrive within milliseconds of
their own timestamps).

1. Steps lost per preemption (target 0). A run is started; a SIGTERM is sent
   half a loop after the step-200 line (to the process, or to worker 1 only,
   found by the TF_CONFIG task index in /proc/<pid>/environ), so it lands
   mid-loop, at about step 250, away from the step-500 checkpoint. The single
   process is then rerun with the same command; the cluster is restarted by
   the launcher. lost = (the last step reached before the preemption: the
   highest step in metrics.jsonl or the step lines, and the "preempted at
   step N" lines, which must name one step for both workers) - (the step the
   run resumed from: summary.json's resumed_from_step). Also checked:
   metrics.jsonl ends with every log step exactly once.
2. Seconds from SIGTERM to the "preempted at step N: checkpoint saved"
   line(s), and to the exit of the process(es) (polled in /proc every
   10 ms); for the cluster also to the launcher's "task worker:N exited" line
   and to the exit of each worker.
3. Seconds from restart to the first resumed step: from the rerun's start
   (single process) or the launcher's "restart 1 of" line (cluster) to the
   first step line after the resume. Split at the start of the new processes
   (/proc/<pid>/stat; for the cluster this is the 1 s back-off), the
   "resuming from step" line (start-up to restored: Python, Hydra,
   TensorFlow import, cluster bring-up, model, restore), the "replica(s),
   global batch" line (input pipeline, trainer) and the first step line (the
   first loop call: tracing, the input skip, and 100 steps). Tracing is
   estimated as the first call minus 100 steps at the run's steady
   examples/s; "TF start-up + tracing" is start-up to restored plus that.
   These runs resume from about step 300. The input skip grows with the
   step: a resumed pipeline reads and drops every batch already trained on.
4. Throughput cost of the default checkpoint cadence
   (`checkpoint.every_steps=500`) against `checkpoint.every_steps=0` (only at
   the end), `trainer.eval_every=0` in both, runs alternating. summary.json's
   examples_per_sec times only the training calls in Trainer.fit, so it
   cannot see a save: its ratio is shown, but the cost is judged by
   wall-clock throughput (steps x batch / train_wall_time_sec, which includes
   the saves, tracing and the final eval and save of both runs) and by an
   in-run estimate: the time between two step lines minus the training time
   of that window (from metrics.jsonl) is the loop's overhead; the median
   overhead of windows that follow a save minus that of the others is the
   time of one save, and one save per 500 steps of steady training is the
   cost (target under 3%).

Each measurement is repeated (--repeats) in fresh processes; medians, with
min-max, are printed. Everything started is killed on exit, error, Ctrl-C or
SIGTERM, before its temporary directory is deleted.

    python benchmarks/fault_tolerance_report.py [--repeats 3] [--single-steps 4000] [--cluster-steps 2000] [--quick]

(with the python that has tfdistx installed). `--quick`: one repeat, runs of
500 (preempted), 1,000 (one process) and 600 steps (cluster): rough numbers;
with one repeat the checkpoint cost rests on one save.
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
import threading
import time
from pathlib import Path

from side_by_side import interruptible, kill_tree, say_estimate

BATCH = 128  # data=synthetic's global batch
LOOP = 100  # trainer.steps_per_loop and trainer.log_every (the defaults)
EVERY = 500  # checkpoint.every_steps (the default)
COMMON = [
    "model=mlp",
    "data=synthetic",
    "logger.tensorboard=false",
    f"trainer.steps_per_loop={LOOP}",
    f"trainer.log_every={LOOP}",
]
TOPOLOGIES = {"one process": ["strategy=one_device"], "2-worker cluster": ["strategy=multiworker", "cluster=2x1"]}

CHIEF = r"^(?!\[worker:[1-9])(?:\[worker:0\] )?"  # a line of the single process, or of worker 0
STEP = re.compile(CHIEF + r"step\s+(\d+)/\d+")
RESUMING = re.compile(CHIEF + r".*resuming from step (\d+)")
READY = re.compile(CHIEF + r".*replicas?\b.*, global batch")  # "1 replica (128 examples each), global batch 128"
PREEMPTED = re.compile(r"^(?:\[(worker:\d+)\] )?.*preempted at step (\d+): checkpoint saved")
NOTICED = re.compile(r"^tfdistx: task worker:\d+ exited with code")
RESTART = re.compile(r"^tfdistx: .*restart 1 of \d+ in (\d+)s")

RUNS = []  # every Run started, killed at exit


class Run:
    """`python -m tfdistx ARGS hydra.run.dir=DIR`, its output lines stamped with their arrival time."""

    def __init__(self, args, run_dir: Path):
        self.dir = run_dir
        self.lines = []  # (time.time() at arrival, line)
        self.started = time.time()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tfdistx", *args, f"hydra.run.dir={run_dir}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )
        RUNS.append(self)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    def find(self, pattern, after=0.0, before=float("inf")):
        """[(arrival, match)] of the lines matching `pattern` that arrived in (after, before)."""
        return [(t, m) for t, line in list(self.lines) if after < t < before for m in [pattern.search(line)] if m]

    def wait_for(self, pattern, accept=lambda m: True, after=0.0, timeout=300.0):
        deadline = time.time() + timeout
        while time.time() < deadline:
            hits = [(t, m) for t, m in self.find(pattern, after) if accept(m)]
            if hits:
                return hits[0]
            if self.proc.poll() is not None and not self.reader.is_alive():
                break
            time.sleep(0.02)
        raise RuntimeError(f"no line matching {pattern.pattern!r} (exit {self.proc.poll()}):\n{self.tail()}")

    def finish(self, expect=0, timeout=600.0) -> int:
        code = self.proc.wait(timeout=timeout)
        self.reader.join(timeout=10)
        if code != expect:
            raise RuntimeError(f"exit code {code}, expected {expect}:\n{self.tail()}")
        return code

    def tail(self, n=40) -> str:
        return "\n".join(line for _, line in self.lines[-n:])

    def summary(self) -> dict:
        return json.loads((self.dir / "summary.json").read_text())

    def metrics(self) -> list:
        return [json.loads(line) for line in (self.dir / "metrics.jsonl").read_text().splitlines()]

    def kill(self):
        """SIGKILL this run's process group, and the cluster tasks (own sessions) writing its directory."""
        if self.proc.poll() is None:
            kill_tree(self.proc.pid)
        for pid in pids_of(self.dir):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def pids_of(run_dir: Path, task_index=None) -> list:
    """Processes whose command line names run_dir (a unique temp dir); with
    task_index, only the cluster task whose TF_CONFIG has that index."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if str(run_dir).encode() not in (proc / "cmdline").read_bytes():
                continue
            if task_index is not None:
                if b"tfdistx.launch.local.launcher" in (proc / "cmdline").read_bytes():
                    continue
                if f'"index": {task_index}}}'.encode() not in (proc / "environ").read_bytes():
                    continue
        except OSError:
            continue
        pids.append(int(proc.name))
    return pids


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")  # a zombie has exited; its parent has not reaped it yet


def exit_times(pids, timeout=120.0) -> dict:
    """{pid: time it exited}, polling every 10 ms."""
    left, done, deadline = set(pids), {}, time.time() + timeout
    while left and time.time() < deadline:
        for pid in list(left):
            if not alive(pid):
                done[pid] = time.time()
                left.discard(pid)
        time.sleep(0.01)
    if left:
        raise RuntimeError(f"processes {sorted(left)} still running {timeout:.0f} s after SIGTERM")
    return done


def started_at(pid: int) -> float:
    """When a process started, on the time.time() clock (to 10 ms): /proc/<pid>/stat and /proc/uptime."""
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    age = float(Path("/proc/uptime").read_text().split()[0]) - ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - age


def sigterm_mid_loop(run: Run, pid_of) -> tuple:
    """SIGTERM half a loop after the step-200 line; (time sent, last step line seen before)."""
    t100, _ = run.wait_for(STEP, lambda m: int(m[1]) >= LOOP)
    pid = pid_of()
    t200, m = run.wait_for(STEP, lambda m: int(m[1]) >= 2 * LOOP)
    time.sleep(max((t200 - t100) / 2 - (time.time() - t200), 0))
    sent = time.time()
    os.kill(pid, signal.SIGTERM)
    return sent, max(int(m[1]) for t, m in run.find(STEP, before=sent))


def restart_phases(run: Run, restart: float, started) -> dict:
    """Restart -> first resumed step, split where the new processes start
    (`started`: a time, or a function to call while they run) and at the
    lines the resumed run prints. Times in seconds; "first call" still
    includes 100 steps of training, taken out once the run's speed is known."""
    t_resuming, _ = run.wait_for(RESUMING, after=restart)
    started = started() if callable(started) else started
    t_ready, _ = run.wait_for(READY, after=t_resuming)
    t_first, _ = run.wait_for(STEP, after=t_ready)
    return {
        "restart -> first resumed step": t_first - restart,
        "  back-off, until the processes start": started - restart,
        "  start-up to restored": t_resuming - started,
        "  input + trainer set-up": t_ready - t_resuming,
        "  first loop call (tracing + 100 steps)": t_first - t_ready,
    }


def with_tracing(phases: dict, summary: dict) -> dict:
    """Add the first call's time beyond 100 steps at the run's steady speed, and TF start-up + that."""
    tracing = phases["  first loop call (tracing + 100 steps)"] - LOOP * BATCH / summary["examples_per_sec"]
    return {
        **phases,
        "    of which beyond 100 steps (tracing)": tracing,
        "  TF start-up + tracing": phases["  start-up to restored"] + tracing,
    }


def check_saved_after(seen: int, saved: int, run: Run) -> None:
    if saved <= seen:
        raise RuntimeError(f"a SIGTERM after step {seen} was handled at step {saved}:\n{run.tail()}")


def preempt_single(tmp: Path, steps: int) -> dict:
    run_dir = tmp / "preempt-single"
    args = [*TOPOLOGIES["one process"], *COMMON, f"trainer.steps={steps}"]
    first = Run(args, run_dir)
    sent, seen = sigterm_mid_loop(first, lambda: first.proc.pid)
    exited = exit_times([first.proc.pid])[first.proc.pid]
    first.finish(expect=42)
    ((t_saved, m),) = first.find(PREEMPTED)
    check_saved_after(seen, int(m[2]), first)
    reached = max([int(m[2])] + [row["step"] for row in first.metrics()])

    rerun = Run(args, run_dir)  # the same command, the same run directory
    phases = restart_phases(rerun, rerun.started, rerun.started)
    rerun.finish()
    summary = rerun.summary()
    return {
        "steps lost per preemption": reached - summary["resumed_from_step"],
        "metrics.jsonl: every step once": int(
            [r["step"] for r in rerun.metrics()] == list(range(LOOP, steps + 1, LOOP))
        ),
        "saved at step (SIGTERM at ~250)": int(m[2]),
        "SIGTERM -> checkpoint saved": t_saved - sent,
        "SIGTERM -> signalled process exited": exited - sent,
        **with_tracing(phases, summary),
    }


def preempt_cluster(tmp: Path, steps: int) -> dict:
    run_dir = tmp / "preempt-cluster"
    run = Run([*TOPOLOGIES["2-worker cluster"], *COMMON, f"trainer.steps={steps}", "cluster.max_restarts=3"], run_dir)
    workers = {}

    def worker_1():
        for index in (0, 1):
            deadline = time.time() + 30
            while not pids_of(run_dir, index) and time.time() < deadline:
                time.sleep(0.05)
            (workers[index],) = pids_of(run_dir, index)
        return workers[1]

    def restarted():  # the later start of the two new worker processes
        return max(
            started_at(pid) for index in (0, 1) for pid in pids_of(run_dir, index) if pid not in workers.values()
        )

    sent, seen = sigterm_mid_loop(run, worker_1)  # the scheduler preempts worker 1 only
    exited = exit_times(workers.values())
    t_noticed, _ = run.wait_for(NOTICED, after=sent)
    t_restart, _ = run.wait_for(RESTART, after=sent)
    phases = restart_phases(run, t_restart, restarted)
    run.finish()
    summary = run.summary()
    saved = {m[1]: (t, int(m[2])) for t, m in run.find(PREEMPTED, after=sent, before=t_restart)}
    if len(saved) != 2 or len({step for _, step in saved.values()}) != 1:
        raise RuntimeError(f"the workers did not both save at one step: {saved}\n{run.tail(80)}")
    step_saved = max(step for _, step in saved.values())
    check_saved_after(seen, step_saved, run)
    reached = max([step_saved] + [int(m[1]) for _, m in run.find(STEP, before=t_restart)])
    return {
        "steps lost per preemption": reached - summary["resumed_from_step"],
        "metrics.jsonl: every step once": int([r["step"] for r in run.metrics()] == list(range(LOOP, steps + 1, LOOP))),
        "saved at step (SIGTERM at ~250)": step_saved,
        "SIGTERM -> checkpoint saved": max(t for t, _ in saved.values()) - sent,
        "SIGTERM -> signalled process exited": exited[workers[1]] - sent,
        "SIGTERM -> worker 0 exited": exited[workers[0]] - sent,
        "SIGTERM -> launcher noticed": t_noticed - sent,
        "SIGTERM -> all workers exited": max(exited.values()) - sent,
        **with_tracing(phases, summary),
    }


def throughput(tmp: Path, topology: str, steps: int, every: int) -> dict:
    run = Run(
        [
            *TOPOLOGIES[topology],
            *COMMON,
            f"trainer.steps={steps}",
            "trainer.eval_every=0",
            f"checkpoint.every_steps={every}",
        ],
        tmp / f"throughput-{every}-{topology.replace(' ', '-')}",
    )
    run.finish()
    summary = run.summary()
    arrivals = {int(m[1]): t for t, m in run.find(STEP)}
    window = {row["step"]: LOOP * BATCH / row["examples_per_sec"] for row in run.metrics()}
    # Per-loop overhead: the time between step lines that the training call did not take.
    overhead = {s: arrivals[s] - arrivals[s - LOOP] - window[s] for s in arrivals if s - LOOP in arrivals}
    after_save = [v for s, v in overhead.items() if every and (s - LOOP) % every == 0]
    others = [v for s, v in overhead.items() if not (every and (s - LOOP) % every == 0)]
    return {
        "summary examples/s": summary["examples_per_sec"],
        "wall examples/s": steps * BATCH / summary["train_wall_time_sec"],
        "save seconds (in-run)": statistics.median(after_save) - statistics.median(others) if after_save else None,
    }


def cell(values, fmt) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    if len(values) == 1 or min(values) == max(values):
        return fmt.format(values[0])
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}..{fmt.format(max(values))})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--preempt-steps", type=int, default=1000, help="trainer.steps of the preempted runs")
    parser.add_argument("--single-steps", type=int, default=4000, help="trainer.steps of one-process throughput runs")
    parser.add_argument("--cluster-steps", type=int, default=2000, help="trainer.steps of cluster throughput runs")
    parser.add_argument("--quick", action="store_true", help="rough numbers in under 2 minutes (see above)")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.preempt_steps, args.single_steps, args.cluster_steps = 1, 500, 1000, 600
    # Measured on this project's 2-core machine: one process takes ~4 s besides its steps and trains ~65k examples/s
    # here (the step lines cost), a 2-worker cluster ~8 s and ~30k; a preempted run is two runs, a cluster's a restart.
    single = lambda steps: 4 + steps * BATCH / 65_000  # noqa: E731
    cluster = lambda steps: 8 + steps * BATCH / 30_000  # noqa: E731
    say_estimate(
        [
            (args.repeats, 2 * single(args.preempt_steps), "one process preempted and rerun"),
            (args.repeats, 2 * cluster(args.preempt_steps), "2-worker cluster preempted and restarted"),
            (2 * args.repeats, single(args.single_steps), f"one process, {args.single_steps} steps"),
            (2 * args.repeats, cluster(args.cluster_steps), f"2-worker cluster, {args.cluster_steps} steps"),
        ],
        args.quick,
    )
    began, load_before = time.time(), os.getloadavg()

    preempt = {"one process": [], "2-worker cluster": []}
    speed = {(topology, every): [] for topology in TOPOLOGIES for every in (EVERY, 0)}
    steps = {"one process": args.single_steps, "2-worker cluster": args.cluster_steps}
    with tempfile.TemporaryDirectory(prefix="tfdistx-ft-report-") as tmp:
        try:  # inside the temporary directory's block: what writes there is killed before it is deleted
            for repeat in range(args.repeats):
                rdir = Path(tmp) / str(repeat)
                preempt["one process"].append(preempt_single(rdir, args.preempt_steps))
                preempt["2-worker cluster"].append(preempt_cluster(rdir, args.preempt_steps))
                for topology in TOPOLOGIES:
                    for every in (EVERY, 0) if repeat % 2 == 0 else (0, EVERY):  # alternate which goes first
                        speed[topology, every].append(throughput(rdir, topology, steps[topology], every))
                progress = {
                    t: (p[-1]["steps lost per preemption"], round(p[-1]["SIGTERM -> signalled process exited"], 2))
                    for t, p in preempt.items()
                }
                print(
                    f"  repeat {repeat + 1}/{args.repeats} done at {time.time() - began:.0f} s: (lost, exit s) "
                    f"{progress}",
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            for run in RUNS:
                run.kill()

    names, width = list(TOPOLOGIES), 46
    print(
        f"tfdistx fault tolerance, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, {os.cpu_count()} CPUs, "
        f"load average {load_before[0]:.2f} at start, {os.getloadavg()[0]:.2f} at end, {time.time() - began:.0f} s"
    )
    print(
        f"MLP 784-128-10, synthetic data, global batch {BATCH}, steps_per_loop {LOOP}, median (min..max) of "
        f"{args.repeats}"
    )
    print(f"{'preemption (SIGTERM)':<{width}}{names[0]:>28}{names[1]:>28}   target")
    targets = {"steps lost per preemption": "0", "metrics.jsonl: every step once": "1 (yes)"}
    for key in preempt["2-worker cluster"][0]:
        counted = key.startswith(("steps", "metrics", "saved"))
        row = [cell([r.get(key) for r in preempt[t]], "{:.0f}" if counted else "{:.2f}") for t in names]
        print(f"{key + ('' if counted else ' (s)'):<{width}}{row[0]:>28}{row[1]:>28}   {targets.get(key, '')}")

    print(
        f"checkpoint.every_steps={EVERY} against 0, eval_every=0, {args.single_steps} / {args.cluster_steps} steps; "
        "ratios and costs are paired within a repeat"
    )
    rows = {}
    for t in names:
        ckpt, none = speed[t, EVERY], speed[t, 0]
        for every, runs in ((0, none), (EVERY, ckpt)):
            rows.setdefault(f"summary examples/s, every {every}", []).append(
                cell([r["summary examples/s"] for r in runs], "{:,.0f}")
            )
        rows.setdefault(f"  every {EVERY} / every 0 (cannot see saves)", []).append(
            cell([c["summary examples/s"] / n["summary examples/s"] for c, n in zip(ckpt, none)], "{:.3f}")
        )
        for every, runs in ((0, none), (EVERY, ckpt)):
            rows.setdefault(f"wall-clock examples/s, every {every}", []).append(
                cell([r["wall examples/s"] for r in runs], "{:,.0f}")
            )
        rows.setdefault("  cost = 1 - wall-clock ratio (%)", []).append(
            cell([100 * (1 - c["wall examples/s"] / n["wall examples/s"]) for c, n in zip(ckpt, none)], "{:.1f}")
        )
        rows.setdefault("one save, in-run estimate (ms)", []).append(
            cell([1000 * r["save seconds (in-run)"] for r in ckpt], "{:.0f}")
        )
        rows.setdefault(f"  cost of one save per {EVERY} steps (%)", []).append(
            cell(
                [
                    100
                    * r["save seconds (in-run)"]
                    / (r["save seconds (in-run)"] + EVERY * BATCH / r["summary examples/s"])
                    for r in ckpt
                ],
                "{:.1f}",
            )
        )
    for key, (a, b) in rows.items():
        print(f"{key:<{width}}{a:>28}{b:>28}   {'< 3' if '(%)' in key else ''}")


if __name__ == "__main__":
    interruptible(main)
