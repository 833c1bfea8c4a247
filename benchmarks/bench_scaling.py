"""Scaling curve on this machine (issue 12): start-up, steady examples/s and memory per task against N.

Each config is a real `python -m tfdistx ...` with its own run dir:

  mirrored          strategy=mirrored cluster=1x1, 1x2, 1x4              N = logical CPU devices (replicas), one process
  multiworker       strategy=multiworker cluster=1x1, 2x1, 4x1, 8x1      N = worker processes, one replica each
  parameter_server  strategy=parameter_server cluster=ps1w1, ps1w2, ps2w4  N = workers (+ ps tasks + a coordinator)

Weak scaling: the default MLP on data=synthetic, 128 examples per replica and step (global batch = 128 x replicas;
a parameter-server step is one worker's whole batch of 128); 600 steps, 100 a tf.function call, one eval batch and
one checkpoint at the end, no export. N = 8 is skipped when MemAvailable < 8 x 800 MB. Per config:

  start-up s    launch of the CLI until the first training step is done. tfdistx writes no time stamps, so from
                outside: the mtime of metrics.jsonl's first line (written after the first tf.function call:
                tracing + steps_per_loop steps; polled every 20 ms) minus the steps_per_loop - 1 steps after the
                first, at the steady rate.
  examples/s    summary.json's examples_per_sec: steady state, the first (tracing) call left out.
  rel.          examples/s over the family's N = 1.
  RSS MB        each task's peak VmRSS (every process under the CLI sampled from /proc every 0.2 s; a task is a
                process with TF_CONFIG, else the CLI process itself): max and mean over tasks.

How to read it: every process shares this machine's cores (printed). With 2 cores, more replicas or workers
cannot train faster: the curve shows each strategy's overhead (start-up, all-reduce, RPCs, memory), not speed-up.
Written to --out: results.json (every run), table.md (the table printed), scaling.png (the three columns against N).

    python benchmarks/bench_scaling.py [--quick] [--repeats 1] [--families mirrored,multiworker,parameter_server]
                                       [--max-workers 8] [--steps 600] [--out benchmarks/results/scaling] [--keep DIR]

`--quick`: 200 steps, N = 1 and 2 of each family: rough numbers, printed and
not written unless --out is given (the committed results stay the full run's).
"""

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from side_by_side import descendants, interruptible, kill_tree, say_estimate
from tfdistx.commands.report import _pyplot  # matplotlib with the Agg backend, as `tfdistx report` draws

HERE = Path(__file__).resolve().parent
PER_REPLICA, STEPS_PER_LOOP, MB_PER_WORKER = 128, 100, 800
FAMILIES = {  # family -> [(N, replicas, overrides)]
    "mirrored": [(n, n, ["strategy=mirrored", f"cluster=1x{n}"]) for n in (1, 2, 4)],
    "multiworker": [(w, w, ["strategy=multiworker", f"cluster={w}x1"]) for w in (1, 2, 4, 8)],
    "parameter_server": [
        (w, 1, ["strategy=parameter_server", f"cluster=ps{p}w{w}"]) for p, w in ((1, 1), (1, 2), (2, 4))
    ],
}
COMMON = [
    "model=mlp",
    "data=synthetic",
    f"trainer.steps_per_loop={STEPS_PER_LOOP}",
    f"trainer.log_every={STEPS_PER_LOOP}",
    "trainer.eval_every=0",
    "trainer.eval_steps=1",
    "checkpoint.every_steps=0",
    "checkpoint.export=false",
    "logger.console=false",
    "logger.tensorboard=false",
    "cluster.max_restarts=0",
]


def task_name(pid: int):
    """'worker:1' for a process with TF_CONFIG (a task the launcher started), else None."""
    for var in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        if var.startswith(b"TF_CONFIG="):
            task = json.loads(var[len(b"TF_CONFIG=") :])["task"]
            return f"{task['type']}:{task['index']}"
    return None


def watch(proc, metrics: Path, timeout: float):
    """Until the run ends: when metrics.jsonl's first line was written, and each process's peak RSS (MB)."""
    first_line, next_sample, peaks, names, launched = None, 0.0, {}, {}, time.time()
    while proc.poll() is None:
        if first_line is None and metrics.is_file() and metrics.stat().st_size:
            mtime, lines = metrics.stat().st_mtime, metrics.read_text().count("\n")
            if lines:  # two lines already (a poll missed): the poll's time, a little late
                first_line = mtime if lines == 1 else time.time()
        if time.monotonic() >= next_sample:
            next_sample = time.monotonic() + 0.2
            for pid in descendants(proc.pid):
                try:  # a name once seen is kept: a task just forked has its launcher's environment until exec
                    names[pid] = names.get(pid) or task_name(pid)
                    key = names[pid] or ("root" if pid == proc.pid else "launcher")
                    status = Path(f"/proc/{pid}/status").read_text()
                    rss = int(status.split("VmRSS:")[1].split()[0]) / 1024 if "VmRSS:" in status else 0.0
                    peaks[key] = max(peaks.get(key, 0.0), rss)  # a restarted task: the peak of both lives
                except OSError:
                    pass
        if time.time() - launched > timeout:
            kill_tree(proc.pid)
        time.sleep(0.02)
    return first_line, peaks


