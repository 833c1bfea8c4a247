"""Warm starts (checkpoint.init_from, init_skip), the best checkpoint
(checkpoint.keep_best) and early stopping (trainer.early_stopping), in this
process (-m unit): real TensorFlow, real strategies on logical CPUs, real
checkpoints, Keras files and SavedModels in tmp_path. The multi-worker case
runs as real processes in test_own_project_engine.py."""

import json
import os
import shutil
import zipfile

import keras
import numpy as np
import pytest
import tensorflow as tf
from omegaconf import OmegaConf, open_dict

from config_helpers import compose_ok, refused
from engine_helpers import QUICK, SMALL, copied, train
from tfdistx.cluster.placement import Placement
from tfdistx.core.errors import EXIT_RUN_DIR_LOCKED, ConfigError, RunFault
from tfdistx.engine import checkpointing
from tfdistx.engine import warm_start as warm_start_lib
from tfdistx.engine.build import build_run
from tfdistx.engine.loop import Loop, SaveCheckpoints, Schedule, TrackObjective
from tfdistx.engine.parts import model_from_checkpoint

pytestmark = pytest.mark.unit

TINY_STEP = [
    "optimizer.lr=1e-9",
    "trainer.steps=1",
]  # one step that moves no weight by more than ~1e-9: the weights a run starts with
# eval/accuracy peaks early, then the high learning rate loses it (deterministic: the same history every time)
WORSENS = [
    "optimizer.lr=0.03",
    "trainer.eval_every=5",
    "trainer.log_every=5",
    "trainer.steps_per_loop=5",
    "trainer.deterministic=true",
]


def source_run(run_dir, *overrides):
    """A run trained here, with the .hydra/config.yaml Hydra writes for a CLI run (its saved config)."""
    trained = train(run_dir, *overrides)
    cfg = compose_ok(run_dir, *QUICK, *SMALL, *overrides)
    with open_dict(cfg):
        del cfg["hydra"]
    (run_dir / ".hydra").mkdir()
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
    return trained


@pytest.fixture(scope="module")
def mlp_source(tmp_path_factory):
    """The default MLP's source run (40 steps), trained once a module in each pytest worker that runs its
    tests: most warm starts below start from it and only read it (training it anew in each of 10 tests was
    ~0.8 CPU s each). A test that changes or removes its source copies it first (`own_source`)."""
    run_dir = tmp_path_factory.mktemp("warm_source") / "source"
    return source_run(run_dir)


def own_source(mlp_source, run_dir):
    """A copy of the shared source run at `run_dir`, for a test that changes its files (engine_helpers.copied),
    with the .hydra/config.yaml source_run wrote."""
    return copied(mlp_source, run_dir)


def by_position(run) -> list:
    """The trainable variables of a run's newest checkpoint, in model order."""
    weights = run.weights()
    return [weights[name] for name in sorted(weights, key=lambda name: int(name.split("/")[2]))]


def evals(run, name="eval/accuracy") -> list:
    return [(m["step"], m[name]) for m in run.metrics if name in m]


# -- warm starts ------------------------------------------------------------------


WIDE_DEEP = [
    "task=binary",
    "data=synthetic_categorical",
    "model=wide_deep",
    "model.vocab_size=2000",
    "data.vocab_size=2000",
    "model.hidden_units=[32]",
    "model.shards=2",
]  # table shards the checkpoint reaches only through the optimizer


@pytest.mark.parametrize("model", [[], WIDE_DEEP], ids=["mlp", "wide_deep"])
def test_a_warm_start_begins_at_the_source_runs_final_weights_with_fresh_optimizer_slots(tmp_path, model, mlp_source):
    source = source_run(tmp_path / "source", *model) if model else mlp_source
    warm = train(tmp_path / "warm", *model, f"checkpoint.init_from={source.dir}", *TINY_STEP)
    assert (warm.summary["step"], warm.summary["resumed"], warm.summary["init_from"]) == (1, False, str(source.dir))
    for there, here in zip(by_position(source), by_position(warm), strict=True):
        np.testing.assert_allclose(here, there, atol=1e-6)
    reader = tf.train.load_checkpoint(str(tmp_path / "warm" / "checkpoints" / "ckpt-1"))
    assert (
        reader.get_tensor("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE") == 1
    )  # the source's 40 steps are not carried over


