"""Your own callbacks (engine/callbacks.py) and the CSV and terminal
loggers (engine/loggers.py), in process on real TensorFlow: Keras
callbacks through their hooks, tfdistx actions, a callback that raises,
and runs stopped by a callback that resume bit for bit."""

import csv
import io
import json

import numpy as np
import pytest
import tensorflow as tf

from config_helpers import PREFIX, compose_ok, refused
from engine_helpers import train, whole_and_resumed
from tfdistx.core.errors import ConfigError, RunFault
from tfdistx.loggers.progress import ConsoleProgress, relayed_status
from tfdistx.loggers.sinks import CsvLogger

pytestmark = pytest.mark.unit

EVERY_TEN = ["trainer.log_every=10", "trainer.steps_per_loop=10", "checkpoint.every_steps=10"]


def test_a_keras_callback_stops_the_run_where_it_says_and_keras_csv_logger_writes_each_record(tmp_path):
    """StopBelow stops at the first record under its loss; Keras' CSVLogger
    has a row per record, its epoch numbered as Keras numbers them, its step
    column the step; the summary says who stopped it."""
    run = train(
        tmp_path / "run",
        *EVERY_TEN,
        "trainer.steps=200",
        "+callbacks.stop._target_=user_plugins.StopBelow",
        "+callbacks.stop.loss=2.1",
        "+callbacks.csv._target_=keras.callbacks.CSVLogger",
        "+callbacks.csv.filename=keras.csv",  # in the run dir
        "logger.csv=true",
    )
    first_below = next(m["step"] for m in run.metrics if m["loss"] < 2.1)
    assert run.summary["step"] == first_below < 200 and run.metrics[-1]["step"] == first_below
    assert run.summary["stopped_early"] == {
        "step": first_below,
        "reason": "callbacks.stop: StopBelow set model.stop_training",
    }
    rows = list(csv.DictReader(open(run.dir / "keras.csv")))
    assert [int(r["epoch"]) for r in rows] == list(range(len(run.metrics)))  # Keras' numbering: one epoch per record
    assert [int(float(r["step"])) for r in rows] == [m["step"] for m in run.metrics]
    assert [float(r["loss"]) for r in rows] == pytest.approx([m["loss"] for m in run.metrics])
    ours = list(csv.DictReader(open(run.dir / "metrics.csv")))
    assert [int(r["step"]) for r in ours] == [m["step"] for m in run.metrics] and float(
        ours[-1]["loss"]
    ) == run.metrics[-1]["loss"]


def test_a_tfdistx_action_stops_the_run_at_its_own_step(tmp_path):
    run = train(
        tmp_path / "run",
        *EVERY_TEN,
        "trainer.steps=100",
        "+callbacks.at._target_=user_plugins.StopAtStep",
        "+callbacks.at.step=35",
    )
    assert run.summary["stopped_early"] == {"step": 35, "reason": "callbacks.at: step 35 reached"}


def test_terminate_on_nan_stops_a_run_whose_loss_is_nan(tmp_path):
    run = train(
        tmp_path / "run",
        *EVERY_TEN,
        "trainer.steps=100",
        "optimizer=sgd",
        "optimizer.lr=1e30",
        "callbacks=terminate_on_nan",
    )
    assert (
        run.summary["stopped_early"]["reason"] == "callbacks.terminate_on_nan: TerminateOnNaN set model.stop_training"
    )
    assert run.summary["step"] < 100


