"""What the check that the weights are still numbers costs, beside what it checks after.

The loop asks, at every record (every `trainer.log_every` steps, default 100)
and before every save, whether a trainable weight holds a NaN or an infinity
(engine/finite.py: one small computation over the trainable variables, one
vector of booleans read back). For the default MLP, the CNN and the ResNet
on one device at the default batch, this prints, side by side, the median of
`--repeats` timings of:

- one check (the weights all finite: what a healthy run pays at each record);
- one call of the steps between two records, `--steps-per-loop` of them
  (default 100, trainer.steps_per_loop's and trainer.log_every's default);

and the check's share of them. Built in process, as a run builds them
(compose, resolve, engine/build.build_run, engine/runner.make_runner).

    python benchmarks/bench_finite_weights.py [--repeats 7] [--steps-per-loop 100] [--models mlp cnn resnet]
"""

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def timed(call, repeats: int) -> float:
    """The median of `repeats` timings of `call()`, in seconds (one call first, unmeasured: tracing)."""
    call()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def measure(model: str, steps: int, repeats: int) -> tuple:
    from tfdistx.cluster.placement import Placement
    from tfdistx.commands.common import compose
    from tfdistx.config.resolve import resolve
    from tfdistx.engine.build import build_run
    from tfdistx.engine.finite import NonFiniteWeights
    from tfdistx.engine.runner import make_runner

    with tempfile.TemporaryDirectory(prefix="bench-finite-") as run_dir:
        overrides = [f"model={model}", "strategy=one_device", f"trainer.steps={steps * (repeats + 2)}"]
        cfg = compose([*overrides, f"trainer.steps_per_loop={steps}", f"hydra.run.dir={run_dir}"], notes=False)
        run = build_run(resolve(cfg, run_dir), Placement())
        runner = make_runner(run)
        check = NonFiniteWeights(run.model.trainable_variables)
        done = [0]

        def call_of_steps():
            runner.train(done[0], steps)
            done[0] += steps

        per_call = timed(call_of_steps, repeats)
        per_check = timed(check, repeats * 10)
        assert check() is None
        return per_check, per_call, len(check.parts), sum(v.shape.num_elements() for _, v in check.parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps-per-loop", type=int, default=100)
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn", "resnet"])
    args = parser.parse_args()
    print(f"one_device, the default batch, {args.steps_per_loop} steps a call; medians of {args.repeats}")
    print(f"{'model':8} {'variables':>9} {'weights':>11} {'one check':>11} {'one call':>10} {'share':>7}")
    for model in args.models:
        check, call, count, weights = measure(model, args.steps_per_loop, args.repeats)
        print(
            f"{model:8} {count:9d} {weights:11,d} {check * 1e3:8.3f} ms {call * 1e3:7.1f} ms {check / call:7.2%}",
            flush=True,
        )


if __name__ == "__main__":
    main()
