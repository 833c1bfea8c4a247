"""Multi-process training on real processes over loopback: local launcher,
TF_CONFIG passthrough, teardown. No TensorFlow mocks; every cluster runs in a
private network namespace (or on loopback when the OS does not allow one)."""

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import (
    QUICK,
    files,
    free_ports,
    metric_lines,
    processes_of,
    refused_in_one_line,
    start_tfdistx,
    tfdistx_env,
    wait_until,
    workers_tf_config,
)


def digests(run_dir: Path) -> dict:
    """Each task's final-weights fingerprint, from its own log file."""
    found = {}
    for log in (run_dir / "logs").glob("*.log"):
        for line in log.read_text().splitlines():
            if "final weights sha256" in line:
                found[log.stem] = line.rsplit(" ", 1)[1]
    return found


def can_isolate() -> bool:
    return (
        shutil.which("unshare") is not None
        and subprocess.run(["unshare", "--user", "--map-root-user", "--net", "true"], capture_output=True).returncode
        == 0
    )


def test_two_workers_end_with_identical_weights(tfdistx, tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    # Another local user's links at the names worker 1's scratch dir had in the temp dir, or could have: not followed,
    # not removed (the local launcher now gives its tasks a scratch place in logs/.scratch, so they are not even looked
    # at).
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("mine")
    key = hashlib.sha1(str(tmp_path / "run" / "checkpoints").encode()).hexdigest()[:12]
    planted = [scratch / f"tfdistx-{key}-worker1", scratch / f"tfdistx-{key}-worker1-planted"]
    for link in planted:
        link.symlink_to(victim)
    run = tfdistx(
        *QUICK, "strategy=multiworker", "cluster=2x1", "checkpoint.every_steps=20", env={"TMPDIR": str(scratch)}
    )
    assert run.returncode == 0, run
    assert (victim / "precious").read_text() == "mine" and sorted(scratch.iterdir()) == planted
    for link in planted:
        link.unlink()
    summary = run.summary
    assert (summary["strategy"], summary["workers"], summary["replicas"], summary["per_replica_batch"]) == (
        "multiworker",
        2,
        2,
        16,
    )
    assert summary["step"] == 40 and summary["process"] == "worker:0"
    found = digests(run.dir)
    assert set(found) == {"worker-0", "worker-1"} and len(set(found.values())) == 1, found
    assert found["worker-0"] == summary["weights_sha256"]
    # the chief's checkpoints in the run dir; the other worker's scratch copies removed
    assert (run.dir / "checkpoints" / "ckpt-40.index").exists()
    assert (
        list(scratch.iterdir()) == [] and not (run.dir / "logs" / ".scratch").exists()
    )  # the launcher's scratch place: gone too
    assert "[worker:1]" in run.stdout and "[worker:0] step 40/40" in run.stdout
    run_log = (run.dir / "tfdistx.log").read_text()  # the whole run in one file
    assert "[worker:0] step 40/40" in run_log and "[worker:1] task worker:1: final weights" in run_log
    if can_isolate():
        assert "private network namespace" in run.stdout


@pytest.mark.slow  # what auto resolves to is checked in-process (test_unit_config_cluster.py, test_unit_config_plan.py)
def test_auto_strategy_with_several_workers_is_multiworker(tfdistx):
    run = tfdistx(*QUICK, "cluster=2x1")
    assert run.returncode == 0, run
    assert run.summary["strategy"] == "multiworker"


def test_parameter_server_variables_live_on_the_ps(tfdistx):
    run = tfdistx(*QUICK, "strategy=parameter_server", "cluster=ps1w2", "checkpoint.every_steps=20")
    assert run.returncode == 0, run
    summary = run.summary
    assert summary["step"] == 40 and summary["process"] == "chief:0"
    assert summary["variable_devices"] and all(d.startswith("/job:ps/") for d in summary["variable_devices"]), summary
    assert summary["eval"]["eval/accuracy"] >= 0
    assert [m["step"] for m in run.metrics] == [20, 40]
    assert (run.dir / "checkpoints" / "ckpt-40.index").exists()
    # TF's harmless "Failed to clear function handle cache: UNIMPLEMENTED" at each evaluation: in the task's log only
    assert "E0000" not in run.stdout + run.stderr, run
    # 40 steps over 2 asynchronous workers learn little: the run says so once (its chief, not also the launcher), not
    # only --plan, and its log keeps it
    warning = "tfdistx: warning: 2 asynchronous workers apply stale gradients: 40 steps"
    assert (run.stdout + run.stderr).count(warning) == 1 and warning in (run.dir / "tfdistx.log").read_text(), run


@pytest.mark.slow  # the default run resumes a multiworker run bitwise in test_fault_tolerance
def test_resumed_multiworker_run_continues_from_the_chiefs_checkpoint(tfdistx):
    first = tfdistx(*QUICK, "strategy=multiworker", "cluster=2x1", "checkpoint.every_steps=20")
    assert first.returncode == 0, first
    second = tfdistx(*QUICK, "strategy=multiworker", "cluster=2x1", "trainer.steps=60", "checkpoint.every_steps=20")
    assert second.returncode == 0, second
    assert (second.summary["resumed_from_step"], second.summary["step"]) == (40, 60)
    assert len(set(digests(second.dir).values())) == 1


@pytest.mark.skipif(not can_isolate(), reason="needs unprivileged user and network namespaces")
def test_tf_config_passthrough(tmp_path):
    """Start the two tasks ourselves, as Kubeflow would, each with its TF_CONFIG.
    A rerun of both with another model is refused (exit 2), and the run's
    .hydra/ files are the run's own: only the chief writes them, and it puts
    back what the refused rerun replaced."""
    run_dir = tmp_path / "run"
    proc, outputs = tf_config_tasks(tmp_path, *QUICK, "strategy=multiworker", "cluster=2x1", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, (proc.stderr, outputs)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["process"], summary["workers"], summary["step"]) == ("worker:0", 2, 40)
    final = {
        i: [l for l in out.splitlines() if "final weights sha256" in l][0].rsplit(" ", 1)[1]
        for i, out in outputs.items()
    }
    assert final[0] == final[1] == summary["weights_sha256"]
    config = files(run_dir / ".hydra")
    proc, outputs = tf_config_tasks(
        tmp_path,
        *QUICK,
        "strategy=multiworker",
        "cluster=2x1",
        "model=cnn",
        "trainer.steps=60",
        f"hydra.run.dir={run_dir}",
    )
    assert proc.returncode != 0 and all("was saved by another model" in out for out in outputs.values()), outputs
    assert files(run_dir / ".hydra") == config


def tf_config_tasks(tmp_path, *args):
    """(the shell's result, each worker's output) of a 2x1 run's two tasks started
    with their TF_CONFIG in a network namespace of their own, each `python -m tfdistx ARGS`."""
    spec = {"worker": ["127.0.0.1:23001", "127.0.0.1:23002"]}
    tasks = [
        f"TF_CONFIG='{json.dumps({'cluster': spec, 'task': {'type': 'worker', 'index': i}})}' "
        f"{sys.executable} -m tfdistx {' '.join(args)} > {tmp_path}/worker{i}.out 2>&1 & p{i}=$!;"
        for i in range(2)
    ]
    script = (
        f"{sys.executable} -c 'from tfdistx.cluster.processes import loopback_up; loopback_up()' && "
        + " ".join(tasks)
        + " wait $p0; r0=$?; wait $p1; r1=$?; [ $r0 -eq 0 ] && [ $r1 -eq 0 ]"
    )  # both awaited, whatever the first's code
    proc = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--net", "bash", "-c", script],
        env=tfdistx_env(),
        timeout=600,
        capture_output=True,
        text=True,
    )
    return proc, {i: (tmp_path / f"worker{i}.out").read_text() for i in range(2)}


