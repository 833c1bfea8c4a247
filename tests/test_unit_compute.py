"""How a step computes: gradient accumulation, clipping, XLA, mixed precision.

Equivalences are checked on the trained weights, read back from the final
checkpoint on disk. Every run here trains in this process (engine_helpers:
-m unit); the same under a real multi-worker cluster is in test_cluster.py
(slow).
"""

import numpy as np
import pytest
import tensorflow as tf

import engine_helpers
from test_unit_config_shipped import compose
from tfdistx.config.resolve import resolve
from tfdistx.core import compute
from tfdistx.engine import update


def train(run_dir, *overrides, **kwargs):
    """engine_helpers.train with the default trainer.jit_compile (auto), what this file's claims are about."""
    return engine_helpers.train(run_dir, *overrides, xla_default=True, **kwargs)


def whole_and_resumed(tmp_path, args, **kwargs):
    return engine_helpers.whole_and_resumed(tmp_path, args, xla_default=True, **kwargs)


# SGD rather than Adam: Adam divides by the gradients' running scale, so
# rounding differences between two equal computations grow where a
# gradient is near zero; SGD keeps them at rounding size.
EXACT = ["data=synthetic", "optimizer=sgd", "optimizer.lr=0.05"]


def assert_same_weights(a, b, tolerance=1e-5):
    wa, wb = a.weights(), b.weights()
    assert wa.keys() == wb.keys() and wa
    worst = max(float(np.max(np.abs(wa[k] - wb[k]))) for k in wa)
    assert worst < tolerance, worst


def assert_different_weights(a, b):
    wa, wb = a.weights(), b.weights()
    assert max(float(np.max(np.abs(wa[k] - wb[k]))) for k in wa) > 1e-3


@pytest.fixture(scope="module")
def plain_one_device(tmp_path_factory):
    """EXACT on one device, batches of 32, nothing accumulated or clipped: the run the accumulation and the
    clipping tests each tell theirs apart from. Trained once a module in each pytest worker (two tests
    trained it each, ~1.5 CPU s with XLA); they only read it."""
    return train(tmp_path_factory.mktemp("plain") / "run", *EXACT, "strategy=one_device", "data.batch_size=32")


@pytest.mark.unit
@pytest.mark.parametrize("strategy", [["strategy=one_device"], ["strategy=mirrored", "cluster=1x2"]])
def test_accumulating_4_batches_trains_the_same_weights_as_one_4x_batch(tmp_path, strategy, request):
    accumulated = train(tmp_path / "acc", *EXACT, *strategy, "data.batch_size=32", "trainer.accumulate_steps=4")
    large = train(tmp_path / "large", *EXACT, *strategy, "data.batch_size=128")
    if strategy == ["strategy=one_device"]:
        small = request.getfixturevalue("plain_one_device")
    else:
        small = train(tmp_path / "small", *EXACT, *strategy, "data.batch_size=32")
    assert accumulated.summary["global_batch"] == 128 and accumulated.summary["accumulate_steps"] == 4
    assert_same_weights(accumulated, large)
    assert_different_weights(accumulated, small)  # the comparison can tell


@pytest.mark.unit
def test_a_micro_batch_a_loop_picks_has_the_shape_xla_compiles_for():
    """Issue 32 (18): sliced at a loop's counter, a micro-batch's size was not
    known when the step was compiled, and XLA compiled the accumulated step for
    any size, 10x slower (benchmarks/bench_accumulation.py; README). Each
    micro-batch is the same examples, in the same order, with its shape known."""
    batch = (tf.reshape(tf.range(64 * 3, dtype=tf.float32), [64, 3]), tf.range(64))
    split = update._split(batch, 8)

    @tf.function(jit_compile=True)
    def pick(k):
        features, labels = split(k)
        assert features.shape == (8, 3) and labels.shape == (8,), (features.shape, labels.shape)
        return features, labels

    for k in range(8):
        features, labels = pick(tf.constant(k))
        np.testing.assert_array_equal(labels, np.arange(8 * k, 8 * k + 8))
        np.testing.assert_array_equal(features, batch[0][8 * k : 8 * k + 8])


