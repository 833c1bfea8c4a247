"""Keras' callbacks behave as under `fit` (engine/keras_callbacks.py), in
process on real TensorFlow: the same recording callback under Keras' fit
and under tfdistx sees the same hooks, numbers and logs' keys but for the
differences the docs list; Keras' stateful callbacks resume where an
uninterrupted run would be; TerminateOnNaN stops at the first NaN without
saving it; a callback that fails at any hook and any step keeps the steps
trained; and the callbacks tfdistx does the job of are refused before
TensorFlow starts."""

import csv
import json
import os
import signal
import time

import keras
import numpy as np
import pytest

from config_helpers import refused
from engine_helpers import train, whole_and_resumed
from tfdistx.commands.common import one_line_errors
from tfdistx.core.errors import PluginFailed
from tfdistx.data.sources import synthetic
from tfdistx.models import mlp

pytestmark = pytest.mark.unit

EPOCHS, STEPS_PER_EPOCH, BATCH = 3, 4, 32
# The differences the docs' table lists (docs/own-project.md: Keras' callbacks): tfdistx evaluates without Keras'
# evaluate (no on_test_* hooks), and its logs hold the step and the learning rate besides fit's metrics.
NOT_CALLED = ("on_test_begin", "on_test_end", "on_test_batch_begin", "on_test_batch_end")
EXTRA_KEYS = {
    "on_epoch_end": ["learning_rate", "step"],
    "on_train_end": ["learning_rate", "step"],
    "on_train_batch_end": ["step"],
}


def recorded(path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()]


def under_fit(path) -> list:
    data = synthetic(train_examples=EPOCHS * STEPS_PER_EPOCH * BATCH, eval_examples=64)
    model = mlp((28, 28, 1), 10)
    model.compile(
        optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"]
    )
    model.fit(
        data.train(None).batch(BATCH),
        epochs=EPOCHS,
        steps_per_epoch=STEPS_PER_EPOCH,
        validation_data=data.eval(None).batch(BATCH),
        verbose=0,
        callbacks=[_recorder(path)],
    )
    return recorded(path)


def _recorder(path):
    from user_plugins import Recorder

    return Recorder(str(path))


def as_tfdistx_differs(fit_lines: list) -> list:
    """What fit's record would be with the listed differences applied."""
    lines = []
    for line in fit_lines:
        if line[0] in NOT_CALLED:
            continue
        if line[0] in EXTRA_KEYS and line[-1] is not None:
            line = [*line[:-1], sorted(line[-1] + EXTRA_KEYS[line[0]])]
        lines.append(line)
    return lines


def test_a_recording_callback_sees_under_tfdistx_what_it_sees_under_fit(tmp_path):
    """One step per call (trainer.steps_per_loop=1), a record and an
    evaluation every STEPS_PER_EPOCH steps: fit's epochs, batches and logs."""
    fit_lines = under_fit(tmp_path / "fit.jsonl")
    train(
        tmp_path / "run",
        f"trainer.steps={EPOCHS * STEPS_PER_EPOCH}",
        "trainer.steps_per_loop=1",
        f"trainer.log_every={STEPS_PER_EPOCH}",
        f"trainer.eval_every={STEPS_PER_EPOCH}",
        f"data.batch_size={BATCH}",
        "+callbacks.rec._target_=user_plugins.Recorder",
        f"+callbacks.rec.path={tmp_path / 'tfdistx.jsonl'}",
    )
    ours = recorded(tmp_path / "tfdistx.jsonl")
    assert ours == as_tfdistx_differs(fit_lines)
    assert ours[0] == ["set_params", {"epochs": EPOCHS, "steps": STEPS_PER_EPOCH}]
    assert [line[1] for line in ours if line[0] == "on_epoch_end"] == [0, 1, 2]


def test_batches_and_epochs_go_on_counting_in_a_resumed_run(tmp_path):
    """Stopped at step 6, in the middle of epoch 1, and resumed: epoch 1
    begins again under its number, its batches go on from 2, as the run
    never stopped would have numbered them."""
    args = [
        "trainer.steps_per_loop=1",
        "trainer.log_every=4",
        "trainer.eval_every=0",
        "checkpoint.every_steps=2",
        "+callbacks.rec._target_=user_plugins.Recorder",
    ]
    train(tmp_path / "whole", *args, "trainer.steps=12", f"+callbacks.rec.path={tmp_path / 'whole.jsonl'}")
    train(tmp_path / "split", *args, "trainer.steps=6", f"+callbacks.rec.path={tmp_path / 'first.jsonl'}")
    train(tmp_path / "split", *args, "trainer.steps=12", f"+callbacks.rec.path={tmp_path / 'second.jsonl'}")
    numbered = lambda lines, hook: [line[1] for line in lines if line[0] == hook]  # noqa: E731
    whole, second = recorded(tmp_path / "whole.jsonl"), recorded(tmp_path / "second.jsonl")
    assert numbered(second, "on_epoch_begin") == [1, 2] and numbered(second, "on_epoch_end") == [1, 2]
    assert numbered(second, "on_train_batch_begin") == numbered(whole, "on_train_batch_begin")[6:] == [2, 3, 0, 1, 2, 3]


