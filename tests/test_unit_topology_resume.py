"""A run checkpointed under one topology resumes under another: no step lost
or repeated, the examples after the resume those a whole run trains (in-memory
data: one order on every topology, data/order.py), embedding tables re-split
for another number of parameter servers (engine/resplit.py), a changed global
batch refused in one line (engine/topology.py).

The probe (tests/user_plugins.py): wide_deep over click-like rows, with its
tables in `model.shards` row shards (${cluster.ps}, as conf/model/wide_deep
has it), beside a CountExamples layer that counts in a weight how often each
example was trained on. One device and mirrored replicas run in this process
(-m unit); the other topologies are real local clusters, in
test_topology_resume.py."""

import json
import logging

import numpy as np
import pytest
import tensorflow as tf

from conftest import steps_logged
from engine_helpers import copied, train
from tfdistx.core.errors import ConfigError
from tfdistx.engine import topology
from tfdistx.engine.export import export_checkpoint

EXAMPLES, BATCH, STOP, STEPS = 256, 32, 6, 12  # 8 steps an epoch: stopped in the first, ended in the second
PROBE = [
    "data._target_=user_plugins.indexed_clicks",
    "model._target_=user_plugins.counting_wide_deep",
    "task=binary",
    f"+data.examples={EXAMPLES}",
    f"+model.examples={EXAMPLES}",
    "+model.shards=${cluster.ps}",
    f"data.batch_size={BATCH}",
    "trainer.steps_per_loop=2",
    "trainer.log_every=2",
    "trainer.eval_every=0",
    "logger.tensorboard=false",
    "checkpoint.export=false",
    "cluster.max_restarts=0",
]

TOPOLOGIES = {  # name -> (overrides, strategy, model shards)
    "one_device": (["strategy=one_device"], "one_device", 1),
    "mirrored_1x2": (["strategy=mirrored", "cluster=1x2"], "mirrored", 1),
    "multiworker_2x1": (["strategy=multiworker", "cluster=2x1"], "multiworker", 1),
    "multiworker_4x1": (["strategy=multiworker", "cluster=4x1"], "multiworker", 1),
    "ps1w2": (["strategy=parameter_server", "cluster=ps1w2"], "parameter_server", 1),
    "ps2w4": (["strategy=parameter_server", "cluster=ps2w4"], "parameter_server", 2),
}


def seen_counts(run_dir):
    """The probe's per-example counts in the newest checkpoint."""
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(run_dir / "checkpoints")))
    return reader.get_tensor(next(k for k in reader.get_variable_to_shape_map() if "/seen/" in k))


def model_values(run_dir, shards: int) -> list:
    """The model's trainable values in the newest checkpoint, each table whole
    (its `shards` pieces put together), so that runs of any split compare."""
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(run_dir / "checkpoints")))
    prefix = "optimizer/_trainable_variables/"
    count = len({k[len(prefix) :].split("/")[0] for k in reader.get_variable_to_shape_map() if k.startswith(prefix)})
    values = [reader.get_tensor(f"{prefix}{i}/.ATTRIBUTES/VARIABLE_VALUE") for i in range(count)]
    # wide_deep's variables: the deep table's shards, then the wide table's, then the dense layers'
    tables = [np.concatenate(values[k * shards : (k + 1) * shards])[:1000] for k in range(2)]
    return tables + values[2 * shards :]


def train_whole(run_dir):
    """What a run that never stopped trains: the same on every synchronous
    topology (one example order), so one device, in this process, is the
    reference. Trained once a session: the `topology_whole` fixture (conftest.py),
    for these tests and the real clusters' in test_topology_resume.py."""
    train(run_dir, *PROBE, "strategy=one_device", f"trainer.steps={STEPS}", sizes=[])
    return run_dir


def check_resumed(run_dir, summary: dict, before: str, after: str, whole_dir, output: str = None):
    """No step lost or twice, the resume said, and the examples a whole run trains."""
    assert (summary["step"], summary["resumed_from_step"]) == (STEPS, STOP)
    assert summary["resumed_from_topology"]["strategy"] == TOPOLOGIES[before][1], summary["resumed_from_topology"]
    assert summary["strategy"] == TOPOLOGIES[after][1]
    assert steps_logged(run_dir) == list(range(2, STEPS + 1, 2))
    assert sorted(json.loads((run_dir / "checkpoints" / topology.FILE).read_text())) == [
        f"ckpt-{STEPS}",
        f"ckpt-{STOP}",
    ]
    if output is not None:
        line = next((line for line in output.splitlines() if "resuming on another topology" in line), None)
        assert line and f"-> {summary['strategy']}" in line and f"from step {STOP}" in line, output[-3000:]
        if TOPOLOGIES[before][2] != TOPOLOGIES[after][2]:
            assert f"saved in {TOPOLOGIES[before][2]} shard(s) and are re-split into {TOPOLOGIES[after][2]}" in output
    seen = seen_counts(run_dir)
    assert seen.sum() == STEPS * BATCH  # every step trained one global batch, once
    if "parameter_server" not in (TOPOLOGIES[before][1], TOPOLOGIES[after][1]):  # asynchronous: only in expectation
        np.testing.assert_array_equal(seen, seen_counts(whole_dir))


