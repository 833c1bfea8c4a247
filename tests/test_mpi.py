"""strategy.communication=mpi: multiworker's gradients summed through MPI,
each task of the local cluster started under MPICH's mpiexec (the `mpi`
extra, which the test extra installs). Real processes on loopback, real
MPI, real checkpoints."""

import glob
import json
import os
import signal
from pathlib import Path

from conftest import QUICK, metric_lines, processes_of, start_tfdistx, steps_logged, wait_until
from test_cluster import digests

MPI = ["strategy=multiworker", "cluster=2x1", "strategy.communication=mpi"]
HWLOC_FILES = "/tmp/hydra_hwloc_xmlfile_*"  # what an mpiexec writes, and leaves if it is killed


def python_of(run_dir, task: str) -> int:
    """The task's own process, not the mpiexec that started it."""
    pids = [pid for pid in processes_of(run_dir, task) if Path(f"/proc/{pid}/exe").resolve().name.startswith("python")]
    assert len(pids) == 1, pids
    return pids[0]


def test_mpi_trains_as_one_device_does_and_resumes_bitwise(tfdistx, tmp_path):
    """Both workers end with the same weights; the run follows the one
    example order of every synchronous topology (one device's, to rounding:
    MPI sums in its own order); stopped and resumed, it ends bitwise where
    the run that never stopped ends."""
    whole = tfdistx(*QUICK, *MPI, "trainer.steps=60", "trainer.eval_every=60", run_dir=tmp_path / "whole")
    assert whole.returncode == 0, whole
    found = digests(whole.dir)
    assert set(found) == {"worker-0", "worker-1"} and len(set(found.values())) == 1, found
    assert whole.summary["step"] == 60 and whole.summary["workers"] == 2
    assert "strategy.communication=mpi" in (whole.dir / ".hydra" / "overrides.yaml").read_text()

    first = tfdistx(*QUICK, *MPI, "trainer.steps=30", "trainer.eval_every=60", run_dir=tmp_path / "split")
    resumed = tfdistx(*QUICK, *MPI, "trainer.steps=60", "trainer.eval_every=60", run_dir=tmp_path / "split")
    assert first.returncode == 0 and resumed.returncode == 0, (first, resumed)
    assert resumed.summary["resumed"] and resumed.summary["weights_sha256"] == whole.summary["weights_sha256"]

    one = tfdistx(*QUICK, "strategy=one_device", "trainer.steps=60", "trainer.eval_every=60", run_dir=tmp_path / "one")
    assert one.returncode == 0, one
    ours, theirs = whole.summary["eval"], one.summary["eval"]
    assert ours.keys() == theirs.keys() and all(
        abs(ours[k] - theirs[k]) <= 1e-4 * max(1.0, abs(theirs[k])) for k in ours
    ), (ours, theirs)


def test_a_killed_mpi_worker_restarts_the_cluster_and_a_preempted_one_resumes(tmp_path):
    """worker:1 killed mid-run: the launcher stops its peer, even one waiting
    inside an MPI sum (SIGKILL after the teardown's grace), and restarts the
    round from the newest checkpoint;
    then the launcher's SIGTERM reaches both tasks through mpiexec, they
    checkpoint and the run exits 42; the same command goes on to the end.
    Every step logged once."""
    run_dir = tmp_path / "run"
    topology_files = set(glob.glob(HWLOC_FILES))
    args = [
        *MPI,
        "trainer.steps=1000",
        "trainer.steps_per_loop=20",
        "trainer.log_every=20",
        "trainer.eval_every=0",
        "checkpoint.every_steps=100",
        "logger.tensorboard=false",
        "checkpoint.export=false",
        "cluster.max_restarts=1",
    ]
    proc = start_tfdistx(args, run_dir)
    try:
        wait_until(lambda: metric_lines(run_dir) >= 8, 300, "8 metric lines", [proc])  # past the checkpoint at step 100
        os.kill(python_of(run_dir, "worker:1"), signal.SIGKILL)  # the task under its mpiexec, which ends and says so
        wait_until(
            lambda: "restart 1 of 1" in (run_dir / "tfdistx.log").read_text() and metric_lines(run_dir) >= 5,
            300,
            "the restarted round trains",
            [proc],
        )
        before = metric_lines(run_dir)
        wait_until(lambda: metric_lines(run_dir) > before, 300, "a step more", [proc])
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 42, out[-4000:]
    assert "[worker:0] preempted at step" in out and "[worker:1] preempted at step" in out, out[-4000:]

    again = start_tfdistx(args, run_dir)
    out, _ = again.communicate(timeout=600)
    assert again.returncode == 0, out[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["step"] == 1000 and summary["resumed"]
    assert steps_logged(run_dir) == list(range(20, 1001, 20))  # nothing lost, nothing twice
    for left in (
        set(glob.glob(HWLOC_FILES)) - topology_files
    ):  # by the mpiexec the teardown killed (core/mpi.py): this test's own
        os.remove(left)