def test_weights_that_stop_being_numbers_stop_the_run_and_are_never_saved_or_exported(tmp_path, caplog):
    """A loss that stays finite while weights it never reads turn NaN (an
    optimizer's 0/0 where their gradient stayed zero, as Keras' Adafactor's):
    the run stops at the first call that made them, with one line naming the
    variable; the newest checkpoint stays the last good one, and the export
    is of it."""
    args = [
        "data._target_=user_plugins.ids_data",
        "model._target_=user_plugins.embedded_ids",
        "optimizer._target_=user_plugins.AdamWithoutEpsilon",
        *EVERY_TEN,
        "checkpoint.export=true",
    ]
    train(tmp_path / "run", *args, "trainer.steps=20", sizes=[])  # epsilon 1e-7: the table's unread rows stay 0
    caplog.set_level("WARNING", logger="tfdistx")
    run = train(tmp_path / "run", *args, "trainer.steps=40", "+optimizer.zero_epsilon=true", sizes=[])
    why = "the weights are not numbers: table/embeddings has 40 of 80 entries NaN"
    assert run.summary["stopped_early"] == {"step": 30, "reason": why} and np.isfinite(run.metrics[-1]["loss"])
    assert (
        f"step 30: {why}; the run stops, and no checkpoint is saved from here on (the newest stays the one at step 20)"
        in caplog.text
    )
    assert sorted(p.name for p in (run.dir / "checkpoints").glob("ckpt-*.index")) == ["ckpt-10.index", "ckpt-20.index"]
    assert all(np.all(np.isfinite(w)) for w in run.weights().values())
    exported = tf.saved_model.load(str(run.dir / "export"))
    assert all(np.all(np.isfinite(v.numpy())) for v in exported.variables)


def test_a_callback_that_raises_stops_the_run_in_one_line_naming_it_and_keeps_the_checkpoints(tmp_path):
    with pytest.raises(RunFault) as raised:
        train(tmp_path / "run", *EVERY_TEN, "trainer.steps=100", "+callbacks.chat._target_=user_plugins.Raises")
    assert str(raised.value) == (
        "callbacks.chat (user_plugins.Raises) raised ValueError in on_epoch_end at step 20: the chat "
        "server said no; the steps trained are saved (step 20), and a rerun resumes from there"
    )
    assert raised.value.code == 1
    assert (tmp_path / "run" / "checkpoints" / "ckpt-20.index").exists()


def test_a_logger_that_raises_stops_the_run_in_one_line_naming_it_as_a_callback_is(tmp_path):
    """A user's logger (and any of tfdistx's: the same guard) that raises at a
    record: the run stops with a line naming it and the step, the steps
    trained saved; one that raises as it closes is named too."""
    with pytest.raises(RunFault) as raised:
        train(
            tmp_path / "run",
            *EVERY_TEN,
            "trainer.steps=100",
            "logger.boom._target_=user_plugins.RaisingLogger",
            "logger.boom.at=20",
        )
    assert str(raised.value) == (
        "logger.boom (user_plugins.RaisingLogger) raised ValueError at step 20: logger boom; "
        "the steps trained are saved (step 20), and a rerun resumes from there"
    )
    assert raised.value.code == 1
    assert (tmp_path / "run" / "checkpoints" / "ckpt-20.index").exists()
    with pytest.raises(RunFault) as raised:
        train(tmp_path / "closing", *EVERY_TEN, "trainer.steps=20", "logger.boom._target_=user_plugins.RaisingLogger")
    assert str(raised.value).startswith(
        "logger.boom (user_plugins.RaisingLogger) raised ValueError at step 20: logger boom; "
    )


def test_metrics_jsonl_is_written_a_whole_line_at_a_time_under_a_file_size_limit(tmp_path, capsys):
    """RLIMIT_FSIZE (a batch system's file-size limit; Python ignores
    SIGXFSZ): the write that would pass it fails (File too large) and leaves
    no half line, and the run's log file that hits it says so once, without
    Python's `--- Logging error ---` traceback."""
    import logging
    import resource

    from tfdistx.loggers.sinks import JsonlLogger
    from tfdistx.log_files import into_log_files

    logger, handler = JsonlLogger(str(tmp_path / "metrics.jsonl")), logging.FileHandler(tmp_path / "tfdistx.log")
    logging.getLogger().addHandler(handler)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    try:
        logger(10, {"loss": 1.0})
        resource.setrlimit(resource.RLIMIT_FSIZE, ((tmp_path / "metrics.jsonl").stat().st_size + 20, hard))
        with pytest.raises(OSError, match="File too large"):
            logger(20, {"loss": 0.5, "accuracy": 0.25})  # a line longer than the 20 bytes left
        for _ in range(3):
            into_log_files("x" * 100)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        logging.getLogger().removeHandler(handler)
        handler.close()
        logger.close()
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 10, "loss": 1.0}\n'
    err = capsys.readouterr().err
    assert "Logging error" not in err and "Traceback" not in err
    assert (
        err.count(f"{tmp_path / 'tfdistx.log'} cannot be written (File too large)") == 1
    )  # once (an earlier in-process run's log may say so too)