def test_tasks_forked_from_the_prefork_train_as_fresh_processes_do(tfdistx, tmp_path):
    """cluster.prefork (the default) forks each task from one process that
    imported TensorFlow: the tasks are named in `ps -o comm`, train to the
    same weights as fresh processes (cluster.prefork=false), and leave
    nothing running, the prefork included."""
    args = [*QUICK, "strategy=multiworker", "cluster=2x1", "trainer.steps=400", "checkpoint.every_steps=0"]
    forked_dir = tmp_path / "forked"
    proc = start_tfdistx(args, forked_dir)
    try:
        wait_until(lambda: metric_lines(forked_dir) >= 1, 300, "a step logged", [proc])
        named = {Path(f"/proc/{pid}/comm").read_text().strip() for pid in processes_of(forked_dir)}
        assert {"worker:0", "worker:1"} <= named, named
        assert proc.wait(timeout=300) == 0, proc.stdout.read()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    assert processes_of(forked_dir) == []  # the prefork went with the run
    fresh = tfdistx(*args, "cluster.prefork=false", run_dir=tmp_path / "fresh")
    assert fresh.returncode == 0, fresh
    assert digests(forked_dir) == digests(fresh.dir) and len(set(digests(fresh.dir).values())) == 1, (
        digests(forked_dir),
        digests(fresh.dir),
    )


