"""data.service: the input pipeline on a tf.data service (a dispatcher and
N data workers, started, watched and stopped with the run's tasks).

What is claimed, and tested here: under distributed_epoch every example is
trained at most once per epoch, whichever worker (of training or of the
service) is slow; a straggler is made by stopping a real task's process on
purpose, part of the time (SIGSTOP/SIGCONT). The trainers count what they
train on (user_plugins.counting_model). Config checks, placement from
TF_CONFIG and Slurm, and the TFJob: test_unit_data_service.py (in-process).
"""

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from conftest import processes_of
from test_data_split import seen_counts
from test_kubernetes import exits, run_tfjob, simulator  # noqa: F401 (simulator: a fixture)

EXAMPLES, BATCH = 2048, 16  # 128 batches an epoch
# Well inside the first epoch: no example may be trained twice. (A slow worker's batches come later than the
# others', so near an epoch's end the next epoch's first batches, handed to the fast workers, can be trained
# before the last of this one: each example is trained at most once per epoch of the order, not per window
# of steps as long as an epoch. Measured: with 512 examples, 24 steps trained 42 examples of epoch 1 early.)
STEPS = 24


def probe_args(steps=STEPS, loop=4):
    return [
        "data._target_=service_plugins.indexed_arrays",
        f"data.examples={EXAMPLES}",
        "model._target_=user_plugins.counting_model",
        f"model.examples={EXAMPLES}",
        f"data.batch_size={BATCH}",
        f"trainer.steps={steps}",
        f"trainer.steps_per_loop={loop}",
        f"trainer.log_every={loop}",
        "trainer.eval_every=0",
        "logger.tensorboard=false",
        "checkpoint.export=false",
        "cluster.max_restarts=0",
    ]


class Straggler:
    """Slows a task on purpose: once training has started (the run's log
    names its run dir), its process is stopped `stopped` seconds of every
    `period` (a real slow machine, with no hook in tfdistx), until closed;
    then it is let go. (Slowed from the start, its TensorFlow import alone
    would take half a minute.)"""

    def __init__(self, run_dir: Path, task_type: str, index: int, stopped=0.12, period=0.15):
        self.where, self.stopped, self.period = (run_dir, f"{task_type}:{index}"), stopped, period
        self.pauses, self.done = 0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        pids, log = [], self.where[0] / "tfdistx.log"
        # Polled in this thread until the run ends (close()): wait_until's AssertionError would be lost here;
        # run_with_stragglers asserts that it did straggle.
        while not pids and not self.done.wait(0.05):
            if log.is_file() and "run dir:" in log.read_text(errors="replace"):
                pids = processes_of(*self.where)
        while not self.done.is_set():  # the sleeps below are the straggling itself, not waits for anything
            try:
                for pid in pids:
                    os.kill(pid, signal.SIGSTOP)
                self.pauses += 1
                time.sleep(self.stopped)
            except ProcessLookupError:
                return
            finally:
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGCONT)
                    except ProcessLookupError:
                        pass
            time.sleep(self.period - self.stopped)

    def close(self):
        self.done.set()
        self.thread.join(timeout=5)


def run_with_stragglers(tfdistx, run_dir, args, stragglers):
    slow = [Straggler(run_dir, job, index) for job, index in stragglers]
    try:
        # Fresh: the stragglers find the tasks by the run dir their command line names, as `ps` shows a user's. A run
        # forked from this pytest process's prefork forks its cluster's prefork from itself (cluster/prefork.py), so
        # its tasks show the pytest prefork's command line.
        run = tfdistx(*args, run_dir=run_dir, fresh=True)
    finally:
        for s in slow:
            s.close()
    assert run.returncode == 0, run
    assert all(s.pauses > 5 for s in slow), [s.pauses for s in slow]  # it did straggle
    assert not processes_of(run_dir)  # the dispatcher and data workers died with the launcher
    return run


# -- the done-when: a straggling worker, each example at most once per epoch --