def test_a_warm_start_of_a_schedule_free_optimizer_trains_from_the_loaded_weights(tmp_path, mlp_source):
    """ScheduleFreeAdamW keeps a second set of weights, which its build
    copies from the model's: after a warm start they must be the loaded
    weights, or its first step interpolates back to the fresh ones (0.47
    off the source after one step, before the fix)."""
    source = mlp_source
    warm = train(
        tmp_path / "warm",
        f"checkpoint.init_from={source.dir}",
        "optimizer.name=schedulefreeadamw",
        "strategy=mirrored",
        "cluster=1x2",
        *TINY_STEP,
    )
    for there, here in zip(by_position(source), by_position(warm), strict=True):
        np.testing.assert_allclose(here, there, atol=1e-6)


@pytest.mark.parametrize("strategy", [["strategy=one_device"], ["strategy=mirrored", "cluster=1x2"]])
def test_a_warm_start_with_a_new_head_keeps_the_head_fresh(tmp_path, strategy, caplog, mlp_source):
    source = mlp_source
    new_task = ["data.num_classes=5", *strategy, *TINY_STEP]
    caplog.set_level("INFO", logger="tfdistx")
    warm = train(tmp_path / "warm", f"checkpoint.init_from={source.dir}", "checkpoint.init_skip=[head/]", *new_task)
    fresh = train(tmp_path / "fresh", *new_task)  # the same seed: the initial values the head keeps
    there, here, initial = by_position(source), by_position(warm), by_position(fresh)
    assert [w.shape for w in here] == [(784, 128), (128,), (128, 5), (5,)]
    for index in (0, 1):  # the hidden layer: the source's
        np.testing.assert_allclose(here[index], there[index], atol=1e-6)
    for index in (2, 3):  # the head: as a fresh run starts it
        np.testing.assert_allclose(here[index], initial[index], atol=1e-6)
    assert (
        "2 variables loaded, 2 left freshly initialised (checkpoint.init_skip: mlp/head/kernel, mlp/head/bias)"
        in caplog.text
    )


def test_a_shape_mismatch_is_refused_naming_the_variables(tmp_path, mlp_source):
    with pytest.raises(ConfigError) as caught:
        train(tmp_path / "warm", f"checkpoint.init_from={mlp_source.dir}", "data.num_classes=5")
    [line] = caught.value.lines()
    assert line.startswith(f"tfdistx: invalid config: checkpoint.init_from='{mlp_source.dir}': 2 variables of ckpt-40")
    assert (
        "mlp/head/kernel (128, 5) here" in line
        and "(128, 10) there" in line
        and "checkpoint.init_skip=['head/']" in line
    )
    assert not (tmp_path / "warm" / "checkpoints").exists() or not any((tmp_path / "warm" / "checkpoints").iterdir())


def test_an_init_skip_that_matches_no_variable_is_refused(tmp_path, mlp_source):
    with pytest.raises(ConfigError) as caught:
        train(tmp_path / "warm", f"checkpoint.init_from={mlp_source.dir}", "checkpoint.init_skip=[nope/]")
    [line] = caught.value.lines()
    assert "checkpoint.init_skip='nope/': matches no variable of this run's model; its variables: mlp/dense" in line
    assert "mlp/head/kernel" in line


@pytest.mark.parametrize("file_name", ["model.weights.h5", "model.keras"])
def test_a_warm_start_from_a_keras_file(tmp_path, file_name, mlp_source):
    source = mlp_source
    model, *_ = model_from_checkpoint(source.spec, str(source.dir / "checkpoints" / "ckpt-40"))
    path = tmp_path / file_name
    model.save_weights(path) if file_name.endswith(".weights.h5") else model.save(path)
    warm = train(tmp_path / "warm", f"checkpoint.init_from={path}", *TINY_STEP)
    for there, here in zip(by_position(source), by_position(warm), strict=True):
        np.testing.assert_allclose(here, there, atol=1e-6)


