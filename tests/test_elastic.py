"""Elastic training on a real local cluster (launch/local/elastic.py): four
loopback hosts (127.0.0.1-4, in the launcher's private network namespace)
listed in a file the test edits. A multiworker run of 2:4 loses a host for
good, goes on with three workers, gets it back and grows to four: every
step logged once, and the examples trained, counted by the topology probe
(test_unit_topology_resume.py), those of a run that never changed."""

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from conftest import processes_of, start_tfdistx, steps_logged, task_pid, wait_until
from engine_helpers import train
from test_unit_topology_resume import PROBE, model_values, seen_counts

BATCH, STEPS, EVERY = 24, 48, 4  # 24 divides across 2, 3 and 4 workers: every round keeps the global batch
HOSTS = [f"127.0.0.{n}" for n in range(1, 5)]
ARGS = [arg for arg in PROBE if not arg.startswith("data.batch_size=")] + [
    f"data.batch_size={BATCH}",
    f"trainer.steps={STEPS}",
    f"trainer.steps_per_loop={EVERY}",
    f"trainer.log_every={EVERY}",
    f"checkpoint.every_steps={EVERY}",
    "checkpoint.max_to_keep=20",
]


def rounds(run_dir) -> list:
    path = run_dir / "logs" / "rounds.json"
    return json.loads(path.read_text()) if path.exists() else []


def workers(members: dict) -> int:
    return sum(task.startswith("worker:") for task in members)


def steps_said_in_round(run_dir, number: int) -> list:
    """The steps the chief logged after the launcher's line of round `number`."""
    text = (run_dir / "tfdistx.log").read_text() if (run_dir / "tfdistx.log").exists() else ""
    _, found, after = text.partition(f"tfdistx: round {number}:")
    return [int(m) for m in re.findall(r"^\[(?:worker|chief):0\] step +(\d+)/", after, re.M)] if found else []


def start_elastic(tmp_path, hosts: list, *args):
    """The run, on `hosts` listed in tmp_path/hosts; its output in tmp_path/out.txt. Returns (process, hosts file)."""
    listed = tmp_path / "hosts"
    listed.write_text("\n".join(hosts) + "\n")
    with open(tmp_path / "out.txt", "w") as out:
        return start_tfdistx(
            [
                *ARGS,
                *args,
                f"cluster.elastic.hosts={listed}",
                "cluster.elastic.join_grace=1",
                "cluster.elastic.lost_bound=1",
                "+callbacks.pace._target_=user_plugins.Pace",
                "+callbacks.pace.seconds=0.5",
            ],
            tmp_path / "run",
            stdout=out,
        ), listed


def lose_and_get_back(tmp_path, proc, listed, hosts: list, back=lambda: True) -> str:
    """Round 1 trains; the last of `hosts` is lost for good (out of the list,
    its processes killed); round 2 trains; the host is listed again (`back`:
    what the run then does, waited for); the run ends, successfully. Its output."""
    run_dir = tmp_path / "run"
    with ended(proc, 300):
        wait_until(lambda: max(steps_said_in_round(run_dir, 1), default=0) >= 2 * EVERY, 300, "round 1 trains", [proc])
        listed.write_text("\n".join(hosts[:-1]) + "\n")
        os.kill(worker_at(run_dir, hosts[-1]), signal.SIGKILL)
        wait_until(lambda: steps_said_in_round(run_dir, 2), 300, "round 2 trains", [proc])
        listed.write_text("\n".join(hosts) + "\n")
        wait_until(back, 300, f"{hosts[-1]} is back", [proc])
    output = (tmp_path / "out.txt").read_text()
    assert proc.returncode == 0, output[-4000:]
    wait_until(lambda: not processes_of(run_dir), 30, "every task of every round gone")
    return output


def reached_again(run_dir) -> bool:
    """After round 3 was said, a whole loop (from one step line of the chief's
    own log, logs/chief-0.log, to the next) without a failed call to a worker."""
    said = (run_dir / "tfdistx.log").read_text() if (run_dir / "tfdistx.log").exists() else ""
    if "tfdistx: round 3:" not in said:
        return False
    done = len(re.findall(r"^\[chief:0\] step", said.partition("tfdistx: round 3:")[0], re.M))
    loops = re.split(r"^step ", (run_dir / "logs" / "chief-0.log").read_text(), flags=re.M)[
        1:-1
    ]  # each step line to the next
    return any("Connection refused" not in loop for loop in loops[done:])


