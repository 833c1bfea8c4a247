"""Checkpoints written in the background (engine/snapshot.py,
engine/checkpoint_writer.py), in this process: the steps go on while a
periodic save is written, the checkpoint holds the state of its step
whatever the steps did meanwhile, a resume from one is bitwise; the
running record spans a resume; a save longer than the grace is said.
The kill and signal cases, on real processes: test_async_checkpoints.py."""

import json
import logging
import os
import threading
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from engine_helpers import train
from tfdistx.checkpoint_files import on_disk
from tfdistx.engine.checkpoint_writer import STAGING
from tfdistx.engine import checkpointing
from tfdistx.engine.checkpointing import Checkpointer

pytestmark = pytest.mark.unit

STRATEGIES = {"one_device": ["strategy=one_device"], "mirrored": ["strategy=mirrored", "cluster=1x2"]}


def test_a_save_in_flight_holds_the_state_of_its_step_while_the_steps_change_it(tmp_path):
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(512), keras.layers.Dense(512)])
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
    step = tf.Variable(5, dtype=tf.int64)
    checkpointer = Checkpointer(str(tmp_path / "ckpt"), max_to_keep=3, model=model, optimizer=optimizer, step=step)
    at_5 = [v.numpy().copy() for v in [*model.weights, *optimizer.variables]]
    with checkpointer:
        checkpointer.save_in_background(5)
        for variable in [*model.weights, *optimizer.variables]:  # what the next steps do, while it is written
            variable.assign(variable + 1)
        step.assign(10)
        checkpointer.wait()
    assert checkpointer.stats.background == 1 and checkpointer.stats.saves == 1
    assert tf.train.latest_checkpoint(str(tmp_path / "ckpt")) == str(tmp_path / "ckpt" / "ckpt-5")
    assert not list((tmp_path / "ckpt").glob(STAGING + "*"))
    checkpointer.restore(str(tmp_path / "ckpt" / "ckpt-5"))
    assert int(step.numpy()) == 5
    for value, variable in zip(at_5, [*model.weights, *optimizer.variables]):
        np.testing.assert_array_equal(variable.numpy(), value)


