"""A run's small files are written whole or not at all (tfdistx/whole_files.py),
and a checkpoint's step is read from its name in one place
(tfdistx/checkpoint_files.py). On the real file system; no TensorFlow."""

import os

import pytest

from tfdistx.checkpoint_files import find, newest_step, on_disk, step_of
from tfdistx.whole_files import keep_steps_up_to, read_jsonl, replacing, write_whole

pytestmark = pytest.mark.unit


def test_a_failed_write_leaves_the_file_as_it_was_and_no_temporary_file(tmp_path):
    path = tmp_path / "summary.json"
    write_whole(path, "whole\n")
    with pytest.raises(RuntimeError):
        with replacing(path) as file:
            file.write("half")
            raise RuntimeError("a kill mid-write")
    assert path.read_text() == "whole\n"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_the_file_written_has_the_mode_open_would_give_it(tmp_path):
    write_whole(tmp_path / "new", "x", fsync=True)
    with open(tmp_path / "plain", "w") as file:
        file.write("x")
    assert (tmp_path / "new").stat().st_mode == (tmp_path / "plain").stat().st_mode


def test_a_resumed_run_keeps_the_lines_up_to_its_step_and_drops_a_line_cut_short(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 10}\n{"step": 20}\n{"step": 30}\n{"step": 4')
    keep_steps_up_to(path, 20)
    assert [record for _, record in read_jsonl(path)] == [{"step": 10}, {"step": 20}]


@pytest.mark.parametrize(
    "name, step",
    [
        ("ckpt-150", 150),
        ("/run/checkpoints/ckpt-150", 150),
        ("ckpt-150.index", 150),
        ("ckpt-7.data-00000-of-00001", 7),
        ("ckpt-150_temp", None),
        ("ckpt-.index", None),
        ("checkpoint", None),
        ("best", None),
    ],
)
def test_a_checkpoints_step_is_read_from_its_name(name, step):
    assert step_of(name) == step


def test_the_newest_checkpoint_and_one_by_its_step_are_found_by_their_files(tmp_path):
    assert newest_step(tmp_path) is None and newest_step(tmp_path / "absent") is None
    for step in (50, 150, 100):
        (tmp_path / f"ckpt-{step}.index").touch()
    (tmp_path / "ckpt-x.index").touch()
    assert on_disk(str(tmp_path)) == [os.path.join(tmp_path, f"ckpt-{step}") for step in (50, 100, 150)]
    assert newest_step(tmp_path) == 150
    assert find(str(tmp_path), 50) == os.path.join(tmp_path, "ckpt-50")
