"""Bad input: exit code 2, one line naming the key and what is allowed, no traceback."""

import re
import sys

import pytest

from conftest import QUICK, run_command, tfdistx_env


def assert_refused(run, key, *phrases):
    assert run.returncode == 2, run
    assert "Traceback" not in run.stderr + run.stdout, run
    lines = [line for line in run.stderr.splitlines() if line.startswith("tfdistx: invalid config:")]
    assert lines and any(key in line for line in lines), run
    for phrase in phrases:
        assert phrase in run.stderr, run
    assert not (run.dir / "summary.json").exists()


# End to end, as a user meets them: exit 2, one line, no traceback, no
# summary. Each check of the config itself is tested in-process, once, in
# test_unit_config_*.py (-m unit); here are one of
# those (a bad group option, reworded from Hydra's answer), and the refusals
# that come only once TensorFlow has started or Hydra runs the job.
@pytest.mark.parametrize(
    "args, key, phrases",
    [
        (["strategy=foo"], "strategy='foo'", ["mirrored", "one_device"]),
        (["model._target_=tfdistx.models.nothere"], "model._target_", ["has no attribute 'nothere'", "mlp"]),
        (["task._target_=builtins.int", "trainer.steps=2"], "task._target_='builtins.int'", ["has no signature"]),
        # checked once the source is built (`data write` of 512 examples is fine whatever data.batch_size says)
        (
            ["data.batch_size=1024", "data.train_examples=512"],
            "data.batch_size=1024",
            ["more than the 512 training examples"],
        ),
        (["+hydra.callbacks.x._target_=nope.Nope"], "hydra.callbacks=", ["Error locating target 'nope.Nope'"]),
    ],
)
def test_config_errors(tfdistx, args, key, phrases):
    assert_refused(tfdistx(*args), key, *phrases)


def test_each_problem_is_one_line_on_stderr_and_nothing_else(tfdistx):
    """The end-to-end path of validation: every problem at once, one line
    each, exit 2, before a run dir is made or TensorFlow says anything
    (the suite's one test of "every problem at once")."""
    run = tfdistx(
        "trainer.steps=0", "optimizer.lr=-1", "cluster.max_restarts=-1", "data.batch_size=0", "trainer.log_every=0"
    )
    assert run.returncode == 2 and run.stdout == "", run
    assert run.stderr.splitlines() == [
        "tfdistx: invalid config: cluster.max_restarts=-1: must be 0 or more",
        "tfdistx: invalid config: data.batch_size=0: must be a positive integer (the global batch, split across "
        "replicas)",
        "tfdistx: invalid config: optimizer.lr=-1: must be a positive, finite number (a float32: at most 3.4e38)",
        "tfdistx: invalid config: trainer.steps=0: must be at least 1 and at most 4611686018427387904 (or null)",
        "tfdistx: invalid config: trainer.log_every=0: must be at least 1",
    ], run
    assert not run.dir.exists()


def test_unknown_tfds_dataset(tfdistx, tmp_path):
    run = tfdistx("data=mnist", "data.name=not_a_dataset", f"data.data_dir={tmp_path / 'tfds'}")
    assert_refused(run, "data.name='not_a_dataset'", "tensorflow-datasets")


def test_dataset_that_cannot_be_downloaded_offline(tfdistx, tmp_path):
    # Port 9 on loopback refuses at once: a machine with no route to the
    # download site, without sending anything off this machine.
    run = tfdistx(
        "data=mnist", f"data.data_dir={tmp_path / 'tfds'}", "data.download_check_url=http://127.0.0.1:9", fresh=True
    )  # all a fresh start prints
    assert run.returncode == 10, run  # a fault of the machine (no network), not of the config
    lines = (run.stdout + run.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tfdistx: data=mnist is not downloaded to "), (
        run
    )  # no absl warning before it
    assert "data=synthetic" in lines[0] and "data.data_dir" in lines[0] and "Traceback" not in run.stderr
    assert not (run.dir / "summary.json").exists()


def test_user_model_with_bad_signature(tfdistx):
    run = tfdistx("model._target_=user_plugins.constant_data", "trainer.steps=2")
    assert run.returncode == 2, run
    assert "model._target_" in run.stderr and "Traceback" not in run.stderr, run


