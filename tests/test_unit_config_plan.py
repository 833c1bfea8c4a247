"""`--plan`, in-process (-m unit): commands/plan.describe on the config the
command line composes, line by line; and the decisions it reports that are
made before TensorFlow starts (XLA, precision, which way an objective is
better)."""

import json

import pytest

from config_helpers import compose_ok
from tfdistx.commands.plan import describe
from tfdistx.core import compute, datafiles, strategies
from tfdistx.core.objective import direction, value


@pytest.fixture(autouse=True)
def no_scheduler(monkeypatch):
    """--plan reads this process's environment: no TF_CONFIG or Slurm step here unless a test sets one."""
    for name in ("TF_CONFIG", "SLURM_PROCID", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"):
        monkeypatch.delenv(name, raising=False)


def plan(configs, *overrides) -> list:
    return describe(configs(*overrides)).splitlines()


def data_line(text_lines) -> str:
    return next(line for line in text_lines if line.startswith("data "))


# -- moved from tests/test_file_data.py (it ran `python -m tfdistx ... --plan`) --


def write_files(where, files=4, records=128, manifest=True):
    where.mkdir()
    names = [f"train-{k:05d}-of-{files:05d}.tfrecord" for k in range(files)]
    for name in names:
        (where / name).write_bytes(b"")  # --plan never opens them
    if manifest:  # as `tfdistx data write` leaves it
        (where / "manifest.json").write_text(json.dumps({"splits": {"train": {"files": {n: records for n in names}}}}))
    return where


@pytest.mark.unit
@pytest.mark.parametrize(
    "overrides, says",
    [
        (
            ["strategy=multiworker", "cluster=2x1"],
            "data          512 records; 4 files split by file: each of 2 workers reads 2 of them",
        ),
        (
            ["strategy=multiworker", "cluster=8x1"],
            "data          512 records; 4 file(s) for 8 workers: split by element (each reads every file "
            "and keeps every 8-th record); write at least 8 files to split them by file",
        ),
        ([], "data          512 records; 4 file(s), read by one input pipeline"),
    ],
)
def test_plan_says_how_the_files_split(tmp_path, overrides, says):
    files = write_files(tmp_path / "data")
    cfg = compose_ok(tmp_path / "run", "data=tfrecord", f"data.train_files={files}/train-*", *overrides)
    assert data_line(describe(cfg).splitlines()) == says


# -- more of --plan --------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    "files, manifest, overrides, says",
    [
        (
            5,
            True,
            ["strategy=multiworker", "cluster=2x1"],
            "data          640 records; 5 files split by file: each of 2 workers reads 2-3 of them",
        ),
        (
            2,
            False,
            [],
            "data          no manifest: records counted when a run resumes; 2 file(s), read by one input pipeline",
        ),
    ],
)
def test_plan_counts_the_records_the_manifest_lists(tmp_path, files, manifest, overrides, says):
    where = write_files(tmp_path / "data", files=files, manifest=manifest)
    cfg = compose_ok(tmp_path / "run", "data=tfrecord", f"data.train_files={where}/train-*", *overrides)
    assert data_line(describe(cfg).splitlines()) == says


@pytest.mark.unit
def test_plan_leaves_remote_files_to_tensorflow(tmp_path):
    cfg = compose_ok(
        tmp_path / "run", "data=tfrecord", "data.train_files=gs://bucket/train-*"
    )  # never listed here: no network
    assert data_line(describe(cfg).splitlines()) == (
        "data          gs://bucket/train-*: listed at start (tf.io.gfile), split by file across 1 worker(s) when "
        "there are enough"
    )