def test_keras_files_that_are_damaged_or_of_another_model_are_refused_in_one_line(tmp_path):
    (tmp_path / "random.keras").write_bytes(bytes(range(256)) * 8)
    with zipfile.ZipFile(tmp_path / "other.keras", "w") as archive:
        archive.writestr("notes.txt", "not a model")
    (tmp_path / "random.weights.h5").write_bytes(bytes(range(256)) * 8)
    for name, why in [
        ("random.keras", "is not a Keras .keras file (not a zip archive: damaged, or another kind of file)"),
        ("other.keras", "is not a Keras .keras file (a zip archive without the config.json of a Keras model)"),
        ("random.weights.h5", "is not a Keras .weights.h5 file (not HDF5: damaged, or another kind of file)"),
    ]:
        [line] = refused(
            tmp_path / "run", f"checkpoint.init_from={tmp_path / name}"
        )  # before TensorFlow: the config's own check
        assert line.startswith(f"tfdistx: invalid config: checkpoint.init_from='{tmp_path / name}': {why}"), line
    small = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4), keras.layers.Dense(3)])
    small.save_weights(tmp_path / "small.weights.h5")
    with pytest.raises(ConfigError) as caught:
        train(tmp_path / "warm", f"checkpoint.init_from={tmp_path / 'small.weights.h5'}")
    [line] = caught.value.lines()
    assert line.startswith(
        f"tfdistx: invalid config: checkpoint.init_from='{tmp_path / 'small.weights.h5'}': cannot be loaded into "
        "this run's model: it holds 4 arrays ((6, 4), (4,), (4, 3), (3,)), this run's model 4 ((784, 128), "
        "(128,), (128, 10), (10,)); a .weights.h5 is read as this run's model"
    ), line
    assert "\n" not in line


def test_a_source_checkpoint_rotated_away_while_read_is_taken_again_at_the_newest(tmp_path, caplog, mlp_source):
    """What a warm start from a run still training meets: the newest
    checkpoint it found is removed (as CheckpointManager's max_to_keep
    removes it: the .index first) by the time it is read, and a newer one is
    there. Real files, a real restore; the rotation made at that moment."""
    source = own_source(mlp_source, tmp_path / "source")  # its checkpoints are rotated below
    checkpoints, expected = tmp_path / "source" / "checkpoints", by_position(source)

    rotations = [1]  # how many of the next reads find their checkpoint rotated away

    def rotated_first(spec, path, given, into):
        if rotations[0]:
            rotations[0] -= 1
            newer = str(checkpoints / f"ckpt-{int(path.rsplit('-', 1)[1]) + 10}")
            for part in sorted(
                checkpoints.glob(f"{os.path.basename(path)}.*"), key=lambda p: not p.name.endswith(".index")
            ):
                shutil.copy(part, newer + part.name[len(os.path.basename(path)) :])
                part.unlink()
        return warm_start_lib.restored(spec, path, given, into)

    caplog.set_level("WARNING", logger="tfdistx")
    path, model = warm_start_lib.newest_restored(source.spec, str(tmp_path / "source"), restore=rotated_first)
    assert path == str(checkpoints / "ckpt-50") and "ckpt-40 was removed while it was read" in caplog.text
    for there, here in zip(
        expected, [w.numpy() for w in model.trainable_weights], strict=True
    ):  # ckpt-40's values, now in ckpt-50
        np.testing.assert_allclose(here, there)

    rotations[0] = 3
    with pytest.raises(RunFault) as caught:  # rotated away every time: a later try can succeed, exit 7
        warm_start_lib.newest_restored(source.spec, str(tmp_path / "source"), restore=rotated_first)
    assert caught.value.code == EXIT_RUN_DIR_LOCKED
    [line] = caught.value.lines()
    assert "its newest checkpoint was removed while it was read, 3 times (ckpt-50, ckpt-60, ckpt-70)" in line, line