def test_parameter_servers_with_a_straggling_worker_train_each_example_at_most_once(tfdistx, tmp_path):
    """ps1w2 on a service of two data workers; training worker 1 and data
    worker 1 are each stopped 80% of the time. The dispatcher hands each
    batch of the run's order to one trainer only, so within the epoch no
    example is trained twice, however the workers share the batches."""
    run_dir = tmp_path / "ps"
    run = run_with_stragglers(
        tfdistx,
        run_dir,
        ["strategy=parameter_server", "cluster=ps1w2", "data.service.workers=2", *probe_args()],
        [("worker", 1), ("dataworker", 1)],
    )
    seen = seen_counts(run.dir)
    assert seen.sum() == STEPS * BATCH
    assert seen.max() <= 1, f"{(seen > 1).sum()} examples trained twice"
    assert "1 dispatcher, 2 dataworkers" in run.stdout


@pytest.mark.slow
@pytest.mark.parametrize("strategy", [["strategy=one_device"], ["strategy=multiworker", "cluster=2x1"]])
def test_synchronous_strategies_on_the_service_train_each_example_at_most_once(tfdistx, tmp_path, strategy):
    run = run_with_stragglers(
        tfdistx, tmp_path / "run", [*strategy, "data.service.workers=2", *probe_args()], [("dataworker", 1)]
    )
    seen = seen_counts(run.dir)
    assert seen.sum() == STEPS * BATCH and seen.max() <= 1


@pytest.mark.slow
def test_parallel_epochs_samples_the_data_on_every_worker(tfdistx, tmp_path):
    """Each data worker runs the whole pipeline in an order of its own
    (what parallel_epochs is: sampling; how many examples repeat depends on
    when the second worker joins, so only the steps are counted here)."""
    run = tfdistx(
        "data.service.workers=2",
        "data.service.mode=parallel_epochs",
        *probe_args(steps=32, loop=8),
        run_dir=tmp_path / "run",
    )
    assert run.returncode == 0, run
    assert seen_counts(run.dir).sum() == 32 * BATCH
    assert not processes_of(run.dir)


@pytest.mark.slow
def test_one_worker_resumes_at_the_batch_where_the_run_stopped(tfdistx, tmp_path):
    """One trainer on one data worker reads the batches in order, so a
    resumed run trains exactly the batches an uninterrupted one would have
    trained next: none twice, none lost (with several data workers or
    trainers, the batches in flight when a run stops are not: README)."""
    run_dir = tmp_path / "run"
    first = tfdistx("data.service.workers=1", *probe_args(steps=12), run_dir=run_dir)
    assert first.returncode == 0, first
    again = tfdistx("data.service.workers=1", *probe_args(steps=STEPS), run_dir=run_dir)
    assert again.returncode == 0, again
    assert again.summary["resumed_from_step"] == 12
    seen = seen_counts(run_dir)
    assert seen.sum() == STEPS * BATCH and seen.max() <= 1


@pytest.mark.slow
def test_deterministic_with_the_service_warns_once_that_resume_is_not_exact(tfdistx, tmp_path):
    run = tfdistx("data.service.workers=1", "trainer.deterministic=true", *probe_args(steps=4))
    assert run.returncode == 0, run
    warnings = [line for line in (run.stdout + run.stderr).splitlines() if "is not bitwise equal" in line]
    assert len(warnings) == 1, warnings


# F811 (a redefinition) on purpose: simulator is the fixture imported above
@pytest.mark.slow
def test_tfjob_pods_run_the_service_and_training_outlives_a_killed_data_worker(tmp_path, simulator):  # noqa: F811
    """The exported TFJob's pods, as the operator runs them (tests/simulated_pods.py): the Dispatcher and
    DataWorker pods serve, the trainer finds them in its TF_CONFIG; a data worker pod killed mid-run is
    recreated at a new address, and training, fed by the other one meanwhile, finishes."""
    volume, events, logs = run_tfjob(
        tmp_path,
        "ds",
        [
            "strategy=one_device",
            "data=synthetic",
            "data.service.workers=2",
            "trainer.steps=600",
            "checkpoint.every_steps=200",
        ],
        kill="ds-dataworker-0",
        when="checkpoints/ckpt-200.index",
    )
    assert exits(events, "ds-dataworker-0")[0] == 137
    assert events[-1] == {**events[-1], "event": "job", "status": "Succeeded"}
    assert json.loads((volume / "ds" / "summary.json").read_text())["step"] == 600
    assert "tf.data service dispatcher on ds-dispatcher-0" in logs["ds-dispatcher-0"]
