"""Preemption, restarts and exact resume, on real processes and real checkpoints."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import (
    QUICK,
    free_ports,
    metric_lines,
    run_command,
    start_tfdistx,
    steps_logged,
    task_pid,
    tfdistx_env,
    wait_until,
    whole_and_resumed,
    workers_tf_config,
)

LONG = [
    "trainer.steps=1000000",
    "trainer.steps_per_loop=20",
    "trainer.log_every=20",
    "trainer.eval_every=0",
    "checkpoint.every_steps=100000",
    "logger.tensorboard=false",
]


def wait_for_lines(run_dir: Path, n: int, proc, timeout=300):
    wait_until(lambda: metric_lines(run_dir) >= n, timeout, f"{n} metric lines", [proc])


def run_and_interrupt(args, run_dir: Path, after_lines: int, interrupt, timeout=600, env=None):
    """Start tfdistx; once `after_lines` metric lines exist, call interrupt(proc);
    return (exit code, output). Whatever happens, nothing is left running."""
    proc = start_tfdistx(args, run_dir, env)
    try:
        wait_for_lines(run_dir, after_lines, proc)
        interrupt(proc)
        out, _ = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    return proc.returncode, out


# USR1 (cluster.notice_signals' default) is what `tfdistx job slurm`'s script passes on from sbatch --signal=B:USR1@N:
# a preemption notice as SIGTERM is, with no override.
@pytest.mark.parametrize("notice", [signal.SIGTERM, signal.SIGUSR1], ids=["sigterm", "usr1_slurms_time_limit_notice"])
def test_a_notice_checkpoints_exits_42_and_a_rerun_resumes(tmp_path, notice):
    run_dir = tmp_path / "run"
    code, out = run_and_interrupt(LONG, run_dir, 2, lambda proc: proc.send_signal(notice))
    assert code == 42, out[-3000:]
    assert f"{notice.name}: checkpointing at the next loop boundary" in out and "Traceback" not in out
    preempted_at = steps_logged(run_dir)[-1]
    assert (run_dir / "checkpoints" / f"ckpt-{preempted_at}.index").exists()

    rerun = run_command(
        [sys.executable, "-m", "tfdistx", *LONG, f"trainer.steps={preempted_at + 40}", f"hydra.run.dir={run_dir}"],
        env=tfdistx_env(),
        timeout=600,
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["resumed_from_step"], summary["step"]) == (preempted_at, preempted_at + 40)
    assert steps_logged(run_dir) == list(range(20, preempted_at + 41, 20))


def test_a_sigterm_after_the_cluster_forms_and_before_training_still_ends_the_task():
    """TensorFlow's coordination service swaps in a SIGTERM handler that only
    logs when a multi-worker strategy starts; an evicted task must not train on."""
    script = (
        "import os, signal, time\n"
        "from tfdistx.engine import strategy\n"
        "strategy.build('multiworker', {}, None)\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "time.sleep(10)\n"
        "print('trained on')\n"
    )
    env = tfdistx_env(TF_CONFIG=workers_tf_config(free_ports(1), 0))
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == -signal.SIGTERM and "trained on" not in run.stdout, run.stderr[-2000:]


# One device resumes bitwise in test_tasks, test_unit_compute and test_file_data too; a multiworker 2x1 run
# resumed after a kill ends bitwise equal to a whole one in the default run's random-kill test below.
@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy", [["strategy=one_device"], ["strategy=mirrored", "cluster=1x2"], ["strategy=multiworker", "cluster=2x1"]]
)
def test_stopped_and_resumed_deterministic_run_ends_bitwise_equal(tfdistx, tmp_path, strategy):
    args = [
        *QUICK,
        *strategy,
        "trainer.deterministic=true",
        "model.dropout=0.2",
        "trainer.steps_per_loop=10",
        "checkpoint.every_steps=10",
    ]
    whole, resumed = whole_and_resumed(tfdistx, tmp_path, args)
    assert resumed.summary["weights_sha256"] == whole.summary["weights_sha256"]


@pytest.mark.slow  # the preemption matrix's default cells and the lost ps's restart run by default
def test_preempted_worker_restarts_the_cluster_and_it_finishes(tmp_path):
    run_dir = tmp_path / "run"
    args = ["strategy=multiworker", "cluster=2x1", *LONG, "trainer.steps=600", "cluster.max_restarts=2"]
    # the scheduler preempts worker 1 only
    code, out = run_and_interrupt(args, run_dir, 3, lambda proc: os.kill(task_pid(run_dir, "worker:1"), signal.SIGTERM))
    assert code == 0, out[-4000:]
    assert "[worker:0] preempted at step" in out and "[worker:1] preempted at step" in out
    assert "restart 1 of 2" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["step"] == 600 and summary["resumed"]
    assert steps_logged(run_dir) == list(range(20, 601, 20))  # nothing lost, nothing twice


def test_a_killed_peer_costs_a_slow_models_run_at_most_one_loop(tmp_path):
    """A model whose every step takes 0.1 s (a sleep in its call, user_plugins.slow_model), checkpoints only at the
    end: worker:1 is SIGKILLed mid-loop while the chief is slower than the launcher's teardown of the round (held
    stopped for 3 s: the moment a busy machine gives it). The launcher lets the chief's call fail and the chief save
    the last loop boundary it keeps in memory (engine/commit.py) before it stops the round: the restart resumes from
    that boundary, not from step 0, and every step is logged once."""
    run_dir = tmp_path / "run"
    args = [
        *QUICK,
        "strategy=multiworker",
        "cluster=2x1",
        "model._target_=user_plugins.slow_model",
        "trainer.steps_per_loop=5",
        "trainer.log_every=5",
        "checkpoint.every_steps=0",
        "cluster.max_restarts=1",
    ]
    proc = start_tfdistx(args, run_dir)
    try:
        wait_for_lines(run_dir, 2, proc)
        chief = task_pid(run_dir, "worker:0")
        os.kill(chief, signal.SIGSTOP)
        last_logged = steps_logged(run_dir)[-1]  # the chief writes the metrics: none can come while it is stopped
        os.kill(task_pid(run_dir, "worker:1"), signal.SIGKILL)
        time.sleep(3)  # not a wait for anything: a chief slower than the teardown's second is what is tested
        with contextlib.suppress(ProcessLookupError):  # stopped with the round, the chief is gone
            os.kill(chief, signal.SIGCONT)
        out, _ = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 0, out[-4000:]
    assert "task worker:1 exited with code 137; stopping the cluster" in out, out[-4000:]
    assert re.search(r"\[worker:0\] tfdistx: lost contact with worker:1 .*the last loop boundary, saved now", out), out
    summary = json.loads((run_dir / "summary.json").read_text())
    # at most one loop lost: the one the loss cut short, or the one just logged (the peer lost in the all-reduce that
    # follows a loop's line, before the chief kept that boundary)
    assert summary["step"] == 40 and summary["resumed_from_step"] >= last_logged - 5, (summary, last_logged)
    assert steps_logged(run_dir) == list(range(5, 41, 5))  # each step once: the loop the peer's loss cut short again


# by default the launcher's SIGTERM reaches every worker in test_preemption's matrix (multiworker with the service)
@pytest.mark.slow
def test_sigterm_to_the_launcher_checkpoints_every_worker_and_exits_42(tmp_path):
    """The whole job is preempted: no restart, the tasks save, the launcher says 42."""
    run_dir = tmp_path / "run"
    code, out = run_and_interrupt(
        ["strategy=multiworker", "cluster=2x1", *LONG], run_dir, 2, lambda proc: proc.send_signal(signal.SIGTERM)
    )
    assert code == 42, out[-4000:]
    assert "[worker:0] preempted at step" in out and "[worker:1] preempted at step" in out and "restart" not in out
    saved = int(out.split("[worker:0] preempted at step ")[1].split(":")[0])
    assert (run_dir / "checkpoints" / f"ckpt-{saved}.index").exists()


@pytest.mark.slow  # by default a stopped ps worker (the harder case: no exit to see) is treated as lost, below
def test_parameter_server_job_survives_a_killed_worker(tmp_path):
    """The coordinator reschedules the lost worker's steps; the launcher restarts that worker alone."""
    run_dir = tmp_path / "run"
    args = ["strategy=parameter_server", "cluster=ps1w2", *LONG, "trainer.steps=1500", "trainer.log_every=100"]
    code, out = run_and_interrupt(args, run_dir, 2, lambda proc: os.kill(task_pid(run_dir, "worker:1"), signal.SIGKILL))
    assert code == 0, out[-4000:]
    assert "task worker:1 exited with code 137; restarting it alone" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["step"] == 1500 and not summary["resumed"]  # the coordinator never stopped
    assert steps_logged(run_dir) == list(range(100, 1501, 100))