def test_mlflow_gets_each_step_once_its_checkpoint_is_saved_so_a_resumed_run_sends_no_step_twice(tmp_path):
    """MLflow has no way to take a point back: a point is sent once a
    checkpoint at or after its step is saved. A run killed past its last
    checkpoint never sent those steps, and resumed sends them once; one
    killed after a checkpoint, before it sent that step, sends it from
    metrics.jsonl as it resumes. Its store is the run's own SQLite file,
    its artifacts beside it."""
    from mlflow import MlflowClient

    from tfdistx.whole_files import append_jsonl
    from tfdistx.loggers.mlflow_logger import MlflowLogger

    run_dir, checkpoints = tmp_path / "run", tmp_path / "run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    keys = dict(experiment="tfdistx", tracking_uri=None, run_name=None, timeout=5, checkpoint_dir=checkpoints)

    def attempt(records, saved_after, resumed_from=0):
        """A run's attempt from `resumed_from`: each record logged (metrics.jsonl, then MLflow), then its checkpoint
        if saved."""
        lines = [line for line in (run_dir / "metrics.jsonl").read_text().splitlines()] if resumed_from else []
        (run_dir / "metrics.jsonl").write_text(
            "".join(line + "\n" for line in lines if json.loads(line)["step"] <= resumed_from)
        )
        logged = [
            json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        ]  # as the run's loggers pass it
        logger = MlflowLogger(run_dir, {"trainer": {"steps": 40}}, logged=logged, **keys)
        for step, loss in records:
            append_jsonl(run_dir / "metrics.jsonl", {"step": step, "loss": loss})
            logger(step, {"loss": loss})
            if step in saved_after:
                (checkpoints / f"ckpt-{step}.index").write_text("")
        return logger  # killed: never closed

    attempt([(10, 3.0), (20, 2.0)], saved_after={10})  # killed past its checkpoint: 20 is trained again
    attempt([(20, 2.5), (30, 1.5)], saved_after={20, 30}, resumed_from=10)  # killed after saving 30, before sending it
    # killed after MLflow stored 30's batch but before mlflow.json said so (the file as it was before that send)
    sent = json.loads((run_dir / "mlflow.json").read_text())
    after_30 = attempt([], saved_after=set(), resumed_from=30)  # the resume sends 30, once
    assert json.loads((run_dir / "mlflow.json").read_text())["sent_up_to"] == 30
    (run_dir / "mlflow.json").write_text(json.dumps({**sent, "sent_up_to": 20}) + "\n")
    assert after_30.run_id == sent["run_id"]
    last = attempt([(40, 1.0)], saved_after={40}, resumed_from=30)
    last.close()  # the end's checkpoint makes the last point final
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    assert [(m.step, m.value) for m in client.get_metric_history(last.run_id, "loss")] == [
        (10, 3.0),
        (20, 2.5),
        (30, 1.5),
        (40, 1.0),
    ]
    assert client.get_run(last.run_id).info.artifact_uri.startswith((run_dir / "mlartifacts").as_uri())
    assert (
        len(client.search_runs([client.get_experiment_by_name("tfdistx").experiment_id])) == 1
    )  # each attempt logged on into it


def test_step_lines_print_their_numbers_in_columns_that_line_up():
    from tfdistx.loggers.progress import fixed_width

    stream = io.StringIO()
    progress = ConsoleProgress(200, stream=stream, live=False)
    progress(100, {"loss": 1.3, "accuracy": 0.5, "examples_per_sec": 9876.0})
    progress(200, {"loss": 0.9639, "accuracy": 0.51234, "examples_per_sec": 123456.0})
    first, second = stream.getvalue().splitlines()
    assert first == "step 100/200  loss   1.300  accuracy  0.5000    9,876 ex/s"
    assert second.startswith("step 200/200  loss  0.9639  accuracy  0.5123  123,456 ex/s  ETA ")
    assert [fixed_width(v) for v in (0.06391, 12.35, 1234.0, 0.0002, 9.99996)] == [
        "0.06391",
        "  12.35",
        "   1234",
        "2.000e-04",
        "  10.00",
    ]


