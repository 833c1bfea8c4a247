"""`strategy.partitioner` (parameter servers): TF's MinSizePartitioner splits
large variables across the ps tasks, Keras 3 trains on them unchanged
(tfdistx/engine/sharding.py), and a checkpoint resumes onto another number of
ps tasks, the variables re-split.

Layers: the config checks are `unit` (in-process, test_unit_partitioner.py);
one real cluster run is in the default layer; the rest are `slow`."""

import subprocess
import sys

import numpy as np
import pytest

from conftest import EXPORTED, QUICK, tfdistx_env
from test_unit_partitioner import SPLIT
from tfdistx.core import strategies

# The default MLP: its 784x128 kernel is 401,408 of the model's 407,080 bytes (98.6%).
MLP_SHAPES = [(784, 128), (128,), (128, 10), (10,)]
MODEL_BYTES = 407_080
RUN = [*QUICK, EXPORTED, "checkpoint.every_steps=20"]


def ps_shares(summary) -> dict:
    """Each ps task's share of the model's bytes, as the run measured them on its variables."""
    held = summary["variable_bytes"]
    assert all(device.startswith("/job:ps/") for device in held), held
    return {device: count / sum(held.values()) for device, count in held.items()}


def predictions(export_dir, tmp_path) -> np.ndarray:
    """The export's logits for 64 fixed images, computed in a fresh process with plain TensorFlow."""
    script = (
        "import sys, numpy as np, tensorflow as tf\n"
        "serve = tf.saved_model.load(sys.argv[1]).signatures['serving_default']\n"
        "x = np.random.default_rng(0).random((64, 28, 28, 1), dtype=np.float32)\n"
        "name = list(serve.structured_input_signature[1])[0]\n"
        "np.save(sys.argv[2], serve(**{name: tf.constant(x)})['logits'].numpy())\n"
    )
    out = tmp_path / f"{export_dir.parent.name}-{len(list(tmp_path.glob('*.npy')))}.npy"
    proc = subprocess.run(
        [sys.executable, "-c", script, str(export_dir), str(out)],
        capture_output=True,
        text=True,
        env=tfdistx_env(),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return np.load(out)


def test_a_kernel_split_across_two_ps_trains_resumes_on_one_and_exports(tfdistx, tmp_path):
    # Unsplit, the kernel alone would put 99.9% of the model on one ps (the plan says so).
    assert max(strategies.ps_bytes(MLP_SHAPES, 2, None)) / MODEL_BYTES > 0.99
    first = tfdistx(*RUN, *SPLIT, "cluster=ps2w2")
    assert first.returncode == 0, first
    shares = ps_shares(first.summary)
    assert len(shares) == 2 and max(shares.values()) <= 0.6, shares
    # --plan computes the same bytes without TensorFlow
    assert list(first.summary["variable_bytes"].values()) == strategies.ps_bytes(
        MLP_SHAPES, 2, strategies.partitioner_settings({"min_shard_bytes": 65536, "max_shards": 2}, 2)
    )

    # One ps (the slow tests resume onto three): the split kernel's checkpoint restores whole.
    resumed = tfdistx(*RUN, *SPLIT, "cluster=ps1w2", "trainer.steps=80")
    assert resumed.returncode == 0, resumed
    summary = resumed.summary
    assert (summary["step"], summary["resumed"], summary["resumed_from_step"], summary["ps"]) == (80, True, 40, 1)
    assert [m["step"] for m in resumed.metrics] == [20, 40, 60, 80]  # none lost, none repeated
    assert list(summary["variable_bytes"].values()) == [MODEL_BYTES]

    # The export (built unsplit from the run's last checkpoint) reproduces the run's own evaluation.
    from test_export import reproduce
    from tfdistx.data import sources as data_lib

    found = reproduce(
        resumed.dir / "export", data_lib.synthetic(train_examples=512, eval_examples=128), "classification", tmp_path
    )
    assert found["eval/loss"] == pytest.approx(summary["eval"]["eval/loss"], rel=1e-4)
    assert found["eval/accuracy"] == pytest.approx(summary["eval"]["eval/accuracy"], abs=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize(
    "there, ps", [(["cluster=ps1w2"], 1), (["cluster=ps3w2", "strategy.partitioner.max_shards=3"], 3)]
)
def test_resume_onto_another_ps_count_restores_every_weight_exactly(tfdistx, tmp_path, there, ps):
    """Trained split in two, resumed with one ps (nothing split) or split in
    three: with a learning rate too small to move a float32 weight, the
    resumed run's export predicts exactly what the first run's did."""
    first = tfdistx(*RUN, *SPLIT, "cluster=ps2w2")
    assert first.returncode == 0, first
    before = predictions(first.dir / "export", tmp_path)
    resumed = tfdistx(*RUN, *SPLIT, *there, "trainer.steps=60", "optimizer.lr=1e-30")
    assert resumed.returncode == 0, resumed
    assert resumed.summary["resumed_from_step"] == 40 and resumed.summary["step"] == 60
    assert [m["step"] for m in resumed.metrics] == [20, 40, 60]
    shares = ps_shares(resumed.summary)
    assert len(shares) == ps and (ps == 1 or max(shares.values()) <= 0.4), (
        shares
    )  # three shards of the kernel on three ps
    np.testing.assert_allclose(predictions(resumed.dir / "export", tmp_path), before, rtol=0, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize(
    "shards", [["model.shards=1"], []], ids=["split-by-the-partitioner", "split-by-hand-and-again"]
)
def test_wide_deep_tables_resume_onto_another_ps_count(tfdistx, tmp_path, shards):
    """model.shards=1: the tables are split by TF's partitioner alone; by
    default wide_deep splits them into one shard per ps itself, and the
    partitioner splits each of those again (640 kB with 2 ps, 427 kB with 3)."""
    args = [
        *RUN,
        "strategy=parameter_server",
        "strategy.partitioner.min_shard_bytes=262144",
        "data=synthetic_categorical",
        "model=wide_deep",
        *shards,
        "model.vocab_size=20000",
        "data.vocab_size=20000",
        "model.hidden_units=[16]",
    ]
    first = tfdistx(*args, "cluster=ps2w2")
    assert first.returncode == 0, first
    # 20,000 x 16 floats (1.28 MB) in two shards of 640 kB: neither ps holds more than 60%
    assert len(ps_shares(first.summary)) == 2 and max(ps_shares(first.summary).values()) <= 0.6
    resumed = tfdistx(*args, "cluster=ps3w2", "strategy.partitioner.max_shards=3", "trainer.steps=80")
    assert resumed.returncode == 0, resumed
    assert (resumed.summary["resumed_from_step"], resumed.summary["step"]) == (40, 80)
    assert len(ps_shares(resumed.summary)) == 3 and max(ps_shares(resumed.summary).values()) <= 0.45

    from test_export import reproduce
    from tfdistx.data import sources as data_lib

    source = data_lib.synthetic_categorical(vocab_size=20000, train_examples=512, eval_examples=128)
    found = reproduce(resumed.dir / "export", source, "binary", tmp_path)
    assert found["eval/auc"] == pytest.approx(resumed.summary["eval"]["eval/auc"], abs=1e-6)