def run_one(overrides, run_dir: Path, steps: int, batch: int, timeout: float = 1800) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "tfdistx",
        *COMMON,
        *overrides,
        f"data.batch_size={batch}",
        f"trainer.steps={steps}",
        f"hydra.run.dir={run_dir}",
    ]
    log = run_dir.parent / f"{run_dir.name}.out"
    with open(log, "w") as out:
        launched = time.time()
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        )
        try:
            first_line, peaks = watch(proc, run_dir / "metrics.jsonl", timeout)
        finally:
            if proc.poll() is None:  # interrupted, or a timeout: the launcher and every task it started
                kill_tree(proc.pid)
                proc.wait()
    if proc.returncode or first_line is None or not (run_dir / "summary.json").is_file():
        print(
            f"  FAILED (exit {proc.returncode}): {' '.join(overrides)}\n{log.read_text()[-1500:]}",
            file=sys.stderr,
            flush=True,
        )
        return {}
    summary = json.loads((run_dir / "summary.json").read_text())
    tasks = {key: mb for key, mb in peaks.items() if ":" in key} or {"single": peaks["root"]}
    ex_s = summary["examples_per_sec"]
    return {
        "startup_s": first_line - launched - (STEPS_PER_LOOP - 1) * batch / ex_s,
        "first_log_s": first_line - launched,
        "chief_build_s": summary["wall_time_sec"] - summary["train_wall_time_sec"],
        "examples_per_sec": ex_s,
        "rss_max_mb": max(tasks.values()),
        "rss_mean_mb": statistics.mean(tasks.values()),
        "rss_per_task_mb": tasks,
        "rss_by_process_mb": peaks,
        "replicas": summary["replicas"],
        "strategy_class": summary["strategy_class"],
    }