def test_a_run_with_callbacks_lion_and_a_schedule_resumes_bitwise(tmp_path):
    args = [
        *EVERY_TEN,
        "strategy=mirrored",
        "cluster=1x2",
        "trainer.deterministic=true",
        "optimizer._target_=keras.optimizers.Lion",
        (
            "optimizer.schedule={_target_:keras.optimizers.schedules.PiecewiseConstantDecay,"
            "boundaries:[20],values:[0.001,0.0003]}"
        ),
        "+callbacks.stop._target_=user_plugins.StopBelow",
        "+callbacks.stop.loss=0.0",
        "logger.csv=true",
    ]
    whole, resumed = whole_and_resumed(tmp_path, args, stop_at=20, steps=40)
    assert resumed.summary["weights_sha256"] == whole.summary["weights_sha256"]
    assert (resumed.dir / "metrics.csv").read_text().count("\n") == 1 + 4  # the header, and steps 10..40 once each


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "+callbacks.x._target_=nosuchpkg.Cb",
            "callbacks.x._target_='nosuchpkg.Cb': no module named 'nosuchpkg' is importable",
        ),
        ("callbacks=nope", "callbacks"),
        ("logger.csv=maybe", "logger.csv"),
    ],
)
def test_a_bad_callback_or_logger_key_is_refused_before_tensorflow(tmp_path, override, message):
    assert any(message in line for line in refused(tmp_path, override))


INSIDE = "a path inside the run dir, e.g. keras_log.csv"


@pytest.mark.parametrize(
    "overrides, line",
    [
        (
            ["callbacks.csv_logger.filename=../mine.csv", "callbacks.csv_logger.append=false"],
            "callbacks.csv_logger.filename='../mine.csv': would be written outside the run dir, "
            f"where tfdistx does not write: name {INSIDE}",
        ),
        (
            ["callbacks.csv_logger.filename=/tmp/mine.csv"],
            "callbacks.csv_logger.filename='/tmp/mine.csv': would be written outside the run dir, "
            f"where tfdistx does not write: name {INSIDE}",
        ),
        (
            ["callbacks.csv_logger.filename=metrics.jsonl"],
            "callbacks.csv_logger.filename='metrics.jsonl': is the run's own metrics.jsonl, "
            f"which this would replace: name {INSIDE}",
        ),
    ],
)
def test_a_shipped_callbacks_file_outside_the_run_dir_or_over_its_files_is_refused(tmp_path, overrides, line):
    assert refused(tmp_path / "run", "callbacks=[csv_logger]", *overrides) == [PREFIX + line]


def test_a_shipped_callbacks_file_through_a_link_out_of_the_run_dir_is_refused(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".lock").write_text("")  # a run dir of tfdistx's, resumed
    (tmp_path / "run" / "out").symlink_to(tmp_path)
    assert refused(tmp_path / "run", "callbacks=[csv_logger]", "callbacks.csv_logger.filename=out/mine.csv") == [
        PREFIX
        + (
            "callbacks.csv_logger.filename='out/mine.csv': leads outside the run dir "
            f"(to {tmp_path / 'mine.csv'}): name {INSIDE}"
        )
    ]


def test_a_directory_tfdistx_did_not_make_holding_a_file_a_logger_writes_is_refused_as_a_run_dir(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "keras_log.csv").write_text("my own rows\n")
    (tmp_path / "mine" / "metrics.csv").write_text("my own rows\n")
    assert refused(tmp_path / "mine", "callbacks=[csv_logger]", "logger=[default,csv]") == [
        PREFIX
        + (
            f"hydra.run.dir='{tmp_path / 'mine'}': holds keras_log.csv, metrics.csv, which a run writes, "
            "and tfdistx did not make it (no .lock): name a new directory, or move them (nothing was changed)"
        )
    ]
    compose_ok(tmp_path / "mine")  # without those loggers the directory is no run's