@pytest.mark.unit
@pytest.mark.parametrize(
    "overrides, line",
    [
        (
            [],
            "strategy      auto  -> one_device (mirrored instead when several GPUs are visible): one replica on one "
            "device (TF's default strategy, or OneDeviceStrategy on strategy.device)",
        ),
        (
            ["cluster=2x1"],
            "strategy      auto  -> multiworker: MultiWorkerMirroredStrategy: synchronous all-reduce across worker "
            "processes",
        ),
        (["strategy=parameter_server", "cluster=ps1w2"], "cluster       ps1w2: 2 worker(s) x 1 device(s), 1 ps"),
        (["strategy=mirrored"], "replicas      decided by the GPUs visible at start (else 1 per worker)"),
        (
            ["strategy=parameter_server", "cluster=ps1w2"],
            "replicas      2 workers, asynchronous: each step trains one worker on a whole batch",
        ),
        (
            ["task=binary", "data.num_classes=2"],
            "task          binary: metrics auc, accuracy, log_loss; objective eval/auc",
        ),
        (
            ["trainer.accumulate_steps=4", "data.batch_size=32"],
            "accumulate    4 batches of 32 per step: the gradients of 128 examples, the activations of 32 in memory",
        ),
        (
            ["trainer.jit_compile=false"],
            "compute       float32; XLA off (trainer.jit_compile=false); steps per XLA call 1 (XLA does not compile "
            "the whole step here)",
        ),
        (
            ["trainer.steps_per_xla_call=4"],
            "compute       float32; XLA auto: on with GPUs; on CPUs on for a model of Dense layers only, else off "
            "(on CPUs XLA pays only for a dense model's whole step, and slows convolutions and embeddings "
            "(docs/performance.md)); steps per XLA call 4 (trainer.steps_per_xla_call=4)",
        ),
        (
            ["trainer.accumulate_steps=8"],
            "compute       float32; XLA auto: on with GPUs; off on CPUs with trainer.accumulate_steps=8 (a step of "
            "8 micro-batches trained slower compiled: docs/performance.md); steps per XLA call 1 (auto): a step of 8 "
            "micro-batches is long beside a call's cost",
        ),
        (
            ["optimizer.clip_norm=0.5"],
            "optimizer     adam (keras.optimizers.Adam), lr 0.001, schedule constant; clip clip_norm 0.5 after the "
            "sum over replicas",
        ),
        (
            ["strategy=mirrored", "optimizer.scale_lr_with_replicas=true"],
            "optimizer     adam (keras.optimizers.Adam), lr 0.001 x replicas, schedule constant",
        ),
        (
            ["trainer.steps=null", "trainer.epochs=3"],
            "steps         3 epoch(s); 100 per tf.function call; log every 100; eval every 500",
        ),
        (
            ["strategy=multiworker", "cluster=2x1", "cluster.task_threads=3"],
            "  threads     each task: 3 intra-op, 3 inter-op, idle threads sleep (no spinning); cluster.task_threads=3",
        ),
        (
            ["strategy=parameter_server", "cluster=ps1w2", "cluster.task_threads=1"],
            "  threads     each task: 1 intra-op, 2 inter-op, idle threads sleep (no spinning); cluster.task_threads=1",
        ),
        (
            ["strategy=multiworker", "cluster=2x1", "cluster.nice=10"],
            "  priority    nice 10, in a session of its own: the cores go to this machine's other work first",
        ),
        (
            ["strategy=multiworker", "cluster=2x1", "strategy.communication=mpi"],
            "collectives   each step: one all-reduce of every gradient, in one pack (strategy.bytes_per_pack), "
            "float32; the metrics: one sum per tf.function call; strategy.communication=mpi (the gradients through "
            "MPI, each task under mpiexec; the rest ring over gRPC)",
        ),
        (
            [
                "strategy=multiworker",
                "cluster=2x1",
                "strategy.bytes_per_pack=262144",
                "strategy.all_reduce_dtype=bfloat16",
            ],
            "collectives   each step: one all-reduce of every gradient, in packs of 262144 bytes "
            "(strategy.bytes_per_pack), bfloat16; the metrics: one sum per tf.function call; "
            "strategy.communication=auto (ring over gRPC on CPUs, NCCL on GPUs)",
        ),
    ],
)
def test_plan_line(configs, overrides, line):
    assert line in plan(configs, *overrides)


@pytest.mark.unit
@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["strategy=mirrored"],
        ["strategy=multiworker", "cluster=2x1"],
        ["strategy=parameter_server", "cluster=ps1w2"],
    ],
)
def test_plan_says_the_replicas_and_the_batch_once(configs, overrides):
    lines = plan(configs, *overrides)
    assert [line.split()[0] for line in lines].count("replicas") == 1, lines
    assert [line.split()[0] for line in lines].count("batch") == 1, lines


@pytest.mark.unit
def test_plan_names_the_run_dir_and_a_local_clusters_logs(tmp_path):
    single = describe(compose_ok(tmp_path / "one")).splitlines()
    assert (
        f"run dir       {tmp_path / 'one'}: .hydra/, metrics.jsonl, summary.json, checkpoints/, tensorboard/" in single
    )
    cluster = describe(compose_ok(tmp_path / "two", "cluster=2x1")).splitlines()
    assert (
        f"run dir       {tmp_path / 'two'}: .hydra/, metrics.jsonl, summary.json, checkpoints/, tensorboard/, "
        "logs/<task>.log" in cluster
    )


