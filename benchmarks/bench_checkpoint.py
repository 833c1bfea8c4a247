"""Checkpoints at the size users train: the steps' stall per periodic save,
synchronous and in the background, side by side with Keras and TensorFlow's
own, for checkpoints of about 0.1, 0.5 and 1.5 GB; in one run.

Each model is a 784-H-H-10 MLP with Adam (its checkpoint: the weights and
two slots per weight, float32), trained on MNIST-shaped synthetic data at
batch 128, a save every `every` steps. For each, alternating:

- tfdistx, `checkpoint.every_steps=0` (the end's save only), then
  `every_steps=N` written in the background (the default) and with
  `checkpoint.background=false` (the steps wait for each save, as before);
- Keras `model.fit` without and with `ModelCheckpoint(save_weights_only=True,
  save_freq=N)`;
- one tf.function a step with a plain `tf.train.Checkpoint` of the same
  variables, without saves, written synchronously, and with
  `CheckpointOptions(enable_async=True)` (checkpoint_baseline.py).

Printed per model: the stall per periodic save (the training time with the
saves less the time without, over the saves: what the saves cost the run,
the copies, the writes' use of the cores and the waits included; and, for
tfdistx, what the loop itself waited at each save, summary.json's
`stall_sec_per_save`), a save's time (tfdistx: from its snapshot to its
files in place; the others: what a save call blocked), the restore time,
and tfdistx's SIGTERM-to-exit-42 with a save in flight (the signal sent as
soon as one is being written: the worst case, a save to finish and one of
its own to write). Then the issue's run: 784-8192-8192-10, 60 steps,
`every_steps=5` against `0`, its time ratio. And under parameter servers
(ps1w2, the first model): the coordinator's wait at a background save (a
copy of each variable in its ps task's memory) against a synchronous save.

    python benchmarks/bench_checkpoint.py [--repeats 2] [--models 0.1,0.5,1.5] [--quick]

`--quick`: the 0.1 GB model, one repeat, no issue run: rough numbers.
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from side_by_side import interruptible, kill_tree, run, say_estimate

HERE = Path(__file__).resolve().parent
ENV = {
    **os.environ,
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
}
# model -> (hidden width, steps, steps between saves): a checkpoint of about 0.1, 0.5, 1.5 GB; at least
# three periodic saves, each interval a few times a save's time on this machine.
MODELS = {"0.1": (2600, 60, 10), "0.5": (6100, 50, 10), "1.5": (10800, 40, 10)}
BATCH = 128
COMMON = [
    "data.batch_size=128",
    "trainer.steps_per_loop=100",
    "trainer.log_every=100",
    "trainer.eval_every=0",
    "trainer.eval_steps=1",
    "checkpoint.export=false",
    "logger.tensorboard=false",
    "logger.console=false",
]
STAGING = ".writing-ckpt-"


def tfdistx(run_dir: Path, *args, keep: bool = False) -> dict:
    """The run's summary; its checkpoints deleted unless `keep` (a 1.5 GB model's runs would fill the disk)."""
    run([sys.executable, "-m", "tfdistx", *COMMON, *args, f"hydra.run.dir={run_dir}"], env=ENV)
    summary = json.loads((run_dir / "summary.json").read_text())
    if not keep:
        shutil.rmtree(run_dir, ignore_errors=True)
    return summary


def baseline(mode: str, hidden: int, steps: int, every: int, where: str) -> dict:
    done = run(
        [
            sys.executable,
            str(HERE / "checkpoint_baseline.py"),
            f"--mode={mode}",
            f"--hidden={hidden},{hidden}",
            f"--batch={BATCH}",
            f"--steps={steps}",
            f"--every={every}",
            f"--dir={where}",
        ],
        env=ENV,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def sigterm_to_exit(run_dir: Path, hidden: int, every: int, background: bool) -> float:
    """Seconds from a SIGTERM sent while a save is being written to the process's exit (which must be 42)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tfdistx",
            *COMMON,
            f"model.hidden_units=[{hidden},{hidden}]",
            "trainer.steps=100000",
            "trainer.steps_per_loop=1",
            f"checkpoint.every_steps={every}",
            f"checkpoint.background={str(background).lower()}",
            f"hydra.run.dir={run_dir}",
        ],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    checkpoints = run_dir / "checkpoints"
    try:
        deadline = time.monotonic() + 900
        while not (checkpoints.is_dir() and any(checkpoints.glob(STAGING + "*"))):
            if proc.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"the run ended ({proc.returncode}) or stalled before its first save")
            time.sleep(0.005)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=900)
        elapsed = time.monotonic() - sent
    finally:
        kill_tree(proc.pid)
        proc.wait()
        shutil.rmtree(run_dir, ignore_errors=True)
    if code != 42:
        sys.exit(f"SIGTERM with a save in flight: exit {code}, not 42")
    return elapsed


