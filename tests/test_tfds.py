"""Real tensorflow-datasets pipelines on generated data (tfds.testing.mock_data)."""

import json
import subprocess
import sys

import pytest
import tensorflow_datasets as tfds

from conftest import tfdistx_env
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
