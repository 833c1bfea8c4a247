"""A real single-node Slurm (Debian's slurm-wlm and munge) running tfdistx:
`srun -n 2` multi-worker training, and a sweep submitted through
hydra-submitit-launcher. The fixture starts Slurm with the project's script
(installing slurm-wlm and munge with apt if missing) and stops it at the end."""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import QUICK, metric_lines, steps_logged, tfdistx_env, wait_until

# Installs packages, writes /etc and starts daemons: only with `pytest -m system`.
pytestmark = [pytest.mark.system, pytest.mark.xdist_group("slurm")]  # one real Slurm: its tests in one test process

START = Path(__file__).resolve().parent.parent / "scripts" / "slurm" / "start-local-slurm.sh"
STOP = START.with_name("stop-local-slurm.sh")


@pytest.fixture(scope="module")
def slurm():
    """A running Slurm; stopped again at the end unless it was running before."""
    if os.geteuid() != 0:
        pytest.skip("starting a local Slurm needs root")
    was_running = subprocess.run(["pgrep", "-x", "slurmctld"], capture_output=True).returncode == 0
    started = subprocess.run(["bash", str(START)], capture_output=True, text=True, timeout=900)
    assert started.returncode == 0, started.stdout + started.stderr
    assert shutil.which("srun")
    yield
    if not was_running:
        _end_our_jobs()
        subprocess.run(["bash", str(STOP)], capture_output=True, timeout=120)
        # A job step whose daemons are gone waits for them forever: none may be left.
        subprocess.run(["pkill", "-KILL", "-x", "slurmstepd"], capture_output=True)


