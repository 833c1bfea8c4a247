"""Where a multi-worker step's time goes, term by term, beside its bounds, in one run.

For W = 2 and 4 workers on this machine's loopback, the default 784-128-10
MLP at a global batch of 256:

1. Loopback bandwidth B, measured here: one TCP stream between two processes.
2. The parts of a step, timed apart inside a W-worker cluster
   (multiworker_step_parts.py, started by tfdistx's own launcher): an
   all-reduce alone at 4 KB, 400 KB, 4 MB and 40 MB, from which latency
   alpha and bandwidth beta are fitted (t = alpha + S / beta, least
   squares); the model's own gradients summed as tfdistx sums them; the few
   floats of a step's metrics (one all-reduce more, if a step summed them);
   the update alone (forward, backward, Adam; no collective); the input alone,
   as tfdistx feeds it and through the strategy's distributed iterator.
   Each all-reduce is set against the ring's bound 2(W-1)/W x S/B
   (nccl-tests' bus bandwidth) and the fitted alpha + S/beta.
3. Whole runs of `python -m tfdistx`, alternating, examples/s and ms a
   step: one_device (the same two cores in one process), multiworker Wx1
   with each task's threads as tfdistx sizes them (cluster.task_threads=auto)
   and as TensorFlow sizes them (=0), with the gradients summed in bfloat16
   (strategy.all_reduce_dtype: half the bytes, rounded), with the gradients
   summed through MPI (strategy.communication=mpi, when the mpi extra is
   installed; its alpha in the step: bench_mpi_in_step.py), and
   parameter_server ps1wW with both thread settings.

    python benchmarks/bench_multiworker_step.py [--workers 2 4] [--steps 3000] [--repeats 3] [--quick]

The first two parts run each task with TensorFlow's threads as
cluster.task_threads=auto would size them, as a run does.
"""

import argparse
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from side_by_side import interruptible, run, say_estimate, table
from tfdistx.core.threads import AUTO, environment, task_threads

HERE = Path(__file__).resolve().parent
BATCH = 256
STREAM_BYTES = 512 * 2**20


def loopback_bandwidth() -> float:
    """Bytes/s of one TCP stream over 127.0.0.1 between two processes (the best of three)."""
    receiver = (
        "import socket, sys\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1); print(s.getsockname()[1], flush=True)\n"
        "c, _ = s.accept(); got = 0\n"
        "while True:\n"
        "    b = c.recv(1 << 22)\n"
        "    if not b: break\n"
        "    got += len(b)\n"
        "c.sendall(b'k')\n"
    )
    best = 0.0
    chunk = b"\0" * (1 << 22)
    for _ in range(3):
        child = subprocess.Popen([sys.executable, "-c", receiver], stdout=subprocess.PIPE)
        port = int(child.stdout.readline())
        with socket.create_connection(("127.0.0.1", port)) as sock:
            started = time.perf_counter()
            for _ in range(STREAM_BYTES // len(chunk)):
                sock.sendall(chunk)
            sock.shutdown(socket.SHUT_WR)
            sock.recv(1)
            best = max(best, STREAM_BYTES / (time.perf_counter() - started))
        child.wait()
    return best


def parts(workers: int, repeats: int) -> dict:
    """multiworker_step_parts.py's milliseconds, from a W-worker local cluster."""
    per_pool, _ = task_threads(AUTO, {"worker": workers}, environ={})
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **environment(per_pool)}  # what a local cluster's task gets
    with tempfile.TemporaryDirectory() as log_dir:
        task = [sys.executable, str(HERE / "multiworker_step_parts.py"), f"--batch={BATCH}", f"--repeats={repeats}"]
        launch = (
            "import sys; from tfdistx.cluster.launch_spec import LaunchSpec; "
            "from tfdistx.launch.local.launcher import run_local_cluster; "
            f"sys.exit(run_local_cluster(LaunchSpec(command={tuple(task)!r}, log_dir={log_dir!r}, run_log=None, "
            f"primary=('worker',), counts={{'worker': {workers}}})))"
        )
        out = run([sys.executable, "-c", launch], check=False, env=env)
        lines = (Path(log_dir) / "worker-0.log").read_text().splitlines()
        found = [line for line in lines if line.startswith("{")]
        if out.returncode or not found:
            sys.exit(f"the parts' cluster failed ({out.returncode}):\n" + "\n".join(lines[-30:]))
        return json.loads(found[-1])


def fit(points: dict) -> tuple:
    """(alpha s, beta bytes/s): t = alpha + S / beta fitted to {S: ms} by least
    squares of the relative error (weights 1/t^2), so that the small sizes,
    where alpha shows, count as much as the large ones."""
    rows = [(float(size), ms / 1e3) for size, ms in points.items()]
    w = [1 / t**2 for _, t in rows]
    sw, ss, st = sum(w), sum(wi * s for wi, (s, _) in zip(w, rows)), sum(wi * t for wi, (_, t) in zip(w, rows))
    sss, sst = sum(wi * s * s for wi, (s, _) in zip(w, rows)), sum(wi * s * t for wi, (s, t) in zip(w, rows))
    gamma = (sw * sst - ss * st) / (sw * sss - ss * ss)
    return (st - gamma * ss) / sw, 1 / gamma


