"""A user's own project on tfdistx, end to end (issue 23's "done when"): a
directory of its own — a model module, a data module and a config dir with
a data option and an experiment — that uses nothing of tfdistx's checkout
but the installed package. It trains under one device and multiworker 2x1,
warm-starts a second run from the first with a new head, keeps and exports
the best checkpoint, stops early, and `tfdistx predict` writes predictions
equal to the SavedModel's.

Real processes started from the project's directory, as its user would, with
no tests/ on the path."""

import csv
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

MODELS = '''
import keras


def small(input_shape, num_outputs, width=16):
    """Flatten, one hidden layer ("body"), and a head of num_outputs logits ("head")."""
    inputs = keras.Input(shape=tuple(input_shape))
    hidden = keras.layers.Dense(width, activation="relu", name="body")(keras.layers.Flatten()(inputs))
    return keras.Model(inputs, keras.layers.Dense(num_outputs, name="head")(hidden))
'''

DATA = '''
import numpy as np

from tfdistx.data import in_memory


def digits(num_classes=5, train_examples=1024, eval_examples=256, seed=0):
    """8x8 'digits' whose class is the brightest of num_classes fixed regions: learnable in a few steps."""
    rng = np.random.default_rng(seed)
    regions = rng.integers(0, num_classes, size=64)

    def make(n):
        images = rng.random((n, 8, 8, 1), dtype=np.float32)
        sums = np.stack([images.reshape(n, 64)[:, regions == k].mean(axis=1) for k in range(num_classes)], axis=1)
        return images, np.argmax(sums, axis=1).astype(np.int64)

    return in_memory(make(train_examples), make(eval_examples), num_classes=num_classes, train_examples=train_examples)
'''

CONFIGS = {
    "model/small.yaml": "# a small MLP with a named head\n_target_: digitsproj.models.small\nwidth: 16\n",
    "data/digits.yaml": "# five-class 8x8 digits\n_target_: digitsproj.data.digits\nbatch_size: 64\nnum_classes: 5\n",
    "data/digits3.yaml": (
        "# the same images, three classes: a new head\n_target_: digitsproj.data.digits\nbatch_size: 64\n"
        "num_classes: 3\n"
    ),
    "experiment/mine.yaml": textwrap.dedent("""\
        # @package _global_
        # digits on the small model
        defaults:
          - override /model: small
          - override /data: digits
        optimizer:
          lr: 0.01
        trainer:
          steps: 60
          steps_per_loop: 10
          log_every: 10
          eval_every: 20
        logger:
          tensorboard: false
        """),
}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("myproject")
    package = root / "digitsproj"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text(MODELS)
    (package / "data.py").write_text(DATA)
    for name, text in CONFIGS.items():
        (root / "conf" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "conf" / name).write_text(text)
    return root