@pytest.mark.unit
def test_plan_names_a_checkpoint_dir_of_its_own(tmp_path):
    cfg = compose_ok(tmp_path / "run", f"checkpoint.dir={tmp_path / 'ckpt'}")
    assert f"checkpoints   every 500 steps, keep 3, in {tmp_path / 'ckpt'}" in describe(cfg).splitlines()


TWO_WORKERS = {"cluster": {"worker": ["a:2222", "b:2222"]}, "task": {"type": "worker", "index": 1}}


@pytest.mark.unit
def test_plan_shows_the_tasks_a_tf_config_gives(configs, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps(TWO_WORKERS))
    lines = plan(configs, "strategy=multiworker", "cluster=2x1")
    at = next(i for i, line in enumerate(lines) if line.startswith("placement "))
    assert lines[at].endswith("; this process is worker:1")
    assert lines[at + 1 : at + 4] == [
        "  task        worker:0  a:2222",
        "  task        worker:1  b:2222",
        f"  TF_CONFIG   {json.dumps(TWO_WORKERS)}",
    ]


@pytest.mark.unit
def test_plan_names_who_placed_the_process_in_cluster_launch_words(configs, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps(TWO_WORKERS))
    assert "placement     tf_config; this process is worker:1" in plan(configs, "strategy=multiworker", "cluster=2x1")


@pytest.mark.unit
def test_plan_does_not_warn_a_single_asynchronous_worker(configs):
    assert not any(
        line.startswith("WARNING")
        for line in plan(configs, "strategy=parameter_server", "cluster=ps1w1", "trainer.steps=10")
    )


# -- moved from tests/test_unit_config_checks.py (the two suites of --plan merged) --


def plan_text(configs, *overrides) -> str:
    return "\n".join(plan(configs, *overrides))


@pytest.mark.unit
def test_plan_shows_the_cluster_without_running_it(configs):
    text = plan_text(
        configs, "strategy=multiworker", "cluster=4x8", "data.batch_size=256", "optimizer.scale_lr_with_replicas=true"
    )
    for line in ["worker:3", "replicas      4", "per replica 64", "lr 0.001 x replicas = 0.004", "every 500 steps"]:
        assert line in text, text


@pytest.mark.unit
@pytest.mark.parametrize("steps, warned", [(1000, True), (4000, False)])
def test_plan_warns_of_too_few_steps_for_asynchronous_workers(configs, steps, warned):
    text = plan_text(configs, "strategy=parameter_server", "cluster=ps2w4", f"trainer.steps={steps}")
    assert ("WARNING       4 asynchronous workers apply stale gradients" in text) == warned, text
    if warned:
        assert "trainer.steps=4000" in text


@pytest.mark.unit
def test_plan_says_what_auto_xla_chooses(configs):
    assert (
        "compute       mixed_bfloat16; XLA auto: on with GPUs; on CPUs on for a model of Dense layers only"
        in plan_text(configs, "trainer.precision=mixed_bfloat16")
    )
    assert "XLA off (auto): strategy=parameter_server" in plan_text(
        configs, "strategy=parameter_server", "cluster=ps1w2"
    )


@pytest.mark.unit
@pytest.mark.parametrize(
    "overrides, says",
    [
        ([], "placement     this process"),
        (["strategy=multiworker", "cluster=2x1"], "local cluster launched by tfdistx"),
        (["strategy=parameter_server", "cluster=ps2w4"], "task        ps:1"),
        (["strategy=mirrored", "cluster=1x4"], "replicas      4"),
        (["checkpoint.every_steps=0"], "checkpoints   every end only steps"),
        (["trainer.eval_every=0"], "eval every end only"),
    ],
)
def test_plan_lines(configs, overrides, says):
    assert says in plan_text(configs, *overrides)


# -- decisions --plan reports, made without TensorFlow ----------------------------


CPU_RULE = (
    "on CPUs XLA pays only for a dense model's whole step, and slows convolutions and embeddings (docs/performance.md)"
)
PER_CALL = (
    "each call's fixed cost saved, a large part of a small dense step (docs/performance.md); the most, up to 10, that "
    "divide the steps per loop, log, eval and checkpoint"
)


