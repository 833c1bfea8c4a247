"""`tfdistx export`, `predict`, `evaluate` and `data write` as a user meets
them when something is wrong: every argument refused before TensorFlow
starts, a full or read-only disk or a file-size limit is exit 3 in one line
with nothing half-written, a killed command's temporary directory is
removed by the next, and a warm start from a run still training never
takes its rotated checkpoints for a bad config; and `predict` as a user
starts it, on the run's eval split and refusing a file. Real processes, a
real tmpfs, real kills; the run they work on is trained once in this process."""

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from conftest import QUICK as RUN_QUICK
from conftest import Run, files, refused_in_one_line, run_command, start_tfdistx, tfdistx_env, wait_until
from engine_helpers import train
from test_unit_predict import CLASSIFIED_COLUMNS, MLP, csv_rows, expected_columns, predict, serving, train_run
from test_unit_predict import data  # noqa: F401 (a fixture: the rows `tfdistx data write` writes)
from tfdistx.core.errors import EXIT_RUN_DIR_LOCKED, ConfigError, RunFault
from tfdistx.data import sources
from tfdistx.rundir import new_directory


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return train_run(tmp_path_factory.mktemp("commands") / "run", *MLP)


# Each command's argv, run in one fresh process (cli.main in-process, as `tfdistx ...` calls it):
# its exit codes and stderr, and whether TensorFlow was imported by the end.
IN_A_FRESH_PROCESS = r"""
import contextlib, io, json, sys
from tfdistx import cli
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            cli.main(argv)
        code = 0
    except SystemExit as leaving:
        code = leaving.code
    results.append([code, err.getvalue()])
print(json.dumps({"results": results, "tensorflow": "tensorflow" in sys.modules}))
"""


def test_every_refusal_of_export_predict_evaluate_and_data_write_comes_before_tensorflow(run, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    without_export = tmp_path / "no-export"
    shutil.copytree(run, without_export, ignore=shutil.ignore_patterns("export*", "predictions*"))
    before = files(run)
    refusals = [
        (["predict", "/nope"], "run_dir='/nope': is not a tfdistx run directory"),
        (["predict", run, "--format", "xml"], "--format='xml': one of csv, tfrecord"),
        (["predict", run, "--batch-size", "0"], "--batch-size=0: at least 1"),
        (["predict", run, "--out", "/proc/x"], "--out='/proc/x': cannot be written: making a directory in /proc fails"),
        (["predict", run, "--out", run / "checkpoints" / "p"], "is inside"),
        (["predict", run, "--out", mine], "exists and is not predictions written by tfdistx predict"),
        (["predict", run, "--step", "7"], "--step=7: no such checkpoint"),
        (["predict", run, "--data-files", tmp_path / "none-*.csv"], "none-*.csv': no file matches"),
        (["predict", without_export], "has no export/"),
        (["export", "/nope"], "run_dir='/nope': is not a tfdistx run directory"),
        (["export", run, "--step", "7"], "--step=7: no such checkpoint"),
        (["export", run, "--out", run], "would replace"),
        (["export", run, "--step", "10", "--out", run / "export"], "is the run's own export"),
        (["export", run, "--out", mine], "exists and is not a SavedModel"),
        (["export", run, "--out", "/proc/x"], "--out='/proc/x': cannot be written"),
        (["evaluate", "/nope"], "run_dir='/nope': is not a tfdistx run directory"),
        (["evaluate", run, "--step", "7"], "--step=7: no such checkpoint"),
        (["evaluate", run, "model=cnn"], "model='cnn': this run was trained with model._target_=tfdistx.models.mlp"),
        (["data", "write", "data=synthetic", "--out", mine], "exists and is not data written by tfdistx data write"),
        (["data", "write", "data=synthetic", "--out", "/proc/x"], "--out='/proc/x': cannot be written"),
    ]
    proc = subprocess.run(
        [sys.executable, "-c", IN_A_FRESH_PROCESS, json.dumps([[str(a) for a in argv] for argv, _ in refusals])],
        capture_output=True,
        text=True,
        env=tfdistx_env(),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    for (argv, phrase), (code, err) in zip(refusals, found["results"]):
        lines = err.strip().splitlines()
        assert (
            code == 2 and len(lines) == 1 and lines[0].startswith("tfdistx: invalid config: ") and phrase in lines[0]
        ), (argv, code, err)
    assert found["tensorflow"] is False  # not one of them started TensorFlow: each took a fraction of a second
    assert files(run) == before and [p.name for p in mine.iterdir()] == ["notes.txt"] and not os.path.exists("/proc/x")


FULL_DISK = """
mount -t tmpfs -o size=1m tmpfs "$DISK" || exit 97
cp -a "$RUN" "$DISK/run"
head -c $(( $(df -k --output=avail "$DISK" | tail -1) * 1024 )) /dev/zero > "$DISK/fill" 2>/dev/null   # full
"$@" evaluate "$DISK/run" > "$OUT/evaluate.txt" 2>&1; echo $? > "$OUT/evaluate.rc"
"$@" export "$DISK/run" --out "$DISK/e" > "$OUT/export.txt" 2>&1; echo $? > "$OUT/export.rc"
"$@" predict "$DISK/run" --out "$DISK/p" > "$OUT/predict.txt" 2>&1; echo $? > "$OUT/predict.rc"
ls -A "$DISK" > "$OUT/left.txt"
cp -a "$DISK/run" "$OUT/run"
rm "$DISK/fill"
mount -o remount,ro "$DISK"
"$@" export "$DISK/run" --out "$DISK/e" > "$OUT/readonly.txt" 2>&1; echo $? > "$OUT/readonly.rc"
"""


def test_a_full_or_read_only_disk_under_evaluate_export_and_predict_is_exit_3_in_one_line_and_leaves_nothing(
    run, tmp_path
):
    """A real full file system: a tmpfs mounted in a user namespace of its
    own (no privileges needed, nothing left mounted), holding a copy of the run."""
    disk, out, copy = tmp_path / "disk", tmp_path / "out", tmp_path / "run"
    disk.mkdir(), out.mkdir()
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True)
    if probe.returncode:
        pytest.skip(f"cannot make a small file system here (unshare --user --mount: {probe.stderr.decode().strip()})")
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("predictions*", "export-step-*"))
    # an evaluation's line must take a new page of the full disk: its record cut short would join the next one appended
    (copy / "evaluations.jsonl").write_text(json.dumps({"step": 0, "padding": "x" * 4063}) + "\n")  # 4090 bytes
    before = files(copy)
    subprocess.run(
        [
            "unshare",
            "--user",
            "--map-root-user",
            "--mount",
            "sh",
            "-c",
            FULL_DISK,
            "sh",
            sys.executable,
            "-m",
            "tfdistx",
        ],
        env=tfdistx_env(DISK=str(disk), OUT=str(out), RUN=str(copy)),
        timeout=600,
        check=True,
    )
    full = "No space left on device"
    for name, expected in (
        ("evaluate", f"the run ({full}): the evaluation stopped; evaluations.jsonl is as it was."),
        ("export", f"--out='{disk}/e' ({full}): nothing was written."),
        ("predict", f"--out='{disk}/p' ({full}): nothing was written."),
        ("readonly", f"--out='{disk}/e' (Read-only file system): nothing was written"),
    ):
        text = (out / f"{name}.txt").read_text()
        assert (out / f"{name}.rc").read_text().strip() == "3", text[-3000:]
        lines = [line for line in text.splitlines() if line.startswith("tfdistx:") and "predict: " not in line]
        assert len(lines) == 1 and lines[0].startswith(f"tfdistx: cannot write {expected}"), text
        assert "Traceback" not in text and "Error" not in text, text
    assert (out / "left.txt").read_text().split() == [
        "fill",
        "run",
    ]  # no SavedModel, no predictions, no .e.tmp-*, no .p.tmp-*
    assert files(out / "run") == before  # evaluations.jsonl as it was: no line cut short


