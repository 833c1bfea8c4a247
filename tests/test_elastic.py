"""Elastic training on a real local cluster (cluster/elastic.py): four
loopback hosts (127.0.0.1-4, in the launcher's private network namespace)
listed in a file the test edits. A multiworker run of 2:4 loses a host for
good, goes on with three workers, gets it back and grows to four: every
step logged once, and the examples trained, counted by the topology probe
(test_unit_topology_resume.py), those of a run that never changed."""

import json
import os
import re
import signal

import numpy as np

from conftest import processes_of, start_tfdistx, steps_logged, wait_until
from engine_helpers import train
from test_unit_topology_resume import PROBE, model_values, seen_counts

BATCH, STEPS, EVERY = 24, 48, 4  # 24 divides across 2, 3 and 4 workers: every round keeps the global batch
HOSTS = [f"127.0.0.{n}" for n in range(1, 5)]
ARGS = [arg for arg in PROBE if not arg.startswith("data.batch_size=")] + [
    f"data.batch_size={BATCH}", f"trainer.steps={STEPS}", f"trainer.steps_per_loop={EVERY}", f"trainer.log_every={EVERY}",
    f"checkpoint.every_steps={EVERY}", "checkpoint.max_to_keep=20"]


def rounds(run_dir) -> list:
    path = run_dir / "logs" / "rounds.json"
    return json.loads(path.read_text()) if path.exists() else []


def steps_said_in_round(run_dir, number: int) -> list:
    """The steps the chief logged after the launcher's line of round `number`."""
    text = (run_dir / "tfdistx.log").read_text() if (run_dir / "tfdistx.log").exists() else ""
    _, found, after = text.partition(f"tfdistx: round {number}:")
    return [int(m) for m in re.findall(r"^\[worker:0\] step +(\d+)/", after, re.M)] if found else []


def worker_at(run_dir, host: str) -> int:
    """The pid of the task the launcher placed on `host` (its TF_CONFIG names the host)."""
    for pid in processes_of(run_dir, "worker"):
        try:
            environ = open(f"/proc/{pid}/environ", "rb").read()
        except OSError:
            continue
        config = json.loads(next(v for v in environ.split(b"\0") if v.startswith(b"TF_CONFIG="))[len(b"TF_CONFIG="):])
        if config["cluster"]["worker"][config["task"]["index"]].startswith(f"{host}:"):
            return pid
    raise AssertionError(f"no task on {host}")


def test_a_multiworker_run_loses_a_host_goes_on_and_grows_back(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("\n".join(HOSTS) + "\n")
    run_dir, out = tmp_path / "run", open(tmp_path / "out.txt", "w")
    proc = start_tfdistx([*ARGS, "strategy=multiworker", "cluster.workers=2:4", f"cluster.elastic.hosts={hosts}",
                          "cluster.elastic.join_grace=1", "cluster.elastic.lost_bound=1",
                          "+callbacks.pace._target_=user_plugins.Pace", "+callbacks.pace.seconds=0.5"], run_dir, stdout=out)
    try:
        wait_until(lambda: max(steps_said_in_round(run_dir, 1), default=0) >= 2 * EVERY, 300, "round 1 trains", [proc])
        hosts.write_text("\n".join(HOSTS[:3]) + "\n")  # 127.0.0.4 is lost for good: out of the list, its processes killed
        os.kill(worker_at(run_dir, HOSTS[3]), signal.SIGKILL)
        wait_until(lambda: steps_said_in_round(run_dir, 2), 300, "round 2 (three workers) trains", [proc])
        hosts.write_text("\n".join(HOSTS) + "\n")  # it is back
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out.close()
    output = (tmp_path / "out.txt").read_text()
    assert proc.returncode == 0, output[-4000:]

    said = rounds(run_dir)
    assert [len(r["members"]) for r in said] == [4, 3, 4], said
    assert said[1]["reason"] == "lost worker:3 at 127.0.0.4" and said[2]["reason"] == "127.0.0.4 joined", said
    assert "127.0.0.4" not in said[1]["members"].values()
    assert re.search(r"^tfdistx: round 2: 4 -> 3 workers \(lost worker:3 at 127\.0\.0\.4\), resuming from step \d+$", output, re.M), output
    assert re.search(r"^tfdistx: round 3: 3 -> 4 workers \(127\.0\.0\.4 joined\), resuming from step \d+$", output, re.M), output
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
        assert abs(summary["eval"][key] - value) <= 1e-4 * max(1.0, abs(value)), (key, summary["eval"], whole.summary["eval"])


def test_below_min_for_its_bound_stops_in_one_line_with_exit_9(tfdistx, tmp_path):
    """One host listed where 2:4 needs two: no round forms, no task starts,
    and after cluster.elastic.below_min_timeout the run stops with its own code."""
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1\n")
    run = tfdistx(*ARGS, "strategy=multiworker", "cluster.workers=2:4", f"cluster.elastic.hosts={hosts}",
                  "cluster.elastic.below_min_timeout=1")
    assert run.returncode == 9, run
    lines = [line for line in run.stderr.splitlines() if line.startswith("tfdistx: ") and not line.startswith("tfdistx: note:")]
    assert len(lines) == 1 and "fewer than cluster.elastic.min_workers=2 for 1s" in lines[0] and "exit 9" in lines[0], run
    assert not (run.dir / "checkpoints").exists() and not processes_of(run.dir)