STATEFUL = {
    "early_stopping": [
        "+callbacks.stop._target_=keras.callbacks.EarlyStopping",
        "+callbacks.stop.monitor=loss",
        "+callbacks.stop.mode=max",
        "+callbacks.stop.patience=3",
    ],  # loss falls: never better; stops at epoch 3
    "reduce_lr_on_plateau": [
        "+callbacks.lr._target_=keras.callbacks.ReduceLROnPlateau",
        "+callbacks.lr.monitor=loss",
        "+callbacks.lr.mode=max",
        "+callbacks.lr.patience=2",
        "+callbacks.lr.cooldown=1",
        "+callbacks.lr.factor=0.5",
    ],
}


@pytest.mark.parametrize("callback", STATEFUL)
def test_a_stateful_keras_callback_resumed_acts_where_an_uninterrupted_run_does(tmp_path, callback):
    """Stopped at step 20 and resumed: EarlyStopping stops, ReduceLROnPlateau
    lowers the rate, at the same steps as the run that never stopped (their
    patience so far is in the checkpoint; under fit a restart forgets it)."""
    args = [
        "trainer.steps_per_loop=10",
        "trainer.log_every=10",
        "checkpoint.every_steps=10",
        "trainer.deterministic=true",
        *STATEFUL[callback],
    ]
    whole, resumed = whole_and_resumed(tmp_path, args, stop_at=20, steps=80)
    assert [(m["step"], m["lr"]) for m in resumed.metrics] == [(m["step"], m["lr"]) for m in whole.metrics]
    assert resumed.summary["step"] == whole.summary["step"] and resumed.summary.get(
        "stopped_early"
    ) == whole.summary.get("stopped_early")
    assert resumed.summary["weights_sha256"] == whole.summary["weights_sha256"]
    if callback == "early_stopping":
        assert whole.summary["step"] == 40 < 80


def test_a_run_a_keras_early_stopping_stopped_trains_nothing_when_run_again(tmp_path, caplog):
    """EarlyStopping stops the run; the same command again in its directory
    ends at once, as a finished run does: nothing trained, its summary,
    metrics, checkpoints and export as they were, the final checkpoint
    evaluated. Without the callback in its config, a rerun trains on."""
    args = [
        "trainer.steps_per_loop=10",
        "trainer.log_every=10",
        "checkpoint.every_steps=10",
        "checkpoint.export=true",
        "trainer.steps=100",
        "+callbacks.stop._target_=keras.callbacks.EarlyStopping",
        "+callbacks.stop.monitor=loss",
        "+callbacks.stop.mode=max",  # the loss falls: never better than the first epoch's, so it stops at epoch 2
        "+callbacks.stop.patience=2",
    ]
    run = train(tmp_path / "run", *args)
    stop = run.summary["step"]
    assert (
        run.summary["stopped_early"]
        == {
            "step": stop,
            "reason": "callbacks.stop: EarlyStopping set model.stop_training",
        }
        and stop == 30
    )
    names = ("summary.json", "metrics.jsonl", "export/saved_model.pb", "checkpoints/checkpoint")
    before = {name: (run.dir / name).read_bytes() for name in names}
    kept = sorted(p.name for p in run.dir.iterdir())
    caplog.set_level("INFO", logger="tfdistx")
    again = train(tmp_path / "run", *args)
    assert {name: (run.dir / name).read_bytes() for name in names} == before
    assert sorted(p.name for p in run.dir.iterdir()) == sorted([*kept, "evaluations.jsonl"])  # no export.replaced-*
    assert (
        f"the run in this directory stopped early at step {stop} (ckpt-{stop}): callbacks.stop: EarlyStopping set "
        "model.stop_training; nothing to train" in caplog.text
    )
    assert again.objective == run.summary["eval"]["eval/accuracy"]
    without = train(tmp_path / "run", *args[:5])
    assert without.summary["step"] == 100 and without.summary["resumed_from_step"] == stop