def test_the_csv_logger_keeps_a_file_there_aside_when_told_not_to_append(tmp_path):
    args = [*EVERY_TEN, "trainer.steps=20", "callbacks=[csv_logger]", "callbacks.csv_logger.append=false"]
    train(tmp_path / "run", *args)
    first = (tmp_path / "run" / "keras_log.csv").read_text()
    train(tmp_path / "run", *args, "trainer.steps=30")  # resumed: a new file, the first kept beside it
    kept = list((tmp_path / "run").glob("keras_log.replaced-*.csv"))
    assert len(kept) == 1 and kept[0].read_text() == first
    assert len(list(csv.DictReader(open(tmp_path / "run" / "keras_log.csv")))) == 1  # the resumed run's one record


@pytest.mark.parametrize(
    "overrides, line",
    [
        (
            ['logger.mlflow.experiment=""'],
            "logger.mlflow.experiment='': the name of an MLflow experiment: 1 to 500 characters",
        ),
        (["logger.mlflow.run_name=''"], "logger.mlflow.run_name='': 1 to 250 characters, or null: the run dir's name"),
        (
            ["logger.mlflow.tracking_uri=file:///tmp/mlruns"],
            "logger.mlflow.tracking_uri='file:///tmp/mlruns': is MLflow's file store, which MLflow 3 refuses unless "
            "MLFLOW_ALLOW_FILE_STORE=true: name a SQLite store (sqlite:///PATH/mlflow.db) or a server, or leave it "
            "null for the run's own store",
        ),
        (
            ["logger.mlflow.tracking_uri=sqlite:////nowhere/at/all/mlflow.db"],
            "logger.mlflow.tracking_uri='sqlite:////nowhere/at/all/mlflow.db': its directory /nowhere/at/all "
            "does not exist: make it, or name another",
        ),
        (["logger.mlflow.enabled=maybe"], "logger.mlflow.enabled='maybe': allowed: true, false"),
        (
            ["logger.mlflow.tracking_uri=ftp://example.org/mlflow"],
            "logger.mlflow.tracking_uri='ftp://example.org/mlflow': MLflow has no tracking store for ftp: name a "
            "tracking server (http://HOST:5000, https://...), a database (sqlite:///PATH/mlflow.db, postgresql://..., "
            "mysql://..., mssql://...) or databricks, or leave it null for the run's own store",
        ),
    ],
)
def test_a_bad_mlflow_key_is_refused_before_tensorflow(tmp_path, monkeypatch, overrides, line):
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    assert refused(tmp_path / "run", "logger=[default,mlflow]", *overrides) == [PREFIX + line]


def test_an_unknown_logger_in_a_list_is_named_with_the_loggers_there_are(tmp_path, monkeypatch):
    from tfdistx.config import userconf

    own = tmp_path / "conf" / "logger"
    own.mkdir(parents=True)
    (own / "mine.yaml").write_text("csv: true\n")
    monkeypatch.setenv(userconf.ENV, str(tmp_path / "conf"))
    assert refused(tmp_path / "run", "logger=[default,nope]") == [
        PREFIX
        + (
            "logger='nope': allowed: csv, default, mine, mlflow, wandb; "
            "or your own: --config-dir DIR with DIR/logger/nope.yaml"
        )
    ]


def test_metrics_csv_drops_the_rows_after_the_step_a_run_resumes_from_and_adds_columns_as_metrics_appear(tmp_path):
    path = tmp_path / "metrics.csv"
    logger = CsvLogger(path)
    logger(10, {"loss": 1.0})
    logger(20, {"loss": 0.5, "eval/loss": 0.7})  # a new column: the file is rewritten with it
    logger(30, {"loss": 0.25})
    assert list(csv.reader(open(path))) == [
        ["step", "loss", "eval/loss"],
        ["10", "1.0", ""],
        ["20", "0.5", "0.7"],
        ["30", "0.25", ""],
    ]
    CsvLogger(path, resume_step=20)(30, {"loss": 0.3})
    assert list(csv.reader(open(path)))[1:] == [["10", "1.0", ""], ["20", "0.5", "0.7"], ["30", "0.3", ""]]