def measure(model: str, repeats: int, root: Path) -> dict:
    hidden, steps, every = MODELS[model]
    saves = steps // every - 1  # the end's save is in every run, the saves before it are what differs
    shape = f"model.hidden_units=[{hidden},{hidden}]"
    samples = {}

    def add(name, value):
        samples.setdefault(name, []).append(value)

    for repeat in range(repeats):
        where = root / f"{model}-{repeat}"
        none = tfdistx(where / "none", shape, f"trainer.steps={steps}", "checkpoint.every_steps=0")
        ours = tfdistx(where / "async", shape, f"trainer.steps={steps}", f"checkpoint.every_steps={every}", keep=True)
        sync = tfdistx(
            where / "sync",
            shape,
            f"trainer.steps={steps}",
            f"checkpoint.every_steps={every}",
            "checkpoint.background=false",
        )
        resumed = tfdistx(where / "async", shape, f"trainer.steps={steps + 1}", f"checkpoint.every_steps={every}")
        base = none["train_wall_time_sec"]
        add("tfdistx background: stall per save", (ours["train_wall_time_sec"] - base) / saves)
        add("tfdistx background: the loop's own wait per save", ours["checkpoint"]["stall_sec_per_save"])
        add("tfdistx background: a save's write", ours["checkpoint"]["save_sec_min"])
        add("tfdistx synchronous: stall per save", (sync["train_wall_time_sec"] - base) / saves)
        add("tfdistx synchronous: a save", sync["checkpoint"]["save_sec_min"])
        add("tfdistx: restore", resumed["checkpoint"]["restore_sec"])
        add("tfdistx: checkpoint GB", ours["checkpoint"]["bytes"] / 1e9)
        add("tfdistx background: SIGTERM to exit 42", sigterm_to_exit(where / "sigterm-async", hidden, every, True))
        add("tfdistx synchronous: SIGTERM to exit 42", sigterm_to_exit(where / "sigterm-sync", hidden, every, False))
        scratch = str(where)
        fit_alone = baseline("fit", hidden, steps, 0, scratch)["train_sec"]
        loop_alone = baseline("tf_sync", hidden, steps, 0, scratch)["train_sec"]
        for mode, label, alone in (
            ("fit", "Keras fit + ModelCheckpoint", fit_alone),
            ("tf_sync", "tf.train.Checkpoint sync", loop_alone),
            ("tf_async", "tf.train.Checkpoint async", loop_alone),
        ):
            saving = baseline(mode, hidden, steps, every, scratch)
            add(f"{label}: stall per save", (saving["train_sec"] - alone) / saving["saves"])
            add(f"{label}: a save call", saving["save_call_sec"])
            add(f"{label}: restore", saving["restore_sec"])
            add(f"{label}: checkpoint GB", saving["bytes"] / 1e9)
        print(
            f"  {model} GB, repeat {repeat + 1} done (1-min load average {os.getloadavg()[0]:.1f})",
            file=sys.stderr,
            flush=True,
        )
    return {name: statistics.median(values) for name, values in samples.items()}


def parameter_servers(model: str, repeats: int, root: Path) -> dict:
    """ps1w2 (a local cluster): what the coordinator's loop waits for at a background save (a copy of each
    variable in its ps task's memory, one request a variable), against a synchronous save."""
    hidden, steps, every = MODELS[model]
    saves = steps // every - 1
    shape = [f"model.hidden_units=[{hidden},{hidden}]", "strategy=parameter_server", "cluster=ps1w2"]
    samples = {}
    for repeat in range(repeats):
        where = root / f"ps-{model}-{repeat}"
        runs = {
            name: tfdistx(where / name, *shape, f"trainer.steps={steps}", *extra)
            for name, extra in (
                ("none", ["checkpoint.every_steps=0"]),
                ("async", [f"checkpoint.every_steps={every}"]),
                ("sync", [f"checkpoint.every_steps={every}", "checkpoint.background=false"]),
            )
        }
        base = runs["none"]["train_wall_time_sec"]
        for name, value in (
            ("ps1w2 background: stall per save", (runs["async"]["train_wall_time_sec"] - base) / saves),
            ("ps1w2 background: the loop's own wait per save", runs["async"]["checkpoint"]["stall_sec_per_save"]),
            ("ps1w2 background: a save's write", runs["async"]["checkpoint"]["save_sec_min"]),
            ("ps1w2 synchronous: stall per save", (runs["sync"]["train_wall_time_sec"] - base) / saves),
            ("ps1w2 synchronous: a save", runs["sync"]["checkpoint"]["save_sec_min"]),
        ):
            samples.setdefault(name, []).append(value)
    return {name: statistics.median(values) for name, values in samples.items()}