def test_parameter_servers_whose_coordinator_is_gone_stop_on_their_own(tmp_path):
    """Under TF_CONFIG no launcher stops a parameter-server run's servers:
    with the coordinator killed mid-run (as a crashed or cut-off machine
    leaves it), the ps and both workers each stop within
    cluster.peer_timeout with one line naming it, exit 5, and none is left."""
    run_dir = tmp_path / "run"
    spec = {"chief": ["127.0.0.1:23101"], "ps": ["127.0.0.1:23102"], "worker": ["127.0.0.1:23103", "127.0.0.1:23104"]}
    args = (
        f"strategy=parameter_server cluster=ps1w2 trainer.steps=1000000 trainer.steps_per_loop=10 trainer.log_every=10 "
        f"checkpoint.every_steps=0 logger.tensorboard=false cluster.peer_timeout=4 hydra.run.dir={run_dir}"
    )
    tasks = [(job, index) for job, addresses in spec.items() for index in range(len(addresses))]
    start = " ".join(
        f"TF_CONFIG='{json.dumps({'cluster': spec, 'task': {'type': job, 'index': index}})}' "
        f"{sys.executable} -m tfdistx {args} > {tmp_path}/{job}{index}.out 2>&1 & {job}{index}=$!;"
        for job, index in tasks
    )
    servers = [(job, index) for job, index in tasks if job != "chief"]
    # Once the chief has logged a step: SIGKILL it, then time each server's own end (bounded: 120 s, then killed).
    script = (
        f"{sys.executable} -c 'from tfdistx.cluster.processes import loopback_up; loopback_up()' || exit 9; {start} "
        f"for i in $(seq 600); do [ -s {run_dir}/metrics.jsonl ] && break; sleep 0.5; done; "
        f"[ -s {run_dir}/metrics.jsonl ] || {{ echo 'no step logged'; kill -9 $chief0 "
        + " ".join(f"${j}{i}" for j, i in servers)
        + "; exit 9; }; "
        "kill -9 $chief0; killed=$(date +%s); "
        # The watchdog's sleep goes with it: an orphaned sleep would hold this script's output open for 120 s.
        "( trap 'kill $s 2>/dev/null; exit 0' TERM; sleep 120 & s=$!; wait $s; kill -9 "
        + " ".join(f"${j}{i}" for j, i in servers)
        + " 2>/dev/null ) >/dev/null 2>&1 & watchdog=$!; "
        + " ".join(f"wait ${j}{i}; echo {j}{i} $? $(( $(date +%s) - killed ));" for j, i in servers)
        + " kill $watchdog 2>/dev/null; wait $watchdog; true"
    )
    proc = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--net", "bash", "-c", script],
        env=tfdistx_env(),
        timeout=900,
        capture_output=True,
        text=True,
    )
    outputs = {f"{job}{index}": (tmp_path / f"{job}{index}.out").read_text() for job, index in tasks}
    ended = {
        line.split()[0]: (int(line.split()[1]), int(line.split()[2]))
        for line in proc.stdout.splitlines()
        if len(line.split()) == 3
    }
    assert set(ended) == {"ps0", "worker0", "worker1"}, (proc.stdout, proc.stderr, outputs)
    for name, (code, seconds) in ended.items():
        assert code == 5 and seconds <= 4 + 30, (name, code, seconds, outputs[name][-2000:])
        said = [line for line in outputs[name].splitlines() if line.startswith("tfdistx: lost contact")]
        assert said == [
            "tfdistx: lost contact with chief:0: no answer for 4s (cluster.peer_timeout); "
            f"{name[:-1]}:{name[-1]} stops serving"
        ], outputs[name][-2000:]