def test_the_terminal_status_line_is_redrawn_in_place_under_the_step_lines():
    stream = io.StringIO()
    progress = ConsoleProgress(100, stream=stream, live=True)
    progress.after_steps(10)
    progress.after_steps(20)
    progress(20, {"loss": 1.5})
    progress.close()
    text = stream.getvalue()
    assert "\r\x1b[Kstep  20/100  loss   1.500\n" in text  # the record's line replaces the status line, and stays
    assert (
        "\r\x1b[Kstep  10/100" in text and "steps/s  ETA" in text
    )  # drawn after each call, with a rate from the second
    assert text.endswith("\r\x1b[K")  # closed: the status line is cleared


def test_a_lambda_callback_calls_a_function_given_with_partial(tmp_path):
    """Hydra's `_partial_: true`: the function itself, its `path` bound, is LambdaCallback's on_epoch_end."""
    notes = tmp_path / "notes.txt"
    run = train(
        tmp_path / "run",
        *EVERY_TEN,
        "trainer.steps=30",
        "+callbacks.notes._target_=keras.callbacks.LambdaCallback",
        f"+callbacks.notes.on_epoch_end={{_target_:user_plugins.note_loss,_partial_:true,path:'{notes}'}}",
    )
    assert [line.split()[0] for line in notes.read_text().splitlines()] == [
        "0",
        "1",
        "2",
    ]  # Keras' epochs: one per record
    assert float(notes.read_text().splitlines()[-1].split()[1]) == pytest.approx(run.metrics[-1]["loss"])


PLATEAU = [
    "+callbacks.plateau._target_=keras.callbacks.ReduceLROnPlateau",
    "+callbacks.plateau.monitor=loss",
    "+callbacks.plateau.factor=0.5",
    "+callbacks.plateau.patience=0",
    "+callbacks.plateau.min_delta=10",
]  # halves at each record after the first


def test_reduce_lr_on_plateau_sets_the_rate_and_a_resumed_run_keeps_it(tmp_path):
    """Keras' ReduceLROnPlateau reads and sets self.model.optimizer.learning_rate
    between steps; the schedule goes on from the rate it set, and the rate is
    in the checkpoint, as is the callback's own state (its patience so far and
    its best): a run resumed at step 20 has the same rates after it."""
    args = [*EVERY_TEN, "trainer.deterministic=true", *PLATEAU]
    whole, resumed = whole_and_resumed(tmp_path, args, stop_at=20, steps=40)
    assert [m["lr"] for m in whole.metrics] == pytest.approx(
        [0.001, 0.001, 0.0005, 0.00025]
    )  # set after each record's line
    assert [m["lr"] for m in resumed.metrics if m["step"] > 20] == pytest.approx([0.0005, 0.00025])
    assert resumed.summary["weights_sha256"] == whole.summary["weights_sha256"]


def test_a_users_logger_by_target_gets_every_record_and_is_closed(tmp_path):
    run = train(
        tmp_path / "run",
        *EVERY_TEN,
        "trainer.steps=30",
        "logger.lines._target_=user_plugins.LinesLogger",
        "logger.lines.name=l.txt",
    )
    assert [line.split()[0] for line in (run.dir / "l.txt").read_text().splitlines()] == ["10", "20", "30"]
    assert any(
        "logger.nope._target_='nosuchpkg.L': no module named 'nosuchpkg'" in line
        for line in refused(tmp_path, "logger.nope._target_=nosuchpkg.L")
    )