def test_a_rerun_of_a_warm_started_run_resumes_and_does_not_initialise_again(tmp_path, caplog, mlp_source):
    own_source(mlp_source, tmp_path / "source")  # removed below
    args = [f"checkpoint.init_from={tmp_path / 'source'}", "trainer.steps=20"]
    first = train(tmp_path / "warm", *args)
    caplog.set_level("INFO", logger="tfdistx")
    shutil.rmtree(tmp_path / "source")  # a source gone since does not stop the resume
    resumed = train(tmp_path / "warm", *args[:1], "trainer.steps=40")
    assert (resumed.summary["resumed_from_step"], resumed.summary["step"]) == (20, 40)
    assert "is not applied: it initialises a new run, and this one resumes from its own checkpoint" in caplog.text
    assert first.summary["weights_sha256"] != resumed.summary["weights_sha256"]


@pytest.mark.parametrize(
    "overrides, phrase",
    [
        (
            ["checkpoint.init_from=/nonexistent/run"],
            "checkpoint.init_from='/nonexistent/run': does not exist; allowed: a tfdistx run directory",
        ),
        (
            ["checkpoint.init_from=/tmp", "checkpoint.init_skip=[head/]"],
            "is a directory, but not a tfdistx run directory (no .hydra/config.yaml)",
        ),
        (["checkpoint.init_skip=[head/]"], "checkpoint.init_skip=['head/']: only applies with checkpoint.init_from"),
        (
            ["trainer.early_stopping.patience=0"],
            "trainer.early_stopping.patience=0: evaluations without an improvement: at least 1",
        ),
        (
            ["trainer.early_stopping.min_delta=-1"],
            "trainer.early_stopping.min_delta=-1.0: must be a finite number, 0 or more",
        ),
        (
            ["trainer.early_stopping.patience=3", "trainer.eval_every=0"],
            "trainer.early_stopping.patience=3: counts evaluations of trainer.objective=eval/accuracy, "
            "and trainer.eval_every=0",
        ),
    ],
)
def test_bad_warm_start_and_early_stopping_keys_are_refused_before_tensorflow(tmp_path, overrides, phrase):
    [line] = refused(tmp_path / "run", *overrides)
    assert phrase in line, line


def test_a_run_without_checkpoints_a_directory_of_checkpoints_and_a_bad_regex_are_refused(tmp_path):
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / ".hydra").mkdir()
    (tmp_path / "run" / ".hydra" / "config.yaml").write_text("checkpoint: {dir: null}\n")
    [line] = refused(tmp_path / "new", f"checkpoint.init_from={tmp_path / 'run'}")
    assert "that run has no checkpoint yet" in line, line
    (tmp_path / "run" / "checkpoints" / "ckpt-5.index").write_text("")
    lines = refused(
        tmp_path / "new", f"checkpoint.init_from={tmp_path / 'run' / 'checkpoints'}", "checkpoint.init_skip=['(']"
    )
    assert len(lines) == 2 and "is a directory of checkpoints: name one" in lines[0], lines
    assert "checkpoint.init_skip='(': is not a regular expression" in lines[1], lines


# -- the best checkpoint ----------------------------------------------------------


def test_keep_best_keeps_the_best_evaluation_and_exports_it(tmp_path):
    run = train(
        tmp_path / "run",
        *WORSENS,
        "checkpoint.keep_best=true",
        "checkpoint.export=true",
        "checkpoint.max_to_keep=1",
        "checkpoint.every_steps=5",
    )
    history = evals(run)
    best_step, best_value = history[
        int(np.argmax([v for _, v in history]))
    ]  # the first of equals: only a strict improvement replaces it
    assert best_step < 40, history  # the construction: accuracy peaks early, then the high learning rate loses it
    best_dir = tmp_path / "run" / "checkpoints" / "best"
    assert run.summary["best"] == {
        "step": best_step,
        "value": best_value,
        "objective": "eval/accuracy",
        "checkpoint": str(best_dir / f"ckpt-{best_step}"),
    }
    assert sorted(p.name for p in best_dir.glob("*.index")) == [
        f"ckpt-{best_step}.index"
    ]  # max_to_keep=1 did not rotate it away
    assert run.objective == best_value  # what a sweep is told: the kept model's value
    assert checkpointing.find(str(tmp_path / "run" / "checkpoints"), best_step) == str(
        best_dir / f"ckpt-{best_step}"
    )  # --step N
    # the export is the best checkpoint's model, not the last
    features = tf.random.stateless_uniform((8, 28, 28, 1), seed=(1, 2))
    exported = tf.saved_model.load(str(tmp_path / "run" / "export")).signatures["serving_default"](features=features)[
        "logits"
    ]
    for checkpoint, same in (
        (best_dir / f"ckpt-{best_step}", True),
        (tmp_path / "run" / "checkpoints" / "ckpt-40", False),
    ):
        model, *_ = model_from_checkpoint(run.spec, str(checkpoint))
        assert np.allclose(exported, model(features), atol=1e-5) == same, checkpoint