def test_a_stopped_parameter_server_worker_is_treated_as_lost(tmp_path):
    """TensorFlow notices a dead worker, not a frozen one: the launcher kills
    a task stopped past cluster.stopped_task_timeout, and the run goes on."""
    run_dir = tmp_path / "run"
    args = [
        "strategy=parameter_server",
        "cluster=ps1w2",
        *LONG,
        "trainer.steps=1500",
        "trainer.log_every=100",
        "cluster.stopped_task_timeout=3",
    ]
    code, out = run_and_interrupt(args, run_dir, 2, lambda proc: os.kill(task_pid(run_dir, "worker:1"), signal.SIGSTOP))
    assert code == 0, out[-4000:]
    assert "task worker:1 has been stopped for more than 3s (cluster.stopped_task_timeout): treating it as lost" in out
    assert "task worker:1 exited with code 137; restarting it alone" in out
    assert json.loads((run_dir / "summary.json").read_text())["step"] == 1500
    assert steps_logged(run_dir) == list(range(100, 1501, 100))


@pytest.mark.slow
def test_a_stopped_multiworker_peer_is_named_in_one_line_and_the_cluster_restarts(tmp_path):
    """TensorFlow's heartbeat notices the frozen peer within cluster.peer_timeout;
    the survivor says so in one line and the launcher restarts the cluster,
    which finishes. (The launcher's own bound on a stopped task is set past
    it: with both at their 60 s default the launcher kills the task first,
    as it does for a frozen task of a one-process job.)"""
    run_dir = tmp_path / "run"
    args = [
        "strategy=multiworker",
        "cluster=2x1",
        *LONG,
        "trainer.steps=3000",
        "trainer.log_every=100",
        "checkpoint.every_steps=500",
        "cluster.peer_timeout=20",
        "cluster.stopped_task_timeout=300",
    ]
    code, out = run_and_interrupt(args, run_dir, 2, lambda proc: os.kill(task_pid(run_dir, "worker:1"), signal.SIGSTOP))
    assert code == 0, out[-4000:]
    assert (
        "[worker:0] tfdistx: lost contact with worker:1 of the cluster (a frozen peer counts as lost after "
        "cluster.peer_timeout=20s), stopping"
    ) in out
    assert "Traceback" not in out and "exited with code 5; stopping the cluster" in out
    assert json.loads((run_dir / "summary.json").read_text())["step"] == 3000