def test_no_tpu_reachable(tfdistx):
    run = tfdistx("strategy=tpu", env={"TPU_NAME": ""})
    assert_refused(run, "strategy.tpu", "no TPU is reachable")


def test_model_that_does_not_fit_the_data(tfdistx):
    run = tfdistx("model=wide_deep", "trainer.steps=2")  # ids model, image data
    assert_refused(
        run,
        "model='wide_deep'",
        "needs integer (categorical id) features",
        "float32 (28, 28, 1)",
        "data=synthetic_categorical",
    )


def test_model_whose_output_the_task_cannot_use(tfdistx):
    # a model that always makes 10 logits; the binary task needs 1
    run = tfdistx("task=binary", "data.num_classes=2", "model._target_=user_plugins.ten_logits", "trainer.steps=2")
    assert_refused(
        run, "model='user_plugins.ten_logits'", "does not fit data=tfdistx.data.synthetic", "task=binary needs 1"
    )


@pytest.mark.parametrize(
    "args, key",
    [
        (["trainer.steps=5,abc"], "trainer.steps='abc'"),  # the second value of a list: refused before the first job
    ],
)
def test_a_bad_sweep_is_refused_before_any_job(tmp_path, args, key):
    run = run_command(
        [sys.executable, "-m", "tfdistx", "-m", *QUICK, *args], env=tfdistx_env(), cwd=tmp_path, timeout=120
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert [line for line in run.stderr.splitlines() if line.startswith("tfdistx: invalid config:") and key in line], (
        run.stderr
    )
    assert not list(tmp_path.rglob("summary.json"))  # no job ran


def test_evaluate_refuses_a_model_that_does_not_fit_and_unreadable_run_files(tfdistx):
    run = tfdistx(*QUICK)
    assert run.returncode == 0, run

    def evaluate(*args):
        return run_command(
            [sys.executable, "-m", "tfdistx", "evaluate", str(run.dir), *args], env=tfdistx_env(), timeout=300
        )

    other = evaluate(
        "model=cnn"
    )  # never evaluated with weights left at their initial values; nothing of the run's to delete
    assert other.returncode == 2 and "Traceback" not in other.stderr, other.stderr[-2000:]
    assert other.stderr.strip().splitlines() == [
        "tfdistx: invalid config: model='cnn': this run was trained with model=mlp, which its "
        "checkpoints hold: evaluate takes the run's own model; drop this override (nothing was changed)"
    ]
    assert not (run.dir / "evaluations.jsonl").exists()
    other = evaluate("data.num_classes=5")  # another model all the same: found when its checkpoint is restored
    assert (
        other.returncode == 2
        and "was saved by another model or optimizer" in other.stderr
        and "delete" not in other.stderr
    )
    assert not (run.dir / "evaluations.jsonl").exists()
    (run.dir / ".hydra" / "overrides.yaml").write_bytes(b"\xff\xfe[[[")
    unreadable = evaluate()
    assert unreadable.returncode == 2 and "Traceback" not in unreadable.stderr, unreadable.stderr[-2000:]
    assert "its .hydra/overrides.yaml cannot be read" in unreadable.stderr


def test_an_agent_whose_rendezvous_host_does_not_resolve_stops_in_one_line_with_exit_4(tfdistx):
    """The keeper's own DNS name may appear late (a JobSet pod's): the agent waits
    for it, at most cluster.elastic.below_min_timeout, and then says so once."""
    run = tfdistx(
        "strategy=multiworker",
        "cluster=2x1",
        "cluster.launch=agent",
        "cluster.agent.store=no-such-host.invalid:5000",
        "cluster.elastic.below_min_timeout=1",
        *QUICK,
    )
    assert run.returncode == 4, run
    said = [line for line in run.stderr.splitlines() if line.startswith("tfdistx: ")]
    assert re.fullmatch(
        r"tfdistx: cluster\.agent\.store=no-such-host\.invalid:5000: no-such-host\.invalid does not resolve on this "
        r"node \(.+\) after 1s \(cluster\.elastic\.below_min_timeout\)",
        said[-1],
    ), run.stderr
    assert "Traceback" not in run.stderr and not (run.dir / "checkpoints").exists()