def test_a_keras_callback_never_replaces_a_file_out_of_the_run_dir(tmp_path):
    """Keras' callbacks that write where a key says (ModelCheckpoint's
    filepath, CSVLogger's filename, TensorBoard's log_dir) write in the run
    dir, as callbacks=csv_logger does: a path out of it, where the user's
    own file is, is refused before TensorFlow starts (a subclass's when it
    is built), and the file is as it was."""
    mine = tmp_path / "mine.keras"
    mine.write_bytes(b"the user's own model")
    model_checkpoint = ["+callbacks.mc._target_=keras.callbacks.ModelCheckpoint"]
    for overrides, line in [
        (
            [*model_checkpoint, f"+callbacks.mc.filepath={mine}"],
            f"callbacks.mc.filepath='{mine}': would be written outside the run dir, where tfdistx does not write: "
            "name a path inside the run dir, e.g. best.keras",
        ),
        (
            [*model_checkpoint, "+callbacks.mc.filepath=../mine.keras"],
            "callbacks.mc.filepath='../mine.keras': would be written outside the run dir, where tfdistx does not "
            "write: name a path inside the run dir, e.g. best.keras",
        ),
        (
            ["+callbacks.tb._target_=keras.callbacks.TensorBoard"],  # its default log_dir, logs: the run's task logs
            "callbacks.tb.log_dir='logs': is the run's own logs, which this would replace: name a path inside the "
            "run dir, e.g. keras_tensorboard",
        ),
        (
            ["+callbacks.csv._target_=keras.callbacks.CSVLogger", f"+callbacks.csv.filename={tmp_path / 'k.csv'}"],
            f"callbacks.csv.filename='{tmp_path / 'k.csv'}': would be written outside the run dir, where tfdistx "
            "does not write: name a path inside the run dir, e.g. keras_log.csv",
        ),
    ]:
        assert refused(tmp_path / "run", *overrides) == [PREFIX + line]
    with pytest.raises(ConfigError) as raised:  # a subclass, known to be ModelCheckpoint once it is imported
        train(
            tmp_path / "sub",
            "trainer.steps=10",
            "+callbacks.mc._target_=user_plugins.SaveInto",
            f"+callbacks.mc.into={tmp_path}",
            "+callbacks.mc.name=mine.keras",
        )
    assert raised.value.lines() == [
        PREFIX + f"callbacks.mc.filepath='{mine}': would be written outside the run dir, where tfdistx does not "
        "write: name a path inside the run dir, e.g. best.keras"
    ]
    assert mine.read_bytes() == b"the user's own model"


def test_a_keras_callbacks_relative_path_is_the_run_dirs_and_a_rerun_resumes_writing_it(tmp_path):
    """A relative path is the run dir's: ModelCheckpoint writing one file
    every epoch, a rerun (a resume) replaces what the run's first part wrote
    there; a directory tfdistx did not make that holds a file a callback's
    pattern names is refused as a run dir."""
    args = [*EVERY_TEN, "+callbacks.mc._target_=keras.callbacks.ModelCheckpoint", "+callbacks.mc.filepath=last.keras"]
    train(tmp_path / "run", *args, "trainer.steps=20")
    first = (tmp_path / "run" / "last.keras").read_bytes()
    train(tmp_path / "run", *args, "trainer.steps=30")
    assert (tmp_path / "run" / "last.keras").read_bytes() != first and not (tmp_path / "last.keras").exists()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "m-07.keras").write_bytes(b"the user's own model")
    args[-1] = "+callbacks.mc.filepath='m-{epoch:02d}.keras'"
    assert refused(tmp_path / "mine", *args) == [
        PREFIX + f"hydra.run.dir='{tmp_path / 'mine'}': holds m-07.keras, which a run writes, and tfdistx did not "
        "make it (no .lock): name a new directory, or move them (nothing was changed)"
    ]


def test_a_local_clusters_chief_sends_its_status_line_as_lines_of_its_own_for_its_launcher_to_draw():
    """Its output is a pipe to the launcher (cluster/processes.py draws the status on the launcher's terminal)."""
    stream = io.StringIO()
    progress = ConsoleProgress(100, stream=stream, relay=True)
    progress.after_steps(10)
    progress(10, {"loss": 1.5})
    progress.close()
    lines = stream.getvalue().splitlines()
    assert "step  10/100  loss   1.500" in lines and "\r" not in stream.getvalue()
    statuses = [relayed_status(line) for line in lines if relayed_status(line) is not None]
    assert statuses[0].startswith("step  10/100") and "elapsed" in statuses[0] and statuses[-1] == ""  # closed: gone