def test_a_save_asked_while_one_is_written_waits_for_it_is_written_too_and_the_wait_is_said_once(
    tmp_path, monkeypatch, caplog
):
    """At most one save in flight: the next waits for the one being written
    (never skipped: every checkpoint the cadence asks for is written), the
    loop's wait is counted in the stall, and said once, naming both steps."""
    monkeypatch.setattr(checkpointing, "WAITING_WORTH_SAYING", 0.0)  # any wait is said (else from 1 s)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256)])
    step = tf.Variable(5, dtype=tf.int64)
    checkpointer = Checkpointer(str(tmp_path / "ckpt"), max_to_keep=5, model=model, step=step)
    in_place = threading.Event()

    def held_until_the_loop_waits(saved_step):  # ckpt-5's files are in place; its save returns once the loop waits
        if saved_step != 5:
            return
        in_place.set()
        deadline = time.monotonic() + 60
        while checkpointer.writer._job is not None and time.monotonic() < deadline:  # None: the loop is in wait()
            time.sleep(0.001)

    checkpointer.kept.on_add = held_until_the_loop_waits
    with caplog.at_level(logging.WARNING, logger="tfdistx.engine.checkpointing"), checkpointer:
        checkpointer.save_in_background(5)
        assert in_place.wait(60) and checkpointer.writer.in_flight == 5
        step.assign(10)
        checkpointer.save_in_background(10)  # waits for ckpt-5, then starts its own
        checkpointer.save_in_background(10)  # asked again at the same step: nothing more
    said = [r.getMessage() for r in caplog.records if "waited" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("step 10: the steps waited "), said
    assert "for the checkpoint of step 5 to be written: saves come faster than they are written" in said[0]
    assert [os.path.basename(p) for p in on_disk(str(tmp_path / "ckpt"))] == ["ckpt-5", "ckpt-10"]
    assert checkpointer.stats.saves == checkpointer.stats.background == 2 and len(checkpointer.stats.stalls) == 2


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_periodic_saves_are_written_in_the_background_and_a_resume_from_one_is_bitwise(tmp_path, strategy):
    args = [*STRATEGIES[strategy], "checkpoint.every_steps=10", "trainer.deterministic=true"]
    whole = train(tmp_path / "whole", *args, "trainer.steps=40")
    first = train(tmp_path / "split", *args, "trainer.steps=20")
    saved = first.summary["checkpoint"]
    # ckpt-10 and ckpt-20 written while the steps went on (the end's save waited for the one of step 20)
    assert (saved["saves"], saved["background_saves"]) == (2, 2), saved
    assert saved["stall_sec"] >= 0 and saved["save_sec"] > 0 and saved["bytes"] > 0
    assert [os.path.basename(p) for p in on_disk(str(tmp_path / "split" / "checkpoints"))] == ["ckpt-10", "ckpt-20"]
    resumed = train(tmp_path / "split", *args, "trainer.steps=40")
    assert resumed.summary["resumed_from_step"] == 20 and resumed.summary["checkpoint"]["restore_sec"] > 0
    assert resumed.summary["weights_sha256"] == whole.summary["weights_sha256"]


def _metric_lines(trained) -> dict:
    return {line["step"]: line for line in trained.metrics}


def test_a_record_that_spans_a_resume_reports_what_an_uninterrupted_run_reports(tmp_path):
    """SIGTERM at step 14, inside the record of steps 11-20: the resumed
    run's record at 20 sums steps 11-14 too (the running record is in the
    checkpoint), so its loss and accuracy are the uninterrupted run's, bit
    for bit; and a Keras callback that acts on them (EarlyStopping on the
    training loss) sees what it would see under fit."""
    args = ["trainer.steps=30", "trainer.steps_per_loop=2", "trainer.log_every=10", "trainer.deterministic=true"]
    whole = train(tmp_path / "whole", *args)
    with pytest.raises(SystemExit) as preempted:
        train(
            tmp_path / "split", *args, "+callbacks.signal._target_=user_plugins.SignalAt", "+callbacks.signal.step=14"
        )
    assert preempted.value.code == 42
    assert os.path.basename(on_disk(str(tmp_path / "split" / "checkpoints"))[-1]) == "ckpt-14"
    resumed = train(tmp_path / "split", *args)
    assert resumed.summary["resumed_from_step"] == 14
    uninterrupted, spanning = _metric_lines(whole), _metric_lines(resumed)
    for step in (20, 30):
        for key in ("loss", "accuracy"):
            assert spanning[step][key] == uninterrupted[step][key], (step, key, spanning[step], uninterrupted[step])


def test_early_stopping_on_the_training_loss_stops_where_it_would_have_without_the_resume(tmp_path):
    """Keras' EarlyStopping(monitor='loss') acts on each record's training
    loss: with a record that spans a resume summed whole, a run preempted
    inside one stops at the uninterrupted run's step."""
    args = [
        "trainer.steps=200",
        "trainer.steps_per_loop=1",
        "trainer.log_every=10",
        "trainer.deterministic=true",
        "optimizer.lr=0.01",
        "+callbacks.stop._target_=keras.callbacks.EarlyStopping",
        "+callbacks.stop.monitor=loss",
        "+callbacks.stop.patience=1",
        "+callbacks.stop.min_delta=0.01",
    ]
    whole = train(tmp_path / "whole", *args)
    stopped = whole.summary["stopped_early"]
    assert stopped and stopped["step"] == 50  # before the running record was checkpointed, 60 after this resume
    signal_at = stopped["step"] - 3  # inside the record that decides the stop
    with pytest.raises(SystemExit):
        train(
            tmp_path / "split",
            *args,
            "+callbacks.signal._target_=user_plugins.SignalAt",
            f"+callbacks.signal.step={signal_at}",
        )
    resumed = train(tmp_path / "split", *args)
    assert resumed.summary["resumed_from_step"] == signal_at
    assert resumed.summary["stopped_early"]["step"] == stopped["step"]
    assert resumed.summary["weights_sha256"] == whole.summary["weights_sha256"]


def test_a_save_longer_than_the_grace_a_preemption_gives_is_said_once_naming_the_key(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="tfdistx.engine.checkpointing"):
        trained = train(tmp_path / "run", "checkpoint.every_steps=10", "cluster.preemption_grace=0.000001")
    said = [r.getMessage() for r in caplog.records if "cluster.preemption_grace" in r.getMessage()]
    assert len(said) == 1 and "longer than the 1e-06s a preemption gives the run to save" in said[0], said
    assert trained.summary["checkpoint"]["saves"] == 4


def test_the_state_file_names_only_whole_checkpoints_and_rotation_keeps_max_to_keep(tmp_path):
    trained = train(tmp_path / "run", "checkpoint.every_steps=5", "checkpoint.max_to_keep=2")
    directory = tmp_path / "run" / "checkpoints"
    state = tf.train.get_checkpoint_state(str(directory))
    assert [os.path.basename(p) for p in state.all_model_checkpoint_paths] == ["ckpt-35", "ckpt-40"]
    assert [os.path.basename(p) for p in on_disk(str(directory))] == ["ckpt-35", "ckpt-40"]
    assert trained.summary["checkpoint"]["background_saves"] == 8
    assert json.loads((directory / "topology.json").read_text()).keys() == {"ckpt-35", "ckpt-40"}
