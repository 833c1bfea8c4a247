"""Every way Keras writes a model trains, resumes bit for bit and exports,
in process on real strategies (one device, mirrored 1x2): `Sequential`
without a `keras.Input`, and a subclassed model with a weight of its own
made in `build()` (the functional one is the default MLP of every other
engine test). Their weights exist only after
a first call; tfdistx makes them before the optimizer and the checkpoint.
The cluster strategies: tests/test_model_styles.py."""

import numpy as np
import pytest
import tensorflow as tf

from tfdistx.core.errors import ConfigError

from engine_helpers import RUNNERS, train, whole_and_resumed

pytestmark = pytest.mark.unit

# The third style, functional, is the default MLP's: every other engine test trains and resumes it.
STYLES = {
    "sequential_without_input": ["model._target_=user_plugins.sequential_without_input"],
    "subclassed": ["model._target_=user_plugins.subclassed"],
}
STRATEGIES = {"one_device": ["strategy=one_device"], "mirrored_1x2": ["strategy=mirrored", "cluster=1x2"]}
EVERY_TEN = [
    "trainer.deterministic=true",
    "trainer.steps_per_loop=10",
    "trainer.log_every=10",
    "checkpoint.every_steps=10",
    "checkpoint.export=true",
]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("style", STYLES)
def test_every_model_style_trains_resumes_bitwise_and_exports(tmp_path, style, strategy):
    whole, resumed = whole_and_resumed(
        tmp_path, [*EVERY_TEN, *STRATEGIES[strategy], *STYLES[style]], stop_at=20, steps=40
    )
    assert whole.summary["step"] == 40 and np.isfinite(whole.metrics[-1]["loss"])
    assert whole.metrics[-1]["loss"] < whole.metrics[0]["loss"]
    assert resumed.summary["weights_sha256"] == whole.summary["weights_sha256"]
    assert [m["loss"] for m in resumed.metrics] == [m["loss"] for m in whole.metrics]
    served = tf.saved_model.load(str(whole.dir / "export"))
    assert served.signatures["serving_default"] is not None
    if style == "subclassed":  # its own weight, made in build(), is trained and saved with the rest
        weights = list(whole.weights().values())
        assert len(weights) == 5  # two Dense layers' kernels and biases, and the scale
        assert any(
            w.shape == (10,) and np.all(np.abs(w - 1) < 0.5) and np.any(w != 1) for w in weights
        )  # the scale, trained from 1


def test_batch_normalization_and_dropout_leave_every_replica_the_same_weights(tmp_path):
    """Two replicas of a model with BatchNormalization and Dropout: each
    replica updates its copy of the moving statistics from its own batch,
    and every variable's copies are equal after training (the mean over the
    replicas, as tf.keras read them), and again after a resume, which
    ends bitwise where the whole run does."""
    args = [
        *EVERY_TEN,
        *STRATEGIES["mirrored_1x2"],
        "model._target_=user_plugins.normalized_with_dropout",
        "checkpoint.export=false",  # the weights are the claim here
    ]
    whole, resumed = whole_and_resumed(tmp_path, args, stop_at=20, steps=40)
    for runner in RUNNERS[-3::2]:  # the whole run's and the resumed one's
        copies = {v.path: runner.strategy.experimental_local_results(v.value) for v in runner.model.weights}
        assert len(copies) == 8 and all(len(each) == 2 for each in copies.values())
        moving = [path for path in copies if "moving_" in path]
        assert len(moving) == 2 and not np.array_equal(copies[moving[0]][0].numpy(), np.zeros(32))  # updated
        differ = [path for path, (a, b) in copies.items() if not np.array_equal(a.numpy(), b.numpy())]
        assert differ == [], differ
    assert resumed.summary["weights_sha256"] == whole.summary["weights_sha256"]
    assert resumed.summary["eval"] == whole.summary["eval"]  # evaluated with the same statistics on both replicas


def test_a_model_whose_first_call_fails_is_refused_in_one_line_naming_it(tmp_path):
    with pytest.raises(ConfigError) as raised:
        train(tmp_path / "run", "model._target_=user_plugins.subclassed", "data=synthetic_categorical")
    lines = raised.value.lines()
    assert len(lines) == 1 and "model='user_plugins.subclassed': does not fit data=" in lines[0], lines
    assert "its first call failed: " in lines[0] and "(in Subclassed.call())" in lines[0], lines