def issue_run(repeats: int, root: Path) -> dict:
    """The issue's 784-8192-8192-10 run: 60 steps, every_steps=5 against 0, with the config's other defaults."""
    times = {"0": [], "5 background": [], "5 synchronous": []}
    for repeat in range(repeats):
        base = [
            "model.hidden_units=[8192,8192]",
            "trainer.steps=60",
            "checkpoint.export=false",
            "logger.tensorboard=false",
        ]
        for name, extra in (
            ("0", ["checkpoint.every_steps=0"]),
            ("5 background", ["checkpoint.every_steps=5"]),
            ("5 synchronous", ["checkpoint.every_steps=5", "checkpoint.background=false"]),
        ):
            run_dir = root / f"issue-{repeat}-{name.replace(' ', '-')}"
            run([sys.executable, "-m", "tfdistx", *base, *extra, f"hydra.run.dir={run_dir}"], env=ENV)
            times[name].append(json.loads((run_dir / "summary.json").read_text())["train_wall_time_sec"])
            shutil.rmtree(run_dir, ignore_errors=True)
    return {name: statistics.median(values) for name, values in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--models", default="0.1,0.5,1.5")
    parser.add_argument("--quick", action="store_true", help="the 0.1 GB model, one repeat, no issue run")
    parser.add_argument("--dir", default=None, help="where the runs write (default: a temporary directory)")
    args = parser.parse_args()
    models = ["0.1"] if args.quick else args.models.split(",")
    repeats = 1 if args.quick else args.repeats
    # Measured on this 2-core machine (quiet): a model's repeat (4 tfdistx runs, 2 SIGTERM runs, 6 baseline runs)
    # about 3, 6 and 14 min for the three models; the issue's three runs about 2 min.
    minutes = {"0.1": 3, "0.5": 6, "1.5": 14}
    say_estimate(
        [(repeats, 60 * minutes[model], f"the {model} GB model's runs") for model in models]
        + [(repeats, 90, "ps1w2, three runs")]
        + ([] if args.quick else [(repeats, 120, "the issue's run, three ways")]),
        quick=args.quick,
    )
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        results = {model: measure(model, repeats, Path(root)) for model in models}
        ps = parameter_servers(models[0], repeats, Path(root))
        issue = None if args.quick else issue_run(repeats, Path(root))
    print(
        f"Checkpoints, median of {repeats} (1-min load average {load:.1f} before, {os.getloadavg()[0]:.1f} after); "
        f"seconds unless named"
    )
    names = list(next(iter(results.values())))
    print(f"{'':<52}" + "".join(f"{model + ' GB':>12}" for model in models))
    for name in names:
        print(f"{name:<52}" + "".join(f"{results[model][name]:>12.3f}" for model in models))
    for model in models:
        ours, sync = results[model]["tfdistx background: stall per save"], results[model]["tfdistx synchronous: a save"]
        own = results[model]["tfdistx background: the loop's own wait per save"]
        print(
            f"{model} GB: a background save stalls the run {ours / sync:.1%} of a synchronous save's time "
            f"({own / sync:.1%} the loop's own wait)"
        )
    print(f"Parameter servers (ps1w2, a local cluster), the {models[0]} GB model, median of {repeats}, seconds")
    for name, value in ps.items():
        print(f"{name:<52}{value:>12.3f}")
    if issue:
        print(
            "784-8192-8192-10, 60 steps, train_wall_time_sec: every_steps=0 {0:.1f} s, =5 in the background {1:.1f} s "
            "(ratio {2:.2f}), =5 synchronous {3:.1f} s (ratio {4:.2f})".format(
                issue["0"],
                issue["5 background"],
                issue["0"] / issue["5 background"],
                issue["5 synchronous"],
                issue["0"] / issue["5 synchronous"],
            )
        )


if __name__ == "__main__":
    interruptible(main)