@pytest.mark.unit
@pytest.mark.parametrize(
    "asked, strategy, gpus, layers, ops, decided",
    [
        (
            "auto",
            "one_device",
            None,
            None,
            (),
            (None, f"auto: on with GPUs; on CPUs on for a model of Dense layers only, else off ({CPU_RULE})"),
        ),
        (
            "auto",
            "one_device",
            False,
            {"Dense"},
            {"MatMul", "Relu"},
            (True, "on (auto): a model of Dense layers, on CPUs"),
        ),
        (
            "auto",
            "one_device",
            False,
            {"Dense", "Conv2D"},
            (),
            (False, "off (auto): on CPUs, and this model has Conv2D weights"),
        ),
        (
            "auto",
            "one_device",
            False,
            {"Dense", "Embedding"},
            (),
            (False, "off (auto): on CPUs, and this model has Embedding weights"),
        ),
        (
            "auto",
            "one_device",
            False,
            {"Dense"},
            {"MatMul", "DenseBincount"},
            (False, "off (auto): on CPUs, and this model has DenseBincount ops"),
        ),
        (
            "auto",
            "one_device",
            False,
            {"Dense", "MyModel"},
            {"MatMul", "Unique", "Sort", "While", "DenseBincount"},
            (False, "off (auto): on CPUs, and this model has MyModel weights and DenseBincount, Sort, Unique ... ops"),
        ),
        ("auto", "mirrored", True, {"Conv2D"}, (), (True, "on (auto): GPUs")),
        (
            "auto",
            "multiworker",
            None,
            None,
            (),
            (False, f"off (auto): {CPU_RULE}, and strategy=multiworker compiles only the gradients"),
        ),
        (
            "auto",
            "multiworker",
            False,
            {"Dense"},
            (),
            (False, "off (auto): on CPUs, and strategy=multiworker would compile only the gradients"),
        ),
        (
            "true",
            "multiworker",
            False,
            {"Dense"},
            (),
            (True, "on (trainer.jit_compile=true): the gradients; the sum and update outside"),
        ),
        (
            "auto",
            "parameter_server",
            None,
            None,
            (),
            (
                False,
                "off (auto): strategy=parameter_server: its variables live on the ps tasks, away "
                "from the device that computes, and XLA compiles only steps whose variables are on their own device",
            ),
        ),
        (
            "auto",
            "parameter_server",
            True,
            {"Dense"},
            (),
            (False, "off (auto): strategy=parameter_server cannot use it"),
        ),
    ],
)
def test_what_xla_setting_is_chosen(asked, strategy, gpus, layers, ops, decided):
    """Before the model is built (--plan) the whole rule; after (the run's log), a few words."""
    asked = True if asked == "true" else asked
    assert compute.decide_jit(asked, strategies.get(strategy), gpus, layers, ops) == decided


@pytest.mark.unit
@pytest.mark.parametrize(
    "asked, gpus, layers, decided",
    [
        (
            "auto",
            None,
            None,
            (
                None,
                "auto: on with GPUs; off on CPUs with trainer.accumulate_steps=8 (a step of 8 micro-batches trained "
                "slower compiled: docs/performance.md)",
            ),
        ),
        ("auto", False, {"Dense"}, (False, "off (auto): on CPUs, with trainer.accumulate_steps=8")),
        ("auto", True, {"Dense"}, (True, "on (auto): GPUs")),
        ("true", False, {"Dense"}, (True, "on (trainer.jit_compile=true)")),
    ],
)
def test_auto_leaves_xla_off_for_accumulated_steps_on_cpus(asked, gpus, layers, decided):
    """Issue 32 (18): measured slower compiled on CPUs (benchmarks/bench_accumulation.py)."""
    asked = True if asked == "true" else asked
    assert compute.decide_jit(asked, strategies.get("one_device"), gpus, layers, accumulate_steps=8) == decided
    assert compute.decide_steps_per_xla_call(
        "auto", True, strategies.get("one_device"), 100, (100, 0, 0), False, {"Dense"}, accumulate_steps=8
    ) == (1, "1 (auto): a step of 8 micro-batches is long beside a call's cost")


