"""How many TensorFlow threads each task of a local cluster gets
(cluster.task_threads, core/threads.py), and that the launcher gives them
to its real task processes. In-process (-m unit), no TensorFlow."""

import os
import sys

import pytest

from config_helpers import PREFIX, compose_ok, refused
from tfdistx.cluster.launch_spec import LaunchSpec
from tfdistx.launch.local.launcher import run_local_cluster
from tfdistx.core import threads

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "counts, cores, expected",
    [
        ({"worker": 2}, 2, 1),  # multiworker 2x1 on two cores: one each
        ({"worker": 4}, 2, 1),  # never fewer than one
        ({"chief": 1, "worker": 3, "ps": 2}, 8, 2),  # ps tasks mostly wait: the chief and workers share the cores
        ({"worker": 1, "dispatcher": 1, "data_worker": 1}, 4, 4),  # one trainer beside a tf.data service
    ],
)
def test_auto_divides_the_cores_among_the_tasks_that_run_steps(counts, cores, expected):
    got, why = threads.task_threads("auto", counts, available=cores, environ={})
    assert got == expected
    assert f"{cores} core(s)" in why and "cluster.task_threads=auto" in why


def test_a_number_is_taken_as_it_is_and_zero_is_tensorflows_own():
    assert threads.task_threads(3, {"worker": 2}, available=2, environ={})[0] == 3
    got, why = threads.task_threads(0, {"worker": 2}, available=2, environ={})
    assert got is None and "TensorFlow's own" in why
    assert threads.environment(None) == {}
    # Sized to their share of the cores, the tasks' idle threads sleep instead of spinning.
    assert threads.environment(4) == {
        "TF_NUM_INTRAOP_THREADS": "4",
        "TF_NUM_INTEROP_THREADS": "4",
        threads.NO_SPINNING_ENV: "1",
    }
    # One inter-op thread hangs a parameter-server worker's first step: never fewer than two.
    assert threads.environment(1) == {
        "TF_NUM_INTRAOP_THREADS": "1",
        "TF_NUM_INTEROP_THREADS": "2",
        threads.NO_SPINNING_ENV: "1",
    }


def test_the_users_own_environment_wins():
    got, why = threads.task_threads("auto", {"worker": 2}, available=2, environ={"TF_NUM_INTEROP_THREADS": "4"})
    assert got is None and "TF_NUM_INTEROP_THREADS=4" in why


@pytest.mark.parametrize("value", ["many", -1, 1.5, True])
def test_a_bad_value_is_refused_in_one_line(tmp_path, value):
    lines = refused(tmp_path, "strategy=multiworker", "cluster=2x1", f"cluster.task_threads={value}")
    assert len(lines) == 1 and lines[0].startswith(f"{PREFIX}cluster.task_threads=") and "allowed: auto" in lines[0]


def test_a_good_value_composes(tmp_path):
    assert (
        compose_ok(tmp_path, "strategy=multiworker", "cluster=2x1", "cluster.task_threads=2").cluster.task_threads == 2
    )


def test_the_launcher_gives_every_task_its_threads(tmp_path):
    """Real task processes of a real local cluster print what their environment holds."""
    show = "import os; print('threads', os.environ['TF_NUM_INTRAOP_THREADS'], os.environ['TF_NUM_INTEROP_THREADS'])"
    spec = LaunchSpec(
        command=(sys.executable, "-c", show),
        log_dir=str(tmp_path),
        run_log=None,
        primary=("worker",),
        counts={"worker": 2},
        task_env=threads.environment(1),
    )
    code = run_local_cluster(spec, isolate=False)
    assert code == 0
    for index in (0, 1):
        assert "threads 1 2" in (tmp_path / f"worker-{index}.log").read_text()


def test_a_task_told_so_runs_tensorflow_without_spinning(tmp_path):
    """What engine/join.py does in a task whose environment has NO_SPINNING_ENV,
    in a fresh interpreter (before TensorFlow starts): TensorFlow's config
    then says so, and ops still run; a process not told so keeps the default."""
    import subprocess

    code = (
        "import os, tensorflow as tf\n"
        "from tensorflow.python.eager import context\n"
        "from tfdistx.internals import tensorflow as internals\n"
        f"if os.environ.get({threads.NO_SPINNING_ENV!r}) == '1':\n    internals.disable_thread_spinning()\n"
        "print(int(tf.reduce_sum(tf.range(10))), context.context().config.experimental.disable_thread_spinning)"
    )
    for told, says in (("1", "45 True"), ("", "45 False")):
        run = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, threads.NO_SPINNING_ENV: told, "TF_CPP_MIN_LOG_LEVEL": "2"},
        )
        assert run.returncode == 0 and run.stdout.split("\n")[-2] == says, run.stderr[-2000:]
