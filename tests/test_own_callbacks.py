"""Your own callbacks, optimizer and loggers, in real processes (issue 34's
"done when"): a Keras callback of the user's that notes a value every
record and stops the run when its condition holds, Keras' CSVLogger,
`optimizer._target_=keras.optimizers.Lion` with a piecewise schedule and
metrics.csv and MLflow, under one device and multiworker 2x1 (the chief's callback
decides; both workers stop at its step); and the terminal's status line,
redrawn in place in a pseudo-terminal."""

import csv
import json
import os
import pty
import subprocess
import sys

import pytest

from conftest import tfdistx_env

CALLBACK = ["+callbacks.stop._target_=user_plugins.StopBelow", "+callbacks.stop.loss=2.1", "callbacks=csv_logger",
            "optimizer._target_=keras.optimizers.Lion", "optimizer.beta_2=0.98",
            "optimizer.schedule={_target_:keras.optimizers.schedules.PiecewiseConstantDecay,boundaries:[100],values:[0.001,0.0003]}",
            "logger=[default,csv,mlflow]", "trainer.steps=600", "trainer.log_every=20", "trainer.steps_per_loop=20"]


@pytest.mark.parametrize("placement", [["strategy=one_device"], ["strategy=multiworker", "cluster=2x1"]], ids=["one_device", "multiworker"])
def test_a_users_callback_stops_the_run_where_it_says_with_lion_csv_and_mlflow(tfdistx, tmp_path, monkeypatch, placement):
    run = tfdistx(*placement, *CALLBACK)
    assert run.returncode == 0, run
    metrics = [json.loads(line) for line in (run.dir / "metrics.jsonl").read_text().splitlines()]
    first_below = next(m["step"] for m in metrics if m["loss"] < 2.1)
    summary = json.loads((run.dir / "summary.json").read_text())
    assert summary["stopped_early"] == {"step": first_below, "reason": "callbacks.stop: StopBelow set model.stop_training"}
    assert metrics[-1]["step"] == first_below and summary["step"] == first_below
    assert [m["lr"] for m in metrics if m["step"] <= 100] == pytest.approx([0.001] * (min(first_below, 100) // 20))
    rows = list(csv.DictReader(open(run.dir / "keras_log.csv")))
    assert [int(r["epoch"]) for r in rows] == [m["step"] for m in metrics]
    assert [int(r["step"]) for r in csv.DictReader(open(run.dir / "metrics.csv"))] == [m["step"] for m in metrics]
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 reads its (local) file store only when told to
    runs = mlflow_runs(tmp_path / "mlruns")  # the local store, in the directory the run started from
    assert [run.info.status for run in runs] == ["FINISHED"] and runs[0].data.metrics["loss"] == metrics[-1]["loss"]
    assert runs[0].data.params["optimizer._target_"] == "keras.optimizers.Lion"
    if "cluster=2x1" in placement:  # the worker, without the callback, stopped at the chief's step
        assert f"[worker:1] stopped early at step {first_below}: a callback of the chief asked to stop" in run.stdout


def mlflow_runs(store):
    import mlflow

    mlflow.set_tracking_uri(store.as_uri())
    return mlflow.search_runs(experiment_names=["tfdistx"], output_format="list")


def test_a_terminal_shows_a_status_line_redrawn_in_place(tmp_path):
    """In a pseudo-terminal: the status line is drawn again and again on one
    line (carriage return, erase) while the steps run, the step lines stay."""
    main, child = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "tfdistx", "model=cnn", "data.batch_size=64", "trainer.steps=400",
                             "trainer.steps_per_loop=200", "trainer.log_every=200", f"hydra.run.dir={tmp_path / 'run'}"],
                            stdout=child, stderr=subprocess.DEVNULL, env=tfdistx_env(), cwd=tmp_path)
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
    assert "step 400/400" in status[-1] and "\r\x1b[Kstep 400/400  loss " in text
    assert text.rstrip("\r\n").count("\n") < len(status)  # in place: fewer lines than drawings
