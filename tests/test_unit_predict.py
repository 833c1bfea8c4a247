"""`tfdistx predict RUN_DIR`: a run's export applied to TFRecord and CSV
files (or the run's eval split), the predictions in sharded files in input
order, equal row by row to what the SavedModel itself returns for the same
rows. Runs trained once per module in this process (with the .hydra files
Hydra writes for a run), real files on disk; the command in-process (-m
unit). As a real process, for the default input and a refusal:
test_commands.py."""

import json
import shutil

import numpy as np
import pytest
import tensorflow as tf
from omegaconf import OmegaConf

from tfdistx.commands import export as export_command
from tfdistx.commands import predict as command
from tfdistx.commands.common import compose
from tfdistx.config.resolve import resolve
from tfdistx.data import files as data_files
from tfdistx.data import sources
from tfdistx.engine import fit

SIZES = ["data.train_examples=256", "data.eval_examples=100"]
MLP = ["data.image_shape=[6]", *SIZES]
WIDE_DEEP = [
    "data=synthetic_categorical",
    "model=wide_deep",
    "data.vocab_size=100",
    "model.vocab_size=100",
    "model.hidden_units=[8]",
    *SIZES,
]
QUICK = [
    "trainer.steps=20",
    "trainer.steps_per_loop=10",
    "trainer.log_every=10",
    "trainer.eval_every=0",
    "data.batch_size=32",
    "checkpoint.every_steps=10",
    "logger.tensorboard=false",
]


def train_run(run_dir, *overrides):
    """A run as `python -m tfdistx` leaves it (.hydra/config.yaml and
    overrides.yaml as Hydra writes them, checkpoints, export/), trained in this process."""
    overrides = [*QUICK, *overrides]
    cfg = compose([*overrides, f"hydra.run.dir={run_dir}"], notes=False)
    (run_dir / ".hydra").mkdir(parents=True)
    task_config = OmegaConf.to_container(cfg)
    task_config.pop("hydra")
    (run_dir / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(task_config))
    (run_dir / ".hydra" / "overrides.yaml").write_text(OmegaConf.to_yaml(overrides))
    fit.train(resolve(cfg, str(run_dir)))
    assert (run_dir / "export" / "saved_model.pb").is_file()
    return run_dir


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return train_run(tmp_path_factory.mktemp("mlp") / "run", *MLP)


