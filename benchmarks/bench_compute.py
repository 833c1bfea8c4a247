"""Compute-bound models: tfdistx (float32, with and without XLA) against Keras 3
`fit` with XLA and a tuned `steps_per_execution`, and against the machine's
fp32 matmul rate. Side by side in one run; medians and ratios printed.

1. The 784-1024-1024-10 MLP at global batch 1024 (Adam, one device): its
   achieved GFLOP/s (examples/s x training FLOPs per example) is printed as a
   fraction of the matmul rate measured in the same run (matmul_rate.py).
2. ResNet-20 on CIFAR-shaped synthetic data at batch 128.

`fit`'s steps_per_execution is tuned first: each of --spe-candidates is run
once and the fastest is the one compared. Every measurement is a fresh
process; contenders alternate; throughput excludes tracing and compiling.

    python benchmarks/bench_compute.py [--repeats 3] [--only mlp|resnet] [--quick]

`--quick`: one repeat, a quarter of the steps, `fit`'s steps_per_execution
not tuned (8), no XLA mixed_bfloat16 contender, and ResNet-20 without XLA
(its compiling is most of a short run; the MLP runs the same XLA code):
rough numbers.
"""

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from side_by_side import compare, interruptible, run, say_estimate

HERE = Path(__file__).resolve().parent
MODELS = {
    # name: (tfdistx overrides, keras_fit_baseline.py arguments, batch, steps, steps per tf.function call)
    "mlp": (["model=mlp", "model.hidden_units=[1024,1024]"], ["--model=mlp", "--hidden=1024,1024"], 1024, 200, 20),
    "resnet": (
        ["model=resnet", "data.image_shape=[32,32,3]"],
        ["--model=resnet", "--image-shape=32,32,3"],
        128,
        60,
        10,
    ),
}
QUICK_DIVISOR = 4  # --quick: steps and steps per call divided by this
# For the estimate, measured on this project's 2-core machine (docs/performance.md): examples/s in float32, and the
# seconds a process takes besides its timed steps (start-up, tracing, XLA compiling, fit's warm-up, the eval batch).
RATE = {"mlp": 21_000, "resnet": 380}
OVERHEAD = {"mlp": 5, "resnet": 8}


def mlp_training_flops(widths=(784, 1024, 1024, 10)) -> int:
    """Per example: forward 2 x multiply-adds, weight gradients 2 x, input
    gradients 2 x (none for the first layer, whose input is data)."""
    macs = [a * b for a, b in zip(widths, widths[1:])]
    return 2 * sum(macs) + 2 * sum(macs) + 2 * sum(macs[1:])


def tfdistx_run(model: str, *extra: str, quick: bool = False) -> float:
    overrides, _, batch, steps, per_loop = MODELS[model]
    if quick:
        steps, per_loop = steps // QUICK_DIVISOR, max(per_loop // QUICK_DIVISOR, 1)
    with tempfile.TemporaryDirectory() as run_dir:
        cmd = [
            sys.executable,
            "-m",
            "tfdistx",
            "strategy=one_device",
            "data=synthetic",
            *overrides,
            *extra,
            f"data.batch_size={batch}",
            f"trainer.steps={steps}",
            f"trainer.steps_per_loop={per_loop}",
            f"trainer.log_every={steps}",
            "trainer.eval_every=0",
            "trainer.eval_steps=1",
            "checkpoint.every_steps=0",
            "checkpoint.export=false",
            "logger.console=false",
            "logger.tensorboard=false",
            f"hydra.run.dir={run_dir}",
        ]
        run(cmd, env=_env())
        return json.loads((Path(run_dir) / "summary.json").read_text())["examples_per_sec"]


def keras_fit(model: str, steps_per_execution: int, jit_compile: bool = True, quick: bool = False) -> float:
    _, arguments, batch, steps, _ = MODELS[model]
    steps = steps // QUICK_DIVISOR if quick else steps
    cmd = [
        sys.executable,
        str(HERE / "keras_fit_baseline.py"),
        *arguments,
        f"--batch={batch}",
        f"--steps={steps}",
        f"--steps-per-execution={steps_per_execution}",
    ] + (["--jit-compile"] if jit_compile else [])
    out = run(cmd, env=_env())
    return json.loads(out.stdout.strip().splitlines()[-1])["examples_per_sec"]