def worker_at(run_dir, host: str) -> int:
    """The pid of the task the launcher placed on `host` in the
    current round (logs/rounds.json: its members, task -> host)."""
    members = json.loads((run_dir / "logs" / "rounds.json").read_text())[-1]["members"]
    for task in [task for task, at in members.items() if at == host]:
        for pid in processes_of(run_dir, task):
            return pid
    raise AssertionError(f"no task on {host}: {members}")


def test_a_multiworker_run_loses_a_host_goes_on_and_grows_back(tmp_path):
    """Checkpoints only at the end (and when the round grows): the lost host
    costs at most one loop all the same, since the chief saves the last loop
    boundary's state it kept in memory (engine/commit.py) as it stops."""
    run_dir = tmp_path / "run"
    proc, listed = start_elastic(
        tmp_path, HOSTS, "strategy=multiworker", "cluster.workers=2:4", f"checkpoint.every_steps={STEPS}"
    )
    output = lose_and_get_back(tmp_path, proc, listed, HOSTS)

    said = rounds(run_dir)
    assert [workers(r["members"]) for r in said] == [4, 3, 4], said
    assert said[1]["reason"] == "lost worker:3 at 127.0.0.4" and said[2]["reason"] == "127.0.0.4 joined", said
    assert "127.0.0.4" not in said[1]["members"].values()
    assert re.search(
        r"^tfdistx: round 2: 4 -> 3 workers \(lost worker:3 at 127\.0\.0\.4\), resuming from step \d+$", output, re.M
    ), output
    before_the_loss = (run_dir / "tfdistx.log").read_text().partition("tfdistx: round 2:")[0]
    last_said = max(int(m) for m in re.findall(r"^\[worker:0\] step +(\d+)/", before_the_loss, re.M))
    assert said[1]["first_step"] - 1 >= last_said - EVERY, said  # at most one loop lost, though no checkpoint was due
    assert re.search(
        r"lost contact with worker:3 .*a restart resumes from step \d+, the last loop boundary, saved now", output
    ), output
    assert re.search(
        r"^tfdistx: round 3: 3 -> 4 workers \(127\.0\.0\.4 joined\), resuming from step \d+$", output, re.M
    ), output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds"] == said and summary["step"] == STEPS and summary["workers"] == 4
    assert steps_logged(run_dir) == list(range(EVERY, STEPS + 1, EVERY))  # each step once, none lost

    whole = train(tmp_path / "whole", *ARGS, "strategy=one_device", sizes=[])  # one order on every synchronous topology
    seen = seen_counts(run_dir)
    assert seen.sum() == STEPS * BATCH
    np.testing.assert_array_equal(seen, seen_counts(whole.dir))
    for mine, reference in zip(model_values(run_dir, 1), model_values(whole.dir, 1)):
        np.testing.assert_allclose(mine, reference, rtol=1e-4, atol=1e-6)
    for key, value in whole.summary["eval"].items():
        assert abs(summary["eval"][key] - value) <= 1e-4 * max(1.0, abs(value)), (
            key,
            summary["eval"],
            whole.summary["eval"],
        )


def test_below_min_for_its_bound_stops_in_one_line_with_exit_9(tfdistx, tmp_path):
    """One host listed where 2:4 needs two: no round forms, no task starts,
    and after cluster.elastic.below_min_timeout the run stops with its own
    code, in one line (after the one saying it waits)."""
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1\n")
    run = tfdistx(
        *ARGS,
        "strategy=multiworker",
        "cluster.workers=2:4",
        f"cluster.elastic.hosts={hosts}",
        "cluster.elastic.below_min_timeout=1",
    )
    assert run.returncode == 9, run
    lines = [
        line
        for line in run.stderr.splitlines()
        if line.startswith("tfdistx: ") and not line.startswith("tfdistx: note:")
    ]
    assert len(lines) == 2 and "waiting for more, at most 1s" in lines[0], run  # a quiet wait is said, once
    assert "fewer than cluster.elastic.min_workers=2 for 1s" in lines[1] and "exit 9" in lines[1], run
    assert not (run.dir / "checkpoints").exists() and not processes_of(run.dir)


