"""A run never loses the run that is already in its directory: two runs
cannot share a directory, a killed run or cluster leaves nothing in the
way of its rerun, a failed one says so. Real runs, real files. (What
fit.train refuses or finishes over a run that is there, in this process:
test_unit_run_dir.py.)"""

import json
import signal
import subprocess
import sys

from conftest import QUICK, processes_of, run_command, start_tfdistx, tfdistx_env, wait_until
from test_fault_tolerance import LONG, run_and_interrupt, wait_for_lines


def test_a_second_run_in_the_same_directory_is_refused_and_the_first_is_unharmed(tmp_path):
    run_dir = tmp_path / "run"
    first = start_tfdistx(LONG, run_dir)
    try:
        wait_for_lines(run_dir, 2, first)
        overrides = (run_dir / ".hydra" / "overrides.yaml").read_text()
        second = run_command(
            [sys.executable, "-m", "tfdistx", *QUICK, "optimizer=sgd", f"hydra.run.dir={run_dir}"],
            env=tfdistx_env(),
            timeout=300,
        )
        assert second.returncode == 7, (
            second.stderr
        )  # the directory is busy, not the config bad: a later try can succeed
        assert (
            f"another run is using this directory (pid {first.pid}" in second.stderr
            and "Traceback" not in second.stderr
        )
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
    anywhere past the lines the test waited for (the default MLP makes ~100
    steps in the 0.1 s between two looks)."""
    last = max(int(p.name[len("ckpt-") : -len(".index")]) for p in (run_dir / "checkpoints").glob("ckpt-*.index"))
    return f"trainer.steps={last + more}"


def test_a_killed_run_leaves_no_lock_behind(tmp_path):
    run_dir = tmp_path / "run"

    def kill_once_a_checkpoint_is_whole(proc):  # a metrics line comes before its step's save is written
        wait_until(lambda: any((run_dir / "checkpoints").glob("ckpt-*.index")), 120, "a first checkpoint", [proc])
        proc.send_signal(signal.SIGKILL)

    run_and_interrupt([*LONG, "checkpoint.every_steps=20"], run_dir, 2, kill_once_a_checkpoint_is_whole)
    rerun = run_command(
        [
            sys.executable,
            "-m",
            "tfdistx",
            *LONG,
            "checkpoint.every_steps=20",
            steps_past_the_last_checkpoint(run_dir),
            f"hydra.run.dir={run_dir}",
        ],
        env=tfdistx_env(),
        timeout=300,
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["resumed"]


def test_runs_started_together_get_their_own_directories(tmp_path):
    args = [*QUICK, "trainer.steps=10", "checkpoint.export=false"]
    procs = [
        start_tfdistx(args, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(2)
    ]  # no hydra.run.dir
    for proc in procs:
        assert proc.wait(timeout=300) == 0, proc.stderr.read()[-2000:]
    runs = sorted(p.parent for p in (tmp_path / "outputs").glob("*/*/summary.json"))
    assert len(runs) == 2 and runs[0] != runs[1]


def test_a_killed_cluster_leaves_nothing_behind_once_it_runs_again(tmp_path):
    """SIGKILL to the launcher: its tasks die with it (PR_SET_PDEATHSIG), and
    worker 1's scratch checkpoints (in the run's logs/.scratch, never the
    system temp dir) stay behind until the same run starts again, which
    removes them; the launcher leaves no file of its own (its supervisor is
    a fork, given its spec in memory)."""
    scratch, run_dir = tmp_path / "tmp", tmp_path / "run"
    scratch.mkdir()
    args = ["strategy=multiworker", "cluster=2x1", *LONG, "checkpoint.every_steps=20"]
    left = run_dir / "logs" / ".scratch"

    def kill_once_worker_1_saved(proc):  # its first save may come after the chief's lines
        wait_until(
            lambda: any(p.is_file() for p in left.rglob("*")), 120, "worker 1's first scratch checkpoint", [proc]
        )
        proc.send_signal(signal.SIGKILL)

    run_and_interrupt(args, run_dir, 2, kill_once_worker_1_saved, env={"TMPDIR": str(scratch)})
    wait_until(lambda: processes_of(run_dir) == [], 30, "the tasks to die with their launcher (their own SIGKILL)")
    assert [p for p in left.rglob("*") if p.is_file()] and not (run_dir / "logs" / ".cluster.json").exists()
    rerun = run_command(
        [sys.executable, "-m", "tfdistx", *args, steps_past_the_last_checkpoint(run_dir), f"hydra.run.dir={run_dir}"],
        env=tfdistx_env(TMPDIR=str(scratch)),
        timeout=600,
    )
    assert rerun.returncode == 0, rerun.stdout[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["resumed"]
    # (TensorFlow's own __autograph_generated_file*.py of the killed tasks are not ours to remove)
    assert (
        not left.exists()
        and list(scratch.glob("tfdistx-*")) == []
        and not (run_dir / "logs" / ".cluster.json").exists()
    )


def test_a_run_that_fails_before_writing_anything_leaves_no_stub(tfdistx):
    run = tfdistx("model=wide_deep", "trainer.steps=2")  # refused once TensorFlow has started
    assert run.returncode == 2, run
    assert not run.dir.exists()


def test_a_failed_cluster_run_is_marked_failed_and_reported_so(tfdistx):
    run = tfdistx("strategy=multiworker", "cluster=2x1", "cluster.max_restarts=0", "model=wide_deep", "trainer.steps=2")
    assert run.returncode == 2, run
    assert (run.dir / "FAILED").read_text().strip() == "exit code 2"
    assert (
        "needs integer (categorical id) features" in (run.dir / "logs" / "worker-0.log").read_text()
    )  # the error is kept
    assert run.stdout.count("needs integer (categorical id) features") == 1  # each worker refuses it: said once
    report = subprocess.run(
        [sys.executable, "-m", "tfdistx", "report", str(run.dir)], capture_output=True, text=True, env=tfdistx_env()
    )
    assert report.returncode == 0, report.stderr
    assert "**Failed:** exit code 2" in (run.dir / "report.md").read_text()