def test_lost_parameter_server_restarts_the_cluster_from_the_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    # 1200 steps, a record every 100 held 0.3 s by the coordinator (user_plugins.Pace), the ps killed after
    # the second: ten records still to go however fast this machine trains (a kill after the last step
    # would test nothing), and the steps' CPU time is a fifth of the 6000 steps this once took to be sure
    args = [
        "strategy=parameter_server",
        "cluster=ps1w2",
        *LONG,
        "trainer.steps=1200",
        "trainer.log_every=100",
        "checkpoint.every_steps=100",
        "+callbacks.pace._target_=user_plugins.Pace",
        "+callbacks.pace.seconds=0.3",
    ]

    def kill_the_ps(proc):  # once a checkpoint is whole: a metrics line comes before its step's save is written
        wait_until(lambda: any((run_dir / "checkpoints").glob("ckpt-*.index")), 120, "a first checkpoint", [proc])
        os.kill(task_pid(run_dir, "ps"), signal.SIGKILL)

    code, out = run_and_interrupt(args, run_dir, 2, kill_the_ps)
    assert code == 0, out[-4000:]
    assert "task ps:0 exited with code 137; stopping the cluster" in out and "restart 1 of 3" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    # resumed exactly at a checkpoint's step (the loop's own count, saved with it)
    assert (
        summary["step"] == 1200
        and summary["resumed_from_step"] % 100 == 0
        and 100 <= summary["resumed_from_step"] < 1200
    )
    assert steps_logged(run_dir) == list(range(100, 1201, 100))


