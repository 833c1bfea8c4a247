"""A run never loses the run that is already in its directory: a checkpoint
of another model or optimizer is refused (not taken as damage and trained
over), and two runs cannot share a directory. Real runs, real files."""

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from conftest import QUICK, processes_of, start_tfdistx, tfdistx_env, wait_until
from engine_helpers import train
from test_fault_tolerance import LONG, run_and_interrupt, wait_for_lines
from tfdistx.config.errors import ConfigError

SMALL_CNN = ["model=cnn", "model.filters=[4]", "model.dense_units=8"]


def files(run_dir):
    """Every file of a run but its log (which each attempt appends to)."""
    return {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name not in ("tfdistx.log", ".lock")}


@pytest.mark.unit  # fit.train's refusal, in this process (engine_helpers); exit 2 is the same for every ConfigError
def test_resuming_with_another_model_or_optimizer_is_refused_and_the_run_is_kept(tmp_path):
    first = train(tmp_path / "run", *SMALL_CNN, "checkpoint.every_steps=20")
    before = files(first.dir)
    for change, what in [
        (["model=mlp"], "the model's weights differ"),
        ([*SMALL_CNN, "model.dense_units=16"], "#2: (784, 8) there, (784, 16) here"),
        ([*SMALL_CNN, "optimizer=sgd"], "the optimizer differs"),
    ]:
        with pytest.raises(ConfigError) as refused:
            train(tmp_path / "run", *change, "trainer.steps=80")
        text = "\n".join(refused.value.lines())
        assert "another model or optimizer" in text and what in text and "use another hydra.run.dir" in text, text
        assert files(first.dir) == before, f"{change} changed the first run's files"


def test_a_second_run_in_the_same_directory_is_refused_and_the_first_is_unharmed(tmp_path):
    run_dir = tmp_path / "run"
    first = start_tfdistx(LONG, run_dir)
    try:
        wait_for_lines(run_dir, 2, first)
        overrides = (run_dir / ".hydra" / "overrides.yaml").read_text()
        second = subprocess.run([sys.executable, "-m", "tfdistx", *QUICK, "optimizer=sgd", f"hydra.run.dir={run_dir}"],
                                capture_output=True, text=True, env=tfdistx_env(), timeout=300)
        assert second.returncode == 7, second.stderr  # the directory is busy, not the config bad: a later try can succeed
        assert f"another run is using this directory (pid {first.pid}" in second.stderr and "Traceback" not in second.stderr
        assert (run_dir / ".hydra" / "overrides.yaml").read_text() == overrides
        first.send_signal(signal.SIGTERM)
        out, _ = first.communicate(timeout=300)
        assert first.returncode == 42, out[-3000:]
    finally:
        first.kill()
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(20, steps[-1] + 1, 20))  # the first run's lines, all of them, once


def steps_past_the_last_checkpoint(run_dir, more=20) -> str:
    """trainer.steps for a rerun that trains on: a killed run may have got
    anywhere past the lines the test waited for (the seeds' MLP makes ~100
    steps in the 0.1 s between two looks)."""
    last = max(int(p.name[len("ckpt-"):-len(".index")]) for p in (run_dir / "checkpoints").glob("ckpt-*.index"))
    return f"trainer.steps={last + more}"


