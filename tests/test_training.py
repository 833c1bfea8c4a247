"""Short real training runs: real TensorFlow, real strategies, files on disk."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import QUICK, run_command, start_tfdistx, tfdistx_env, wait_until


def test_default_run_learns_and_writes_its_run_dir(tfdistx):
    run = tfdistx(
        "trainer.steps=300", "trainer.log_every=100", "trainer.eval_every=100", fresh=True
    )  # as a user starts it
    assert run.returncode == 0, run
    summary = run.summary
    assert summary["step"] == 300
    assert (summary["strategy"], summary["replicas"], summary["workers"]) == ("one_device", 1, 1)
    assert summary["resumed"] is False and summary["examples_per_sec"] > 0
    # The synthetic task is learnable: well above the 10% of chance.
    assert summary["eval"]["eval/accuracy"] > 0.25

    metrics = run.metrics
    assert [m["step"] for m in metrics] == [100, 200, 300]
    assert metrics[-1]["loss"] < metrics[0]["loss"]
    assert {"loss", "accuracy", "examples_per_sec", "lr", "eval/loss", "eval/accuracy"} <= set(metrics[-1])

    assert (run.dir / ".hydra" / "config.yaml").exists()
    assert list((run.dir / "checkpoints").glob("ckpt-300.index"))
    events = list((run.dir / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    # progress on the terminal, one plain line per log step
    assert "step 300/300" in run.stdout and "ex/s" in run.stdout


def test_tensorboard_holds_the_logged_scalars(tfdistx):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tfdistx(*QUICK, "logger.tensorboard=true")
    assert run.returncode == 0, run
    events = EventAccumulator(str(run.dir / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    tags = set(events.Tags()["tensors"])
    assert {"train/loss", "train/accuracy", "eval/accuracy"} <= tags
    assert [e.step for e in events.Tensors("train/loss")] == [20, 40]


# Strategies, models, optimizers, schedules and epochs run in this process
# in test_unit_engine.py (-m unit): the same engine call a run makes.


def test_user_model_and_data_targets(tfdistx):
    # a target's own keys are given as any group's (no `+`); a key it does not take is refused (test_unit_config_own.py)
    quick = [o for o in QUICK if not o.startswith(("data.train_examples", "data.eval_examples"))]
    run = tfdistx(
        *quick,
        "model._target_=user_plugins.tiny_model",
        "data._target_=user_plugins.constant_data",
        "data.examples=256",
        "optimizer.lr=0.05",
    )
    assert run.returncode == 0, run
    assert run.summary["step"] == 40
    assert run.summary["eval"]["eval/accuracy"] > 0.8
    # a command-line target gets only the keys given: the mlp's own are left out, and said so
    assert (
        "model._target_=user_plugins.tiny_model gets only the model keys you give (not the default group's "
        "hidden_units, dropout)" in run.stderr
    )


def test_killed_run_resumes_without_repeating_steps(tmp_path):
    """SIGKILL mid-run, rerun the same command: it continues from the last
    checkpoint (fit.train's resume, in this process: test_unit_run_dir.py)."""
    run_dir = tmp_path / "run"
    args = [
        "trainer.steps=4000",
        "trainer.steps_per_loop=20",
        "trainer.log_every=20",
        "trainer.eval_every=0",
        "checkpoint.every_steps=100",
        "logger.tensorboard=false",
    ]
    proc = start_tfdistx(args, run_dir, stdout=subprocess.DEVNULL)
    try:
        # A checkpoint counts once CheckpointManager has recorded it in the
        # `checkpoint` state file (the last thing a save writes).
        wait_until(lambda: (run_dir / "checkpoints" / "checkpoint").exists(), 300, "a first checkpoint", [proc])
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    killed_lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert 0 < len(killed_lines) < 200, "the run ended before it could be killed"

    rerun = run_command(
        [sys.executable, "-m", "tfdistx", *args, f"hydra.run.dir={run_dir}"], env=tfdistx_env(), timeout=600
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    import json

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed"] and summary["resumed_from_step"] >= 100 and summary["step"] == 4000
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(20, 4001, 20))


def test_wandb_offline_without_an_api_key(tfdistx, tmp_path):
    env = {"HOME": str(tmp_path), "WANDB_API_KEY": None, "WANDB_MODE": None, "NETRC": str(tmp_path / "none")}
    run = tfdistx(*QUICK, "logger=wandb", env=env)
    assert run.returncode == 0, run
    offline = list((run.dir / "wandb").glob("offline-run-*"))
    assert offline, run
    assert list(offline[0].glob("*.wandb"))


def test_wandb_with_a_key_but_no_network_falls_back_to_offline(tfdistx, tmp_path):
    # Port 9 on loopback refuses at once: W&B unreachable, nothing leaves the machine.
    env = {"HOME": str(tmp_path), "WANDB_API_KEY": "0" * 40, "WANDB_BASE_URL": "http://127.0.0.1:9", "WANDB_MODE": None}
    run = tfdistx(*QUICK, "logger=wandb", "logger.wandb.init_timeout=3", env=env)
    assert run.returncode == 0 and run.summary["step"] == 40, run
    warnings = [line for line in (run.stdout + run.stderr).splitlines() if "W&B is unreachable" in line]
    assert len(warnings) == 1 and "logging offline" in warnings[0] and "Traceback" not in run.stderr, run
    assert list((run.dir / "wandb").glob("offline-run-*/*.wandb"))


def test_the_tfdistx_script_imports_a_users_target_from_the_current_directory(tmp_path):
    """As `python -m tfdistx` does: the README says the two are the same."""
    script = Path(sys.executable).with_name("tfdistx")
    if not script.exists():
        pytest.skip("the tfdistx console script is not installed beside this python")
    (tmp_path / "my_data.py").write_text(
        "from tfdistx.data import synthetic\n\ndef load(**kwargs):\n    return synthetic(**kwargs)\n"
    )
    run = subprocess.run(
        [str(script), *QUICK, "data._target_=my_data.load", f"hydra.run.dir={tmp_path / 'run'}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=tfdistx_env(),
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["step"] == 40


def test_a_finished_run_exits_promptly_after_its_last_line(tmp_path):
    """Tearing down the input pipelines waited 77 s after a mirrored 1x4 run
    (tf.data's autotune thread); the run now ends once its files are written.
    Asserted loosely (a shared machine); the closing note has the figures."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = start_tfdistx(
        [
            "trainer.steps=300",
            "trainer.log_every=100",
            "trainer.eval_every=0",
            "logger.tensorboard=false",
            "strategy=mirrored",
            "cluster=1x4",
        ],
        tmp_path / "run",
        env={"TMPDIR": str(scratch)},
    )
    last, lines = None, []
    for line in proc.stdout:
        last = time.monotonic()
        lines.append(line)
    proc.wait(timeout=600)
    waited = time.monotonic() - last
    assert proc.returncode == 0
    assert waited < 10, f"exited {waited:.1f}s after its last line"
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["step"] == 300
    assert "exported ckpt-300" in (tmp_path / "run" / "tfdistx.log").read_text()  # the log is whole
    out = "".join(lines)  # where the run is, said at its start and its end
    assert f"run dir: {tmp_path / 'run'}" in out and f"done at step 300: {tmp_path / 'run'}" in out
    # The lines a local cluster's task shows, without its [worker:0]:
    # no Hydra [time][logger][INFO] prefix; the log keeps it.
    assert not [line for line in lines if line.startswith("[")], out[-2000:]
    assert re.match(
        r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\]\[tfdistx[.\w]*\]\[INFO\] - ",
        (tmp_path / "run" / "tfdistx.log").read_text(),
    )
    first, second = [line for line in lines if line.startswith("step ")][
        :2
    ]  # a number's column has one width from line to line
    assert first.index(" ex/s") == second.index(" ex/s"), (first, second)
    assert list(scratch.iterdir()) == []  # what exit handlers remove (TensorFlow's autograph files) is removed


def test_a_users_data_target_gets_only_the_keys_given(tfdistx):
    """data=synthetic's num_classes: 10 must not override the function's own default of 2."""
    run = tfdistx(*QUICK, "data._target_=user_plugins.two_classes_by_default")
    assert run.returncode == 0, run
    assert "data._target_=user_plugins.two_classes_by_default gets only the data keys you give" in run.stderr
    assert "num_classes" in run.stderr and run.summary["step"] == 40
    given = tfdistx(*QUICK, "data._target_=user_plugins.two_classes_by_default", "data.num_classes=3")
    assert given.returncode == 2 and "got num_classes=3" in given.stderr, given  # what the user sets does reach it


def test_a_second_tensorflow_installed_is_one_warning_line(tfdistx, tmp_path):
    """An older tfdistx installed tensorflow-cpu beside tensorflow: the run says
    so before TensorFlow starts, with the fix, and trains; --plan says it too."""
    site = tmp_path / "site" / "tensorflow_cpu-2.21.0.dist-info"
    site.mkdir(parents=True)
    (site / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorflow-cpu\nVersion: 2.21.0\n")
    env = {"PYTHONPATH": str(tmp_path / "site")}
    run = tfdistx(*QUICK, "trainer.steps=2", env=env)
    assert run.returncode == 0, run
    warned = [line for line in run.stderr.splitlines() if "installed together" in line]
    assert len(warned) == 1 and warned[0].startswith(
        "tfdistx: warning: tensorflow 2.21.0, tensorflow-cpu 2.21.0 are installed together"
    ), run
    assert "pip uninstall -y tensorflow tensorflow-cpu" in warned[0]
    plan = tfdistx("--plan", env=env)
    assert "WARNING       tensorflow 2.21.0, tensorflow-cpu 2.21.0 are installed together" in plan.stdout, plan