def test_launcher_gives_up_after_max_restarts(tfdistx):
    run = tfdistx(
        *QUICK,
        "strategy=multiworker",
        "cluster=2x1",
        "cluster.max_restarts=1",
        "data._target_=user_plugins.crashing_on_worker_1",
    )
    assert run.returncode == 7, run
    assert "restart 1 of 1" in run.stderr
    assert "giving up: the cluster stopped after 1 restart(s) (cluster.max_restarts=1); last exit code 7" in run.stderr


def test_a_damaged_checkpoint_falls_back_to_the_newest_intact_one(tfdistx):
    first = tfdistx(*QUICK, "checkpoint.every_steps=20")
    assert first.returncode == 0, first
    data = first.dir / "checkpoints" / "ckpt-40.data-00000-of-00001"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 3])  # as a kill mid-write would leave it
    second = tfdistx(*QUICK, "checkpoint.every_steps=20", "trainer.steps=60")
    assert second.returncode == 0, second
    assert second.summary["resumed_from_step"] == 20
    assert "ckpt-40 is damaged" in second.stdout + second.stderr
    assert (
        "restored" in second.stdout + second.stderr
        and "ckpt-20, the newest intact checkpoint" in second.stdout + second.stderr
    )


def _random_kill_run(tmp_path, seed: int):
    """A deterministic 2-worker run; a random worker is SIGKILLed at a random
    moment; the launcher restarts the cluster from the last checkpoint."""
    import random

    rng = random.Random(seed)
    args = [
        "strategy=multiworker",
        "cluster=2x1",
        "trainer.steps=300",
        "trainer.steps_per_loop=10",
        "trainer.log_every=10",
        "trainer.eval_every=0",
        "checkpoint.every_steps=50",
        "trainer.deterministic=true",
        "model.dropout=0.2",
        "logger.tensorboard=false",
        "cluster.max_restarts=2",
    ]
    run_dir = tmp_path / f"killed{seed}"

    def kill_a_random_worker_at_a_random_moment(proc):
        time.sleep(rng.uniform(0.0, 2.0))  # not a wait for anything: the random moment is what is tested
        os.kill(task_pid(run_dir, f"worker:{rng.choice([0, 1])}"), signal.SIGKILL)

    code, out = run_and_interrupt(args, run_dir, 1, kill_a_random_worker_at_a_random_moment)
    return args, run_dir, code, out


@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.slow)])
def test_worker_killed_at_a_random_moment_loses_nothing(tmp_path, seed):
    args, run_dir, code, out = _random_kill_run(tmp_path, seed)
    assert code == 0, out[-4000:]
    assert "restart 1 of 2" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["step"] == 300  # resumed from a checkpoint, or from scratch if killed before the first
    assert steps_logged(run_dir) == list(range(10, 301, 10))
    whole = run_command(
        [sys.executable, "-m", "tfdistx", *args, f"hydra.run.dir={tmp_path / 'whole'}"], env=tfdistx_env(), timeout=600
    )
    assert whole.returncode == 0, whole.stdout[-3000:]
    assert json.loads((tmp_path / "whole" / "summary.json").read_text())["weights_sha256"] == summary["weights_sha256"]