# -- in this process: one device and mirrored replicas -----------------------------


@pytest.fixture(scope="module")
def stopped_on_one_device(tmp_path_factory):
    """The probe's first part on one device, stopped at STOP: trained once a module in each pytest worker,
    and copied (engine_helpers.copied) by each test that resumes it or refuses its resume."""
    return train(
        tmp_path_factory.mktemp("stopped") / "run", *PROBE, "strategy=one_device", f"trainer.steps={STOP}", sizes=[]
    )


def first_part(tmp_path, before: str, stopped_on_one_device):
    """The first part of a run on topology `before`, in tmp_path/run."""
    if before == "one_device":
        return copied(stopped_on_one_device, tmp_path / "run")
    return train(tmp_path / "run", *PROBE, *TOPOLOGIES[before][0], f"trainer.steps={STOP}", sizes=[])


@pytest.mark.unit
@pytest.mark.parametrize("before, after", [("one_device", "mirrored_1x2"), ("mirrored_1x2", "one_device")])
def test_one_device_and_mirrored_resume_onto_each_other(
    tmp_path, topology_whole, caplog, before, after, stopped_on_one_device
):
    caplog.set_level(logging.INFO, logger="tfdistx")
    first_part(tmp_path, before, stopped_on_one_device)
    resumed = train(tmp_path / "run", *PROBE, *TOPOLOGIES[after][0], f"trainer.steps={STEPS}", sizes=[])
    check_resumed(resumed.dir, resumed.summary, before, after, topology_whole, caplog.text)
    # the same examples, step by step, and the optimizer's state carried over: the whole run's weights
    for mine, reference in zip(model_values(resumed.dir, 1), model_values(topology_whole, 1)):
        np.testing.assert_allclose(mine, reference, rtol=1e-4, atol=1e-6)


@pytest.mark.unit
@pytest.mark.parametrize("before, after", [(2, 3), (3, 1)])
def test_embedding_tables_are_re_split_for_another_number_of_shards(tmp_path, caplog, before, after):
    """As when the number of ps changes (model.shards follows cluster.ps):
    the tables and Adam's moments of every row carry over, so the run ends
    where one that kept its split all along does."""
    caplog.set_level(logging.INFO, logger="tfdistx")
    args = [arg for arg in PROBE if not arg.startswith("+model.shards")]
    kept = train(tmp_path / "kept", *args, f"+model.shards={before}", f"trainer.steps={STEPS}", sizes=[])
    train(tmp_path / "run", *args, f"+model.shards={before}", f"trainer.steps={STOP}", sizes=[])
    resumed = train(tmp_path / "run", *args, f"+model.shards={after}", f"trainer.steps={STEPS}", sizes=[])
    assert f"saved in {before} shard(s) and are re-split into {after}" in caplog.text
    assert resumed.summary["resumed_from_topology"] is None  # the same topology: only the split changed
    np.testing.assert_array_equal(seen_counts(resumed.dir), seen_counts(kept.dir))
    for mine, reference in zip(model_values(resumed.dir, after), model_values(kept.dir, before)):
        np.testing.assert_allclose(mine, reference, rtol=1e-5, atol=1e-7)
    # The run's config now says `after`: its checkpoint from before the change still exports (`tfdistx export --step`).
    caplog.clear()
    export_checkpoint(resumed.spec, str(resumed.dir / "checkpoints" / f"ckpt-{STOP}"), str(tmp_path / "export"))
    assert f"ckpt-{STOP}: its embedding tables were saved in {before} shard(s)" in caplog.text
    assert (tmp_path / "export" / "saved_model.pb").is_file()


@pytest.mark.unit
def test_a_changed_global_batch_is_refused_in_one_line_and_nothing_is_touched(tmp_path, stopped_on_one_device):
    """data.batch_size is the global batch: a resume on another topology keeps
    it (the per-replica batch follows). Asking for another would change what a
    step and the data position mean: refused, with the way out."""
    first = first_part(tmp_path, "one_device", stopped_on_one_device)
    before = {path.name: path.stat().st_mtime_ns for path in (first.dir / "checkpoints").iterdir()}
    with pytest.raises(ConfigError) as refused:
        train(
            tmp_path / "run",
            *PROBE,
            *TOPOLOGIES["mirrored_1x2"][0],
            "data.batch_size=64",
            f"trainer.steps={STEPS}",
            sizes=[],
        )
    line = str(refused.value)
    assert "\n" not in line and line.startswith("data.batch_size=64"), line
    assert "global batch of 32" in line and "set data.batch_size=32" in line and "checkpoint.init_from=" in line
    assert {path.name: path.stat().st_mtime_ns for path in (first.dir / "checkpoints").iterdir()} == before
    assert steps_logged(first.dir) == list(range(2, STOP + 1, 2))