@pytest.mark.unit
def test_accumulated_embedding_gradients_stay_sparse_and_train_the_same_weights(tmp_path):
    wide_deep = [
        *EXACT,
        "data=synthetic_categorical",
        "model=wide_deep",
        "model.vocab_size=1000",
        "data.vocab_size=1000",
    ]
    accumulated = train(tmp_path / "acc", *wide_deep, "data.batch_size=32", "trainer.accumulate_steps=4")
    large = train(tmp_path / "large", *wide_deep, "data.batch_size=128")
    assert_same_weights(accumulated, large)


@pytest.mark.unit
def test_global_clipping_clips_the_gradient_summed_over_replicas(tmp_path, plain_one_device):
    """Keras clips before it sums over replicas: given global_clipnorm, two
    replicas would each clip half a gradient. tfdistx clips the sum, so one
    and two replicas train the same weights."""
    clipped = [*EXACT, "optimizer.global_clip_norm=0.05"]
    one = train(tmp_path / "one", *clipped, "strategy=one_device")
    two = train(tmp_path / "two", *clipped, "strategy=mirrored", "cluster=1x2")
    unclipped = plain_one_device  # EXACT, one device, QUICK's batch of 32
    assert_same_weights(one, two)
    assert_different_weights(one, unclipped)


@pytest.mark.unit
@pytest.mark.parametrize("compute", [["trainer.jit_compile=true"], ["trainer.precision=mixed_float16"]])
def test_stopped_and_resumed_run_ends_bitwise_equal_with_xla_and_with_loss_scaling(tmp_path, compute):
    """float32 under XLA; and mixed_float16, whose loss scale is checkpointed with the optimizer."""
    whole, resumed = whole_and_resumed(
        tmp_path, ["data=synthetic", *compute, "trainer.deterministic=true"], stop_at=20, steps=40
    )
    assert whole.summary["weights_sha256"] == resumed.summary["weights_sha256"]


@pytest.mark.unit
def test_mixed_precision_trains_like_float32_under_mirrored_replicas(tmp_path):
    runs = {
        precision: train(
            tmp_path / precision,
            "data=synthetic",
            "strategy=mirrored",
            "cluster=1x2",
            f"trainer.precision={precision}",
            "trainer.steps=80",
            "checkpoint.export=true",
        )
        for precision in ("float32", "mixed_bfloat16", "mixed_float16")
    }
    for precision, run in runs.items():
        assert run.summary["precision"] == precision
        assert (run.dir / "export" / "saved_model.pb").exists()
    reference = runs["float32"].summary["train"]["loss"]
    assert reference < 2.1  # it learned: 10 classes start at ln 10 = 2.30
    for precision in ("mixed_bfloat16", "mixed_float16"):
        assert abs(runs[precision].summary["train"]["loss"] - reference) < 0.05, precision


@pytest.mark.unit
def test_auto_xla_follows_the_devices_and_the_strategy_table():
    """The GPU branch of the choice, exercised on a machine without GPUs."""

    def jit_compile(cfg, gpus):  # as the plan and the engine decide it, from the run spec's trainer and strategy row
        spec = resolve(cfg)
        return compute.planned_jit(spec.trainer, spec.strategy.row, gpus)

    default = compose("data=synthetic")
    assert jit_compile(default, gpus=True)[0] is True
    assert jit_compile(default, gpus=False)[0] is None  # on CPUs: decided by the model's layers, once it is built
    assert jit_compile(compose("data=synthetic", "strategy=central_storage"), gpus=True)[0] is False
    assert jit_compile(compose("data=synthetic", "trainer.jit_compile=false"), gpus=True)[0] is False