def test_a_parameter_server_run_drops_a_lost_worker_and_takes_it_back(tmp_path):
    """ps1w3 at 2:3: the coordinator gives a lost worker's steps to the
    others, without a checkpoint or a restart; back, the worker is started
    in its place and given steps again. Asynchronous: which worker trains
    which step is timing's, so the examples are counted in total."""
    run_dir, steps = tmp_path / "run", 2 * STEPS  # time for the worker that comes back to start TensorFlow
    proc, listed = start_elastic(
        tmp_path,
        HOSTS[:3],
        "strategy=parameter_server",
        "cluster=ps1w3",
        "cluster.workers=2:3",
        f"trainer.steps={steps}",
    )
    output = lose_and_get_back(tmp_path, proc, listed, HOSTS[:3], back=lambda: reached_again(run_dir))

    said = rounds(run_dir)
    assert [workers(r["members"]) for r in said] == [3, 2, 3], said
    assert [r["reason"] for r in said] == ["started", "lost worker:2 at 127.0.0.3", "worker:2 back at 127.0.0.3"], said
    assert said[0]["members"]["chief:0"] == said[0]["members"]["ps:0"] == "127.0.0.1"
    assert "going on after step" in output and "resuming" not in output, output[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["step"] == steps and summary["rounds"] == said and not summary["resumed"]
    assert steps_logged(run_dir) == list(range(EVERY, steps + 1, EVERY))
    assert seen_counts(run_dir).sum() == steps * BATCH  # every step one batch, once


@pytest.mark.slow  # the path of a fixed cluster's restart (test_fault_tolerance), through the elastic launcher
@pytest.mark.parametrize(
    "topology, task",
    [
        (["strategy=multiworker", "cluster.workers=2:3"], "worker:1"),
        (["strategy=parameter_server", "cluster=ps1w2", "cluster.workers=1:2"], "ps:0"),
    ],
    ids=["a worker", "a ps"],
)
def test_a_task_lost_on_a_host_still_listed_restarts_the_round_from_the_checkpoint(tmp_path, topology, task):
    """Not elastic: its host is still there, so the same round starts again
    from the newest checkpoint (cluster.max_restarts). A ps always does: the
    chief's host holds it, for the whole run."""
    run_dir = tmp_path / "run"
    proc, _ = start_elastic(tmp_path, HOSTS[:3], *topology, "cluster.max_restarts=1")
    with ended(proc, 300):
        wait_until(lambda: max(steps_said_in_round(run_dir, 1), default=0) >= 2 * EVERY, 300, "round 1 trains", [proc])
        os.kill(task_pid(run_dir, task), signal.SIGKILL)
    output = (tmp_path / "out.txt").read_text()
    assert proc.returncode == 0, output[-4000:]
    said = rounds(run_dir)
    assert [r["reason"] for r in said] == ["started", "restart 1 of 1 after exit code 137"], said
    assert said[0]["members"] == said[1]["members"] and said[1]["first_step"] > 1
    assert steps_logged(run_dir) == list(range(EVERY, STEPS + 1, EVERY))
    assert seen_counts(run_dir).sum() == STEPS * BATCH


@contextlib.contextmanager
def ended(proc, timeout: float):
    """Inside: what the test does to the running run; then the run is waited
    for, at most `timeout` seconds; killed if the test failed first."""
    try:
        yield
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def going_on_for(proc, seconds: float) -> None:
    """`seconds` of the run going on: the pace of a change the test
    makes, not a wait for the run (which must not end meanwhile)."""
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=seconds)


