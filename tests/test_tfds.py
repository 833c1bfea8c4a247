"""Real tensorflow-datasets pipelines on generated data (tfds.testing.mock_data)."""

import json
import subprocess
import sys

import pytest
import tensorflow_datasets as tfds

from conftest import run_command, tfdistx_env
from test_cluster import can_isolate
from tfdistx.cli import main


@pytest.mark.parametrize("dataset, model", [("mnist", "mlp"), ("fashion_mnist", "cnn"), ("cifar10", "cnn")])
def test_tfds_dataset_trains(tmp_path, dataset, model):
    run_dir = tmp_path / "run"
    with tfds.testing.mock_data(num_examples=256):
        main(
            [
                f"data={dataset}",
                f"model={model}",
                "data.batch_size=32",
                "data.download=false",
                "trainer.steps=16",
                "trainer.steps_per_loop=8",
                "trainer.log_every=8",
                "trainer.eval_steps=2",
                "logger.tensorboard=false",
                f"hydra.run.dir={run_dir}",
            ]
        )
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["step"] == 16
    assert 0.0 <= summary["eval"]["eval/accuracy"] <= 1.0
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [8, 16]


def test_a_prepared_tfds_directory_trains_and_is_written_without_a_network(tmp_path):
    """A dataset prepared once (here tfds.testing's DummyMnist, generated
    locally) is read from data.data_dir with no network at all: the run and
    `tfdistx data write` run in a network namespace with no interfaces up,
    when the OS allows one."""
    data_dir = tmp_path / "tensorflow_datasets"
    tfds.testing.DummyMnist(data_dir=str(data_dir)).download_and_prepare()
    offline = ["unshare", "--user", "--map-root-user", "--net"] if can_isolate() else []
    data = ["data=mnist", "data.name=dummy_mnist", f"data.data_dir={data_dir}", "data.batch_size=4"]
    run_dir = tmp_path / "run"
    run = subprocess.run(
        [
            *offline,
            sys.executable,
            "-m",
            "tfdistx",
            *data,
            "trainer.steps=10",
            "trainer.steps_per_loop=5",
            "trainer.log_every=5",
            "logger.tensorboard=false",
            f"hydra.run.dir={run_dir}",
        ],
        capture_output=True,
        text=True,
        env=tfdistx_env(),
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["step"] == 10 and 0.0 <= summary["eval"]["eval/accuracy"] <= 1.0

    out = tmp_path / "files"
    write = subprocess.run(
        [*offline, sys.executable, "-m", "tfdistx", "data", "write", *data, "--out", str(out), "--shards", "2"],
        capture_output=True,
        text=True,
        env=tfdistx_env(),
        timeout=300,
    )
    assert write.returncode == 0, write.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert sum(manifest["splits"]["train"]["files"].values()) == 20  # DummyMnist's train split
    assert (
        manifest["features"]["features"] == {"dtype": "float32", "shape": [28, 28, 1]} and manifest["num_classes"] == 10
    )


# -- data=tfds data.name=ANY under multiworker 2x1 (one device: test_unit_tfds.py) -------------------------------

KINDS_2X1 = {
    "images": [
        "data.name=tf_flowers",
        "data.train_split='train[:75%]'",
        "data.eval_split='train[75%:]'",
        "data.image_size=[12,12]",
        "model=cnn",
        "model.filters=[4]",
        "model.dense_units=8",
    ],
    "text": ["data.name=imdb_reviews", "model=text", "data.sequence_length=16", "model.embedding_dim=8"],
    "numbers": [
        "data.name=diamonds",
        "data.train_split='train[:75%]'",
        "data.eval_split='train[75%:]'",
        "model.hidden_units=[8]",
    ],
}


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
    """tf_flowers, imdb_reviews and diamonds prepared offline from mock_data's examples (tfds_data.py): a data_dir
    every task of a local cluster reads, as a user's prepared copy."""
    import tfds_data

    return tfds_data.prepare(tmp_path_factory.mktemp("tensorflow_datasets"), ["diamonds", "imdb_reviews", "tf_flowers"])


@pytest.mark.parametrize("kind", sorted(KINDS_2X1))
def test_a_tfds_dataset_under_multiworker_resumes_exports_and_predicts_from_its_raw_inputs(
    kind, tfds_dir, tfdistx, tmp_path
):
    """data=tfds under multiworker 2x1: 10 steps, then resumed to 20 (the text also trained whole: the same
    weights, bitwise, its vocabulary kept with the run and read back by the resume), exported, and `tfdistx
    predict` from the raw eval split gives the trained model's predictions. About 20 CPU s a kind (two local
    clusters of two tasks and a predict; the text, three clusters)."""
    args = [
        "strategy=multiworker",
        "cluster=2x1",
        "data=tfds",
        f"data.data_dir={tfds_dir}",
        "data.download=false",
        "data.batch_size=8",
        "trainer.steps_per_loop=10",
        "trainer.log_every=10",
        "trainer.eval_every=0",
        "checkpoint.every_steps=10",
        "trainer.jit_compile=false",
        "logger.tensorboard=false",
        *KINDS_2X1[kind],
    ]
    run_dir = tmp_path / "split"
    first = tfdistx(*args, "trainer.steps=10", "checkpoint.export=false", run_dir=run_dir)
    assert first.returncode == 0, first
    resumed = tfdistx(*args, "trainer.steps=20", run_dir=run_dir)
    assert resumed.returncode == 0 and resumed.summary["resumed_from_step"] == 10, resumed
    assert resumed.summary["task"] == ("regression" if kind == "numbers" else "classification")  # task=auto's
    if kind == "text":
        whole = tfdistx(*args, "trainer.steps=20", "checkpoint.export=false", run_dir=tmp_path / "whole")
        assert whole.returncode == 0, whole
        assert resumed.summary["weights_sha256"] == whole.summary["weights_sha256"]
        assert (run_dir / "preprocessing" / "vocabulary.txt").read_text() == (
            tmp_path / "whole" / "preprocessing" / "vocabulary.txt"
        ).read_text()

    predicted = run_command(
        [sys.executable, "-m", "tfdistx", "predict", str(run_dir), "--out", str(tmp_path / "p")],
        env=tfdistx_env(),
        timeout=300,
    )
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    import numpy as np
    import tensorflow as tf

    from tfdistx.commands.predict import _spec
    from tfdistx.engine.parts import model_from_checkpoint

    # The trained model on the eval split as training read it (token ids, scaled pixels, one vector of columns).
    model, task, source, status = model_from_checkpoint(_spec(str(run_dir)), str(run_dir / "checkpoints" / "ckpt-20"))
    status.expect_partial()
    expected = np.concatenate(
        [
            task.serving_outputs(model(x, training=False))["classes" if kind != "numbers" else "predictions"].numpy()
            for x, _ in source.eval(None).batch(16)
        ]
    ).reshape(-1)
    (shard,) = (tmp_path / "p").glob("predictions-*.csv")
    header = shard.read_text().splitlines()[0].split(",")
    column = header.index("classes" if kind != "numbers" else "predictions_0")  # one target: one column
    found = np.loadtxt(shard, delimiter=",", skiprows=1, ndmin=2)[:, column]
    np.testing.assert_allclose(found, expected, rtol=1e-5, atol=1e-5)
    export_inputs = (
        tf.saved_model.load(str(run_dir / "export")).signatures["serving_default"].structured_input_signature[1]
    )
    raw = {"images": tf.uint8, "text": tf.string, "numbers": tf.float32}[kind]
    assert raw in {spec.dtype for spec in export_inputs.values()}  # raw inputs: pixels, strings, a table's columns