@pytest.mark.unit
def test_scaled_learning_rate_would_change_mid_run_and_is_refused(tmp_path):
    train(
        tmp_path / "run",
        *PROBE,
        "strategy=one_device",
        "optimizer.scale_lr_with_replicas=true",
        f"trainer.steps={STOP}",
        sizes=[],
    )
    with pytest.raises(ConfigError) as refused:
        train(
            tmp_path / "run",
            *PROBE,
            *TOPOLOGIES["mirrored_1x2"][0],
            "optimizer.scale_lr_with_replicas=true",
            f"trainer.steps={STEPS}",
            sizes=[],
        )
    assert "optimizer.scale_lr_with_replicas=false optimizer.lr=" in str(refused.value), str(refused.value)


@pytest.mark.unit
def test_a_run_from_before_the_record_resumes_on_another_topology(tmp_path, topology_whole, stopped_on_one_device):
    first = first_part(tmp_path, "one_device", stopped_on_one_device)
    (first.dir / "checkpoints" / topology.FILE).unlink()  # as an earlier tfdistx left its checkpoints
    resumed = train(tmp_path / "run", *PROBE, *TOPOLOGIES["mirrored_1x2"][0], f"trainer.steps={STEPS}", sizes=[])
    assert (resumed.summary["step"], resumed.summary["resumed_from_topology"]) == (STEPS, None)  # unknown: not claimed
    np.testing.assert_array_equal(seen_counts(resumed.dir), seen_counts(topology_whole))


@pytest.mark.unit
def test_the_record_keeps_the_checkpoints_on_disk_and_a_damaged_one_is_kept_aside(tmp_path):
    for step in (10, 20):
        (tmp_path / f"ckpt-{step}.index").touch()
    topology.record(str(tmp_path), 10, {"strategy": "one_device"})
    topology.record(str(tmp_path), 20, {"strategy": "mirrored"})
    (tmp_path / "ckpt-10.index").unlink()  # rotated out by max_to_keep
    topology.record(str(tmp_path), 30, {"strategy": "multiworker"})
    assert sorted(json.loads((tmp_path / topology.FILE).read_text())) == ["ckpt-20", "ckpt-30"]
    assert topology.written_under(str(tmp_path / "ckpt-20")) == {"strategy": "mirrored"}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left
    (tmp_path / topology.FILE).write_text("{not json")
    assert topology.written_under(str(tmp_path / "ckpt-20")) is None  # unknown: resumes unchecked
    topology.record(
        str(tmp_path), 40, {"strategy": "one_device"}
    )  # the chief's next save keeps the damaged record aside
    assert [p.read_text() for p in tmp_path.glob("topology.replaced-*.json")] == ["{not json"]
    assert sorted(json.loads((tmp_path / topology.FILE).read_text())) == ["ckpt-40"]


def _topology(strategy, workers, ps=0, replicas=None, batch=64):
    replicas = replicas or workers
    return topology.describe(
        strategy=strategy,
        cluster=f"{workers}x1",
        workers=workers,
        ps=ps,
        replicas=replicas,
        input_pipelines=workers,
        global_batch=batch,
        per_replica_batch=batch // (1 if ps else replicas),
        learning_rate=0.001,
    )


@pytest.mark.unit
@pytest.mark.parametrize(
    "before, in_memory, note",
    [
        (_topology("multiworker", 2), True, None),  # one order on every topology
        (_topology("multiworker", 2), False, "split per input pipeline"),  # files: each pipeline its own
        (_topology("parameter_server", 2, ps=1), True, "only in expectation"),
    ],
)
def test_what_the_log_says_of_the_data_after_a_resume(caplog, before, in_memory, note):
    caplog.set_level(logging.INFO, logger="tfdistx")
    now = _topology("one_device", 1)
    said = topology.on_resume(
        before,
        now,
        batch_size=64,
        accumulate_steps=1,
        scale_lr_with_replicas=False,
        checkpoint="/r/ckpt-600",
        run_dir="/r",
        start_step=600,
        in_memory=in_memory,
        log_it=True,
    )
    assert said == before
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith(
        f"resuming on another topology: {topology.text(before)} -> {topology.text(now)}, from step 600"
    )
    assert len(lines) == (2 if note else 1) and (note is None or note in lines[1]), lines
    assert (
        topology.on_resume(
            now,
            now,
            batch_size=64,
            accumulate_steps=1,
            scale_lr_with_replicas=False,
            checkpoint="/r/ckpt-600",
            run_dir="/r",
            start_step=600,
            in_memory=in_memory,
            log_it=True,
        )
        is None
    )  # unchanged: nothing said