def test_model_checkpoint_keeps_its_best_across_a_resume(tmp_path):
    """save_best_only: a resumed run saves only when it beats the best of
    the run before it (keras-team/keras#17012: under fit it saves again)."""
    args = [
        "trainer.steps_per_loop=10",
        "trainer.log_every=10",
        "checkpoint.every_steps=10",
        "+callbacks.best._target_=keras.callbacks.ModelCheckpoint",
        "+callbacks.best.monitor=loss",
        "+callbacks.best.mode=max",
        "+callbacks.best.save_best_only=true",
        "+callbacks.best.filepath=best.keras",  # the run dir's
    ]
    train(tmp_path / "run", *args, "trainer.steps=20")
    saved = (tmp_path / "run" / "best.keras").stat().st_mtime_ns
    train(tmp_path / "run", *args, "trainer.steps=40")  # the loss only falls: never again the best by mode=max
    assert (tmp_path / "run" / "best.keras").stat().st_mtime_ns == saved


def test_terminate_on_nan_stops_at_the_first_nan_call_and_saves_no_nan_checkpoint(tmp_path):
    run = train(
        tmp_path / "run",
        "trainer.steps=100",
        "trainer.steps_per_loop=1",
        "trainer.log_every=10",
        "checkpoint.every_steps=5",
        "optimizer=sgd",
        "optimizer.lr=1e30",
        "callbacks=terminate_on_nan",
    )
    stopped = run.summary["stopped_early"]
    assert (
        stopped["reason"] == "callbacks.terminate_on_nan: TerminateOnNaN set model.stop_training"
        and stopped["step"] < 10
    )
    saved = sorted(int(p.name[5:-6]) for p in (run.dir / "checkpoints").glob("ckpt-*.index"))
    assert all(step < stopped["step"] for step in saved)  # the NaN step is not saved over the good ones
    weights = run.weights() if saved else {}
    assert all(np.all(np.isfinite(w)) for w in weights.values())


# Each hook's last call in a run of 20 steps, two calls of 10: the end hooks at step 20, the begin hooks at 10.
FAILS = {
    "on_epoch_end": 20,
    "on_train_batch_end": 20,
    "on_train_end": 20,
    "on_epoch_begin": 10,
    "on_train_batch_begin": 10,
}


@pytest.mark.parametrize("hook", FAILS)
def test_a_callback_failing_at_its_last_call_keeps_the_steps_trained(tmp_path, hook):
    """20 of 20 steps, no periodic checkpoint: the failure's line names the
    callback, its hook and step, and says truly what was saved: every step
    (a failure before a call's steps is held until they are done)."""
    with pytest.raises(PluginFailed) as raised:
        train(
            tmp_path / "run",
            "trainer.steps=20",
            "trainer.steps_per_loop=10",
            "trainer.log_every=10",
            "checkpoint.every_steps=0",
            "+callbacks.x._target_=user_plugins.FailsIn",
            f"+callbacks.x.hook={hook}",
            f"+callbacks.x.step={FAILS[hook]}",
        )
    line = str(raised.value)
    saved = sorted(int(p.name[5:-6]) for p in (tmp_path / "run" / "checkpoints").glob("ckpt-*.index"))
    assert line.startswith(
        f"callbacks.x (user_plugins.FailsIn) raised RuntimeError in {hook} at step {FAILS[hook]}: boom; "
    ), line
    assert saved == [20] and "saved (step 20)" in line, line
    assert raised.value.code == 1


@pytest.mark.parametrize("hook", ["on_train_batch_end", "on_epoch_begin"])
def test_ctrl_c_inside_a_callback_is_an_interrupt_not_the_callbacks_failure(tmp_path, hook):
    """Ctrl-C landing in a C call inside a hook comes out as SystemError: it
    stays Ctrl-C (exit 130, commands/task.py), not "callbacks.x raised"."""
    with pytest.raises(KeyboardInterrupt):
        train(
            tmp_path / "run",
            "trainer.steps=20",
            "trainer.steps_per_loop=10",
            "trainer.log_every=10",
            "checkpoint.every_steps=0",
            "+callbacks.x._target_=user_plugins.FailsIn",
            f"+callbacks.x.hook={hook}",
            f"+callbacks.x.step={FAILS[hook]}",
            "+callbacks.x.interrupted=true",
        )