@pytest.fixture(scope="module")
def wide_deep(tmp_path_factory):
    return train_run(tmp_path_factory.mktemp("wide_deep") / "run", *WIDE_DEEP)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The rows as `tfdistx data write` writes them: TFRecord and CSV, 2 shards each, of both kinds of features."""
    root = tmp_path_factory.mktemp("data")
    images = sources.synthetic(image_shape=[6], train_examples=300, eval_examples=50, seed=7)
    clicks = sources.synthetic_categorical(vocab_size=100, train_examples=300, eval_examples=50, seed=7)
    for name, source in (("images", images), ("clicks", clicks)):
        for fmt in ("tfrecord", "csv"):
            data_files.write(source, str(root / f"{name}-{fmt}"), shards=2, fmt=fmt)
    return root


def predict(*argv) -> int:
    return command.main([str(a) for a in argv])


def serving(export_dir):
    return tf.saved_model.load(str(export_dir)).signatures["serving_default"]


def tfrecord_rows(path, spec) -> dict:
    records = list(tf.data.TFRecordDataset(str(path)).as_numpy_iterator())
    return {k: v.numpy() for k, v in tf.io.parse_example(records, spec).items()}


def csv_rows(path):
    header = path.read_text().splitlines()[0].split(",")
    return header, np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2)


IMAGE = {"features": tf.io.FixedLenFeature([6], tf.float32)}
CLICK = {"categorical": tf.io.FixedLenFeature([8], tf.int64), "dense": tf.io.FixedLenFeature([4], tf.float32)}
CLASSIFIED = {
    "classes": tf.io.FixedLenFeature([], tf.int64),
    "logits": tf.io.FixedLenFeature([10], tf.float32),
    "probabilities": tf.io.FixedLenFeature([10], tf.float32),
}
CLASSIFIED_COLUMNS = ["classes", *(f"logits_{j}" for j in range(10)), *(f"probabilities_{j}" for j in range(10))]


def assert_same(found: dict, expected: dict):
    assert set(found) == set(expected)
    for name, value in expected.items():
        assert found[name].shape == value.shape, name
        np.testing.assert_allclose(found[name], value, rtol=1e-6, atol=1e-6, err_msg=name)


def expected_columns(outputs: dict) -> np.ndarray:
    """The SavedModel's outputs as predict's CSV columns: sorted by name, each flattened."""
    return np.concatenate([outputs[name].numpy().reshape(len(outputs[name]), -1) for name in sorted(outputs)], axis=1)


@pytest.mark.unit
def test_tfrecord_files_predict_what_the_saved_model_does_in_order(run, data, tmp_path):
    inputs = sorted((data / "images-tfrecord").glob("train-*"))
    assert (
        predict(
            run, "--data-files", data / "images-tfrecord" / "train-*", "--format", "tfrecord", "--out", tmp_path / "p"
        )
        == 0
    )
    serve = serving(run / "export")
    manifest = json.loads((tmp_path / "p" / "predictions.json").read_text())
    assert [(i["file"], i["rows"], i["predictions"]) for i in manifest["inputs"]] == [
        (str(inputs[0]), 150, "predictions-00000-of-00002.tfrecord"),
        (str(inputs[1]), 150, "predictions-00001-of-00002.tfrecord"),
    ]
    assert manifest["rows"] == 300 and manifest["format"] == "tfrecord"
    assert manifest["export"]["path"] == str(run / "export") and manifest["export"]["checkpoint_step"] is None
    assert manifest["outputs"] == {
        "classes": {"shape": [], "dtype": "int64"},
        "logits": {"shape": [10], "dtype": "float32"},
        "probabilities": {"shape": [10], "dtype": "float32"},
    }
    for k, path in enumerate(inputs):  # row i of shard k is row i of file k
        expected = {name: value.numpy() for name, value in serve(**tfrecord_rows(path, IMAGE)).items()}
        assert_same(tfrecord_rows(tmp_path / "p" / f"predictions-{k:05d}-of-00002.tfrecord", CLASSIFIED), expected)


@pytest.mark.unit
def test_csv_files_in_csv_predictions_out(run, data, tmp_path):
    assert (
        predict(
            run,
            "--data-files",
            data / "images-csv" / "train-00001-*",
            data / "images-csv" / "train-00000-*",
            "--out",
            tmp_path / "p",
            "--batch-size",
            64,
        )
        == 0
    )  # the globs' order; batches never span two files
    serve = serving(run / "export")
    for k, name in enumerate(["train-00001-of-00002.csv", "train-00000-of-00002.csv"]):
        header, rows = csv_rows(data / "images-csv" / name)
        assert header[-1] == "label"
        header, found = csv_rows(tmp_path / "p" / f"predictions-{k:05d}-of-00002.csv")
        assert header == CLASSIFIED_COLUMNS and len(found) == 150
        np.testing.assert_allclose(
            found, expected_columns(serve(features=tf.constant(rows[:, :-1], tf.float32))), rtol=1e-6, atol=1e-6
        )


@pytest.mark.unit
def test_dict_features_from_tfrecord_and_csv(wide_deep, data, tmp_path):
    serve = serving(wide_deep / "export")
    assert (
        predict(wide_deep, "--data-files", data / "clicks-tfrecord" / "train-*", "--out", tmp_path / "from-tfrecord")
        == 0
    )
    assert predict(wide_deep, "--data-files", data / "clicks-csv" / "train-*", "--out", tmp_path / "from-csv") == 0
    for k in range(2):
        rows = tfrecord_rows(data / "clicks-tfrecord" / f"train-{k:05d}-of-00002.tfrecord", CLICK)
        expected = expected_columns(serve(**rows))
        for out in ("from-tfrecord", "from-csv"):
            header, found = csv_rows(tmp_path / out / f"predictions-{k:05d}-of-00002.csv")
            assert header == ["logits_0", "probabilities_0"]
            np.testing.assert_allclose(found, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.unit
def test_step_n_exports_that_checkpoint_once_and_predicts_with_it(run, data, tmp_path, capsys):
    eval_file = data / "images-tfrecord" / "eval-00000-of-00001.tfrecord"
    assert predict(run, "--step", 10, "--data-files", eval_file) == 0
    assert "exported ckpt-10 to" in capsys.readouterr().err
    assert (run / "export-step-10" / "saved_model.pb").is_file()
    manifest = json.loads((run / "predictions-step-10" / "predictions.json").read_text())
    assert manifest["export"]["path"] == str(run / "export-step-10") and manifest["export"]["checkpoint_step"] == 10
    header, found = csv_rows(run / "predictions-step-10" / "predictions-00000-of-00001.csv")
    rows = tfrecord_rows(eval_file, IMAGE)
    np.testing.assert_allclose(found, expected_columns(serving(run / "export-step-10")(**rows)), rtol=1e-6, atol=1e-6)
    assert not np.allclose(found, expected_columns(serving(run / "export")(**rows)))  # not the final step's model
    # the export at step 10 is there now: used as it is, not written again
    stamp = (run / "export-step-10" / "saved_model.pb").stat().st_mtime_ns
    assert predict(run, "--step", 10, "--data-files", eval_file, "--out", tmp_path / "again") == 0
    assert "exported" not in capsys.readouterr().err
    assert (run / "export-step-10" / "saved_model.pb").stat().st_mtime_ns == stamp
    assert (tmp_path / "again" / "predictions-00000-of-00001.csv").read_text() == (
        run / "predictions-step-10" / "predictions-00000-of-00001.csv"
    ).read_text()


@pytest.mark.unit
def test_a_rerun_keeps_the_earlier_predictions_aside(run, data, tmp_path):
    out = tmp_path / "p"
    assert predict(run, "--data-files", data / "images-csv" / "eval-*", "--out", out) == 0
    first = (out / "predictions-00000-of-00001.csv").read_text()
    assert predict(run, "--data-files", data / "images-tfrecord" / "train-*", "--out", out) == 0
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("p.replaced-")]
    assert len(kept) == 1 and (kept[0] / "predictions-00000-of-00001.csv").read_text() == first
    assert sorted(p.name for p in out.iterdir()) == [
        "predictions-00000-of-00002.csv",
        "predictions-00001-of-00002.csv",
        "predictions.json",
    ]


@pytest.mark.unit
def test_a_one_tensor_model_reads_the_feature_by_the_runs_own_name(run, tmp_path):
    """A run trained on data=tfrecord with data.features={pixels: ...}: its
    export's one input is `features`, and records holding `pixels` are read."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("predictions*", "export-step-*"))
    config = OmegaConf.load(copy / ".hydra" / "config.yaml")
    config.data = {
        "_target_": "tfdistx.data.tfrecord",
        "train_files": "unused",
        "label": "y",
        "features": {"pixels": {"dtype": "float32", "shape": [6]}, "y": {"dtype": "int64", "shape": []}},
    }
    OmegaConf.save(config, copy / ".hydra" / "config.yaml")
    rows = np.random.default_rng(0).random((40, 6), dtype=np.float32)
    with tf.io.TFRecordWriter(str(tmp_path / "rows.tfrecord")) as writer:
        for i, row in enumerate(rows):
            feature = {
                "pixels": tf.train.Feature(float_list=tf.train.FloatList(value=row)),
                "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 10])),
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    np.savetxt(
        tmp_path / "rows.csv",
        np.c_[rows, np.arange(40)],
        delimiter=",",
        header="a,b,c,d,e,f,y",
        comments="",
        fmt="%.9g",
    )
    assert predict(copy, "--data-files", tmp_path / "rows.tfrecord", tmp_path / "rows.csv") == 0
    expected = expected_columns(serving(copy / "export")(features=tf.constant(rows)))
    for k in range(2):  # the CSV's label is the run's data.label, y: every other column is a feature
        np.testing.assert_allclose(
            csv_rows(copy / "predictions" / f"predictions-{k:05d}-of-00002.csv")[1], expected, rtol=1e-6, atol=1e-6
        )


def refused(capsys, *argv) -> str:
    """Exit 2 and one `invalid config` line, no traceback; returns the line."""
    with pytest.raises(SystemExit) as leaving:
        predict(*argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("tfdistx: invalid config:")]
    assert leaving.value.code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.unit
def test_bad_input_is_refused_in_one_line_and_writes_nothing(run, wide_deep, data, tmp_path, capsys):
    out = ["--out", tmp_path / "p"]
    line = refused(capsys, run, "--data-files", tmp_path / "none-*.tfrecord", *out)
    assert "--data-files=" in line and "none-*.tfrecord" in line and "no file matches" in line
    line = refused(capsys, run, "--data-files", data / "clicks-tfrecord" / "train-*", *out)
    assert (
        "train-00000-of-00002.tfrecord" in line
        and "no feature 'features'" in line
        and "categorical, dense, label" in line
    )
    line = refused(capsys, wide_deep, "--data-files", data / "images-csv" / "train-*", *out)
    assert (
        "train-00000-of-00002.csv" in line
        and "no column 'categorical_0'" in line
        and "'categorical' (int64 [8])" in line
    )
    line = refused(capsys, run, "--data-files", data / "clicks-csv" / "eval-*", *out)
    assert "has 12 column(s) besides the label" in line and "float32 [6]: 6 value(s)" in line
    (tmp_path / "junk.tfrecord").write_bytes(b"not a record at all, but long enough")
    assert "not readable as TFRecord" in refused(capsys, run, "--data-files", tmp_path / "junk.tfrecord", *out)
    assert "is not a tfdistx run directory" in refused(capsys, tmp_path, *out)
    assert "--format='parquet': one of csv, tfrecord" in refused(capsys, run, "--format", "parquet", *out)
    assert "is inside" in refused(capsys, run, "--out", run / "export" / "predictions")
    assert "is inside" in refused(capsys, run, "--out", run / "checkpoints" / "p")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    assert "exists and is not predictions written by tfdistx predict" in refused(
        capsys, run, "--out", tmp_path / "mine"
    )
    assert "--step=7: no such checkpoint" in refused(capsys, run, "--step", 7, *out)
    without_export = tmp_path / "no-export"
    shutil.copytree(run, without_export, ignore=shutil.ignore_patterns("export*", "predictions*"))
    line = refused(capsys, without_export)
    assert "has no export/" in line and "tfdistx export RUN_DIR" in line
    assert not (tmp_path / "p").exists() and not (without_export / "predictions").exists()
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]


