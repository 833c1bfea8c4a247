"""The engine in this process (-m unit): real TensorFlow, real strategies on
four logical CPU devices, real checkpoints in tmp_path, no tfdistx process.
Each run is composed as the command line composes it, resolved into a
RunSpec and handed to `engine/fit.train`, the call a single-process run
makes (commands/execute.py): the runner, the update, checkpointing, the
example order and the tasks, in seconds rather than a process each.
Processes and clusters are tested in test_training.py and beyond."""

import numpy as np
import pytest
import tensorflow as tf

from engine_helpers import train, whole_and_resumed
from tfdistx.data.order import ArrayExamples

pytestmark = pytest.mark.unit


# -- strategies: the same run on one device and on several replicas --------------


def test_mirrored_on_four_logical_cpus_follows_one_device(tmp_path):
    """Same seed, same global batch: 4 replicas of 8 follow one device of 32."""
    mirrored = train(tmp_path / "mirrored", "strategy=mirrored", "cluster=1x4")
    single = train(tmp_path / "single", "strategy=one_device")
    assert (
        mirrored.summary["strategy_class"],
        mirrored.summary["replicas"],
        mirrored.summary["per_replica_batch"],
    ) == ("MirroredStrategy", 4, 8)
    assert [m["step"] for m in mirrored.metrics] == [m["step"] for m in single.metrics] == [20, 40]
    for m, s in zip(mirrored.metrics, single.metrics):
        assert m["loss"] == pytest.approx(s["loss"], rel=1e-3)
    weights, reference = mirrored.weights(), single.weights()
    assert weights.keys() == reference.keys() and weights
    for name in weights:
        np.testing.assert_allclose(weights[name], reference[name], rtol=1e-3, atol=1e-5, err_msg=name)


def test_mirrored_runs_of_two_sizes_in_one_process(tmp_path):
    """A sweep's jobs under the basic launcher share a process: TF's
    collective groups of the first strategy must not catch the second's."""
    four = train(tmp_path / "four", "strategy=mirrored", "cluster=1x4", "trainer.steps=10")
    two = train(tmp_path / "two", "strategy=mirrored", "cluster=1x2", "trainer.steps=10")
    assert (four.summary["replicas"], two.summary["replicas"], two.summary["step"]) == (4, 2, 10)


@pytest.mark.parametrize(
    "overrides, strategy_class, replicas",
    [
        (["strategy=central_storage", "cluster=1x2"], "CentralStorageStrategy", 2),
        (["cluster=1x2"], "MirroredStrategy", 2),  # auto: several devices on one worker
    ],
)
def test_a_strategy_runs_its_replicas(tmp_path, overrides, strategy_class, replicas):
    run = train(tmp_path / "run", *overrides)
    assert (run.summary["strategy_class"], run.summary["replicas"], run.summary["step"]) == (
        strategy_class,
        replicas,
        40,
    )


# -- optimizers and schedules (accumulation, clipping, precision: test_unit_compute.py) --


@pytest.mark.parametrize("optimizer, schedule", [("sgd", "warmup_cosine"), ("adamw", "cosine"), ("adam", "constant")])
def test_optimizers_and_schedules(tmp_path, optimizer, schedule):
    run = train(
        tmp_path / "run",
        f"optimizer={optimizer}",
        f"optimizer.schedule={schedule}",
        "optimizer.warmup_steps=10",
        "optimizer.lr=0.01",
    )
    lrs = [m["lr"] for m in run.metrics]
    if schedule == "constant":
        assert lrs == pytest.approx([0.01, 0.01])
    else:  # cosine decays towards 0 at the last step
        assert lrs[-1] < lrs[0] <= 0.01 + 1e-9


def test_linear_lr_scaling_with_replicas(tmp_path):
    run = train(
        tmp_path / "run",
        "strategy=mirrored",
        "cluster=1x2",
        "optimizer.lr=0.001",
        "optimizer.scale_lr_with_replicas=true",
    )
    assert run.summary["learning_rate"] == pytest.approx(0.002)
    assert run.metrics[0]["lr"] == pytest.approx(0.002)


def test_epochs_instead_of_steps(tmp_path):
    run = train(tmp_path / "run", "trainer.steps=null", "trainer.epochs=2")  # 512 examples / 32 = 16 steps an epoch
    assert run.summary["step"] == 32


@pytest.mark.parametrize(
    "model, overrides",
    [
        ("cnn", ["data.image_shape=[28,28,1]", "model.filters=[8,16]", "model.dense_units=32"]),
        ("resnet", ["data.image_shape=[32,32,3]", "model.depth=8", "model.width=8"]),
    ],
)
def test_models(tmp_path, model, overrides):
    run = train(tmp_path / "run", f"model={model}", *overrides, "trainer.steps=20")
    assert run.summary["step"] == 20 and np.isfinite(run.summary["eval"]["eval/loss"])


# -- tasks: each trains on two replicas, and reports what it offers ----------------