def test_ctrl_c_wrapped_by_a_c_call_leaves_the_one_line_guard_as_ctrl_c():
    with pytest.raises(KeyboardInterrupt):
        with one_line_errors():
            raise SystemError(
                "<built-in method __array__ of numpy.ndarray> returned a result with an exception set"
            ) from KeyboardInterrupt()


def test_an_error_after_ctrl_c_leaves_the_one_line_guard_as_ctrl_c():
    """A peer stopped by the same Ctrl-C fails this task's next step with
    TensorFlow's UnavailableError: that is Ctrl-C's too (exit 130, no line).
    Ctrl-C interrupts here as in a task (a suite started in the background
    by a shell without job control inherits SIGINT ignored)."""
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            with one_line_errors():
                try:
                    os.kill(os.getpid(), signal.SIGINT)
                    time.sleep(10)
                except KeyboardInterrupt:
                    pass
                raise RuntimeError("UnavailableError: the peer went away")
    finally:
        signal.signal(signal.SIGINT, inherited)


@pytest.mark.parametrize(
    "override, refusal",
    [
        (
            "+callbacks.b._target_=keras.callbacks.BackupAndRestore",
            "tfdistx resumes every run from its own checkpoints",
        ),
        ("+callbacks.e._target_=keras.callbacks.SwapEMAWeights", "not supported"),
    ],
)
def test_a_keras_callback_whose_job_tfdistx_does_is_refused_before_tensorflow(tmp_path, override, refusal):
    lines = refused(tmp_path, override)
    assert len(lines) == 1 and refusal in lines[0], lines


def test_early_stopping_restoring_best_weights_is_refused_pointing_at_keep_best(tmp_path):
    lines = refused(
        tmp_path, "+callbacks.s._target_=keras.callbacks.EarlyStopping", "+callbacks.s.restore_best_weights=true"
    )
    assert len(lines) == 1 and "checkpoint.keep_best=true" in lines[0], lines


def test_a_subclass_of_a_refused_callback_is_refused_when_built(tmp_path):
    from tfdistx.core.errors import ConfigError

    with pytest.raises(ConfigError) as raised:
        train(
            tmp_path / "run", "+callbacks.b._target_=user_plugins.MyBackup", f"+callbacks.b.backup_dir={tmp_path / 'b'}"
        )
    assert "keras.callbacks.BackupAndRestore is not used by tfdistx" in str(raised.value)


def test_a_plain_function_is_an_action_with_its_keys_bound(tmp_path):
    run = train(
        tmp_path / "run",
        "trainer.steps=30",
        "trainer.log_every=10",
        "trainer.steps_per_loop=10",
        "+callbacks.note._target_=user_plugins.note_step",
        f"+callbacks.note.path={tmp_path / 'steps.txt'}",
    )
    assert (tmp_path / "steps.txt").read_text().split() == ["10", "20", "30"] and run.summary["step"] == 30


def test_progbar_logger_draws_steps_within_an_epoch(tmp_path, capsys):
    train(
        tmp_path / "run",
        "trainer.steps=20",
        "trainer.log_every=10",
        "trainer.steps_per_loop=5",
        "+callbacks.bar._target_=keras.callbacks.ProgbarLogger",
    )
    out = capsys.readouterr().out
    assert "Epoch 2/2" in out and "10/10" in out and "20/10" not in out


def test_keras_csv_logger_has_val_columns_only_for_metrics(tmp_path):
    train(
        tmp_path / "run",
        "trainer.steps=30",
        "trainer.log_every=10",
        "trainer.eval_every=30",
        "trainer.steps_per_loop=10",
        "+callbacks.csv._target_=keras.callbacks.CSVLogger",
        f"+callbacks.csv.filename={tmp_path / 'run' / 'k.csv'}",  # absolute, inside the run dir
    )
    header = next(csv.reader(open(tmp_path / "run" / "k.csv")))
    assert header == ["epoch", "accuracy", "learning_rate", "loss", "step", "val_accuracy", "val_loss"]


def test_the_docs_table_says_what_tfdistx_refuses():
    from pathlib import Path

    from tfdistx.core import callbacks

    page = (Path(__file__).resolve().parents[1] / "docs" / "own-project.md").read_text()
    rows = {line.split("|")[1].strip(" `"): line for line in page.splitlines() if line.startswith("| `")}
    for name in callbacks.REFUSED:
        assert "refused" in rows[name], name
    for name, (key, _, _) in callbacks.REFUSED_WITH.items():
        assert f"{key}=true` is refused" in rows[name], name
