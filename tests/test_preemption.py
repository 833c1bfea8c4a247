"""Preemption under every strategy and placement, and every wait bounded by
the tasks themselves. Real processes: a local cluster under its launcher,
or every task started by TF_CONFIG as a scheduler starts them (Kubernetes
and Slurm send SIGTERM to every task of a job at once).

The matrix: strategy x tf.data service on/off x whom the SIGTERM reaches
(the launcher; every task; the chief alone). Every cell ends in exit 42
with one checkpoint at the step the signal was taken, no line at error
level, and a resume that loses and repeats no step; where the README
promises it (synchronous strategies, without the service), the resumed
run's weights are bitwise those of a run never stopped. A representative
row runs by default, the whole matrix with -m slow.
"""

import json
import os
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import conftest
from conftest import (
    free_ports,
    metric_lines,
    run_command,
    start_tfdistx,
    steps_logged,
    task_pid,
    tfdistx_env,
    wait_until,
)

ENDLESS = [*conftest.ENDLESS, "cluster.startup_timeout=120"]
STRATEGIES = {
    "one_device": ["strategy=one_device"],
    "mirrored": ["strategy=mirrored", "cluster=1x2"],
    "multiworker": ["strategy=multiworker", "cluster=2x1"],
    "parameter_server": ["strategy=parameter_server", "cluster=ps1w2"],
}
TRAINERS = {
    "one_device": ("worker",),
    "mirrored": ("worker",),
    "multiworker": ("worker",),
    "parameter_server": ("chief",),
}
CHIEF = {"one_device": "worker:0", "mirrored": "worker:0", "multiworker": "worker:0", "parameter_server": "chief:0"}
# What a scheduler's TF_CONFIG holds for each (the service's jobs added when on).
JOBS = {
    "one_device": {"worker": 1},
    "mirrored": {"worker": 1},
    "multiworker": {"worker": 2},
    "parameter_server": {"chief": 1, "ps": 1, "worker": 2},
}
SERVICE = ["data.service.workers=1"]
ERROR_LEVEL = re.compile(r"Traceback|^\S*\s*E\d{4} |\bERROR\b|tfdistx: error|invalid config", re.MULTILINE)


@dataclass
class Preempted:
    codes: dict  # task (or "launcher") -> exit code
    output: str  # everything the processes printed
    step: int  # where the trainers saved, as they said it


def preempt_by_launcher(args, run_dir: Path) -> Preempted:
    """SIGTERM to the command the user started: the local launcher, which
    passes it to every task (for a one-process strategy, the one process)."""
    proc = start_tfdistx(args, run_dir)
    try:
        wait_until(lambda: metric_lines(run_dir) >= 1, 300, "a first metrics line", [proc])
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=180)
    finally:
        proc.kill()
    after = out.partition("SIGTERM:")[2].splitlines()
    assert len(after) <= 8, out[-3000:]  # each trainer's two lines, perhaps a step line between
    return Preempted({"launcher": proc.returncode}, out, _step_saved(out))


def preempt_by_scheduler(args, run_dir: Path, jobs: dict, signalled: set, ending: set) -> Preempted:
    """Every task started by TF_CONFIG, as a scheduler places them; SIGTERM
    to the `signalled` tasks; the `ending` ones must then end by themselves.
    The others (a ps whose chief alone was preempted keeps serving) are
    stopped afterwards, as the scheduler would."""
    ports = iter(free_ports(sum(jobs.values())))
    cluster = {job: [f"127.0.0.1:{next(ports)}" for _ in range(n)] for job, n in jobs.items()}
    procs = {}
    try:
        for job, addresses in cluster.items():
            for index in range(len(addresses)):
                tf_config = json.dumps({"cluster": cluster, "task": {"type": job, "index": index}})
                procs[f"{job}:{index}"] = start_tfdistx(args, run_dir, env={"TF_CONFIG": tf_config})
        wait_until(lambda: metric_lines(run_dir) >= 1, 300, "a first metrics line", procs.values())
        for name in signalled:
            procs[name].send_signal(signal.SIGTERM)
        wait_until(lambda: all(procs[name].poll() is not None for name in ending), 180, f"{sorted(ending)} to end")
    finally:
        for proc in procs.values():
            proc.kill()
    outputs = {name: proc.communicate()[0] for name, proc in procs.items()}
    for name in signalled:  # a served task says nothing; a trainer its two lines, perhaps a step line between
        assert len(outputs[name].partition("SIGTERM:")[2].splitlines()) <= 3, outputs[name][-3000:]
    out = "\n".join(f"[{name}] {line}" for name, text in outputs.items() for line in text.splitlines())
    return Preempted({name: procs[name].returncode for name in ending}, out, _step_saved(out))