def tfdistx_run(args: list, steps: int) -> float:
    with tempfile.TemporaryDirectory() as run_dir:
        cmd = [
            sys.executable,
            "-m",
            "tfdistx",
            *args,
            "model=mlp",
            "data=synthetic",
            f"data.batch_size={BATCH}",
            f"trainer.steps={steps}",
            f"trainer.log_every={steps}",
            "trainer.eval_every=0",
            "trainer.eval_steps=1",
            "checkpoint.every_steps=0",
            "checkpoint.export=false",
            "logger.console=false",
            "logger.tensorboard=false",
            f"hydra.run.dir={run_dir}",
        ]
        out = run(cmd, check=False, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
        if out.returncode:
            sys.exit(f"failed ({out.returncode}): {' '.join(cmd)}\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
        return json.loads((Path(run_dir) / "summary.json").read_text())["examples_per_sec"]


def report_parts(workers: int, got: dict, bandwidth: float) -> None:
    alpha, beta = fit({int(s): ms for s, ms in got["all_reduce"].items()})
    ring = 2 * (workers - 1) / workers
    print(
        f"\n{workers} workers: all-reduce alone, one float32 tensor (alpha {alpha * 1e3:.3f} ms, beta "
        f"{beta / 1e6:,.0f} MB/s fitted; loopback B {bandwidth / 1e6:,.0f} MB/s measured)"
    )
    print(f"  {'bytes':>12} {'ms':>9} {'alpha+S/beta':>13} {'ring bound 2(W-1)/W*S/B':>24} {'ms / bound':>11}")
    for size, ms in got["all_reduce"].items():
        bound = ring * int(size) / bandwidth * 1e3
        print(
            f"  {int(size):>12,} {ms:>9.3f} {(alpha + int(size) / beta) * 1e3:>13.3f} {bound:>24.3f} "
            f"{ms / bound:>11.1f}"
        )
    size = got["gradient_bytes"]
    model_fit = (alpha + size / beta) * 1e3
    print(
        f"  the MLP's gradients ({size:,} bytes, 4 tensors, one all-reduce): {got['gradients']:.3f} ms, "
        f"{got['gradients'] / model_fit:.2f}x alpha + S/beta ({model_fit:.3f} ms)"
    )
    print(f"\n{workers} workers: the parts of one step, per worker, ms (each timed alone, every worker at once)")
    rows = [
        ("gradients' all-reduce", got["gradients"]),
        ("update (forward, backward, Adam; no collective)", got["compute"]),
        ("input, as tfdistx feeds it", got["input"]),
        ("  (through the distributed iterator instead)", got["input_distributed_iterator"]),
        ("  (a metrics all-reduce, if every step had one)", got["metric_state"]),
    ]
    for name, ms in rows:
        print(f"  {name:<50} {ms:8.3f}")
    print(f"  {'sum of the first three':<50} {got['gradients'] + got['compute'] + got['input']:8.3f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="W=2, 500 steps, one repeat: rough numbers")
    args = parser.parse_args()
    if args.quick:
        args.workers, args.steps, args.repeats = [2], 500, 1
    examples = args.steps * BATCH
    say_estimate(
        [
            (1, 15, "loopback bandwidth"),
            (len(args.workers), 40, "the parts, in a cluster each"),
            (args.repeats, 8 + examples / 200_000, "one_device"),
            *[
                (5 * args.repeats, 10 + examples / 50_000, f"multiworker {w}x1 (3 settings) and ps1w{w} (2)")
                for w in args.workers
            ],
        ],
        args.quick,
    )

    bandwidth = loopback_bandwidth()
    got = {w: parts(w, 40 if args.quick else 200) for w in args.workers}
    for w in args.workers:
        report_parts(w, got[w], bandwidth)

    contenders = {"one_device": lambda: tfdistx_run(["strategy=one_device"], args.steps)}
    for w in args.workers:
        for threads in ("auto", 0):
            contenders[f"multiworker {w}x1, task_threads={threads}"] = lambda w=w, t=threads: tfdistx_run(
                ["strategy=multiworker", f"cluster={w}x1", f"cluster.task_threads={t}"], args.steps
            )
            contenders[f"parameter_server ps1w{w}, task_threads={threads}"] = lambda w=w, t=threads: tfdistx_run(
                ["strategy=parameter_server", f"cluster=ps1w{w}", f"cluster.task_threads={t}"], args.steps
            )
        contenders[f"multiworker {w}x1, all_reduce_dtype=bfloat16"] = lambda w=w: tfdistx_run(
            ["strategy=multiworker", f"cluster={w}x1", "strategy.all_reduce_dtype=bfloat16"], args.steps
        )
        if importlib.util.find_spec("mpi4py"):  # the mpi extra installed
            contenders[f"multiworker {w}x1, communication=mpi"] = lambda w=w: tfdistx_run(
                ["strategy=multiworker", f"cluster={w}x1", "strategy.communication=mpi"], args.steps
            )
    print()
    medians = table(
        contenders,
        args.repeats,
        f"\nWhole runs: the default MLP, global batch {BATCH}, {args.steps} steps",
        "/ one_device",
        lambda m, name: m[name] / m["one_device"],
    )
    print(f"\n  {'contender':<45} {'ms a step':>10}")
    for name, value in medians.items():
        print(f"  {name:<45} {BATCH / value * 1e3:>10.3f}")
    for w in args.workers:
        mw, ps = (
            medians[f"multiworker {w}x1, task_threads=auto"],
            medians[f"parameter_server ps1w{w}, task_threads=auto"],
        )
        print(f"  ps1w{w} / multiworker {w}x1 (task_threads=auto): {ps / mw:.2f}")
    if importlib.util.find_spec(
        "mpi4py"
    ):  # alpha in the step, TensorFlow's collective against MPI's, at the same worker counts
        print("\nThe gradients' sum in the step, gRPC against MPI (bench_mpi_in_step.py):", flush=True)
        subprocess.run(
            [
                sys.executable,
                str(HERE / "bench_mpi_in_step.py"),
                "--workers",
                *map(str, args.workers),
                "--steps",
                str(100 if args.quick else 500),
            ],
            check=True,
        )


if __name__ == "__main__":
    interruptible(main)