def test_the_best_survives_a_resume(tmp_path):
    args = [*WORSENS, "checkpoint.keep_best=true"]
    train(tmp_path / "run", *args, "trainer.steps=20")
    resumed = train(tmp_path / "run", *args)
    history = evals(resumed)  # both parts: the lines before the checkpoint are kept
    assert [step for step, _ in history] == [5, 10, 15, 20, 25, 30, 35, 40]
    best_step, best_value = history[int(np.argmax([v for _, v in history]))]
    assert best_step <= 20, (
        history
    )  # the construction: a resume that took its first evaluation for the best would keep a later step
    assert (resumed.summary["best"]["step"], resumed.summary["best"]["value"]) == (best_step, best_value)
    assert [p.name for p in (tmp_path / "run" / "checkpoints" / "best").glob("*.index")] == [f"ckpt-{best_step}.index"]


def test_a_checkpoint_written_before_the_objective_state_still_restores(tmp_path):
    """Checkpoints of earlier tfdistx hold no objective state: resumed whole
    without it, keep_best then starts from the evaluations after the resume."""
    first = train(tmp_path / "run", *WORSENS, "trainer.steps=20")
    run = build_run(first.spec, Placement())
    path = str(tmp_path / "run" / "checkpoints" / "ckpt-20")
    run.checkpointer.restore(path)
    old = {name: value for name, value in run.checkpointer.trackables.items() if name != "objective"}
    run.checkpointer.close()
    shutil.rmtree(tmp_path / "run" / "checkpoints")
    tf.train.CheckpointManager(
        tf.train.Checkpoint(**old), str(tmp_path / "run" / "checkpoints"), max_to_keep=3, checkpoint_name="ckpt"
    ).save(checkpoint_number=20)
    assert not [k for k in tf.train.load_checkpoint(path).get_variable_to_shape_map() if k.startswith("objective/")]
    resumed = train(tmp_path / "run", *WORSENS, "checkpoint.keep_best=true")
    assert resumed.summary["resumed_from_step"] == 20
    after = [(s, v) for s, v in evals(resumed) if s > 20]
    assert resumed.summary["best"]["step"] == after[int(np.argmax([v for _, v in after]))][0]


# -- early stopping ---------------------------------------------------------------


def stops_at(history, patience, lower_is_better=False, min_delta=0.0):
    """Keras' EarlyStopping rule over an eval history: the step it stops at, or None."""
    reference, waited = None, 0
    for step, value in history:
        better = reference is None or (
            value < reference - min_delta if lower_is_better else value > reference + min_delta
        )
        reference, waited = (value, 0) if better else (reference, waited + 1)
        if waited >= patience:
            return step
    return None


def test_early_stopping_stops_where_the_eval_history_says_and_a_rerun_trains_nothing(tmp_path, caplog):
    args = [*WORSENS, "trainer.early_stopping.patience=2", "checkpoint.every_steps=0"]
    run = train(tmp_path / "run", *args)
    history = evals(run)
    stop = stops_at(history, patience=2)
    assert stop is not None and stop < 40 and history[-1][0] == stop, (
        history
    )  # the construction, and no evaluation after it
    assert run.summary["step"] == stop and run.summary["stopped_early"]["step"] == stop
    assert "eval/accuracy has not improved by more than 0 for 2 evaluations" in run.summary["stopped_early"]["reason"]
    assert (
        run.summary["best"]["checkpoint"] is None and run.summary["best"]["step"] < stop
    )  # no keep_best: no best/ checkpoint
    assert [p.name for p in (tmp_path / "run" / "checkpoints").glob("*.index")] == [
        f"ckpt-{stop}.index"
    ]  # the final save, there

    before = {name: (tmp_path / "run" / name).read_text() for name in ("summary.json", "metrics.jsonl")}
    caplog.set_level("INFO", logger="tfdistx")
    rerun = train(tmp_path / "run", *args, "trainer.steps=80")  # more steps asked for: still nothing to train
    assert {name: (tmp_path / "run" / name).read_text() for name in before} == before
    assert f"stopped early at step {stop}" in caplog.text and rerun.objective == run.summary["eval"]["eval/accuracy"]
    [evaluation] = [json.loads(line) for line in (tmp_path / "run" / "evaluations.jsonl").read_text().splitlines()]
    assert evaluation["step"] == stop