@pytest.mark.slow  # the full disk's test above runs by default
def test_a_file_size_limit_under_export_is_exit_3_in_one_line_and_leaves_nothing(run, tmp_path):
    """EFBIG (RLIMIT_FSIZE, as a batch system sets it): Python ignores
    SIGXFSZ, so the write fails instead of killing the process."""

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (10_000, 10_000))  # below each of the SavedModel's two main files

    proc = subprocess.run(
        [sys.executable, "-m", "tfdistx", "export", str(run), "--out", str(tmp_path / "e")],
        preexec_fn=limited,
        capture_output=True,
        text=True,
        env=tfdistx_env(),
        timeout=300,
    )
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert [line for line in proc.stderr.splitlines() if line.startswith("tfdistx:")] == [
        f"tfdistx: cannot write --out='{tmp_path / 'e'}' (File too large): nothing was written. Free some space and "
        "run the command again."
    ]
    assert list(tmp_path.iterdir()) == []


def test_a_killed_predict_leaves_its_temporary_directory_to_the_next_predict_which_removes_it(run, tmp_path):
    rows = np.random.default_rng(0).random((3000, 6), dtype=np.float32)
    np.savetxt(
        tmp_path / "rows.csv",
        rows,
        delimiter=",",
        header=",".join(f"features_{j}" for j in range(6)),
        comments="",
        fmt="%.6g",
    )
    out = tmp_path / "p"
    # --batch-size 1: a call of the model a row, seconds of predicting to be killed in
    killed = start_tfdistx(
        ["predict", str(run), "--data-files", str(tmp_path / "rows.csv"), "--out", str(out), "--batch-size", "1"],
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: list(tmp_path.glob(".p.tmp-*")), 120, "predict's temporary directory", [killed])
        killed.send_signal(signal.SIGKILL)
    finally:
        killed.wait()
    assert killed.returncode == -signal.SIGKILL and len(list(tmp_path.glob(".p.tmp-*"))) == 1 and not out.exists()

    assert predict(run, "--data-files", tmp_path / "rows.csv", "--out", out) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p", "rows.csv"]  # the killed one's is gone
    assert json.loads((out / "predictions.json").read_text())["rows"] == 3000