# What srun does for one step, for a test without Slurm: each rank started with the variables srun sets (one node,
# `localhost`), every rank awaited, and the step's code the largest of theirs, as srun returns it. Each rank's code and
# output are kept beside it (rank-N.code, rank-N.out).
FAKE_SRUN = """#!{python}
import os, subprocess, sys
command = [arg for arg in sys.argv[1:] if not arg.startswith("--")]
# the script's port probe: one task on the one node, its answer printed
if "tfdistx.launch.slurm.free_ports" in command:
    os.execv(sys.executable, [sys.executable, *command[1:]])
ranks = int(os.environ["SLURM_NTASKS"])
place = {{"SLURM_STEP_NUM_TASKS": str(ranks), "SLURM_STEP_NODELIST": "localhost", "SLURM_STEP_TASKS_PER_NODE": \
str(ranks)}}
procs = [
    subprocess.Popen(command, env={{**os.environ, **place, "SLURM_PROCID": str(rank)}},
                     stdout=open(f"{out}/rank-{{rank}}.out", "w"), stderr=subprocess.STDOUT)
    for rank in range(ranks)
]
codes = [proc.wait() for proc in procs]
for rank, code in enumerate(codes):
    open(f"{out}/rank-{{rank}}.code", "w").write(str(code))
sys.exit(max(codes))
"""


@pytest.mark.skipif(not can_isolate(), reason="needs unprivileged user and network namespaces")
def test_a_slurm_job_of_parameter_servers_that_trains_to_its_end_reports_0_from_every_task(tmp_path):
    """The script `tfdistx job slurm` prints, run as sbatch would run it, its srun a stand-in that starts the
    step's five ranks with Slurm's variables (chief, ps, two workers, the sidecar evaluator): a run that trains to
    its end leaves every rank with 0 (the servers told so by the chief, where they waited out cluster.peer_timeout
    and exited 5 before), so the step's code (srun's: the largest) and the job's (`exit "$code"`) are 0."""
    run_dir, bin_dir, script = tmp_path / "run", tmp_path / "bin", tmp_path / "train.sbatch"
    args = [
        *QUICK,
        "strategy=parameter_server",
        "cluster=ps1w2",
        "cluster.evaluator=true",
        "cluster.peer_timeout=5",
        f"hydra.run.dir={run_dir}",
    ]
    export = subprocess.run(
        [sys.executable, "-m", "tfdistx", "job", "slurm", *args, "--out", str(script)],
        capture_output=True,
        text=True,
        env=tfdistx_env(),
        timeout=120,
    )
    assert export.returncode == 0, export.stderr
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN.format(python=sys.executable, out=tmp_path))
    (bin_dir / "srun").chmod(0o755)
    env = tfdistx_env(
        PATH=os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        SLURM_JOB_ID="17",
        SLURM_NTASKS="5",
        SLURM_JOB_NUM_NODES="1",
        SLURMD_NODENAME="localhost",  # as the fake step names the node
    )
    job = subprocess.run(
        [
            "unshare",
            "--user",
            "--map-root-user",
            "--net",
            "bash",
            "-c",
            f"{sys.executable} -c 'from tfdistx.cluster.processes import loopback_up; loopback_up()' && bash {script}",
        ],
        env=env,
        timeout=600,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert (tmp_path / "rank-0.code").exists(), (job.returncode, job.stdout, job.stderr)  # the step ran
    outputs = {rank: (tmp_path / f"rank-{rank}.out").read_text() for rank in range(5)}
    codes = {rank: (tmp_path / f"rank-{rank}.code").read_text() for rank in range(5)}
    assert codes == {rank: "0" for rank in range(5)}, (codes, {r: o[-1500:] for r, o in outputs.items()})
    assert job.returncode == 0, (job.stdout, job.stderr)
    assert json.loads((run_dir / "summary.json").read_text())["step"] == 40
    assert all("lost contact" not in output and "Traceback" not in output for output in outputs.values()), outputs


@pytest.mark.skipif(not can_isolate(), reason="needs unprivileged user and network namespaces")
def test_the_tf_data_service_of_a_multiworker_run_under_tf_config_ends_with_0_when_the_training_does(tmp_path):
    """Two workers, the dispatcher and a data worker, each started by hand with its TF_CONFIG: the run trains to its
    end, and every task exits 0 (the service's tasks stopped one cluster.peer_timeout after the trainers, with 5)."""
    run_dir = tmp_path / "run"
    spec = {
        "worker": ["127.0.0.1:23201", "127.0.0.1:23202"],
        "dispatcher": ["127.0.0.1:23203"],
        "dataworker": ["127.0.0.1:23204"],
    }
    args = " ".join([*QUICK, "strategy=multiworker", "cluster=2x1", "data.service.workers=1", "cluster.peer_timeout=5"])
    tasks = [(job, index) for job, addresses in spec.items() for index in range(len(addresses))]
    start = " ".join(
        f"TF_CONFIG='{json.dumps({'cluster': spec, 'task': {'type': job, 'index': index}})}' "
        f"{sys.executable} -m tfdistx {args} hydra.run.dir={run_dir} > {tmp_path}/{job}{index}.out 2>&1 & "
        f"{job}{index}=$!;"
        for job, index in tasks
    )
    script = (
        f"{sys.executable} -c 'from tfdistx.cluster.processes import loopback_up; loopback_up()' || exit 9; {start} "
        + " ".join(f"wait ${job}{index}; echo {job}{index} $?;" for job, index in tasks)
    )
    proc = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--net", "bash", "-c", script],
        env=tfdistx_env(),
        timeout=600,
        capture_output=True,
        text=True,
    )
    outputs = {f"{job}{index}": (tmp_path / f"{job}{index}.out").read_text() for job, index in tasks}
    ended = dict(line.split() for line in proc.stdout.splitlines() if len(line.split()) == 2)
    assert ended == {name: "0" for name in outputs}, (ended, proc.stderr, {t: o[-1500:] for t, o in outputs.items()})
    assert json.loads((run_dir / "summary.json").read_text())["step"] == 40