@pytest.mark.unit
@pytest.mark.parametrize(
    "asked, jit, strategy, gpus, layers, periods, decided",
    [
        ("auto", True, "one_device", False, {"Dense"}, (100, 100, 500, 500), (10, "10 (auto)")),
        ("auto", True, "one_device", False, {"Dense"}, (100, 100, 0, 0), (10, "10 (auto)")),
        ("auto", True, "one_device", False, {"Dense"}, (100, 25, 500, 300), (5, "5 (auto)")),
        ("auto", True, "one_device", False, {"Dense"}, (64, 64, 0, 0), (8, "8 (auto)")),
        ("auto", True, "one_device", False, {"Dense"}, (100, 7, 0, 0), (1, "1 (auto)")),
        (
            "auto",
            None,
            "one_device",
            None,
            None,
            (100, 100, 0, 0),
            (None, f"auto: 10 for the whole step of a model of Dense layers on CPUs ({PER_CALL}), else 1"),
        ),
        (
            "auto",
            True,
            "one_device",
            False,
            {"Dense", "Conv2D"},
            (100, 100, 0, 0),
            (1, "1 (auto): a model beyond Dense layers"),
        ),
        (
            "auto",
            True,
            "one_device",
            True,
            {"Dense"},
            (100, 100, 0, 0),
            (1, "1 (auto): with GPUs (the saving is shown on CPUs: docs/performance.md)"),
        ),
        (
            "auto",
            False,
            "one_device",
            False,
            {"Dense"},
            (100, 100, 0, 0),
            (1, "1 (XLA does not compile the whole step here)"),
        ),
        (
            "auto",
            True,
            "mirrored",
            False,
            {"Dense"},
            (100, 100, 0, 0),
            (1, "1 (XLA does not compile the whole step here)"),
        ),
        (3, True, "one_device", False, {"Conv2D"}, (100, 100, 0, 0), (3, "3 (trainer.steps_per_xla_call=3)")),
        (
            16,
            True,
            "one_device",
            False,
            {"Dense"},
            (10, 100, 0, 0),
            (10, "10 (trainer.steps_per_xla_call=16, capped by trainer.steps_per_loop=10)"),
        ),
        (
            4,
            False,
            "one_device",
            False,
            {"Conv2D"},
            (100, 100, 0, 0),
            (1, "1 (XLA does not compile the whole step here)"),
        ),  # and refused, below
    ],
)
def test_how_many_steps_one_xla_call_takes(asked, jit, strategy, gpus, layers, periods, decided):
    """auto: the most steps, up to 10, that divide the loop's periods (steps per loop, log, eval, checkpoint)."""
    steps_per_loop, *every = periods
    assert (
        compute.decide_steps_per_xla_call(asked, jit, strategies.get(strategy), steps_per_loop, every, gpus, layers)
        == decided
    )


@pytest.mark.unit
@pytest.mark.parametrize(
    "asked, jit, refused",
    [
        (
            4,
            False,
            "trainer.steps_per_xla_call=4: more than 1 only where XLA compiles the whole step, and XLA is off (auto): "
            "on CPUs, and this model has Conv2D weights: set trainer.jit_compile=true to compile it anyway, or "
            "trainer.steps_per_xla_call=1",
        ),
        (4, True, None),
        (1, False, None),
        ("auto", False, None),
    ],
)
def test_steps_per_xla_call_above_1_is_refused_where_auto_left_xla_off(asked, jit, refused):
    """What validation cannot know before the model is built (issue 32, item 16)."""
    problem = compute.steps_per_xla_call_problem(asked, jit, "off (auto): on CPUs, and this model has Conv2D weights")
    assert (str(problem) if problem else None) == refused


@pytest.mark.unit
@pytest.mark.parametrize(
    "precision, gpus, warned",
    [
        ("mixed_float16", False, True),
        ("mixed_bfloat16", False, False),
    ],
)
def test_half_precision_on_cpus_is_warned_about(precision, gpus, warned):
    warning = compute.precision_warning(precision, gpus)
    assert (warning is not None) == warned
    if warned:
        assert warning.startswith("trainer.precision=mixed_float16 without GPUs") and "mixed_bfloat16" in warning


@pytest.mark.unit
@pytest.mark.parametrize(
    "metric, way",
    [
        ("eval/loss", "minimize"),
        ("eval/log_loss", "minimize"),
        ("eval/rmse", "minimize"),
        ("mae", "minimize"),
        ("eval/accuracy", "maximize"),
        ("eval/auc", "maximize"),
        ("eval/micro_f1", "maximize"),
        ("top_k_accuracy", "maximize"),
    ],
)
def test_which_way_an_objective_is_better(metric, way):
    assert direction(metric) == way


@pytest.mark.unit
def test_an_objectives_value_is_read_from_the_summary():
    summary = {"eval": {"eval/accuracy": 0.75}, "train": {"loss": 0.5, "accuracy": 0.7}}
    assert (value("eval/accuracy", summary), value("loss", summary), value("accuracy", summary)) == (0.75, 0.5, 0.7)
    assert value("eval/auc", summary) != value("eval/auc", summary)  # nan: the run did not report it


@pytest.mark.unit
@pytest.mark.parametrize("files, pipelines, split", [(4, 4, True), (3, 4, False), (1, 1, True)])
def test_files_are_split_by_file_when_each_pipeline_gets_one(files, pipelines, split):
    assert datafiles.shards_by_file(files, pipelines) is split
