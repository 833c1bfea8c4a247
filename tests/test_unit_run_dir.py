"""A run never loses the run that is already in its directory, as fit.train
sees it, in this process (engine_helpers: -m unit; a refusal's exit 2 is
the same for every ConfigError): a rerun resumes from the saved step; a
checkpoint of another model or optimizer is refused (not taken as damage
and trained over), fewer steps than done are refused, a run killed after
its last checkpoint is finished by its rerun, checkpoint.restore=false
keeps the previous run aside, a bad `checkpoint` state file hides nothing.
Real runs, real files. (Two runs in one directory, killed runs and
clusters: test_run_dir.py.)"""

import os
import shutil

import pytest

from conftest import files
from engine_helpers import copied, train
from tfdistx.core.errors import ConfigError

SMALL_CNN = ["model=cnn", "model.filters=[4]", "model.dense_units=8"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished run of 40 steps, checkpoints at 20 and 40, trained once a module in each pytest worker: each test that
    reruns, resumes or sets aside such a run works on its own copy (`copied`), not a run trained anew
    (~0.7 CPU s each, five tests)."""
    return train(tmp_path_factory.mktemp("finished") / "run", "checkpoint.every_steps=20")


@pytest.mark.unit
def test_resuming_with_another_model_or_optimizer_is_refused_and_the_run_is_kept(tmp_path):
    first = train(tmp_path / "run", *SMALL_CNN, "checkpoint.every_steps=20")
    before = files(first.dir)
    for change, what in [
        (["model=mlp"], "the model's weights differ"),
        ([*SMALL_CNN, "model.dense_units=16"], "#2: (784, 8) there, (784, 16) here"),
        ([*SMALL_CNN, "optimizer=sgd"], "the optimizer differs"),
    ]:
        with pytest.raises(ConfigError) as refused:
            train(tmp_path / "run", *change, "trainer.steps=80")
        text = "\n".join(refused.value.lines())
        assert "another model or optimizer" in text and what in text and "use another hydra.run.dir" in text, text
        assert files(first.dir) == before, f"{change} changed the first run's files"


@pytest.mark.unit  # the killed run in test_training.py resumes through the command
def test_rerun_resumes_from_the_saved_step(tmp_path, finished):
    copied(finished, tmp_path / "run")
    second = train(tmp_path / "run", "trainer.steps=80", "checkpoint.every_steps=20")
    assert (second.summary["resumed"], second.summary["resumed_from_step"], second.summary["step"]) == (True, 40, 80)
    assert [m["step"] for m in second.metrics] == [20, 40, 60, 80]


@pytest.mark.unit
def test_fewer_steps_than_the_run_has_done_is_refused(tmp_path):
    first = train(tmp_path / "run")
    before = files(first.dir)
    with pytest.raises(ConfigError) as refused:
        train(tmp_path / "run", "trainer.steps=20")
    assert refused.value.lines() == [
        "tfdistx: invalid config: trainer.steps=20: the run in this directory is already at step 40 "
        "(ckpt-40): ask for 40 steps or more, or use another hydra.run.dir"
    ]
    assert files(first.dir) == before  # summary.json, metrics.jsonl and checkpoints as they were


@pytest.mark.unit
@pytest.mark.parametrize("missing", [("summary.json", "export"), ("export",)])
def test_a_run_killed_after_its_last_checkpoint_is_finished_by_its_rerun(tmp_path, missing):
    """Killed between the last checkpoint and the summary or export (the files
    such a kill leaves are made by removing them): the rerun trains nothing
    and writes what is missing, the same as the whole run wrote it."""
    whole = train(tmp_path / "run", "checkpoint.every_steps=20", "checkpoint.export=true")
    before = whole.summary
    kept = {name: (whole.dir / name).read_bytes() for name in ("summary.json", "metrics.jsonl") if name not in missing}
    for name in missing:
        shutil.rmtree(whole.dir / name) if (whole.dir / name).is_dir() else (whole.dir / name).unlink()
    rerun = train(tmp_path / "run", "checkpoint.every_steps=20", "checkpoint.export=true")
    assert rerun.objective == whole.objective
    for key in ("step", "train", "eval", "weights_sha256", "global_batch"):
        assert rerun.summary[key] == before[key], key
    if "summary.json" in missing:
        assert (rerun.summary["resumed"], rerun.summary["resumed_from_step"]) == (True, 40)
    assert (rerun.dir / "export" / "saved_model.pb").is_file()
    assert all((rerun.dir / name).read_bytes() == data for name, data in kept.items())  # what it had is untouched
    assert [m["step"] for m in rerun.metrics] == [20, 40]


@pytest.mark.unit
def test_restore_false_keeps_the_previous_run_aside(tmp_path, finished):
    first = copied(finished, tmp_path / "run")
    old_metrics = (first.dir / "metrics.jsonl").read_text()
    fresh = train(tmp_path / "run", "trainer.steps=20", "checkpoint.restore=false", "checkpoint.every_steps=20")
    assert fresh.summary["step"] == 20 and not fresh.summary["resumed"]
    assert [m["step"] for m in fresh.metrics] == [20]
    assert sorted(p.name for p in (fresh.dir / "checkpoints").glob("*.index")) == [
        "ckpt-20.index"
    ]  # no old ones mixed in
    kept = list(fresh.dir.glob("metrics.replaced-*.jsonl"))
    assert len(kept) == 1 and kept[0].read_text() == old_metrics
    assert sorted(p.name for p in next(fresh.dir.glob("checkpoints.replaced-*")).glob("*.index")) == [
        "ckpt-20.index",
        "ckpt-40.index",
    ]


@pytest.mark.unit
def test_a_run_refused_after_restore_false_changes_nothing(tmp_path, finished):
    """checkpoint.restore=false sets the previous run aside only once nothing
    can refuse the new run any more: a warm start that does not fit this
    model is refused first, and the run that is there keeps every file."""
    train(tmp_path / "source", "data.num_classes=5")  # another head: (128, 5)
    first = copied(finished, tmp_path / "run")
    before = {path: path.read_bytes() for path in first.dir.rglob("*") if path.is_file()}
    with pytest.raises(ConfigError, match="checkpoint.init_from"):
        train(tmp_path / "run", "checkpoint.restore=false", f"checkpoint.init_from={tmp_path / 'source'}")
    assert {path: path.read_bytes() for path in first.dir.rglob("*") if path.is_file()} == before


@pytest.mark.unit
@pytest.mark.parametrize("state", ["random bytes", "names a checkpoint that is gone"])
def test_a_bad_checkpoint_state_file_does_not_hide_the_checkpoints(tmp_path, state, caplog, finished):
    first = copied(finished, tmp_path / "run")
    state_file = first.dir / "checkpoints" / "checkpoint"
    if state == "random bytes":
        state_file.write_bytes(os.urandom(256))
    else:  # only a checkpoint that is not on disk: the intact ckpt-20 and ckpt-40 must still be found
        state_file.write_text('model_checkpoint_path: "ckpt-90"\nall_model_checkpoint_paths: "ckpt-90"\n')
    with caplog.at_level("WARNING"):
        second = train(tmp_path / "run", "checkpoint.every_steps=20", "trainer.steps=60")
    assert (second.summary["resumed_from_step"], second.summary["step"]) == (40, 60)
    assert "the checkpoints on disk are used" in caplog.text
    assert list((first.dir / "checkpoints").glob("checkpoint.replaced-*"))