def test_early_stopping_with_keep_best_on_two_replicas_exports_the_best(tmp_path):
    run = train(
        tmp_path / "run",
        *WORSENS,
        "strategy=mirrored",
        "cluster=1x2",
        "trainer.early_stopping.patience=2",
        "checkpoint.keep_best=true",
        "checkpoint.export=true",
    )
    history = evals(run)
    best_step = history[int(np.argmax([v for _, v in history]))][0]
    assert run.summary["stopped_early"]["step"] == stops_at(history, 2) == history[-1][0] < 40
    assert run.summary["best"]["checkpoint"] == str(tmp_path / "run" / "checkpoints" / "best" / f"ckpt-{best_step}")
    assert (tmp_path / "run" / "export" / "saved_model.pb").is_file()


# -- the action and the loop, without TensorFlow ------------------------------------


class State:
    def __init__(self):
        self.value = {"best": None, "best_step": None, "reference": None, "waited": 0}

    def read(self):
        return dict(self.value)

    def write(self, state):
        self.value = dict(state)


class Runner:
    """Steps that do nothing; evaluations (or, `train=True`, logged training
    losses) that are the next of `values`."""

    def __init__(self, values, train=False):
        self.values, self.by_training, self.evaluations = iter(values), train, 0

    def train(self, step, num_steps):
        return np.zeros(1)

    def results(self, totals):
        return {"loss": next(self.values)} if self.by_training else {}

    def examples(self, totals):
        return 0.0

    def evaluate(self):
        self.evaluations += 1
        return {"eval/loss": 0.0 if self.by_training else next(self.values)}


class Counter:
    def __init__(self):
        self.value = 0

    def assign(self, value):
        self.value = value

    def numpy(self):
        return self.value


class Saves:
    def __init__(self):
        self.saved = []

    def save(self, step):
        self.saved.append(step)

    def save_in_background(self, step, latest=True):
        if latest:
            self.saved.append(step)


def test_the_loop_stops_when_an_action_asks_and_saves_there():
    saved_best, saves = [], Saves()
    tracker = TrackObjective("eval/loss", True, State(), save_best=saved_best.append, patience=2, min_delta=0.1)
    values = [3.0, 2.0, 1.95, float("nan"), 1.0]
    result = Loop(Runner(values), Schedule(50, 10, 10, 10), Counter(), [tracker, SaveCheckpoints(saves, 0)]).run()
    # 1.95 is a new best (kept) but not by more than min_delta; NaN never improves: patience spent at step 40
    assert result.stopped_early["step"] == result.step == 40 and saves.saved == [40]
    assert saved_best == [10, 20, 30]
    assert (
        tracker.state.read() == {"best": 1.95, "best_step": 30, "reference": 2.0, "waited": 2} and tracker.exhausted()
    )


def test_a_training_objective_counts_log_steps_and_the_stop_is_evaluated():
    runner = Runner([3.0, 3.5, 3.2, 1.0], train=True)
    tracker = TrackObjective("loss", True, State(), patience=2)
    result = Loop(runner, Schedule(50, 10, 10, 0), Counter(), [tracker]).run()
    assert (
        result.stopped_early["step"] == result.step == 30 and "loss has not improved" in result.stopped_early["reason"]
    )
    assert runner.evaluations == 1 and result.eval == {
        "eval/loss": 0.0
    }  # eval_every=0: evaluated once, where it stopped