FULL_DISK = """
mount -t tmpfs -o size=3m tmpfs "$DISK" || exit 97
"$@" > "$OUT/first.txt" 2>&1; echo $? > "$OUT/first.rc"
ls "$DISK/run/checkpoints" > "$OUT/left.txt"
mount -o remount,size=64m "$DISK"   # space freed: the same command resumes
"$@" > "$OUT/second.txt" 2>&1; echo $? > "$OUT/second.rc"
cp -a "$DISK/run" "$OUT/run"
"""


def test_a_full_disk_stops_the_run_cleanly_and_the_same_command_resumes(tmp_path):
    """A real full file system: a 3 MB tmpfs, mounted in a user namespace of
    its own (no privileges needed, nothing left mounted)."""
    disk, out = tmp_path / "disk", tmp_path / "out"
    disk.mkdir(), out.mkdir()
    command = [
        sys.executable,
        "-m",
        "tfdistx",
        "trainer.steps=100",
        "trainer.steps_per_loop=10",
        "trainer.log_every=10",
        "trainer.eval_every=0",
        "checkpoint.every_steps=10",
        "checkpoint.max_to_keep=100",
        "logger.tensorboard=false",
        f"hydra.run.dir={disk / 'run'}",
    ]
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True)
    if probe.returncode:
        pytest.skip(f"cannot make a small file system here (unshare --user --mount: {probe.stderr.decode().strip()})")
    subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", FULL_DISK, "sh", *command],
        env=tfdistx_env(DISK=str(disk), OUT=str(out)),
        timeout=600,
        check=True,
    )
    first = (out / "first.txt").read_text()
    assert (out / "first.rc").read_text().strip() == "3", first[-3000:]
    assert "Traceback" not in first
    line = next(
        line
        for line in first.splitlines()
        if line.startswith("tfdistx: cannot write the run (No space left on device)")
    )
    newest = line.split("the newest checkpoint is ")[1].split()[0]
    assert not [name for name in (out / "left.txt").read_text().split() if "_temp" in name]  # no partial checkpoint
    assert "cannot write the run" in (out / "run" / "tfdistx.log").read_text()

    second = (out / "second.txt").read_text()
    assert (out / "second.rc").read_text().strip() == "0", second[-3000:]
    summary = json.loads((out / "run" / "summary.json").read_text())
    assert summary["step"] == 100 and summary["resumed_from_step"] == int(newest.split("-")[1])
    assert steps_logged(out / "run") == list(range(10, 101, 10))


def test_a_file_size_limit_stops_the_run_in_one_line_and_leaves_no_partial_checkpoint(tmp_path):
    """EFBIG (RLIMIT_FSIZE, as a batch system sets it): like a full disk,
    one line and exit 3, no `ckpt-N_temp/` left. Python ignores SIGXFSZ, so
    the write fails instead of killing the process."""
    import resource

    run_dir = tmp_path / "run"
    limit = 600_000  # above the logs and config, below one checkpoint of adam's slots for the 784-128-10 MLP

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tfdistx",
            "trainer.steps=20",
            "trainer.steps_per_loop=10",
            "trainer.log_every=10",
            "trainer.eval_every=0",
            "checkpoint.every_steps=10",
            "logger.tensorboard=false",
            f"hydra.run.dir={run_dir}",
        ],
        preexec_fn=limited,
        capture_output=True,
        text=True,
        env=tfdistx_env(),
        timeout=600,
    )
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "tfdistx: cannot write the run (File too large)" in proc.stderr
    assert not list((run_dir / "checkpoints").glob("*_temp*"))