TASKS = {
    "binary": (
        [
            "data=synthetic_categorical",
            "model=wide_deep",
            "model.vocab_size=2000",
            "data.vocab_size=2000",
            "model.hidden_units=[32]",
        ],
        {"eval/auc": 0.7, "eval/accuracy": 0.6},
    ),
    "regression": (
        ["data=synthetic_regression", "model.hidden_units=[32]"],
        {"eval/rmse": -0.6},
    ),  # negative: lower is better
    "multilabel": (["data=synthetic_multilabel", "model.hidden_units=[32]"], {"eval/micro_f1": 0.7, "eval/auc": 0.8}),
    "classification": ([], {"eval/accuracy": 0.15}),  # 10 classes: chance is 0.1
}


@pytest.mark.parametrize("task", list(TASKS))
def test_each_task_trains_on_two_replicas(tmp_path, task):
    overrides, bounds = TASKS[task]
    run = train(
        tmp_path / "run",
        f"task={task}",
        *overrides,
        "strategy=mirrored",
        "cluster=1x2",
        "data.batch_size=128",
        "trainer.steps=160",
        "trainer.steps_per_loop=40",
        "trainer.log_every=40",
    )
    assert (run.summary["task"], run.summary["replicas"], run.summary["step"]) == (task, 2, 160)
    for name, bound in bounds.items():
        value = run.summary["eval"][name]
        assert (value < -bound) if bound < 0 else (value > bound), (name, run.summary["eval"])
    assert run.objective == run.summary["eval"][run.spec.trainer.objective]  # what a sweep is told


def test_a_users_task_with_python_control_flow_on_tensors_trains_as_written(tmp_path):
    """tfdistx traces its own steps without AutoGraph (as Keras' fit does);
    a task of a user's own is still converted: its `if` and `for` on tensors
    (user_plugins.GuardedSquaredHinge) train to the weights of the same loss
    written without them."""
    args = ["task=binary", "data=synthetic", "data.num_classes=2", "trainer.objective=eval/margin_accuracy"]
    plain = train(tmp_path / "plain", *args, "task._target_=user_plugins.SquaredHinge")
    guarded = train(tmp_path / "guarded", *args, "task._target_=user_plugins.GuardedSquaredHinge")
    assert guarded.summary["step"] == 40
    assert guarded.summary["train"]["loss"] == pytest.approx(plain.summary["train"]["loss"], rel=1e-6)
    for name, value in plain.weights().items():
        np.testing.assert_allclose(guarded.weights()[name], value, rtol=1e-5, atol=1e-7)


def test_a_users_task_whose_source_cannot_be_read_runs_as_written(caplog):
    """A task class made in a shell or by exec has no source for AutoGraph to
    read: it runs as written, with one warning, as AutoGraph's own traced
    calls ran it (not refused)."""
    from tfdistx.tasks import traced

    made = {}
    exec(
        "from tfdistx.tasks import Task\nimport tensorflow as tf\n"
        "class Shell(Task):\n    def loss(self, labels, outputs):\n        return tf.abs(labels - outputs)\n",
        made,
    )
    loss = traced(made["Shell"](), "loss")
    assert tf.function(lambda: loss(tf.ones([3]), tf.zeros([3])), autograph=False)().numpy().tolist() == [1.0, 1.0, 1.0]
    assert any(
        "AutoGraph could not convert Shell.loss; it runs as written" in r.getMessage() for r in caplog.records
    ), caplog.records


# -- checkpoints and the example order: a resumed run is the run that never stopped --


def test_a_resumed_run_ends_bitwise_equal_to_one_that_never_stopped(tmp_path):
    args = [
        "strategy=mirrored",
        "cluster=1x2",
        "trainer.deterministic=true",
        "model.dropout=0.2",
        "checkpoint.every_steps=10",
    ]
    whole, resumed = whole_and_resumed(tmp_path, args, stop_at=20, steps=40)
    assert (resumed.summary["step"], resumed.summary["resumed"]) == (40, True)
    assert resumed.summary["weights_sha256"] == whole.summary["weights_sha256"]
    assert [m["loss"] for m in resumed.metrics] == [m["loss"] for m in whole.metrics]


@pytest.mark.parametrize("pipelines, index", [(1, 0), (3, 2)])
def test_an_example_order_starts_at_any_position_without_reading_the_ones_before(pipelines, index):
    """Position 10 of a 24-example pipeline, across the epoch boundary: the
    same examples as reading from 0 and dropping 10."""
    arrays = np.arange(24 * pipelines, dtype=np.int64)
    examples = ArrayExamples(arrays)
    context = tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=index)

    def stream(start, count):
        batches = examples.batches(context, 4, seed=7, window=16, start=start).take(count // 4)
        return np.concatenate(list(batches.as_numpy_iterator()))

    from_zero, from_ten = stream(0, 48), stream(10, 36)
    np.testing.assert_array_equal(from_ten, from_zero[10:46])
    # The pipelines deal one order of all the rows out batch by batch (order.py): this one's
    # batches are every `pipelines`-th, and in one epoch all of them take every row once.
    epoch = [
        np.concatenate(
            list(
                ArrayExamples(arrays)
                .batches(tf.distribute.InputContext(pipelines, i), 4, seed=7, window=16)
                .take(6)
                .as_numpy_iterator()
            )
        )
        for i in range(pipelines)
    ]
    np.testing.assert_array_equal(epoch[index], from_zero[:24])
    assert sorted(np.concatenate(epoch)) == list(arrays)
    assert list(from_zero[:24]) != list(
        from_zero[24:48]
    )  # and each pipeline's batches differ from one epoch to the next