def scratch_left(run_dir) -> list:
    """The non-chief tasks' checkpoint scratch of this run left anywhere: the system's temp directory
    (named after its checkpoint directory, engine/checkpointing.py) or the launcher's logs/.scratch."""
    key = hashlib.sha1(os.path.abspath(run_dir / "checkpoints").encode()).hexdigest()[:12]
    return [*Path(tempfile.gettempdir()).glob(f"tfdistx-{key}-*"), *(run_dir / "logs").glob(".scratch/**/*")]


def test_a_sigterm_as_the_next_round_starts_is_a_preemption_and_a_lost_worker_leaves_no_scratch(tmp_path):
    """2:3 on three hosts; 127.0.0.3 leaves the list and the launcher stops its
    worker (after lost_bound); right after `round 2: 3 -> 2 workers`, SIGTERM to
    the launcher: exit 42 (checkpointed, or nothing to save, said so), never 143;
    no task left, and no scratch directory of any worker, the stopped one's included."""
    run_dir = tmp_path / "run"
    proc, listed = start_elastic(
        tmp_path, HOSTS[:3], "strategy=multiworker", "cluster.workers=2:3", "cluster.preemption_grace=30"
    )
    with ended(proc, 120):
        wait_until(lambda: max(steps_said_in_round(run_dir, 1), default=0) >= EVERY, 240, "round 1 trains", [proc])
        wait_until(
            lambda: len(scratch_left(run_dir)) >= 2, 60, "the workers' scratch", [proc]
        )  # each non-chief saved once
        listed.write_text("\n".join(HOSTS[:2]) + "\n")
        wait_until(
            lambda: "tfdistx: round 2: 3 -> 2 workers" in (tmp_path / "out.txt").read_text(),
            120,
            "round 2 forms",
            [proc],
        )
        proc.send_signal(signal.SIGTERM)
    output = (tmp_path / "out.txt").read_text()
    assert proc.returncode == 42, output[-4000:]
    # Checkpointed, or nothing to save, said so: by the launcher between rounds, or by the tasks as the cluster formed
    # (with tasks forked from the prefork, the signal often finds them already started).
    said = ("nothing to save", "nothing was trained to save", "checkpoint saved; exiting with 42")
    assert "127.0.0.3 left the host list" in output and any(words in output for words in said), output[-4000:]
    wait_until(lambda: not processes_of(run_dir), 30, "every task gone")
    assert scratch_left(run_dir) == []


@pytest.mark.slow  # a whole elastic run of three workers
def test_a_flapping_host_changes_no_round_and_training_goes_on(tmp_path):
    """127.0.0.3 out of the list and back every second, six times: with
    cluster.elastic.lost_bound=3 no change holds its bound, so at most 2
    round changes over the flapping (here none), the steps advance through
    it, and the run finishes, every step logged once."""
    run_dir = tmp_path / "run"
    steps = (
        3 * STEPS
    )  # 36 loops of at least the pace's 0.5 s: the run outlasts the 12 s of flapping and two loops after
    proc, listed = start_elastic(
        tmp_path,
        HOSTS[:3],
        "strategy=multiworker",
        "cluster.workers=2:3",
        "cluster.elastic.lost_bound=3",
        f"trainer.steps={steps}",
    )
    with ended(proc, 300):
        wait_until(lambda: max(steps_said_in_round(run_dir, 1), default=0) >= EVERY, 240, "round 1 trains", [proc])
        before = len(rounds(run_dir))
        step_before = max(steps_logged(run_dir))
        for flap in range(12):  # out, back, out, back, ...: six times out and back, a rewrite a second
            listed.write_text("\n".join(HOSTS[:2] if flap % 2 == 0 else HOSTS[:3]) + "\n")
            going_on_for(proc, 1)
        assert len(rounds(run_dir)) - before <= 2, rounds(run_dir)
        wait_until(
            lambda: max(steps_logged(run_dir)) >= step_before + 2 * EVERY,
            120,
            "steps advance after the flapping",
            [proc],
        )
    output = (tmp_path / "out.txt").read_text()
    assert proc.returncode == 0, output[-4000:]
    assert "left the host list" not in output and len(rounds(run_dir)) == 1, rounds(run_dir)
    assert steps_logged(run_dir) == list(range(EVERY, steps + 1, EVERY))
