"""The engine's parts driven directly, in this process: Schedule, the outer
loop over a real step runner (real TensorFlow, one device), and the
input-skip arithmetic. No subprocesses."""

import numpy as np
import pytest
import tensorflow as tf

from tfdistx.core.run_spec import Optimizer
from tfdistx.data import sources as data_lib
from tfdistx.data import input as input_lib
from tfdistx.engine.loop import Log, Loop, SaveCheckpoints, Schedule
from tfdistx.engine.metrics import MetricSet
from tfdistx.models import mlp
from tfdistx.engine.optim import LearningRateAtStep, build_optimizer
from tfdistx.engine.runner import SyncRunner
from tfdistx.tasks.classification import Classification
from tfdistx.engine.update import Update


@pytest.mark.unit
def test_the_loop_stops_at_every_due_action():
    schedule = Schedule(steps=250, steps_per_loop=100, log_every=30, eval_every=100)
    loop = Loop(None, schedule, None, [SaveCheckpoints(Recorder(), every=120)])
    stops, step = [], 0
    while step < schedule.steps:
        step = loop.next_stop(step)
        stops.append(step)
    assert stops == [30, 60, 90, 100, 120, 150, 180, 200, 210, 240, 250]
    assert schedule.logs_at(250) and schedule.evaluates_at(250) and not schedule.evaluates_at(240)


@pytest.mark.unit
@pytest.mark.parametrize(
    "steps_done, replicas, pipelines, skipped",
    [
        (0, 1, 1, 0),
        (100, 1, 1, 100),  # one device: a batch a step
        (100, 4, 1, 400),  # mirrored over 4: one pipeline feeds 4 replica batches a step
        (100, 2, 2, 100),  # 2 workers: each pipeline feeds its own replica
        (100, 1, 2, 50),  # 2 parameter-server workers: each has done half the steps
    ],
)
def test_batches_skipped_on_resume(steps_done, replicas, pipelines, skipped):
    assert input_lib.batches_to_skip(steps_done, replicas, pipelines) == skipped


class Recorder:
    def __init__(self):
        self.records, self.saved = [], []

    def __call__(self, step, metrics):
        self.records.append((step, metrics))

    def save(self, step):
        self.saved.append(step)

    def save_in_background(self, step, latest=True):
        if latest:
            self.saved.append(step)


@pytest.mark.unit
def test_loop_runs_steps_logs_evaluates_and_saves():
    tf.keras.utils.set_random_seed(0)
    strategy = tf.distribute.get_strategy()
    source = data_lib.synthetic(image_shape=(4, 4, 1), num_classes=3, train_examples=256, eval_examples=64)
    task = Classification(metrics=("accuracy",))
    model = mlp((4, 4, 1), 3, hidden_units=(8,))
    learning_rate = LearningRateAtStep(0.01)
    optimizer = build_optimizer(
        Optimizer(
            "sgd",
            target="keras.optimizers.SGD",
            lr=0.01,
            schedule="constant",
            warmup_steps=0,
            min_lr_ratio=0.0,
            scale_lr_with_replicas=False,
            clip_norm=None,
            global_clip_norm=None,
            options={},
        ),
        learning_rate,
    )
    metrics = MetricSet(task.metrics())
    features, labels = next(iter(source.train(None).batch(2)))
    metrics.build(*task.metric_inputs(labels, model(features)))
    runner = SyncRunner(
        strategy,
        task,
        model,
        Update(task, model, optimizer, global_batch=32, learning_rate=learning_rate),
        metrics,
        train_data=input_lib.train_dataset(strategy, source, 32, seed=0, shuffle_buffer=256),
        eval_data=input_lib.eval_dataset(strategy, source.eval, 32),
    )
    counter, recorder = tf.Variable(0, dtype=tf.int64), Recorder()
    result = Loop(
        runner,
        Schedule(steps=50, steps_per_loop=20, log_every=20, eval_every=25),
        counter,
        [Log([recorder]), SaveCheckpoints(recorder, every=40)],
        learning_rate_at=learning_rate.at,
    ).run()

    assert result.step == 50 and int(counter.numpy()) == 50
    assert [step for step, _ in recorder.records] == [20, 25, 40, 50]
    assert recorder.saved == [40, 50]
    by_step = dict(recorder.records)
    assert set(by_step[20]) == {"loss", "accuracy", "lr", "examples_per_sec"}
    assert set(by_step[25]) == {"eval/loss", "eval/accuracy"}
    assert by_step[40]["lr"] == pytest.approx(0.01)
    # eval over the whole split: 64 examples, counted exactly once
    assert result.eval["eval/accuracy"] * 64 == pytest.approx(round(result.eval["eval/accuracy"] * 64))
    assert np.isfinite(result.train["loss"])