def expected_seconds(family: str, n: int, replicas: int, steps: int) -> float:
    """A config's run, for the estimate: start-up and end as measured on this project's 2-core machine (more
    processes importing TensorFlow on the same cores start slower: ~2.5 s more a worker), the steps at the
    README table's examples/s."""
    start = {"mirrored": 5, "multiworker": 5, "parameter_server": 9}[family] + 2.5 * (n - 1)
    rate = {"mirrored": 65_000, "multiworker": 30_000, "parameter_server": 24_000}[family]
    return start + steps * PER_REPLICA * replicas / rate


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 steps, only N = 1, 2 per family: a smoke test")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--families", default="mirrored,multiworker,parameter_server")
    parser.add_argument("--max-workers", type=int, default=8)
    parser.add_argument(
        "--out",
        type=Path,
        help="where results.json, table.md and scaling.png go (default: benchmarks/results/scaling; "
        "with --quick: nowhere, the table is printed)",
    )
    parser.add_argument(
        "--keep", type=Path, help="keep the run dirs in DIR (new or empty; default: a temp dir, deleted)"
    )
    args = parser.parse_args()
    if args.keep and args.keep.is_dir() and any(args.keep.iterdir()):
        sys.exit(f"--keep {args.keep}: not empty (a run dir there would be resumed, not run)")
    steps = 200 if args.quick else args.steps
    available_mb = int(next(l for l in open("/proc/meminfo") if l.startswith("MemAvailable")).split()[1]) / 1024
    configs, notes = [], []
    for family in args.families.split(","):
        for n, replicas, overrides in FAMILIES[family][: 2 if args.quick else None]:
            if n >= 8 and n <= args.max_workers and available_mb < n * MB_PER_WORKER:
                notes.append(f"skipped {family} N={n}: MemAvailable {available_mb:,.0f} MB < {n} x {MB_PER_WORKER} MB")
            elif n <= args.max_workers:
                configs.append((family, n, replicas, overrides))
    if notes:
        print(*notes, sep="\n", flush=True)
    out = args.out or (None if args.quick else HERE / "results" / "scaling")
    say_estimate(
        [
            (args.repeats, expected_seconds(family, n, replicas, steps), " ".join(overrides))
            for family, n, replicas, overrides in configs
        ],
        args.quick,
    )

    load_before, samples = os.getloadavg()[0], [[] for _ in configs]
    # --keep: the run dirs stay there; else a temporary directory, deleted however the benchmark ends
    with (
        contextlib.nullcontext(args.keep)
        if args.keep
        else tempfile.TemporaryDirectory(prefix="bench-scaling-") as scratch
    ):
        scratch = Path(scratch)
        scratch.mkdir(parents=True, exist_ok=True)
        for repeat in range(args.repeats):  # the configs alternate, as in side_by_side.py
            for (family, n, replicas, overrides), runs in zip(configs, samples):
                result = run_one(
                    overrides, scratch / f"{family}-{overrides[1][8:]}-r{repeat}", steps, PER_REPLICA * replicas
                )
                if result:
                    runs.append(result)
                    print(
                        f"  repeat {repeat + 1}: {' '.join(overrides)}: start-up {result['startup_s']:.1f} s, "
                        f"{result['examples_per_sec']:,.0f} ex/s, RSS max {result['rss_max_mb']:.0f} MB",
                        file=sys.stderr,
                        flush=True,
                    )

    rows = []
    for (family, n, replicas, overrides), runs in zip(configs, samples):
        row = {
            "family": family,
            "config": " ".join(overrides),
            "n": n,
            "global_batch": PER_REPLICA * replicas,
            "runs": runs,
        }
        rows.append(
            {
                **row,
                **{
                    key: statistics.median(r[key] for r in runs) if runs else None
                    for key in ("startup_s", "examples_per_sec", "rss_max_mb", "rss_mean_mb")
                },
            }
        )
    for row in rows:
        base = next((r["examples_per_sec"] for r in rows if r["family"] == row["family"] and r["n"] == 1), None)
        row["relative"] = row["examples_per_sec"] / base if base and row["examples_per_sec"] else None
    notes += [f"{row['config']}: failed in every repeat (its output is above)" for row in rows if not row["runs"]]

    cores, load_after = os.cpu_count(), os.getloadavg()[0]
    fmt = lambda v, spec, unit="": "-" if v is None else format(v, spec) + unit  # noqa: E731
    table = [
        f"Scaling{', quick' if args.quick else ''}: {steps} steps, {PER_REPLICA} examples per replica and step, "
        f"median of {args.repeats}; {cores} cores, 1-min load average {load_before:.1f} before, {load_after:.1f} after",
        "",
        "| config | N (replicas / workers) | global batch | start-up s | examples/s | rel. to N=1 | peak RSS per task "
        "MB (max / mean) |",
        "|---|---|---|---|---|---|---|",
    ]
    table += [
        f"| `{r['config']}` | {r['n']} | {r['global_batch']} | {fmt(r['startup_s'], '.1f')} | "
        f"{fmt(r['examples_per_sec'], ',.0f')} | {fmt(r['relative'], '.2f', 'x')} | {fmt(r['rss_max_mb'], ',.0f')} / "
        f"{fmt(r['rss_mean_mb'], ',.0f')} |"
        for r in rows
    ]
    print("\n".join(table + notes))
    if out is None:
        print("--quick: results.json, table.md and scaling.png not written (--out DIR writes them)")
        return
    args.out = out
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(
        json.dumps(
            {
                "cores": cores,
                "load_before": load_before,
                "load_after": load_after,
                "steps": steps,
                "quick": args.quick,
                "repeats": args.repeats,
                "per_replica_batch": PER_REPLICA,
                "mem_available_mb": available_mb,
                "notes": notes,
                "rows": rows,
            },
            indent=1,
        )
    )
    (args.out / "table.md").write_text("\n".join(table + notes) + "\n")
    # report.py draws a run's curves against step and a sweep's final metric as bars; nothing of it plots a value
    # against N per family, so that is drawn here, with report's Agg pyplot.
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    for ax, key, label in zip(
        axes,
        ("examples_per_sec", "startup_s", "rss_max_mb"),
        ("steady examples/s", "start-up to first step (s)", "peak RSS per task, max (MB)"),
    ):
        for family in dict.fromkeys(r["family"] for r in rows):
            points = [(r["n"], r[key]) for r in rows if r["family"] == family and r[key] is not None]
            if points:
                ax.plot(*zip(*points), "-o", label=family)
        ax.set(
            xlabel="N: replicas (mirrored), workers (multiworker, parameter_server)",
            title=label,
            xscale="log",
            ylim=(0, None),
        )
        ax.minorticks_off()
        ax.set_xticks([1, 2, 4, 8], ["1", "2", "4", "8"])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=9)
    fig.suptitle(
        f"tfdistx weak scaling, {PER_REPLICA} examples per replica, on {cores} cores (load {load_before:.1f})"
        + (": overhead, not speed-up" if cores <= 2 else ""),
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(args.out / "scaling.png", dpi=110)
    plt.close(fig)
    print(*(args.out / name for name in ("results.json", "table.md", "scaling.png")), sep="\n")


if __name__ == "__main__":
    interruptible(main)
