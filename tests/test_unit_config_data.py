"""Data config checks, in-process (-m unit): a built-in source's sizes
(config/sources.py) and a file source's files and features
(core/datafiles.py), before TensorFlow starts. One bad value and its
exact line, or one good value and what it resolves to. Files live in tmp_path;
remote patterns (gs://) are never listed here."""

import pytest

from config_helpers import PREFIX, changed, problems, refused
from tfdistx.config import sources
from tfdistx.core import datafiles

# a file source checked without files: remote patterns are left to tf.io.gfile
REMOTE = "data.train_files=gs://bucket/train-*"
LABEL = {"dtype": "int64", "shape": []}


# (a pattern that matches nothing: test_unit_config_checks.py)


# -- files ----------------------------------------------------------------------


@pytest.mark.unit
def test_eval_files_that_match_nothing_are_refused_too(tmp_path):
    (tmp_path / "train-0.csv").write_text("x,label\n1,0\n")
    assert refused(
        tmp_path / "run", "data=csv", f"data.train_files={tmp_path}/train-*", f"data.eval_files={tmp_path}/eval-*"
    ) == [
        PREFIX + f"data.eval_files='{tmp_path}/eval-*': no file matches (relative paths are from the directory tfdistx "
        "runs in)"
    ]


@pytest.mark.unit
def test_a_list_of_patterns_matches_each_file_once_in_order(tmp_path):
    for name in ("b-1", "a-2", "a-1"):
        (tmp_path / name).write_text("")
    assert datafiles.local_matches([f"{tmp_path}/a-*", f"{tmp_path}/*-1"]) == [
        str(tmp_path / "a-1"),
        str(tmp_path / "a-2"),
        str(tmp_path / "b-1"),
    ]


@pytest.mark.unit
def test_a_pattern_under_home_is_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "train-0.tfrecord").write_text("")
    assert datafiles.local_matches("~/train-*") == [str(tmp_path / "train-0.tfrecord")]


@pytest.mark.unit
def test_remote_patterns_are_left_to_tensorflow():
    assert datafiles.local_matches(["/data/a-*", "s3://bucket/b-*"]) is None


@pytest.mark.unit
def test_the_manifest_counts_only_when_it_lists_every_file():
    manifest = {"splits": {"train": {"files": {"t-0": 10, "t-1": 12}}, "eval": {"files": {"e-0": 5}}}}
    assert datafiles.manifest_counts(manifest, ["/d/t-0", "/d/t-1", "/d/e-0"]) == [10, 12, 5]
    assert datafiles.manifest_counts(manifest, ["/d/t-0", "/d/t-2"]) is None


# (the groups composed, {key: the bad value}, the one line it must produce)
@pytest.mark.unit
@pytest.mark.parametrize(
    "base, change, line",
    [
        (
            ("data=tfrecord", REMOTE),
            {"data.train_files": []},
            "data.train_files=[]: give a glob pattern or a list of files, e.g. "
            "data.train_files='/data/train-*.tfrecord'",
        ),
        (
            ("data=tfrecord", REMOTE),
            {"data.features": 5},
            "data.features=5: a mapping of name -> {dtype, shape}, e.g. {image: {dtype: float32, shape: [784]}}",
        ),
        (
            ("data=tfrecord", REMOTE),
            {"data.features": {"x": 3, "label": LABEL}},
            "data.features.x=3: must be {dtype: float32|int64|string, shape: [...], var_len: false}",
        ),
        (
            ("data=tfrecord", REMOTE),
            {"data.features": {"x": {"dtype": "int64", "shape": [2, 3], "var_len": True}, "label": LABEL}},
            "data.features.x.shape=[2, 3]: a var_len feature is padded or cut to one length: give [N]",
        ),
        (
            ("data=tfrecord", REMOTE),
            {"data.features": {"x": {"dtype": "float32", "shape": "784"}, "label": LABEL}},
            "data.features.x.shape='784': a list of positive sizes ([] for a scalar)",
        ),
        (
            ("data=tfrecord", REMOTE),
            {"data.features": {"x": {"dtype": "float32", "shape": [4]}, "label": LABEL}, "data.label": "target"},
            "data.label='target': not one of data.features: x, label",
        ),
        # a run written by an earlier version names its source tfdistx.records.*: checked as the source it became
        (
            ("data=tfrecord", REMOTE),
            {"data._target_": "tfdistx.records.tfrecord", "data.train_files": None},
            "data.train_files=None: give a glob pattern or a list of files, e.g. "
            "data.train_files='/data/train-*.tfrecord'",
        ),
        # the built-in sources' sizes
        (
            ("data=synthetic_multilabel",),
            {"data.num_labels": 0},
            "data.num_labels=0: must be a whole number, at least 1",
        ),
        (
            ("data=synthetic_regression",),
            {"data.num_targets": 0},
            "data.num_targets=0: must be a whole number, at least 1",
        ),
        (
            ("data=synthetic_categorical",),
            {"data.num_fields": 0},
            "data.num_fields=0: must be a whole number, at least 1",
        ),
        (
            ("data=synthetic_categorical",),
            {"data.dense_features": -1},
            "data.dense_features=-1: must be a whole number, at least 0",
        ),
        ((), {"data.train_examples": 100.0}, "data.train_examples=100.0: must be a whole number, at least 1"),
        ((), {"data.image_shape": []}, "data.image_shape=[]: must be a list of positive sizes, e.g. [28, 28, 1]"),
        ((), {"data.image_shape": 784}, "data.image_shape=784: must be a list of positive sizes, e.g. [28, 28, 1]"),
    ],
)
def test_one_bad_data_value_is_one_line(configs, base, change, line):
    assert problems(changed(configs(*base), change)) == [PREFIX + line]


