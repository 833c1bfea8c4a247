"""Every way Keras writes a model trains under the cluster strategies, on
real processes of a local cluster, and resumes exactly: a subclassed model
with a weight of its own made in `build()`, a `Sequential` without a
`keras.Input`, and a functional one (the default MLP). Their weights exist
only after a first call, made by tfdistx in the strategy's scope before
the optimizer and the checkpoint: on a parameter-server cluster they live
on the ps task. One device and mirrored: tests/test_unit_model_styles.py.

One cell per strategy runs by default (the functional model is every other
cluster test's); the rest with -m slow."""

import signal

import numpy as np
import pytest

from conftest import EXPORTED, QUICK, metric_lines, start_tfdistx, steps_logged, wait_until, whole_and_resumed
from test_cluster import digests

STYLES = {
    "functional": [],
    "sequential_without_input": ["model._target_=user_plugins.sequential_without_input"],
    "subclassed": ["model._target_=user_plugins.subclassed"],
}
EVERY_TEN = ["trainer.steps_per_loop=10", "trainer.log_every=10", "checkpoint.every_steps=10"]
DEFAULT_RUN = {("multiworker", "subclassed"), ("parameter_server", "sequential_without_input")}


def cells(strategy):
    return [
        style if (strategy, style) in DEFAULT_RUN else pytest.param(style, marks=pytest.mark.slow) for style in STYLES
    ]


@pytest.mark.parametrize("style", cells("multiworker"))
def test_every_model_style_trains_on_multiworker_and_resumes_bitwise(tfdistx, tmp_path, style):
    args = [
        *QUICK,
        EXPORTED,
        *EVERY_TEN,
        "strategy=multiworker",
        "cluster=2x1",
        "trainer.deterministic=true",
        *STYLES[style],
    ]
    whole, resumed = whole_and_resumed(tfdistx, tmp_path, args, stop_at=20, steps=40)
    assert resumed.summary["weights_sha256"] == whole.summary["weights_sha256"]
    assert [m["loss"] for m in resumed.metrics] == [m["loss"] for m in whole.metrics]
    assert (resumed.dir / "export" / "saved_model.pb").exists()


@pytest.mark.parametrize("style", cells("parameter_server"))
def test_every_model_style_trains_on_parameter_servers_and_resumes_at_its_step(tfdistx, tmp_path, style):
    """Asynchronous workers: not bitwise, but resumed at the checkpoint's step, each step logged once."""
    args = [*QUICK, EXPORTED, *EVERY_TEN, "strategy=parameter_server", "cluster=ps1w2", *STYLES[style]]
    first = tfdistx(*args, "trainer.steps=20")
    resumed = tfdistx(*args, "trainer.steps=40")
    assert first.returncode == 0 and resumed.returncode == 0, resumed
    assert (resumed.summary["resumed_from_step"], resumed.summary["step"]) == (20, 40)
    assert steps_logged(resumed.dir) == [10, 20, 30, 40]
    losses = [m["loss"] for m in resumed.metrics]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert (resumed.dir / "export" / "saved_model.pb").exists()


def test_batch_normalization_and_dropout_end_with_the_same_weights_on_both_workers_after_a_sigterm(tfdistx, tmp_path):
    """A model with BatchNormalization and Dropout (`training` passed) on two
    workers: each updates its moving statistics from its own batch, and
    both end with the same weights (their mean, as tf.keras read them;
    docs/multi-process.md): in a whole run, and in one stopped by SIGTERM
    and resumed, which ends bitwise where the whole one does."""
    args = [
        *QUICK,
        *EVERY_TEN,
        "strategy=multiworker",
        "cluster=2x1",
        "trainer.deterministic=true",
        "model._target_=user_plugins.normalized_with_dropout",
        "+callbacks.pace._target_=user_plugins.Pace",
        "+callbacks.pace.seconds=0.3",  # slow enough for the signal to land mid-run
    ]
    whole = tfdistx(*args)
    assert whole.returncode == 0, whole
    found = digests(whole.dir)
    assert set(found) == {"worker-0", "worker-1"} and set(found.values()) == {whole.summary["weights_sha256"]}, found
    run_dir = tmp_path / "split"
    proc = start_tfdistx(args, run_dir)
    try:
        wait_until(lambda: metric_lines(run_dir) >= 2, 300, "two records", [proc])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 42
    finally:
        proc.kill()
    resumed = tfdistx(*args, run_dir=run_dir)
    assert resumed.returncode == 0, resumed
    assert 20 <= resumed.summary["resumed_from_step"] < 40
    found = digests(run_dir)
    assert set(found.values()) == {whole.summary["weights_sha256"]}, found
