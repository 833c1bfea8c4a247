"""Your own callbacks, optimizer and loggers, in real processes (issue 34's
"done when"): a project in a directory of its own adds a Keras callback of
its own (it notes each record's loss in a file and stops the run when the
loss is below its threshold), Keras' CSVLogger, `optimizer._target_=
keras.optimizers.Lion` with a piecewise schedule, and the csv and MLflow
loggers. It trains under one device and multiworker 2x1 (the chief's
callbacks decide; the other worker stops at their step and follows the
rate Keras' ReduceLROnPlateau sets), stops where the
callback said, resumes bit for bit after a kill, and MLflow's search finds
the run with its metrics. And the terminal's status line, redrawn in place
in a pseudo-terminal."""

import csv
import json
import os
import pty
import signal
import subprocess
import sys

import pytest

from conftest import metric_lines, start_tfdistx, tfdistx_env, wait_until

CALLBACKS = '''
import keras


class StopBelow(keras.callbacks.Callback):
    """Notes each record's loss in `notes`; stops the run at the first below `loss`."""

    def __init__(self, loss, notes):
        super().__init__()
        self.loss, self.notes = loss, notes

    def on_epoch_end(self, epoch, logs=None):
        with open(self.notes, "a") as file:
            file.write(f"{epoch} {logs['loss']}\\n")
        if logs["loss"] < self.loss:
            self.model.stop_training = True
'''

RUN = [
    "+callbacks.stop._target_=myproj.callbacks.StopBelow",
    "+callbacks.stop.loss=1.9",
    "+callbacks.stop.notes=notes.txt",
    "+callbacks.keras_csv._target_=keras.callbacks.CSVLogger",
    "+callbacks.keras_csv.filename=keras.csv",
    "+callbacks.keras_csv.append=true",
    "optimizer._target_=keras.optimizers.Lion",
    "optimizer.beta_2=0.98",
    (
        "optimizer.schedule={_target_:keras.optimizers.schedules.PiecewiseConstantDecay,"
        "boundaries:[100],values:[0.001,0.0003]}"
    ),
    "logger=[default,csv,mlflow]",
    "trainer.steps=2000",
    "trainer.log_every=20",
    "trainer.steps_per_loop=20",
    "checkpoint.every_steps=20",
    "trainer.deterministic=true",
    "logger.tensorboard=false",
]


@pytest.fixture
def project(tmp_path):
    (tmp_path / "myproj").mkdir()
    (tmp_path / "myproj" / "__init__.py").write_text("")
    (tmp_path / "myproj" / "callbacks.py").write_text(CALLBACKS)
    return tmp_path


def start(project, run_dir, *args):
    # The project's own directory, nothing of tests/; and the PYTHONPATH pytest was given (a checkout that is not the
    # one installed).
    env = tfdistx_env(PYTHONPATH=os.environ.get("PYTHONPATH") or None)
    return subprocess.Popen(
        [sys.executable, "-m", "tfdistx", *RUN, *args, f"hydra.run.dir={run_dir}"],
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finished(proc) -> str:
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    return out


def stopped_where_the_callback_said(run_dir, scheduled=True) -> dict:
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first_below = next(m["step"] for m in metrics if m["loss"] < 1.9)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped_early"] == {
        "step": first_below,
        "reason": "callbacks.stop: StopBelow set model.stop_training",
    }
    assert metrics[-1]["step"] == summary["step"] == first_below
    if scheduled:  # the piecewise schedule's first rate
        assert [m["lr"] for m in metrics if m["step"] <= 100] == pytest.approx([0.001] * 5)
    assert [int(r["step"]) for r in csv.DictReader(open(run_dir / "metrics.csv"))] == [m["step"] for m in metrics]
    return summary