@pytest.mark.unit
@pytest.mark.parametrize(
    "base, change",
    [
        (
            ("data=tfrecord", REMOTE),
            {"data.features": {"x": {"dtype": "float32"}, "label": LABEL}},
        ),  # no shape: a scalar
        (
            ("data=tfrecord", REMOTE),
            {"data.features": {"ids": {"dtype": "int64", "shape": [20], "var_len": True}, "label": LABEL}},
        ),
        (
            ("data=tfrecord", REMOTE),
            {"data.features": {"text": {"dtype": "string", "shape": []}, "y": LABEL}, "data.label": "y"},
        ),
        # a user's own source: its keys are its own, checked by its signature when it is built
        ((), {"data._target_": "json.loads", "data.num_classes": 0}),
    ],
)
def test_a_good_data_value_is_accepted(configs, base, change):
    assert problems(changed(configs(*base), change)) == []


@pytest.mark.unit
@pytest.mark.parametrize(
    "target, current",
    [
        ("tfdistx.records.csv", "tfdistx.data.csv"),
    ],
)
def test_old_source_names_read_as_the_current_ones(target, current):
    assert sources.current(target) == current


# -- values of the wrong kind: named, not a TypeError (as they were before) ------


@pytest.mark.unit
def test_a_train_files_value_that_is_no_pattern_is_named(configs):
    assert problems(changed(configs("data=tfrecord", REMOTE), {"data.train_files": 5})) == [
        PREFIX
        + "data.train_files=5: give a glob pattern or a list of files, e.g. data.train_files='/data/train-*.tfrecord'"
    ]


@pytest.mark.unit
def test_a_feature_shape_that_is_a_number_is_named(configs):
    cfg = changed(
        configs("data=tfrecord", REMOTE), {"data.features": {"x": {"dtype": "float32", "shape": 5}, "label": LABEL}}
    )
    assert problems(cfg) == [PREFIX + "data.features.x.shape=5: a list of positive sizes ([] for a scalar)"]


@pytest.mark.unit
def test_a_dataset_to_download_without_a_network_is_a_fault_of_the_machine(tmp_path):
    """Not a bad config (exit 2): its own exit code, and one line saying what is missing and the way out.
    An empty data_dir and a check URL that refuses at once (port 9 on loopback): no network is tried."""
    from tfdistx.core.errors import EXIT_NO_NETWORK, RunFault
    from tfdistx.data import tfds

    with pytest.raises(RunFault) as fault:
        tfds("mnist", data_dir=str(tmp_path / "tfds"), download_check_url="http://127.0.0.1:9")
    assert fault.value.code == EXIT_NO_NETWORK == 10
    assert fault.value.lines() == [
        f"tfdistx: data=mnist is not downloaded to {tmp_path / 'tfds' / 'mnist' / '3.0.1'}, and the download site is "
        "unreachable from this machine (ConnectionError): download it once on a machine with a network and set "
        "data.data_dir to that copy, or use data=synthetic (exit 10)"
    ]