def matmul_gflops() -> float:
    out = run([sys.executable, str(HERE / "matmul_rate.py")], env=_env())
    return json.loads(out.stdout.strip().splitlines()[-1])["gflops"]


def tuned_steps_per_execution(model: str, candidates) -> int:
    speeds = {spe: keras_fit(model, spe) for spe in candidates}
    print(
        f"{model}: keras fit (XLA) examples/s by steps_per_execution: "
        + ", ".join(f"{spe}: {v:,.0f}" for spe, v in speeds.items()),
        flush=True,
    )
    return max(speeds, key=speeds.get)


def _env():
    return {
        **os.environ,
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=list(MODELS))
    parser.add_argument("--spe-candidates", default="1,8,32")
    parser.add_argument("--quick", action="store_true", help="rough numbers in under 2 minutes (see above)")
    args = parser.parse_args()
    candidates = [int(c) for c in args.spe_candidates.split(",")]
    models = [args.only] if args.only else list(MODELS)
    if args.quick:
        args.repeats, candidates = 1, [8]
    estimate = []
    for model in models:
        _, _, batch, steps, _ = MODELS[model]
        steps = steps // QUICK_DIVISOR if args.quick else steps
        seconds = lambda steps: OVERHEAD[model] + steps * batch / RATE[model]  # noqa: E731
        warm_up = lambda spe: max(2 * spe, 20)  # keras_fit_baseline.py's untimed first fit  # noqa: E731
        if len(candidates) > 1:
            estimate += [
                (1, seconds(steps + warm_up(spe)), f"{model}, tuning fit, steps_per_execution={spe}")
                for spe in candidates
            ]
        ours, fits = ((1, 1) if model == "resnet" else (2, 2)) if args.quick else (3, 2)
        estimate += [
            (ours * args.repeats, seconds(steps), f"{model}, tfdistx, {steps} steps"),
            (fits * args.repeats, seconds(steps + warm_up(max(candidates))), f"{model}, keras fit, {steps} steps"),
        ]
    estimate.append((args.repeats if "mlp" in models else 0, 8, "the matmul rate"))
    say_estimate(estimate, args.quick)
    print(f"{os.cpu_count()} cores", flush=True)

    for model in models:
        # One candidate is not a tuning: no run for it.
        spe = tuned_steps_per_execution(model, candidates) if len(candidates) > 1 else candidates[0]
        quick = args.quick
        contenders = {
            "tfdistx": lambda: tfdistx_run(model, "trainer.jit_compile=false", quick=quick),
            "tfdistx XLA": lambda: tfdistx_run(model, "trainer.jit_compile=true", quick=quick),
            "tfdistx XLA mixed_bfloat16": lambda: tfdistx_run(
                model, "trainer.jit_compile=true", "trainer.precision=mixed_bfloat16"
            ),
            f"keras fit XLA (steps_per_execution={spe})": lambda: keras_fit(model, spe, quick=quick),
            f"keras fit (steps_per_execution={spe})": lambda: keras_fit(model, spe, jit_compile=False, quick=quick),
        }
        if quick:
            del contenders["tfdistx XLA mixed_bfloat16"]
            if model == "resnet":
                del contenders["tfdistx XLA"], contenders[f"keras fit XLA (steps_per_execution={spe})"]
        if model == "mlp":
            contenders["matmul rate (as MLP examples/s)"] = lambda: matmul_gflops() * 1e9 / mlp_training_flops()
        _, _, batch, steps, _ = MODELS[model]
        steps = steps // QUICK_DIVISOR if quick else steps
        medians = compare(
            contenders, args.repeats, f"{model}, one device, batch {batch}, {steps} steps", ours="tfdistx"
        )
        if model == "mlp":
            peak = medians["matmul rate (as MLP examples/s)"]
            for name in (n for n in ("tfdistx", "tfdistx XLA", "tfdistx XLA mixed_bfloat16") if n in medians):
                gflops = medians[name] * mlp_training_flops() / 1e9
                print(
                    f"  {name}: {gflops:,.1f} GFLOP/s = {medians[name] / peak:.2f} of the fp32 matmul rate "
                    f"({peak * mlp_training_flops() / 1e9:,.1f} GFLOP/s)"
                )


if __name__ == "__main__":
    interruptible(main)