def test_a_project_with_its_own_callback_lion_csv_and_mlflow_stops_resumes_and_is_found(project):
    whole = project / "whole"
    finished(start(project, whole))
    summary = stopped_where_the_callback_said(whole)
    noted = [line.split() for line in (project / "notes.txt").read_text().splitlines()]  # the callback's own file
    assert [int(epoch) for epoch, _ in noted] == list(
        range(summary["step"] // 20)
    )  # Keras' epochs: one per record of 20 steps
    rows = list(csv.DictReader(open(whole / "keras.csv")))  # Keras' CSVLogger: a relative path is the run dir's
    assert [int(r["epoch"]) for r in rows] == [int(epoch) for epoch, _ in noted]
    assert [int(float(r["step"])) for r in rows] == list(range(20, summary["step"] + 1, 20))

    killed = project / "killed"  # the same run, killed mid-run and run again: it resumes to the same weights
    proc = start(project, killed)
    try:
        wait_until(lambda: metric_lines(killed) >= 3, 300, "three records", [proc])
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    finished(start(project, killed))
    resumed = stopped_where_the_callback_said(killed)
    assert (
        resumed["resumed"]
        and resumed["weights_sha256"] == summary["weights_sha256"]
        and resumed["step"] == summary["step"]
    )

    # Each run's own MLflow store, in its run dir (nothing in the directory the runs started from), read as the docs
    # say.
    assert not (project / "mlruns").exists() and not (project / "mlflow.db").exists()
    from mlflow import MlflowClient

    for run_dir in (whole, killed):
        client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
        [run] = client.search_runs(
            [client.get_experiment_by_name("tfdistx").experiment_id]
        )  # the resumed run logged on into its own
        logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert run.info.run_name == run_dir.name and run.info.status == "FINISHED"
        assert run.data.metrics["loss"] == logged[-1]["loss"]
        # Each step once, its final value: the killed run's steps past its checkpoint were never sent, as metrics.jsonl
        # dropped them.
        assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss")] == [
            (m["step"], m["loss"]) for m in logged
        ]
        assert run.data.params["optimizer._target_"] == "keras.optimizers.Lion"