def test_a_failing_task_stops_the_cluster(tfdistx):
    run = tfdistx(
        *QUICK,
        "strategy=multiworker",
        "cluster=2x1",
        "data._target_=user_plugins.broken_on_worker_1",
        "trainer.steps=100000",
        timeout=300,
    )
    assert run.returncode == 2, run
    assert "worker 1 cannot read its data" in run.stdout and "task worker:1 exited with code 2" in run.stderr
    assert processes_of(run.dir) == []


def test_ctrl_c_stops_every_task(tmp_path):
    run_dir = tmp_path / "run"
    args = [
        "strategy=multiworker",
        "cluster=2x1",
        "trainer.steps=1000000",
        "trainer.steps_per_loop=10",
        "trainer.log_every=10",
        "logger.tensorboard=false",
    ]
    proc = start_tfdistx(args, run_dir)
    try:
        wait_until(lambda: metric_lines(run_dir) >= 1, 300, "a first metrics line", [proc])
        assert len(processes_of(run_dir)) >= 3  # the launcher, the supervisor, two workers
        proc.send_signal(signal.SIGINT)
        said, _ = proc.communicate(timeout=120)
        assert proc.returncode == 130, said[-3000:]
        wait_until(lambda: processes_of(run_dir) == [], 30, "every process of the run gone")
        assert "Traceback" not in said and "KeyboardInterrupt" not in said, said[-3000:]
        assert "tfdistx: interrupted" in said
    finally:
        proc.kill()  # if the test failed: the launcher's tasks die with it (PR_SET_PDEATHSIG)


