"""Real tensorflow-datasets pipelines on generated data (tfds.testing.mock_data)."""

import json

import pytest
import tensorflow_datasets as tfds

from tfdistx.cli import main


@pytest.mark.parametrize("dataset, model", [("mnist", "mlp"), ("fashion_mnist", "cnn"), ("cifar10", "cnn")])
def test_tfds_dataset_trains(tmp_path, dataset, model):
    run_dir = tmp_path / "run"
    with tfds.testing.mock_data(num_examples=256):
        main([
            f"data={dataset}", f"model={model}", "data.batch_size=32", "data.download=false",
            "trainer.steps=16", "trainer.steps_per_loop=8", "trainer.log_every=8", "trainer.eval_steps=2",
            "logger.tensorboard=false", f"hydra.run.dir={run_dir}",
        ])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["step"] == 16
    assert 0.0 <= summary["eval"]["eval/accuracy"] <= 1.0
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [8, 16]