def test_under_multiworker_the_chiefs_callbacks_stop_every_worker_at_its_step_and_set_their_rate(project):
    """The chief's StopBelow stops both workers at its step; Keras'
    ReduceLROnPlateau on the chief halves the rate at every record after
    the first, down to its min_lr, and the other worker follows: both end
    with the same weights."""
    run_dir = project / "run"
    plateau = [
        "+callbacks.plateau._target_=keras.callbacks.ReduceLROnPlateau",
        "+callbacks.plateau.monitor=loss",
        "+callbacks.plateau.factor=0.5",
        "+callbacks.plateau.patience=0",
        "+callbacks.plateau.min_delta=10",
        "+callbacks.plateau.min_lr=0.0005",
        "optimizer.schedule=constant",
        "optimizer.lr=0.001",
    ]
    out = finished(start(project, run_dir, "strategy=multiworker", "cluster=2x1", *plateau))
    summary = stopped_where_the_callback_said(run_dir, scheduled=False)
    rates = [json.loads(line)["lr"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rates[:4] == pytest.approx([0.001, 0.001, 0.0005, 0.0005])  # down to min_lr
    assert f"[worker:1] stopped early at step {summary['step']}: a callback of the chief asked to stop" in out
    assert out.count("final weights sha256 " + summary["weights_sha256"]) == 2  # both workers, the same weights

    # The same command again: every worker ends at once, as a finished run does; the export and summary untouched.
    kept = {name: (run_dir / name).read_bytes() for name in ("summary.json", "metrics.jsonl", "export/saved_model.pb")}
    again = finished(start(project, run_dir, "strategy=multiworker", "cluster=2x1", *plateau))
    for task in ("worker:0", "worker:1"):
        assert f"[{task}] the run in this directory stopped early at step {summary['step']}" in again, again[-3000:]
    assert {name: (run_dir / name).read_bytes() for name in kept} == kept
    assert not list(run_dir.glob("export.replaced-*")) and "step " + str(summary["step"] + 20) not in again


@pytest.mark.parametrize(
    "placed, prefix",
    [([], ""), (["strategy=multiworker", "cluster=2x1", "logger.tensorboard=false"], "[worker:0] ")],
    ids=["one process", "a local cluster"],
)
def test_a_terminal_shows_a_status_line_redrawn_in_place(tmp_path, placed, prefix):
    """In a pseudo-terminal: the status line is drawn again and again on one
    line (carriage return, erase) while the steps run, the step lines stay.
    A local cluster's too: its chief's, drawn by the launcher under the tasks'
    lines (the tasks write to it through pipes), and in no log file."""
    main, child = pty.openpty()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tfdistx",
            "model=cnn",
            "data.batch_size=64",
            "trainer.steps=400",
            "trainer.steps_per_loop=200",
            "trainer.log_every=200",
            *placed,
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        stdout=child,
        stderr=subprocess.DEVNULL,
        env=tfdistx_env(),
        cwd=tmp_path,
    )
    os.close(child)
    out = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(main)
    assert proc.wait(timeout=600) == 0
    text = out.decode()
    status = [part for part in text.split("\r\x1b[K") if part.startswith("step ") and "elapsed" in part]
    assert len(status) >= 3, text[-2000:]  # redrawn after each call, and every second between
    assert "step 400/400" in status[-1] and f"\r\x1b[K{prefix}step 400/400  loss " in text
    assert "elapsed\r\n" not in text and "elapsed\n" not in text  # in place: no drawing left as a line of its own
    if not placed:
        assert text.rstrip("\r\n").count("\n") < len(status)  # fewer lines than drawings
    assert "elapsed" not in (tmp_path / "run" / "tfdistx.log").read_text()


def test_under_multiworker_a_callback_failing_on_the_chief_saves_with_every_worker_and_stops_them(tfdistx, tmp_path):
    """The chief's callback raises at step 20 of 20 with no periodic save:
    both workers save step 20 together (a save is collective) and stop; the
    run exits 1 with the chief's line, and a rerun finds the run finished."""
    args = [
        "strategy=multiworker",
        "cluster=2x1",
        "trainer.steps=20",
        "trainer.steps_per_loop=10",
        "trainer.log_every=10",
        "checkpoint.every_steps=0",
        "logger.tensorboard=false",
        "data.train_examples=512",
        "data.eval_examples=64",
        "+callbacks.x._target_=user_plugins.FailsIn",
        "+callbacks.x.hook=on_epoch_end",
        "+callbacks.x.step=20",
    ]
    run = tfdistx(*args, timeout=300)
    assert run.returncode == 1, run
    assert (
        "callbacks.x (user_plugins.FailsIn) raised RuntimeError in on_epoch_end at step 20: boom; the steps trained "
        "are saved (step 20), and a rerun resumes from there"
    ) in run.stdout + run.stderr
    assert sorted(p.name for p in (run.dir / "checkpoints").glob("ckpt-*.index")) == ["ckpt-20.index"]
    again = tfdistx(*[a for a in args if "callbacks.x" not in a], timeout=300)
    assert again.returncode == 0 and "nothing to train" in again.stdout + again.stderr, again


STATEFUL = [
    "+callbacks.stop._target_=keras.callbacks.EarlyStopping",
    "+callbacks.stop.monitor=loss",
    "+callbacks.stop.mode=max",
    "+callbacks.stop.patience=4",  # the loss falls: never better than the first epoch's, so it stops at epoch 4
    "+callbacks.lr._target_=keras.callbacks.ReduceLROnPlateau",
    "+callbacks.lr.monitor=loss",
    "+callbacks.lr.mode=max",
    "+callbacks.lr.patience=2",
    "+callbacks.lr.cooldown=1",
    "+callbacks.lr.factor=0.5",
    "+callbacks.best._target_=keras.callbacks.ModelCheckpoint",
    "+callbacks.best.monitor=loss",
    "+callbacks.best.mode=max",
    "+callbacks.best.save_best_only=true",
    "+callbacks.best.filepath='best-{epoch:02d}.keras'",
    "+callbacks.pace._target_=user_plugins.Pace",
    "+callbacks.pace.seconds=0.5",  # slow enough for the signal to land mid-run
    "trainer.steps=200",
    "trainer.steps_per_loop=10",
    "trainer.log_every=10",
    "checkpoint.every_steps=10",
    "trainer.deterministic=true",
    "logger.tensorboard=false",
    "data.train_examples=512",
    "data.eval_examples=64",
]


def test_keras_stateful_callbacks_preempted_and_resumed_act_where_an_uninterrupted_run_does(tfdistx, tmp_path):
    """EarlyStopping, ReduceLROnPlateau and ModelCheckpoint(save_best_only)
    in one run, preempted by SIGTERM after two records and run again: it
    stops at the same step, lowers the rate at the same steps, saves the
    same best files and ends with the same weights as the run never
    stopped (their state is in tfdistx's checkpoint; under fit a restart
    starts them afresh: keras-team/keras#17012)."""
    (tmp_path / "whole").mkdir()
    whole = tfdistx(*STATEFUL, run_dir=tmp_path / "whole" / "run", cwd=tmp_path / "whole")
    assert whole.returncode == 0, whole
    (tmp_path / "split").mkdir()
    run_dir = tmp_path / "split" / "run"
    proc = start_tfdistx(STATEFUL, run_dir, cwd=tmp_path / "split")
    try:
        wait_until(lambda: metric_lines(run_dir) >= 2, 300, "two records", [proc])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 42
    finally:
        proc.kill()
    resumed = tfdistx(*STATEFUL, run_dir=run_dir, cwd=tmp_path / "split")
    assert resumed.returncode == 0, resumed
    assert 20 <= resumed.summary["resumed_from_step"] < whole.summary["step"]
    assert [(m["step"], m["lr"]) for m in resumed.metrics] == [(m["step"], m["lr"]) for m in whole.metrics]
    assert resumed.summary["stopped_early"] == whole.summary["stopped_early"] and whole.summary["step"] == 50
    assert (
        sorted(p.name for p in run_dir.glob("best-*.keras"))  # ModelCheckpoint's relative path: the run dir's
        == sorted(p.name for p in (tmp_path / "whole" / "run").glob("best-*.keras"))
        == ["best-01.keras"]
    )
    assert resumed.summary["weights_sha256"] == whole.summary["weights_sha256"]