def _step_saved(out: str) -> int:
    steps = set(int(step) for step in re.findall(r"preempted at step (\d+): checkpoint saved", out))
    assert len(steps) == 1, f"the trainers saved at steps {steps}:\n{out[-4000:]}"
    return steps.pop()


def assert_preempted_cleanly(result: Preempted, run_dir: Path, expect: dict) -> None:
    """Exit codes as `expect` says, one checkpoint at the signal's step (the
    newest), nothing at error level, and the run dir not marked FAILED
    (a preempted run is resumed, not failed: `tfdistx report` says unfinished)."""
    assert result.codes == expect, result.output[-5000:]
    assert not (run_dir / "FAILED").exists()
    saved = sorted(int(p.name[5:-6]) for p in (run_dir / "checkpoints").glob("ckpt-*.index"))
    assert saved and saved[-1] == result.step, (saved, result.step)
    assert not ERROR_LEVEL.search(result.output), (
        ERROR_LEVEL.search(result.output).group(0) + "\n" + result.output[-5000:]
    )


def resume(args, run_dir: Path, step: int, steps_after: int = 20) -> dict:
    """The same command (one process, or the local launcher) on to `step` +
    `steps_after`: exit 0, no step lost or twice. Returns summary.json."""
    total = step + steps_after
    rerun = run_command(
        [sys.executable, "-m", "tfdistx", *args, f"trainer.steps={total}", f"hydra.run.dir={run_dir}"],
        env=tfdistx_env(),
        timeout=600,
    )
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["resumed_from_step"], summary["step"]) == (step, total)
    assert steps_logged(run_dir) == list(range(10, total + 1, 10))
    return summary


def assert_bitwise_as_never_stopped(args, tmp_path: Path, summary: dict) -> None:
    whole = run_command(
        [
            sys.executable,
            "-m",
            "tfdistx",
            *args,
            f"trainer.steps={summary['step']}",
            f"hydra.run.dir={tmp_path / 'whole'}",
        ],
        env=tfdistx_env(),
        timeout=600,
    )
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert json.loads((tmp_path / "whole" / "summary.json").read_text())["weights_sha256"] == summary["weights_sha256"]


def _cells():
    """(strategy, service, whom) for the whole matrix; a representative row by default."""
    default = {
        ("parameter_server", False, "launcher"),
        ("multiworker", True, "launcher"),
        ("parameter_server", True, "every task"),
    }
    for strategy in STRATEGIES:
        for service in (False, True):
            placements = ["launcher", "every task", "chief alone"]
            if not service and strategy in ("one_device", "mirrored"):
                placements = ["launcher"]  # one process: whoever is signalled, it is that one
            for whom in placements:
                marks = () if (strategy, service, whom) in default else (pytest.mark.slow,)
                yield pytest.param(
                    strategy,
                    service,
                    whom,
                    marks=marks,
                    id=f"{strategy}-{'service' if service else 'no_service'}-{whom.replace(' ', '_')}",
                )


@pytest.mark.parametrize("strategy, service, whom", list(_cells()))
def test_preemption_checkpoints_at_the_signal_exits_42_and_resumes_exactly(tmp_path, strategy, service, whom):
    run_dir = tmp_path / "run"
    exact = not service and strategy != "parameter_server"  # the README's bitwise promise
    args = [
        *STRATEGIES[strategy],
        *ENDLESS,
        *(SERVICE if service else []),
        *(["trainer.deterministic=true"] if exact else []),
    ]
    if whom == "launcher":
        result, expect = preempt_by_launcher(args, run_dir), {"launcher": 42}
    else:
        jobs = {**JOBS[strategy], **({"dispatcher": 1, "dataworker": 1} if service else {})}
        tasks = {f"{job}:{i}" for job, n in jobs.items() for i in range(n)}
        trainers = {f"{job}:{i}" for job in TRAINERS[strategy] for i in range(jobs[job])}
        signalled = tasks if whom == "every task" else {CHIEF[strategy]}
        # Every signalled task leaves, the servers once the trainers
        # have; a synchronous cluster's trainers leave together.
        ending = signalled | (trainers if strategy == "multiworker" else set())
        result, expect = preempt_by_scheduler(args, run_dir, jobs, signalled, ending), {name: 42 for name in ending}
    assert_preempted_cleanly(result, run_dir, expect)
    local = [
        a for a in args if not a.startswith("cluster.max_restarts")
    ]  # the rerun: a local launch of the same command
    summary = resume(local, run_dir, result.step)
    if exact:
        assert_bitwise_as_never_stopped(local, tmp_path, summary)