def export(*argv) -> int:
    """`tfdistx export ARGV` in this process: its exit code (a refusal's one line is on stderr)."""
    try:
        return export_command.main([str(a) for a in argv])
    except SystemExit as leaving:
        return leaving.code


@pytest.mark.unit
def test_a_step_never_writes_over_the_runs_own_export(run, tmp_path, capsys):
    """`--step N` exports another checkpoint than the one the run exported
    (summary.json, `predict RUN`): refused over RUN/export, however it is
    named; nothing is ever written inside it."""
    (tmp_path / "link").symlink_to(run / "export")
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    for out in (run / "export", run / "checkpoints" / ".." / "export", tmp_path / "link"):
        assert export(run, "--step", 10, "--out", out) == 2, out
        [line] = capsys.readouterr().err.strip().splitlines()
        assert line == (
            f"tfdistx: invalid config: --out='{out}': is the run's own export, which stays the model the run exported "
            f"(summary.json describes it): --step 10 writes {run / 'export-step-10'} by default; name another "
            "directory (nothing was changed)"
        )
        assert "is inside" in refused(capsys, run, "--step", 10, "--out", out)
    assert export(run, "--out", run / "export" / "again") == 2
    assert "is inside" in capsys.readouterr().err
    assert {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


@pytest.mark.unit
def test_a_refused_predict_with_step_leaves_no_export_behind(run, data, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("predictions*", "export-step-*"))
    line = refused(
        capsys, copy, "--step", 20, "--data-files", data / "clicks-tfrecord" / "eval-*", "--out", tmp_path / "new" / "p"
    )
    assert "no feature 'features'" in line  # found once the export of ckpt-20 could be read: then removed again
    assert not (tmp_path / "new").exists()  # nor the parent made for --out
    assert sorted(p.name for p in copy.iterdir()) == sorted(
        p.name for p in run.iterdir() if not p.name.startswith(("predictions", "export-step-"))
    )


@pytest.mark.unit
def test_the_progress_line(monkeypatch):
    class Stream:
        def __init__(self, tty):
            self.tty, self.text = tty, ""

        def isatty(self):
            return self.tty

        def write(self, text):
            self.text += text

        def flush(self):
            pass

    clock = iter([10.0, 10.1, 10.2, 10.3, 20.0, 20.1, 22.0])
    monkeypatch.setattr(command.time, "monotonic", lambda: next(clock))
    plain, tty = Stream(False), Stream(True)
    lines = command.Progress(files=True, stream=plain)
    lines(0, 3, 500, False)  # 10.0, mid-file: nothing when stderr is not a terminal
    lines(1, 3, 1000, True)  # 10.1: a file done
    lines(2, 3, 2000, True)  # 10.2: within the second: left out
    lines(3, 3, 3000, True)  # 10.3: left out too (the final line says it all)
    assert plain.text == "tfdistx: predict: 1/3 files, 1,000 rows\n"
    line = command.Progress(files=True, stream=tty)
    line(0, 3, 500, False)  # 20.0
    line(0, 3, 600, False)  # 20.1: within a quarter second
    line(1, 3, 1000, True)  # 22.0
    line.end()
    assert (
        tty.text
        == "\r\x1b[Ktfdistx: predict: 0/3 files, 500 rows\r\x1b[Ktfdistx: predict: 1/3 files, 1,000 rows\r\x1b[K"
    )