def test_a_killed_run_leaves_no_lock_behind(tmp_path):
    run_dir = tmp_path / "run"
    run_and_interrupt([*LONG, "checkpoint.every_steps=20"], run_dir, 2, lambda proc: proc.send_signal(signal.SIGKILL))
    rerun = subprocess.run([sys.executable, "-m", "tfdistx", *LONG, "checkpoint.every_steps=20",
                            steps_past_the_last_checkpoint(run_dir), f"hydra.run.dir={run_dir}"],
                           capture_output=True, text=True, env=tfdistx_env(), timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["resumed"]


def test_runs_started_together_get_their_own_directories(tmp_path):
    args = [*QUICK, "trainer.steps=10", "checkpoint.export=false"]
    procs = [start_tfdistx(args, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(2)]  # no hydra.run.dir
    for proc in procs:
        assert proc.wait(timeout=300) == 0, proc.stderr.read()[-2000:]
    runs = sorted(p.parent for p in (tmp_path / "outputs").glob("*/*/summary.json"))
    assert len(runs) == 2 and runs[0] != runs[1]


# The next three train in this process (engine_helpers: -m unit): what they
# check is fit.train's, and a refusal's exit 2 is the same for every ConfigError.


@pytest.mark.unit
def test_fewer_steps_than_the_run_has_done_is_refused(tmp_path):
    first = train(tmp_path / "run")
    before = files(first.dir)
    with pytest.raises(ConfigError) as refused:
        train(tmp_path / "run", "trainer.steps=20")
    assert refused.value.lines() == ["tfdistx: invalid config: trainer.steps=20: the run in this directory is already at step 40 "
                                     "(ckpt-40): ask for 40 steps or more, or use another hydra.run.dir"]
    assert files(first.dir) == before  # summary.json, metrics.jsonl and checkpoints as they were


@pytest.mark.unit
@pytest.mark.parametrize("missing", [("summary.json", "export"), ("export",)])
def test_a_run_killed_after_its_last_checkpoint_is_finished_by_its_rerun(tmp_path, missing):
    """Killed between the last checkpoint and the summary or export (the files
    such a kill leaves are made by removing them): the rerun trains nothing
    and writes what is missing, the same as the whole run wrote it."""
    whole = train(tmp_path / "run", "checkpoint.every_steps=20", "checkpoint.export=true")
    before = whole.summary
    kept = {name: (whole.dir / name).read_bytes() for name in ("summary.json", "metrics.jsonl") if name not in missing}
    for name in missing:
        shutil.rmtree(whole.dir / name) if (whole.dir / name).is_dir() else (whole.dir / name).unlink()
    rerun = train(tmp_path / "run", "checkpoint.every_steps=20", "checkpoint.export=true")
    assert rerun.objective == whole.objective
    for key in ("step", "train", "eval", "weights_sha256", "global_batch"):
        assert rerun.summary[key] == before[key], key
    if "summary.json" in missing:
        assert (rerun.summary["resumed"], rerun.summary["resumed_from_step"]) == (True, 40)
    assert (rerun.dir / "export" / "saved_model.pb").is_file()
    assert all((rerun.dir / name).read_bytes() == data for name, data in kept.items())  # what it had is untouched
    assert [m["step"] for m in rerun.metrics] == [20, 40]


@pytest.mark.unit
def test_restore_false_keeps_the_previous_run_aside(tmp_path):
    first = train(tmp_path / "run", "checkpoint.every_steps=20")
    old_metrics = (first.dir / "metrics.jsonl").read_text()
    fresh = train(tmp_path / "run", "trainer.steps=20", "checkpoint.restore=false", "checkpoint.every_steps=20")
    assert fresh.summary["step"] == 20 and not fresh.summary["resumed"]
    assert [m["step"] for m in fresh.metrics] == [20]
    assert sorted(p.name for p in (fresh.dir / "checkpoints").glob("*.index")) == ["ckpt-20.index"]  # no old ones mixed in
    kept = list(fresh.dir.glob("metrics.replaced-*.jsonl"))
    assert len(kept) == 1 and kept[0].read_text() == old_metrics
    assert sorted(p.name for p in next(fresh.dir.glob("checkpoints.replaced-*")).glob("*.index")) == ["ckpt-20.index", "ckpt-40.index"]


@pytest.mark.unit
def test_a_run_refused_after_restore_false_changes_nothing(tmp_path):
    """checkpoint.restore=false sets the previous run aside only once nothing
    can refuse the new run any more: a warm start that does not fit this
    model is refused first, and the run that is there keeps every file."""
    train(tmp_path / "source", "data.num_classes=5")  # another head: (128, 5)
    first = train(tmp_path / "run", "checkpoint.every_steps=20")
    before = {path: path.read_bytes() for path in first.dir.rglob("*") if path.is_file()}
    with pytest.raises(ConfigError, match="checkpoint.init_from"):
        train(tmp_path / "run", "checkpoint.restore=false", f"checkpoint.init_from={tmp_path / 'source'}")
    assert {path: path.read_bytes() for path in first.dir.rglob("*") if path.is_file()} == before


@pytest.mark.unit
@pytest.mark.parametrize("state", ["random bytes", "names a checkpoint that is gone"])
def test_a_bad_checkpoint_state_file_does_not_hide_the_checkpoints(tmp_path, state, caplog):
    first = train(tmp_path / "run", "checkpoint.every_steps=20")
    state_file = first.dir / "checkpoints" / "checkpoint"
    if state == "random bytes":
        state_file.write_bytes(os.urandom(256))
    else:  # only a checkpoint that is not on disk: the intact ckpt-20 and ckpt-40 must still be found
        state_file.write_text('model_checkpoint_path: "ckpt-90"\nall_model_checkpoint_paths: "ckpt-90"\n')
    with caplog.at_level("WARNING"):
        second = train(tmp_path / "run", "checkpoint.every_steps=20", "trainer.steps=60")
    assert (second.summary["resumed_from_step"], second.summary["step"]) == (40, 60)
    assert "the checkpoints on disk are used" in caplog.text
    assert list((first.dir / "checkpoints").glob("checkpoint.replaced-*"))


def test_a_killed_cluster_leaves_nothing_behind_once_it_runs_again(tmp_path):
    """SIGKILL to the launcher: its tasks die with it (PR_SET_PDEATHSIG), and
    worker 1's scratch checkpoints and the launcher's spec file stay behind
    until the same run starts again, which removes them."""
    scratch, run_dir = tmp_path / "tmp", tmp_path / "run"
    scratch.mkdir()
    args = ["strategy=multiworker", "cluster=2x1", *LONG, "checkpoint.every_steps=20"]
    run_and_interrupt(args, run_dir, 2, lambda proc: proc.send_signal(signal.SIGKILL), env={"TMPDIR": str(scratch)})
    wait_until(lambda: processes_of(run_dir) == [], 30, "the tasks to die with their launcher (their own SIGKILL)")
    assert list(scratch.glob("tfdistx-*")) and (run_dir / "logs" / ".cluster.json").exists()
    rerun = subprocess.run([sys.executable, "-m", "tfdistx", *args, steps_past_the_last_checkpoint(run_dir), f"hydra.run.dir={run_dir}"],
                           env=tfdistx_env(TMPDIR=str(scratch)), capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stdout[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["resumed"]
    # (TensorFlow's own __autograph_generated_file*.py of the killed tasks are not ours to remove)
    assert list(scratch.glob("tfdistx-*")) == [] and not (run_dir / "logs" / ".cluster.json").exists()


def test_a_run_that_fails_before_writing_anything_leaves_no_stub(tfdistx):
    run = tfdistx("model=wide_deep", "trainer.steps=2")  # refused once TensorFlow has started
    assert run.returncode == 2, run
    assert not run.dir.exists()


def test_a_failed_cluster_run_is_marked_failed_and_reported_so(tfdistx):
    run = tfdistx("strategy=multiworker", "cluster=2x1", "cluster.max_restarts=0", "model=wide_deep", "trainer.steps=2")
    assert run.returncode == 2, run
    assert (run.dir / "FAILED").read_text().strip() == "exit code 2"
    assert "needs integer (categorical id) features" in (run.dir / "logs" / "worker-0.log").read_text()  # the error is kept
    assert run.stdout.count("needs integer (categorical id) features") == 1  # each worker refuses it: said once
    report = subprocess.run([sys.executable, "-m", "tfdistx", "report", str(run.dir)], capture_output=True, text=True, env=tfdistx_env())
    assert report.returncode == 0, report.stderr
    assert "**Failed:** exit code 2" in (run.dir / "report.md").read_text()
