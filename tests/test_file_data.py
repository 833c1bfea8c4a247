"""A user's own data in files (data=tfrecord, data=csv), written by `tfdistx
data write`: which records each strategy's workers read, exact resume, and
bad files refused in one line. Real files on disk, real clusters."""

import json
import random
import sys

import numpy as np
import pytest

from conftest import refused_in_one_line, run_command, tfdistx_env, whole_and_resumed
from engine_helpers import train
from test_data_split import BATCH, EXAMPLES, STEPS, seen_counts


def write_data(out, *overrides, shards=4, fmt="tfrecord", compression=None):
    cmd = [
        sys.executable,
        "-m",
        "tfdistx",
        "data",
        "write",
        *overrides,
        "--out",
        str(out),
        "--shards",
        str(shards),
        "--format",
        fmt,
    ]
    if compression:
        cmd += ["--compression", compression]
    proc = run_command(cmd, tfdistx_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def indexed_files(tmp_path_factory):
    """EXAMPLES records, each carrying its own index, in 4 TFRecord files."""
    return write_data(
        tmp_path_factory.mktemp("indexed"), "data._target_=user_plugins.indexed_data", f"+data.examples={EXAMPLES}"
    )


@pytest.fixture(scope="module")
def ps_files(tmp_path_factory):
    """Twice as many records, so that no parameter-server worker wraps around its shard."""
    return write_data(
        tmp_path_factory.mktemp("indexed_ps"),
        "data._target_=user_plugins.indexed_data",
        f"+data.examples={2 * EXAMPLES}",
    )


def probe(tfdistx, tmp_path, files, *args, examples=EXAMPLES):
    run = tfdistx(
        "data=tfrecord",
        f"data.train_files={files}/train-*",
        "model._target_=user_plugins.counting_model",
        f"+model.examples={examples}",
        f"trainer.steps={STEPS}",
        f"trainer.steps_per_loop={STEPS}",
        f"trainer.log_every={STEPS}",
        "trainer.eval_every=0",
        f"data.batch_size={BATCH}",
        "data.shuffle_buffer=64",
        "logger.tensorboard=false",
        "checkpoint.export=false",
        "cluster.max_restarts=0",
        *args,
    )
    assert run.returncode == 0, run
    return seen_counts(run.dir), run


def test_the_writer_leaves_balanced_shards_and_a_manifest(indexed_files):
    manifest = json.loads((indexed_files / "manifest.json").read_text())
    counts = manifest["splits"]["train"]["files"]
    assert sorted(counts) == [f"train-0000{k}-of-00004.tfrecord" for k in range(4)]
    assert sorted(counts.values()) == [EXAMPLES // 4] * 4
    assert manifest["features"]["index"] == {"dtype": "int64", "shape": []}
    assert manifest["label"] == "label" and manifest["num_classes"] == 2


@pytest.mark.parametrize(
    "strategy",
    [
        pytest.param(["strategy=one_device"], marks=pytest.mark.slow),
        pytest.param(["strategy=mirrored", "cluster=1x2"], marks=pytest.mark.slow),
        ["strategy=multiworker", "cluster=2x1"],
    ],
)
def test_every_record_is_read_once_per_epoch_across_the_cluster(tfdistx, tmp_path, indexed_files, strategy):
    """STEPS x BATCH is one epoch: a record read by two workers would be
    counted twice and another never."""
    seen, run = probe(tfdistx, tmp_path, indexed_files, *strategy)
    assert seen.sum() == STEPS * BATCH
    assert (seen == 1).all(), f"{(seen == 0).sum()} never seen, {(seen > 1).sum()} seen twice"


def test_parameter_server_workers_read_their_own_files(tfdistx, tmp_path, ps_files):
    seen, run = probe(tfdistx, tmp_path, ps_files, "strategy=parameter_server", "cluster=ps1w2", examples=2 * EXAMPLES)
    assert seen.sum() == STEPS * BATCH
    assert (seen <= 1).all(), f"{(seen > 1).sum()} records trained on twice"


# Two workers (each its own files) are slow: test_fault_tolerance resumes a
# multiworker run bitwise already, through the same input code.
@pytest.mark.parametrize(
    "strategy", [["strategy=one_device"], pytest.param(["strategy=multiworker", "cluster=2x1"], marks=pytest.mark.slow)]
)
def test_resumed_at_a_random_step_on_file_data_ends_bitwise_equal(tfdistx, tmp_path, strategy):
    """Windows of 48 records over 4 files of 128, 60 steps of 32 (3.75
    epochs): a random stop lands inside a window, a file and an epoch."""
    files = write_data(tmp_path / "data", "data=synthetic", "data.train_examples=512", "data.image_shape=[8]", shards=4)
    stop_at = random.Random().randint(1, 59)
    print(f"stopped at step {stop_at}")
    args = [
        "data=tfrecord",
        f"data.train_files={files}/train-*",
        "data.shuffle_buffer=48",
        "data.batch_size=32",
        *strategy,
        "trainer.deterministic=true",
        "model.dropout=0.2",
        "trainer.steps_per_loop=1",
        "trainer.log_every=1",
        "checkpoint.every_steps=0",
        "trainer.eval_every=0",
        "logger.tensorboard=false",
        "checkpoint.export=false",
    ]
    whole, resumed = whole_and_resumed(tfdistx, tmp_path, args, stop_at=stop_at, steps=60)
    assert resumed.summary["weights_sha256"] == whole.summary["weights_sha256"]


def test_csv_and_compressed_tfrecord_train_as_the_records_do(tmp_path):
    """The same examples as TFRecord, GZIP TFRecord and CSV: the same training,
    to float rounding (written by `tfdistx data write`, trained in this process)."""
    common = [
        "data=synthetic",
        "data.train_examples=1024",
        "data.eval_examples=256",
        "data.image_shape=[6]",
        "data.num_classes=3",
    ]
    losses = {}
    for fmt, compression in (("tfrecord", None), ("tfrecord", "GZIP"), ("csv", None)):
        files = write_data(tmp_path / f"{fmt}-{compression}", *common, fmt=fmt, compression=compression)
        run = train(
            tmp_path / f"run-{fmt}-{compression}",
            f"data={fmt}",
            f"data.train_files={files}/train-*",
            f"data.eval_files={files}/eval-*",
            "trainer.steps=64",
            "trainer.steps_per_loop=32",
            "trainer.log_every=32",
            sizes=(),
        )
        losses[fmt, compression] = run.summary["eval"]["eval/loss"]
    assert np.allclose(list(losses.values()), losses["tfrecord", None], rtol=1e-4), losses


# -- bad input: exit 2, one line that names the file -----------------------


def test_a_model_for_one_tensor_on_dict_features(tfdistx, indexed_files):
    refused_in_one_line(
        tfdistx("data=tfrecord", f"data.train_files={indexed_files}/train-*", "model=mlp"), "model='mlp'", "dict"
    )


def test_a_file_that_is_not_tfrecord(tfdistx, tmp_path, indexed_files):
    bad = tmp_path / "train-0.tfrecord"
    bad.write_text("id,label\n1,0\n" * 100)
    (tmp_path / "manifest.json").write_text((indexed_files / "manifest.json").read_text())
    refused_in_one_line(
        tfdistx("data=tfrecord", f"data.train_files={bad}"),
        str(bad),
        "not TFRecord, or not compressed as data.compression=null says",
    )


@pytest.mark.parametrize(
    "features, named",
    [
        (
            "{x: {dtype: float32, shape: [4]}, label: {dtype: int64, shape: []}, weight: {dtype: float32, shape: []}}",
            "data.features.weight",
        ),
        pytest.param(
            "{x: {dtype: int64, shape: [4]}, label: {dtype: int64, shape: []}}",
            "data.features.x",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            "{x: {dtype: float32, shape: [5]}, label: {dtype: int64, shape: []}}",
            "data.features.x",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_features_the_records_do_not_hold(tfdistx, indexed_files, features, named):
    """A feature missing from the records, of another dtype, or of another size."""
    refused_in_one_line(
        tfdistx("data=tfrecord", f"data.train_files={indexed_files}/train-*", f"data.features={features}"),
        named,
        "train-00000-of-00004.tfrecord",
    )


def test_a_corrupt_record_mid_file_stops_the_run_naming_the_file(tfdistx, tmp_path, indexed_files):
    data = tmp_path / "data"
    data.mkdir()
    for path in indexed_files.iterdir():
        (data / path.name).write_bytes(path.read_bytes())
    damaged = data / "train-00002-of-00004.tfrecord"
    raw = bytearray(damaged.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one flipped byte: its record's checksum fails
    damaged.write_bytes(bytes(raw))
    run = tfdistx(
        "data=tfrecord",
        f"data.train_files={data}/train-*",
        "model._target_=user_plugins.counting_model",
        f"+model.examples={EXAMPLES}",
        "trainer.steps=40",
        "data.batch_size=32",
        "checkpoint.export=false",
        "logger.tensorboard=false",
    )
    refused_in_one_line(run, str(damaged), "corrupt")


def test_a_truncated_first_file_stops_a_cluster_once_in_one_line(tfdistx, tmp_path, indexed_files):
    """Cut mid-record, inside the shuffle window the start-up check reads:
    refused as a config error (exit 2), so the launcher does not restart."""
    data = tmp_path / "data"
    data.mkdir()
    for path in indexed_files.iterdir():
        (data / path.name).write_bytes(path.read_bytes())
    first = data / "train-00000-of-00004.tfrecord"
    first.write_bytes(first.read_bytes()[: first.stat().st_size // 2 + 7])
    run = tfdistx(
        "data=tfrecord",
        f"data.train_files={data}/train-*",
        "strategy=multiworker",
        "cluster=2x1",
        "model._target_=user_plugins.counting_model",
        f"+model.examples={EXAMPLES}",
        "trainer.steps=40",
        "data.batch_size=32",
        "checkpoint.export=false",
        "logger.tensorboard=false",
    )
    assert run.returncode == 2 and "Traceback" not in run.stdout + run.stderr, run
    assert f"data file='{first}': a corrupt record" in run.stdout and "restart" not in run.stderr, run


@pytest.mark.parametrize(
    "change, said",
    [
        (lambda cells: cells[:-1], "Expect 17 fields but have 16"),  # a ragged row
        pytest.param(lambda cells: ["abc", *cells[1:]], "not a valid float: abc", marks=pytest.mark.slow),
        pytest.param(
            lambda cells: [*cells[:-1], "12"],
            "label: a class id of 10 or more (data.num_classes=10)",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_a_bad_csv_row_is_refused_naming_the_file(tfdistx, tmp_path, change, said):
    data = write_data(
        tmp_path / "csv",
        "data=synthetic",
        "data.image_shape=[4,4,1]",
        "data.train_examples=256",
        "data.eval_examples=64",
        shards=1,
        fmt="csv",
    )
    train = next(data.glob("train-*"))
    lines = train.read_text().splitlines()
    lines[150] = ",".join(change(lines[150].split(",")))
    train.write_text("\n".join(lines) + "\n")
    run = tfdistx(
        "data=csv",
        f"data.train_files={train}",
        "trainer.steps=40",
        "data.batch_size=32",
        "checkpoint.export=false",
        "logger.tensorboard=false",
    )
    refused_in_one_line(run, str(train), said)