@pytest.mark.unit
def test_step_lines_reach_the_runs_log_file_once(tmp_path, capsys):
    """A single run's tfdistx.log (Hydra's file handler) holds the step lines the terminal shows."""
    import logging

    from tfdistx.loggers.progress import ConsoleProgress

    handler = logging.FileHandler(tmp_path / "tfdistx.log")
    logging.getLogger().addHandler(handler)
    try:
        progress = ConsoleProgress(total_steps=20)
        progress(10, {"loss": 1.5})
        progress(20, {"loss": 1.25})
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    shown = capsys.readouterr().out.splitlines()
    assert shown[0] == "step 10/20  loss   1.500" and shown[1].startswith("step 20/20  loss   1.250")
    assert (tmp_path / "tfdistx.log").read_text().splitlines() == shown


@pytest.mark.unit
@pytest.mark.parametrize(
    "steps, log_every, eval_every", [(250, 30, 100), (100, 10, 0), (95, 10, 25), (40, 40, 0), (12, 4, 6)]
)
def test_keras_epochs_count_the_records_made_whatever_step_a_run_starts_from(steps, log_every, eval_every):
    """records_until and epoch_start against the records counted one step at a time."""
    schedule = Schedule(steps=steps, steps_per_loop=7, log_every=log_every, eval_every=eval_every)
    records = [s for s in range(1, steps + 1) if schedule.logs_at(s) or schedule.evaluates_at(s)]
    for step in range(steps + 1):
        assert schedule.records_until(step) == sum(1 for r in records if r <= step)
        assert schedule.epoch_start(step) == max([0, *(r for r in records if r <= step)])
    assert schedule.records_until(steps) == len(records) and records[-1] == steps


class _Steps:
    """A runner whose steps do nothing: the loop's own order is what is watched."""

    def train(self, step, num_steps):
        return np.zeros(1)

    def results(self, totals):
        return {"loss": 1.0}

    def examples(self, totals):
        return 0.0

    def evaluate(self):
        return {}


@pytest.mark.unit
def test_an_action_overrides_only_the_hooks_it_needs():
    """The loop's actions share one base whose every hook is a no-op (as
    Keras' Callback): the base itself is an action that does nothing, and a
    subclass that overrides two hooks is called at those, in the loop's order,
    its stop ending the run there; a user's action through the callbacks'
    guard (a subclass, and a plain callable with one hook) is called the same."""
    from tfdistx.engine.callbacks import Guarded
    from tfdistx.engine.loop import Action

    class StopAfter(Action):
        def __init__(self, at):
            self.at, self.seen = at, []

        def before_steps(self, step):
            self.seen.append(("before_steps", step))

        def __call__(self, step, record):
            self.seen.append(("call", step))
            self.stop_requested = "enough" if step >= self.at else None

    class Plain:  # no base: the hooks it has are called, the others not looked for
        def __init__(self):
            self.finished = None

        def __call__(self, step, record):
            pass

        def finish(self, step):
            self.finished = step

    mine, theirs, plain = StopAfter(20), StopAfter(100), Plain()
    actions = [Action(), mine, Guarded("theirs", "tests.StopAfter", theirs), Guarded("plain", "tests.Plain", plain)]
    result = Loop(
        _Steps(), Schedule(steps=50, steps_per_loop=10, log_every=10, eval_every=0), tf.Variable(0), actions
    ).run()

    assert result.step == 20 and result.stopped_early == {"step": 20, "reason": "enough"}
    assert mine.seen == theirs.seen == [("before_steps", 0), ("call", 10), ("before_steps", 10), ("call", 20)]
    assert plain.finished == 20
    assert not Action().wants_train_metrics() and not actions[3].wants_train_metrics()
