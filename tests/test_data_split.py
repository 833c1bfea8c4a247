"""Which examples each strategy trains on, counted by a probe model, and
learning-rate schedules that follow the loop's true step (parameter servers
included). Real clusters, real checkpoints."""

import json

import numpy as np
import pytest
import tensorflow as tf

EXAMPLES, BATCH, STEPS = 512, 32, 16  # one epoch: 16 steps x 32


def seen_counts(run_dir):
    """The probe's per-index counts, read from the final checkpoint on disk."""
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(run_dir / "checkpoints")))
    key = next(k for k in reader.get_variable_to_shape_map() if "/seen/" in k)
    return reader.get_tensor(key)


def probe(tfdistx, tmp_path, name, *args, examples=EXAMPLES):
    run = tfdistx(
        "data._target_=user_plugins.indexed_data",
        "model._target_=user_plugins.counting_model",
        f"+data.examples={examples}",
        f"+model.examples={examples}",
        f"trainer.steps={STEPS}",
        f"trainer.steps_per_loop={STEPS}",
        f"trainer.log_every={STEPS}",
        "trainer.eval_every=0",
        f"data.batch_size={BATCH}",
        "logger.tensorboard=false",
        "checkpoint.export=false",
        "cluster.max_restarts=0",
        *args,
        run_dir=tmp_path / name,
    )
    assert run.returncode == 0, run
    return seen_counts(run.dir)


@pytest.mark.parametrize(
    "strategy",
    [
        pytest.param(["strategy=one_device"], marks=pytest.mark.slow),
        pytest.param(["strategy=mirrored", "cluster=1x2"], marks=pytest.mark.slow),
        ["strategy=multiworker", "cluster=2x1"],
    ],
)
def test_synchronous_strategies_see_each_example_once_per_epoch(tfdistx, tmp_path, strategy):
    seen = probe(tfdistx, tmp_path, "run", *strategy)
    assert seen.sum() == STEPS * BATCH
    assert (seen == 1).all(), f"{(seen == 0).sum()} never seen, {(seen > 1).sum()} seen twice"


@pytest.mark.parametrize("workers", [pytest.param(2, marks=pytest.mark.slow), 3])  # 3: the uneven split
def test_parameter_server_workers_read_disjoint_shards(tfdistx, tmp_path, workers):
    """Each worker's shard holds STEPS batches, so however the coordinator
    spreads the steps, no worker wraps around: any example seen twice would
    be two workers reading the same data (the bug this guards against)."""
    examples = EXAMPLES * workers
    seen = probe(tfdistx, tmp_path, "run", "strategy=parameter_server", f"cluster=ps1w{workers}", examples=examples)
    assert seen.sum() == STEPS * BATCH
    assert (seen <= 1).all(), f"{(seen > 1).sum()} examples trained on twice"
    assert (seen == 1).sum() == STEPS * BATCH


def expected_bias(steps: int, lr: float) -> float:
    """SGD on a bias whose gradient is always -1 adds the learning rate of
    every step: the sum of Keras' cosine decay over steps 0..steps-1."""
    t = np.arange(steps)
    return float(np.sum(lr * 0.5 * (1 + np.cos(np.pi * t / steps))))


@pytest.mark.parametrize(
    "strategy",
    [
        pytest.param(["strategy=one_device"], marks=pytest.mark.slow),
        pytest.param(["strategy=mirrored", "cluster=1x2"], marks=pytest.mark.slow),
        pytest.param(["strategy=multiworker", "cluster=2x1"], marks=pytest.mark.slow),
        [
            "strategy=parameter_server",
            "cluster=ps1w2",
        ],  # its workers count the true step apart from optimizer.iterations
    ],
)
def test_cosine_schedule_follows_the_true_step(tfdistx, tmp_path, strategy):
    steps, lr = 300, 0.01
    run = tfdistx(
        "data._target_=user_plugins.far_targets",
        "model._target_=user_plugins.bias_only",
        "task=regression",
        "task.loss=mae",
        "optimizer=sgd",
        "optimizer.momentum=0.0",
        f"optimizer.lr={lr}",
        "optimizer.schedule=cosine",
        f"trainer.steps={steps}",
        "trainer.steps_per_loop=20",
        "trainer.log_every=20",
        "trainer.eval_every=0",
        "data.batch_size=16",
        "logger.tensorboard=false",
        "cluster.max_restarts=0",
        *strategy,
    )
    assert run.returncode == 0, run
    assert run.metrics[-1]["step"] == steps and run.metrics[-1]["lr"] == pytest.approx(0.0, abs=1e-9)
    # The bias the workers trained holds the learning rate of every step they took.
    served = tf.saved_model.load(str(run.dir / "export")).signatures["serving_default"]
    bias = float(served(features=tf.zeros([1, 2]))["predictions"][0, 0])
    assert bias == pytest.approx(expected_bias(steps, lr), rel=1e-3)
    summary = json.loads((run.dir / "summary.json").read_text())
    assert summary["step"] == steps