def _end_our_jobs(timeout: float = 60) -> None:
    """The jobs the tests submitted (all of them: this fixture started Slurm)
    end before the daemons stop. A sweep's result is in before its job has
    finished exiting, so wait for the queue to empty, cancelling what remains."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        queue = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=30)
        if queue.returncode != 0 or not queue.stdout.strip():
            return
        if time.monotonic() > deadline - timeout / 2:
            subprocess.run(["scancel", "--full", *queue.stdout.split()], capture_output=True, timeout=30)
        time.sleep(1)


def test_srun_two_tasks_train_one_multiworker_cluster(slurm, tmp_path):
    run_dir = tmp_path / "run"
    cmd = [
        "srun",
        "-n",
        "2",
        "--overcommit",
        "--kill-on-bad-exit=1",
        sys.executable,
        "-m",
        "tfdistx",
        *QUICK,
        "strategy=multiworker",
        "cluster=2x1",
        f"hydra.run.dir={run_dir}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=tfdistx_env(), timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["workers"], summary["replicas"], summary["step"], summary["process"]) == (2, 2, 40, "worker:0")
    digests = {
        line.rsplit(" ", 1)[1] for line in (proc.stdout + proc.stderr).splitlines() if "final weights sha256" in line
    }
    assert digests == {summary["weights_sha256"]}


def test_the_tasks_of_a_step_share_one_default_run_dir(slurm, tmp_path):
    """No hydra.run.dir: the run dir comes from the job and step ids, not each task's clock."""
    cmd = [
        "srun",
        "-n",
        "2",
        "--overcommit",
        "--kill-on-bad-exit=1",
        sys.executable,
        "-m",
        "tfdistx",
        *QUICK,
        "strategy=multiworker",
        "cluster=2x1",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=tfdistx_env(), timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = [p for p in (tmp_path / "outputs").rglob(".hydra")]
    assert len(runs) == 1 and runs[0].parent.parent.name == "slurm", runs
    assert json.loads((runs[0].parent / "summary.json").read_text())["step"] == 40


def test_srun_with_the_wrong_number_of_tasks_is_refused(slurm, tmp_path):
    cmd = [
        "srun",
        "-n",
        "3",
        "--overcommit",
        sys.executable,
        "-m",
        "tfdistx",
        "strategy=multiworker",
        "cluster=2x1",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=tfdistx_env(), timeout=300, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "srun -n 2" in proc.stderr and "Traceback" not in proc.stderr


def test_submitit_sweep_runs_each_job_as_a_slurm_cluster(slurm, tmp_path):
    sweep = tmp_path / "sweep"
    cmd = [
        sys.executable,
        "-m",
        "tfdistx",
        "-m",
        "hydra/launcher=tfdistx_slurm",
        "hydra.launcher.partition=debug",
        f"hydra.launcher.submitit_folder={tmp_path / 'submitit'}",
        "strategy=multiworker",
        "cluster=2x1",
        *QUICK,
        "optimizer.lr=0.001,0.01",
        f"hydra.sweep.dir={sweep}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=tfdistx_env(), timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summaries = [json.loads((sweep / str(job) / "summary.json").read_text()) for job in (0, 1)]
    assert [s["learning_rate"] for s in summaries] == [0.001, 0.01]
    assert all((s["workers"], s["step"]) == (2, 40) for s in summaries)


@pytest.mark.parametrize(
    "placed",
    [["cluster=2x1"], ["cluster.workers=1:2", "cluster.launch=agent", "cluster.elastic.join_grace=1"]],
    ids=["two tasks of one step", "an agent on every node"],
)
def test_the_exported_script_checkpoints_at_slurms_notice_requeues_itself_and_resumes(slurm, tmp_path, placed):
    """`tfdistx job slurm`'s script, sbatch'ed: the notice Slurm gives the batch shell before the time limit
    (--signal=B:USR1@N; sent here at once, as `scancel --signal=USR1 --batch` sends it) reaches every task
    through srun (or every node's agent, which passes it on to its worker), they checkpoint at one step and
    exit 42, the job requeues itself, and its next start resumes from that step in the same run dir and
    finishes: every step logged once. This Slurm has one node: the agents' script (1 to 2 nodes) gets one."""
    run_dir, script, steps = tmp_path / "run", tmp_path / "train.sbatch", 6000
    args = [
        "strategy=multiworker",
        *placed,
        *QUICK,
        f"trainer.steps={steps}",
        "trainer.steps_per_loop=10",
        "trainer.log_every=10",
        f"hydra.run.dir={run_dir}",
    ]
    env = tfdistx_env(
        PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    )  # `python`: this one
    export = subprocess.run(
        [sys.executable, "-m", "tfdistx", "job", "slurm", *args, "--out", str(script), "--notice", "60"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
    )
    assert export.returncode == 0, export.stderr
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--overcommit", str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=tmp_path,
    )
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    wait_until(lambda: metric_lines(run_dir) >= 1, 600, "the job's first metrics line")
    notice = subprocess.run(["scancel", "--signal=USR1", "--batch", job], capture_output=True, text=True, timeout=60)
    assert notice.returncode == 0, notice.stderr
    summary = run_dir / "summary.json"
    wait_until(summary.exists, 900, "the requeued job's summary")
    output = (tmp_path / f"slurm-{job}.out").read_text()  # --open-mode=append: both starts of the job
    assert (
        re.search(r"SIG(USR1|TERM): checkpointing at the next loop boundary", output)
        and f"requeueing job {job}" in output
    ), output[-3000:]
    result = json.loads(summary.read_text())
    assert result["step"] == steps and 0 < result["resumed_from_step"] < steps, result
    # resumed from the checkpoint saved at the notice (since rotated out by checkpoint.max_to_keep: the run went on)
    assert {int(step) for step in re.findall(r"preempted at step (\d+): checkpoint saved", output)} == {
        result["resumed_from_step"]
    }, output[-3000:]
    assert steps_logged(run_dir) == list(range(10, steps + 1, 10))


def test_a_job_whose_derived_ports_something_holds_trains_on_ports_free_on_its_node(slurm, tmp_path):
    """Issue 60, item 10: a step's tasks took cluster.base_port + 64 x (job id mod 500) + rank, which another job
    on the node (ids that agree mod 500) or any program may hold: the task exits 6, its peers 42 as srun ends the
    step, and every requeue took the same ports again. Held here by this test, the exported script's job trains
    to the end on ports its node had free."""
    run_dir, script = tmp_path / "run", tmp_path / "train.sbatch"
    args = ["strategy=multiworker", "cluster=2x1", *QUICK, f"hydra.run.dir={run_dir}"]
    env = tfdistx_env(PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    export = subprocess.run(
        [sys.executable, "-m", "tfdistx", "job", "slurm", *args, "--out", str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
    )
    assert export.returncode == 0, export.stderr
    before = subprocess.run(
        ["sbatch", "--parsable", "--wrap", "true"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    job = int(before.stdout.strip().split(";")[0]) + 1  # this Slurm is the tests' alone: the next id is the script's
    first = 29400 + 64 * (job % 500)
    held = []
    try:
        for port in (first, first + 1):
            sock = socket.socket()
            sock.bind(("", port))
            sock.listen()
            held.append(sock)
        submitted = subprocess.run(
            ["sbatch", "--parsable", "--overcommit", str(script)],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            cwd=tmp_path,
        )
        assert submitted.returncode == 0 and int(submitted.stdout.strip().split(";")[0]) == job, submitted
        wait_until((run_dir / "summary.json").exists, 600, "the job's summary")
    finally:
        for sock in held:
            sock.close()
    assert json.loads((run_dir / "summary.json").read_text())["step"] == 40
    output = (tmp_path / f"slurm-{job}.out").read_text()
    ports = {int(p) for p in re.findall(r"listens on port (\d+) on ALL", output)}
    assert len(ports) == 2 and not ports & {first, first + 1} and "requeueing" not in output, output[-3000:]