@pytest.mark.parametrize(
    "strategy",
    [["strategy=multiworker", "cluster=2x1"], ["strategy=parameter_server", "cluster=ps1w2"]],
    ids=["multiworker", "parameter_server"],
)
def test_a_niced_cluster_yields_in_a_session_of_its_own_and_is_stopped_and_resumed_as_any(tmp_path, strategy):
    """cluster.nice=10: the supervisor, the prefork and every task run at nice 10 in one session of their
    own, whose autogroup (the scheduler's share between sessions) has nice 10 too; the command stays in the
    caller's session, untouched. A SIGTERM to the command still reaches the tasks (42), and the same command
    then finishes the run from its checkpoint."""
    run_dir = tmp_path / "run"
    args = [
        *strategy,
        "cluster.nice=10",
        "trainer.steps=1000000",
        "trainer.steps_per_loop=10",
        "trainer.log_every=10",
        "logger.tensorboard=false",
        "checkpoint.export=false",
    ]
    proc = start_tfdistx(args, run_dir)
    try:
        wait_until(lambda: metric_lines(run_dir) >= 1, 300, "a first metrics line", [proc])
        autogroup = Path("/proc/self/autogroup").exists()  # a kernel built without it has the processes' nice alone
        assert os.getsid(proc.pid) == os.getsid(0)
        assert (
            not autogroup or Path(f"/proc/{proc.pid}/autogroup").read_text() == Path("/proc/self/autogroup").read_text()
        )
        cluster = [pid for pid in processes_of(run_dir) if pid != proc.pid]
        assert len(cluster) >= 4  # the supervisor, the prefork, two workers (and a ps and a chief)
        for pid in cluster:
            assert os.getsid(pid) != os.getsid(0) and os.getpriority(os.PRIO_PROCESS, pid) == 10, pid
            assert not autogroup or Path(f"/proc/{pid}/autogroup").read_text().split()[-2:] == ["nice", "10"], pid
        assert len({os.getsid(pid) for pid in cluster}) == 1
        proc.send_signal(signal.SIGTERM)
        said, _ = proc.communicate(timeout=120)
        assert proc.returncode == 42, said[-3000:]
        wait_until(lambda: processes_of(run_dir) == [], 30, "every process of the run gone")
    finally:
        proc.kill()
    stopped_at = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["step"]
    again = subprocess.run(
        [sys.executable, "-m", "tfdistx", *args, f"trainer.steps={stopped_at + 20}", f"hydra.run.dir={run_dir}"],
        env=tfdistx_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["step"] == stopped_at + 20


def test_a_nice_for_a_task_a_scheduler_placed_is_refused_in_one_line(tfdistx):
    """cluster.nice under TF_CONFIG (cluster.launch=auto): the scheduler started the process, so nothing would be
    niced."""
    run = tfdistx(
        "strategy=multiworker",
        "cluster=2x1",
        "cluster.nice=10",
        *QUICK,
        env={"TF_CONFIG": workers_tf_config(free_ports(2), 0)},
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr, run
    assert (
        "tfdistx: invalid config: cluster.nice=10: a local cluster's priority needs its processes started by tfdistx's "
        "local launcher (cluster.launch=local), and this task was placed by a scheduler: ask the scheduler (Slurm's "
        "--nice, a pod's priority), and leave cluster.nice=0 here"
    ) in run.stderr, run.stderr[-2000:]


# -- a missing peer: exit 4 in time (placement from a scheduler's environment, and a bad one refused:
# test_unit_config_cluster.py) --


def test_a_peer_that_never_starts_ends_the_task_in_time_naming_it(tfdistx):
    ports = free_ports(2)
    run = tfdistx(
        "strategy=multiworker",
        "cluster=2x1",
        "cluster.startup_timeout=3",
        *QUICK,
        env={"TF_CONFIG": workers_tf_config(ports, 0)},
    )
    assert run.returncode == 4 and "Traceback" not in run.stderr, run
    assert (
        "tfdistx: the cluster did not form within cluster.startup_timeout=3s: no answer from worker:1 "
        f"at 127.0.0.1:{ports[1]}" in run.stderr
    ), run
    assert "listens on port" in run.stderr and "ALL of this host's interfaces" in run.stderr  # the exposure warning


def test_a_port_in_use_is_named_with_its_task(tfdistx):
    ports = free_ports(2)
    with socket.socket() as taken:
        taken.bind(("", ports[0]))
        taken.listen()
        run = tfdistx("strategy=multiworker", "cluster=2x1", *QUICK, env={"TF_CONFIG": workers_tf_config(ports, 0)})
    assert run.returncode == 6, run.stderr[-2000:]  # a fault of the machine, which a retry may cure: not a bad config
    assert (
        f"tfdistx: TF_CONFIG='127.0.0.1:{ports[0]}': task worker:0 cannot listen on port {ports[0]}: "
        "it is already in use" in run.stderr
    )
    assert "Traceback" not in run.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra",
    [
        ["trainer.precision=mixed_float16"],
        [
            "trainer.jit_compile=true",
            "trainer.accumulate_steps=2",
            "optimizer.global_clip_norm=1.0",
            "strategy.bytes_per_pack=65536",
        ],
    ],
)
def test_multiworker_runs_mixed_float16_and_xla_with_accumulation(tfdistx, extra):
    """How a step computes, under a real cluster (in one process: test_unit_compute.py)."""
    run = tfdistx(
        *QUICK,
        "data=synthetic",
        "strategy=multiworker",
        "cluster=2x1",
        *extra,
        "trainer.steps=80",
        "trainer.eval_every=80",
        timeout=300,
    )
    assert run.returncode == 0, run
    assert run.summary["step"] == 80 and run.summary["train"]["loss"] < 2.1


@pytest.mark.slow  # the default run checks both ps tasks hold variables in test_tasks' wide_deep_ps run
def test_wide_deep_tables_are_sharded_across_parameter_servers(tfdistx):
    run = tfdistx(
        "recipe=wide_deep_ps",
        "trainer.steps=60",
        "trainer.steps_per_loop=20",
        "trainer.log_every=20",
        "trainer.eval_every=0",
        "data.batch_size=64",
        "data.train_examples=2048",
        "model.vocab_size=20000",
        "data.vocab_size=20000",
        "model.hidden_units=[32]",
        "logger.tensorboard=false",
    )
    assert run.returncode == 0, run
    summary = run.summary
    assert (summary["strategy"], summary["ps"], summary["workers"], summary["step"]) == ("parameter_server", 2, 2, 60)
    assert summary["variable_devices"] == [
        "/job:ps/replica:0/task:0/device:CPU:0",
        "/job:ps/replica:0/task:1/device:CPU:0",
    ]
    losses = [m["loss"] for m in run.metrics]
    assert losses[-1] < losses[0]


def test_a_local_cluster_larger_than_the_machine_is_refused_before_any_process_starts(tfdistx):
    run = tfdistx("strategy=multiworker", "cluster=999x1", "data.batch_size=999")
    line = refused_in_one_line(run, "cluster='999x1'", "a local cluster of 999 processes", "Slurm or Kubernetes")
    assert "at most" in line and not (run.dir / "logs").exists()


def test_the_prefork_outlives_a_schedulers_signals_and_its_tasks_take_them_as_a_fresh_python(tmp_path):
    """Slurm signals every process of a job at once (a preemption, the time limit's USR1): the prefork,
    whose death would SIGKILL its tasks before they checkpoint, ignores those signals, and a task it forks
    gets Python's own dispositions back (USR1 ends it, as it ends a fresh python)."""
    from tfdistx.cluster.prefork import Prefork

    (tmp_path / "probe_signals.py").write_text(
        "import pathlib, signal, sys, time\n"
        "said = {s.name: str(signal.getsignal(s)) for s in "
        "(signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)}\n"
        "pathlib.Path(sys.argv[1]).write_text(repr(said))\n"
        "time.sleep(60)\n"
    )
    said = tmp_path / "said.txt"
    prefork = Prefork([], str(tmp_path))
    try:
        wait_until(prefork.ready, 30, "the prefork")
        task = prefork.spawn(
            [sys.executable, "-m", "probe_signals", str(said)], dict(os.environ), "probe", cwd=str(tmp_path)
        )
        wait_until(said.exists, 30, "the task's dispositions")
        for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            os.kill(prefork.pid, sig)
        time.sleep(1)
        assert prefork.ready() and task.poll() is None  # both still there
        default = str(signal.SIG_DFL)
        assert eval(said.read_text()) == {
            "SIGTERM": default,
            "SIGHUP": default,
            "SIGUSR1": default,
            "SIGUSR2": default,
            "SIGINT": str(signal.default_int_handler),
        }
        task.send_signal(signal.SIGUSR1)
        assert task.wait(timeout=30) == -signal.SIGUSR1
    finally:
        prefork.close()
