"""Bytes of variables on each parameter server, with and without `strategy.partitioner`, side by side.

Each model is trained for a few steps under strategy=parameter_server with P
ps tasks, whole (variables round-robin, as TF places them) and split by
`strategy.partitioner` (TF's MinSizePartitioner); wide_deep also with its
tables split by hand (`model.shards=P`). Printed per model and P: the
model's bytes, the busiest ps task's bytes and share (from the run's
summary: the bytes of the variables on each ps, as TensorFlow placed them),
the ratio of the busiest ps's bytes whole to split, and the steps' examples/s
(one short run each: rough).

    python benchmarks/bench_partitioner.py [--ps 2,4] [--steps 200] [--quick]

`--quick`: P = 2, 40 steps: the bytes are exact (placement does not depend
on the steps); the examples/s are rough.
"""

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from side_by_side import interruptible, run, say_estimate

HERE = Path(__file__).resolve().parent
COMMON = [
    "strategy=parameter_server",
    "trainer.steps_per_loop=20",
    "trainer.log_every=1000",
    "trainer.eval_every=0",
    "trainer.eval_steps=1",
    "checkpoint.every_steps=0",
    "checkpoint.export=false",
    "logger.tensorboard=false",
    "logger.console=false",
    "cluster.max_restarts=0",
    "data.train_examples=4096",
    "data.eval_examples=256",
]
MODELS = {
    "mlp 784-128-10": ["model=mlp", "data.batch_size=128"],
    "mlp 784-1024-1024-10": ["model=mlp", "model.hidden_units=[1024,1024]", "data.batch_size=128"],
    "wide_deep (vocab 100k)": ["data=synthetic_categorical", "model=wide_deep", "data.batch_size=256"],
}
# 64 KiB shards for the small default MLP (its 392 KiB kernel is
# over TF's default 256 KiB once only); TF's default elsewhere.
PARTITIONER = {"mlp 784-128-10": ["strategy.partitioner.min_shard_bytes=65536"]}


def tfdistx(*args, run_dir) -> dict:
    run(
        [sys.executable, "-m", "tfdistx", *COMMON, *args, f"hydra.run.dir={run_dir}"],
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    return json.loads((Path(run_dir) / "summary.json").read_text())


def ways(model: str, ps: int) -> dict:
    """The contenders for one model: {name: overrides}."""
    split = PARTITIONER.get(model, ["strategy.partitioner=true"])
    if model.startswith("wide_deep"):  # model.shards follows cluster.ps unless given: 1 is "whole"
        return {
            "whole": ["model.shards=1"],
            "partitioner": ["model.shards=1", *split],
            "by hand (model.shards=P)": [f"model.shards={ps}"],
        }
    return {"whole": [], "partitioner": split}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ps", default="2,4", help="numbers of ps tasks, comma-separated")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="P = 2, 40 steps: exact bytes, rough examples/s")
    args = parser.parse_args()
    if args.quick:
        args.ps, args.steps = "2", 40
    counts = [int(p) for p in args.ps.split(",")]
    runs = sum(len(ways(m, p)) for m in MODELS for p in counts)
    # Measured on this project's 2-core machine: a local ps cluster
    # starts, builds and exports in ~12 s; 200 steps add ~3 s.
    say_estimate([(runs, 12 + args.steps / 60, "a short parameter-server run")], quick=args.quick)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-partitioner-") as scratch:
        for ps in counts:
            for model, overrides in MODELS.items():
                for way, extra in ways(model, ps).items():
                    summary = tfdistx(
                        *overrides,
                        *extra,
                        f"cluster=ps{ps}w1",
                        f"trainer.steps={args.steps}",
                        run_dir=Path(scratch) / f"{model.split()[0]}-{ps}-{len(rows)}",
                    )
                    held = summary["variable_bytes"]
                    rows.append((model, ps, way, sum(held.values()), max(held.values()), summary["examples_per_sec"]))
                    print(
                        f"  {model}, {ps} ps, {way}: busiest ps {max(held.values()):,} of {sum(held.values()):,} bytes",
                        file=sys.stderr,
                        flush=True,
                    )
    print(
        f"Bytes of variables per ps task (1-min load average {os.getloadavg()[0]:.1f} at the end; {os.cpu_count()} "
        "cores)"
    )
    print(
        f"{'model':<24}{'P':>3}  {'variables':<26}{'model bytes':>13}{'busiest ps':>13}{'share':>8}{'whole / it':>12}"
        f"{'examples/s':>12}"
    )
    for model, ps, way, total, busiest, speed in rows:
        whole = next(b for m, p, w, _, b, _ in rows if (m, p, w) == (model, ps, "whole"))
        print(
            f"{model:<24}{ps:>3}  {way:<26}{total:>13,}{busiest:>13,}{busiest / total:>8.1%}"
            f"{whole / busiest:>11.2f}x{speed:>12,.0f}"
        )


if __name__ == "__main__":
    interruptible(main)
