"""In-process helpers for the engine's unit tests (test_unit_engine.py,
test_compute.py): a run composed as the command line composes it, resolved
into a RunSpec and handed to `engine/fit.train`, the call a single-process
run makes (commands/execute.py). Real TensorFlow, real strategies on four
logical CPU devices, real checkpoints in tmp_path; no tfdistx process."""

import gc
import json
import shutil

import tensorflow as tf

from config_helpers import compose_ok
from tfdistx import rundir
from tfdistx.config.resolve import resolve
from tfdistx.engine import fit
from tfdistx.engine.strategy import configure_devices

# Imported while pytest collects, before any test starts TensorFlow's
# runtime: `cluster=1xN` then has N real replicas in this process. Started
# here, so that an in-process run of another module (a sweep's job with the
# default cluster) cannot set the CPU back to one device first.
configure_devices(4)
assert len(tf.config.list_logical_devices("CPU")) == 4

# Without XLA: compiling each in-process run's step took about a third of the unit layer's CPU time
# (measured: three callback and warm-start files, 147-157 s of CPU with trainer.jit_compile=auto, 92-97 s
# with false). What XLA does to a run is tested where it is the claim: test_unit_fastest_step.py and
# test_unit_compute.py train with the default (XLA_DEFAULT below), and every real-process test trains
# with the default too.
QUICK = [
    "trainer.jit_compile=false",
    "trainer.steps=40",
    "trainer.steps_per_loop=10",
    "trainer.log_every=20",
    "trainer.eval_every=0",
    "data.batch_size=32",
    "logger.tensorboard=false",
    "checkpoint.export=false",
]
XLA_DEFAULT = "trainer.jit_compile=auto"  # the default a user has, after QUICK's
SMALL = ["data.train_examples=512", "data.eval_examples=128"]  # a synthetic source's sizes (file sources have none)


class Trained:
    """A run trained in this process: its objective and run-directory files."""

    def __init__(self, run_dir, spec, objective, composed_with=()):
        self.dir, self.spec, self.objective, self.composed_with = run_dir, spec, objective, list(composed_with)
        self.summary = json.loads((run_dir / "summary.json").read_text())
        self.metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]

    def weights(self) -> dict:
        """The model's trainable variables in the newest checkpoint, by name.
        The checkpoint's object graph reaches them first through the
        optimizer (a functional model's) or through the model's own
        attributes (a subclassed model's), and names them by that path."""
        reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(self.dir / "checkpoints")))
        names = reader.get_variable_to_shape_map()
        through_optimizer = [name for name in names if "/_trainable_variables/" in name]
        chosen = through_optimizer or [
            name for name in names if name.startswith("model/") and "seed_generator" not in name
        ]
        return {name: reader.get_tensor(name) for name in chosen}


# Each run's step runner, held until the process ends, as the command line holds it (commands/ending.py):
# destroying its input pipelines (a mirrored run's above all) can wait seconds to minutes on tf.data's
# threads, and Python's garbage collector destroyed them in whichever later test it ran in: measured,
# single collections of 8-78 s, about 300 s of the unit layer's 6 minutes on two workers.
RUNNERS = []


def train(run_dir, *overrides, sizes=SMALL, xla_default: bool = False) -> Trained:
    """`xla_default`: train with the default trainer.jit_compile (auto), not QUICK's false."""
    composed_with = [*QUICK, *sizes, *([XLA_DEFAULT] if xla_default else []), *overrides]
    spec = resolve(compose_ok(run_dir, *composed_with), str(run_dir))
    with rundir.exclusive(
        str(run_dir)
    ):  # as the command line holds it: its .lock marks a run dir to resume in (rundir.in_the_way)
        trained = fit.train(spec)
    RUNNERS.append(trained.runner)
    # Everything alive now out of the collector's walks: with every run held, each full collection walked
    # a heap that only grew (measured over the unit layer: 30 full collections a worker, 16-23 s, one of
    # 8.6 s; frozen: 3-4 s a worker, none over 1.1 s). What a run left as cyclic garbage is frozen too:
    # memory the test process gives back at its end, as it does the held runners.
    gc.freeze()
    return Trained(run_dir, spec, trained.objective, composed_with)


def copied(trained: Trained, run_dir) -> Trained:
    """A copy of a trained run at `run_dir`, for a test that changes a run a
    module's tests share (one trained per module and pytest worker, not one
    per test: a quick run is ~0.7 CPU s, most of it the same for 1 step or
    40). The same files: nothing in a run dir names the dir (its checkpoints'
    state file names them relatively); its spec composed for the new dir."""
    shutil.copytree(trained.dir, run_dir)
    spec = resolve(compose_ok(run_dir, *trained.composed_with), str(run_dir))
    return Trained(run_dir, spec, trained.objective, trained.composed_with)


def whole_and_resumed(tmp_path, args, stop_at=20, steps=40, xla_default: bool = False):
    """The same run twice: whole, and stopped at `stop_at` then resumed to
    `steps` in one run dir. Returns (whole, resumed)."""
    whole = train(tmp_path / "whole", *args, f"trainer.steps={steps}", xla_default=xla_default)
    train(tmp_path / "split", *args, f"trainer.steps={stop_at}", xla_default=xla_default)
    resumed = train(tmp_path / "split", *args, f"trainer.steps={steps}", xla_default=xla_default)
    assert resumed.summary["resumed_from_step"] == stop_at
    return whole, resumed