def tfdistx(project, *args, timeout=600):
    """`python -m tfdistx ARGS` from the project's directory, as its user runs it."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TFDISTX_CONFIG_PATH")}  # nothing of tests/
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    proc = subprocess.run(
        [sys.executable, "-m", "tfdistx", *args], cwd=project, env=env, capture_output=True, text=True, timeout=timeout
    )
    return proc


def ok(proc):
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def trainable(checkpoint_dir: Path, step=None) -> list:
    """The model's trainable values in a checkpoint, in the model's order."""
    import tensorflow as tf

    path = str(checkpoint_dir / f"ckpt-{step}") if step else tf.train.latest_checkpoint(str(checkpoint_dir))
    reader = tf.train.load_checkpoint(path)
    prefix = "optimizer/_trainable_variables/"
    names = sorted(
        (n for n in reader.get_variable_to_shape_map() if n.startswith(prefix)), key=lambda n: int(n.split("/")[2])
    )
    return [reader.get_tensor(n) for n in names]


def test_a_project_of_its_own(project):
    first, multi, warm, best = (project / "runs" / name for name in ("first", "multi", "warm", "best"))

    # its experiment, under one device and under multiworker 2x1
    ok(tfdistx(project, "--config-dir", "conf", "experiment=mine", f"hydra.run.dir={first}"))
    assert summary(first)["step"] == 60 and summary(first)["eval"]["eval/accuracy"] > 0.4
    ok(
        tfdistx(
            project,
            "--config-dir",
            "conf",
            "experiment=mine",
            "strategy=multiworker",
            "cluster=2x1",
            "trainer.steps=20",
            f"hydra.run.dir={multi}",
        )
    )
    assert (summary(multi)["strategy"], summary(multi)["replicas"], summary(multi)["step"]) == ("multiworker", 2, 20)

    # a warm start from the first run with a new head (3 classes): the body starts from the first run's weights.
    # A learning rate of 1e-9 leaves them where they started, to the tolerance below.
    ok(
        tfdistx(
            project,
            "--config-dir",
            "conf",
            "experiment=mine",
            "data=digits3",
            f"checkpoint.init_from={first}",
            "checkpoint.init_skip=[head]",
            "optimizer.lr=1e-9",
            "trainer.steps=10",
            f"hydra.run.dir={warm}",
        )
    )
    assert summary(warm)["init_from"] == str(first) and summary(warm)["step"] == 10
    body_kernel, body_bias, head_kernel, _ = trainable(warm / "checkpoints")
    source = trainable(first / "checkpoints")
    np.testing.assert_allclose(body_kernel, source[0], atol=1e-6)
    np.testing.assert_allclose(body_bias, source[1], atol=1e-6)
    assert head_kernel.shape == (16, 3) and source[2].shape == (16, 5)

    # the best checkpoint kept and exported; early stopping: no improvement of a whole 1.0 in accuracy is possible,
    # so after the first evaluation (step 20) two more (40, 60) without one stop the run at 60 of 400
    ok(
        tfdistx(
            project,
            "--config-dir",
            "conf",
            "experiment=mine",
            "checkpoint.keep_best=true",
            "trainer.steps=400",
            "trainer.early_stopping.patience=2",
            "trainer.early_stopping.min_delta=1.0",
            f"hydra.run.dir={best}",
        )
    )
    result = summary(best)
    assert result["step"] == 60 and result["stopped_early"]["step"] == 60, result
    evals = [m for m in map(json.loads, (best / "metrics.jsonl").read_text().splitlines()) if "eval/accuracy" in m]
    assert [m["step"] for m in evals] == [20, 40, 60]
    # the best is the best evaluation (the first of equals), whatever early stopping's min_delta asks of an improvement
    best_eval = max(evals, key=lambda m: (m["eval/accuracy"], -m["step"]))
    assert (result["best"]["step"], result["best"]["value"]) == (
        best_eval["step"],
        pytest.approx(best_eval["eval/accuracy"]),
    )
    assert (best / "export" / "saved_model.pb").is_file() and Path(result["best"]["checkpoint"] + ".index").is_file()
    # `tfdistx export` of that run takes the same checkpoint the run exported: the best, not the newest
    again = ok(tfdistx(project, "export", str(best), "--out", str(project / "export-again")))
    assert f"exported ckpt-{best_eval['step']} " in again.stderr, again.stderr

    # predictions of files written from the project's own data, in input order, equal to the SavedModel's
    ok(
        tfdistx(
            project,
            "data",
            "write",
            "--config-dir",
            "conf",
            "data=digits",
            "--out",
            str(project / "files"),
            "--shards",
            "2",
        )
    )
    predicted = ok(
        tfdistx(
            project,
            "predict",
            str(best),
            "--data-files",
            str(project / "files" / "train-*"),
            "--out",
            str(project / "predictions"),
            "--format",
            "csv",
        )
    )
    shards = sorted((project / "predictions").glob("predictions-*.csv"))
    assert len(shards) == 2, predicted.stderr
    import tensorflow as tf

    serve = tf.saved_model.load(str(best / "export")).signatures["serving_default"]
    for shard, tfrecord in zip(shards, sorted((project / "files").glob("train-*"))):
        spec = {"features": tf.io.FixedLenFeature([8, 8, 1], tf.float32)}
        rows = [tf.io.parse_single_example(r, spec)["features"].numpy() for r in tf.data.TFRecordDataset(str(tfrecord))]
        expected = serve(features=tf.constant(np.stack(rows)))
        with shard.open() as f:
            table = list(csv.DictReader(f))
        assert len(table) == len(rows) == 512
        classes = [int(float(r["classes"])) for r in table]
        assert classes == list(expected["classes"].numpy().reshape(-1))