@pytest.mark.slow  # a race, run for a while: the unit layer has its retry (test_unit_warm_start.py)
def test_a_warm_start_from_a_run_still_training_is_never_refused_as_a_bad_config(tmp_path):
    """The source run saves a checkpoint every 10 steps and keeps one: the
    one a warm start finds is rotated away while it is read. Each warm start
    loads the newest, or after a few tries stops with a retryable RunFault;
    never exit 2."""
    source = tmp_path / "source"
    training = start_tfdistx(
        [
            *RUN_QUICK,
            "trainer.steps=100000000",
            "trainer.log_every=1000",
            "checkpoint.every_steps=10",
            "checkpoint.max_to_keep=1",
            "checkpoint.export=false",
        ],
        source,
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_until(
            lambda: list((source / "checkpoints").glob("ckpt-*.index")),
            120,
            "the source run's first checkpoint",
            [training],
        )
        assert training.poll() is None, "the source run ended"
        outcomes = []
        for k in range(2):
            try:
                warm = train(tmp_path / f"warm-{k}", f"checkpoint.init_from={source}", "trainer.steps=1")
                outcomes.append(f"loaded from {warm.summary['init_from']}")
            except RunFault as fault:
                assert fault.code == EXIT_RUN_DIR_LOCKED and "removed while it was read, 3 times" in str(fault), fault
                outcomes.append("retry later")
            except ConfigError as error:
                pytest.fail(f"a warm start from a run still training was refused as a bad config: {error}")
        assert training.poll() is None, outcomes  # it trained, and rotated its checkpoints, throughout
    finally:
        training.kill()
        training.wait()


# A command writing a directory, alive until it is killed.
WRITING = r"""
import sys, time
from tfdistx.rundir import new_directory
with new_directory("--out", sys.argv[1]) as tmp:
    print(tmp, flush=True)
    time.sleep(600)
"""


def test_a_temporary_directory_is_removed_by_the_next_command_only_once_its_writer_is_gone(tmp_path):
    target = tmp_path / "export"
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITING, str(target)], stdout=subprocess.PIPE, text=True, env=tfdistx_env()
    )
    try:
        its_tmp = writer.stdout.readline().strip()
        assert os.path.basename(its_tmp).startswith(".export.tmp-"), its_tmp
        with new_directory("--out", str(target)) as tmp:
            (Path(tmp) / "saved_model.pb").write_text("first")
        assert os.path.isdir(its_tmp)  # a live command's: left alone
        writer.kill()
        writer.wait()
        with new_directory("--out", str(target)) as tmp:
            (Path(tmp) / "saved_model.pb").write_text("second")
        assert not os.path.exists(its_tmp)  # the killed command's: removed by the next that writes there
        assert (target / "saved_model.pb").read_text() == "second"
        assert sorted(p.name.split(".")[0] for p in tmp_path.iterdir()) == [
            "export",
            "export",
        ]  # and the first, kept aside
    finally:
        writer.kill()
        writer.wait()


# -- `tfdistx predict` as a real process (in-process, every case: test_unit_predict.py) --


def test_the_default_input_is_the_runs_eval_split(run):
    """A real process, as a user starts it: no --data-files."""
    proc = run_command([sys.executable, "-m", "tfdistx", "predict", str(run)], env=tfdistx_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = run / "predictions"
    assert (
        proc.stderr.strip().splitlines()[-1]
        == "tfdistx: predict: 100 rows of the eval split of the run's data (tfdistx.data.synthetic) predicted into "
        f"{out}"
    )
    assert "tfdistx: predict: 100 rows\n" in proc.stderr and "Traceback" not in proc.stderr
    manifest = json.loads((out / "predictions.json").read_text())
    assert manifest["inputs"] == [
        {
            "source": "the eval split of the run's data (tfdistx.data.synthetic)",
            "rows": 100,
            "predictions": "predictions-00000-of-00001.csv",
        }
    ]
    features, _ = sources.synthetic(image_shape=[6], train_examples=256, eval_examples=100).eval.arrays
    header, found = csv_rows(out / "predictions-00000-of-00001.csv")
    assert header == CLASSIFIED_COLUMNS
    np.testing.assert_allclose(
        found, expected_columns(serving(run / "export")(features=tf.constant(features))), rtol=1e-6, atol=1e-6
    )


def test_a_refusal_from_the_command_line(run, data, tmp_path):  # noqa: F811 (data: the fixture imported above)
    proc = run_command(
        [
            sys.executable,
            "-m",
            "tfdistx",
            "predict",
            str(run),
            "--data-files",
            str(data / "clicks-tfrecord" / "eval-*"),
            "--out",
            str(tmp_path / "p"),
        ],
        env=tfdistx_env(),
        timeout=300,
    )
    refused_in_one_line(Run(proc, run), "eval-00000-of-00001.tfrecord", "no feature 'features'")
    assert not (tmp_path / "p").exists()