def test_sigterm_before_the_first_step_checkpoints_there_and_exits_42(tmp_path):
    """A SIGTERM while the run is still starting (composing, importing
    TensorFlow, building) is kept: the run saves at its first loop boundary,
    the step it starts from, says so and exits 42; before, Python's default
    ended it with 143 and nothing said."""
    run_dir = tmp_path / "run"
    proc = start_tfdistx(ENDLESS, run_dir)
    try:
        wait_until(lambda: (run_dir / ".hydra" / "config.yaml").exists(), 120, "the run dir", [proc])
        proc.send_signal(signal.SIGTERM)  # TensorFlow is not even imported yet
        out, _ = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 42, out[-3000:]
    assert "SIGTERM: checkpointing at the next loop boundary, then exiting with 42" in out
    assert "preempted at step 0: checkpoint saved; exiting with 42" in out and "Traceback" not in out
    assert (run_dir / "checkpoints" / "ckpt-0.index").exists() and metric_lines(run_dir) == 0
    resume(ENDLESS, run_dir, 0)


def test_a_frozen_dispatcher_is_noticed_by_the_trainers_themselves(tmp_path):
    """The tf.data service's dispatcher stopped (SIGSTOP): the kernel still
    accepts connections for it, so TensorFlow's client waits forever. The
    trainers notice within cluster.peer_timeout on their own (the launcher's
    stopped_task_timeout is set out of reach, as under TF_CONFIG, Slurm or
    Kubernetes), say so in one line and leave with exit 5."""
    run_dir = tmp_path / "run"
    args = [
        "strategy=multiworker",
        "cluster=2x1",
        *ENDLESS,
        *SERVICE,
        "cluster.peer_timeout=5",
        "cluster.stopped_task_timeout=3600",
    ]
    proc = start_tfdistx(args, run_dir)
    try:
        wait_until(lambda: metric_lines(run_dir) >= 1, 300, "a first metrics line", [proc])
        dispatcher = task_pid(run_dir, "dispatcher")
        os.kill(dispatcher, signal.SIGSTOP)
        stopped = time.monotonic()
        out, _ = proc.communicate(timeout=120)
        waited = time.monotonic() - stopped
    finally:
        proc.kill()
    assert proc.returncode == 5, out[-3000:]
    # Whichever trainer's watch fires first names the dispatcher; the other may
    # then see its collective aborted by that trainer's exit and say so instead.
    assert re.search(
        r"\[worker:[01]\] tfdistx: lost contact with dispatcher:0 of the cluster: no answer for 5s "
        r"\(cluster\.peer_timeout\), stopping \(exit 5: a restart resumes from the newest checkpoint\)\n",
        out,
    ), out[-3000:]
    assert waited < 60 and "Traceback" not in out


def test_a_sidecar_evaluator_with_no_training_stops_in_one_line(tfdistx):
    """An evaluator placed by TF_CONFIG whose chief never answers (no
    training started, or it is gone): it stops after cluster.startup_timeout
    with one line and exit 4, instead of polling forever."""
    cluster = {
        "chief": [f"127.0.0.1:{port}" for port in free_ports(1)],
        "ps": ["127.0.0.1:2"],
        "worker": ["127.0.0.1:3", "127.0.0.1:4"],
    }
    tf_config = json.dumps({"cluster": cluster, "task": {"type": "evaluator", "index": 0}})
    run = tfdistx(
        "strategy=parameter_server",
        "cluster=ps1w2",
        "cluster.evaluator=true",
        "cluster.startup_timeout=3",
        env={"TF_CONFIG": tf_config},
        timeout=300,
    )
    assert run.returncode == 4, run
    assert (
        f"tfdistx: the sidecar evaluator stops: no training to evaluate (chief:0 at {cluster['chief'][0]} did not "
        "answer within 3s (cluster.startup_timeout)); 0 checkpoint(s) evaluated (exit 4)"
    ) in run.stderr
    assert "Traceback" not in run.stderr
