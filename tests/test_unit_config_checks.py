"""Bad config is refused before TensorFlow starts: each bad value with the
key, the value and what is allowed. In-process: the same
compose-and-validate the CLI calls (commands/common.compose) and the sweep
check, no subprocess. tests/test_errors.py keeps a few of these end to end
(exit 2, one line, no traceback), and every problem at once; `--plan` is
in test_unit_config_plan.py."""

import sys

import pytest

from tfdistx.commands import run as run_command
from tfdistx.commands.common import compose, register_config_names
from tfdistx.config import schema
from tfdistx.config.compose import compose_and_validate
from tfdistx.core.errors import ConfigError

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module", autouse=True)
def registered():
    schema.register()


def refusal(*overrides) -> str:
    with pytest.raises(ConfigError) as caught:
        compose_and_validate([*overrides, "hydra.run.dir=/tmp/never-made"], notes=False)
    assert len(caught.value.lines()) == 1, caught.value.lines()
    return caught.value.lines()[0]


@pytest.mark.parametrize(
    "overrides, said",
    [
        (["+trainer.foo=1"], "trainer.foo=1: trainer has no such key; its keys: steps"),
        (["optimizer.beta_1=2"], "optimizer.beta_1=2: a decay rate"),
        (["optimizer.epsilon=-1"], "optimizer.epsilon=-1: must be a positive"),
        (["optimizer.min_lr_ratio=-3"], "optimizer.min_lr_ratio=-3: a fraction of optimizer.lr"),
        (["optimizer=sgd", "optimizer.nesterov=maybe"], "optimizer.nesterov='maybe': allowed: true, false"),
        (["optimizer=sgd", "optimizer.momentum=1"], "optimizer.momentum=1"),
        (["optimizer.lr=1e308"], "optimizer.lr=1e+308: must be a positive, finite number"),
        (["cluster.base_port=70000"], "cluster.base_port=70000: a TCP port"),
        (["task.top_k=0"], "task.top_k=0: must be a whole number, at least 1"),
        (["logger=wandb", "logger.wandb.init_timeout=-1"], "logger.wandb.init_timeout=-1: seconds, more than 0"),
        # W&B's own refusals, before TensorFlow starts (issue 60: mode=bogus passed --plan, then failed with exit 1)
        (
            ["logger=wandb", "logger.wandb.mode=bogus"],
            "logger.wandb.mode='bogus': allowed: online, offline, disabled, or null: online with an API key, else "
            "offline",
        ),
        (["logger=wandb", "logger.wandb.log_model=yes"], "logger.wandb.log_model='yes': allowed: true, false"),
        (["logger=wandb", f"logger.wandb.group={'g' * 129}"], "1 to 128 characters or null"),
        (["logger=wandb", "logger.wandb.job_type=''"], "logger.wandb.job_type='': 1 to 64 characters or null"),
        (["data.batch_size=1e9"], "data.batch_size=1000000000.0: must be a positive integer"),
        (["trainer.steps=1e20"], "trainer.steps='1e20'"),
        (["trainer.steps=4611686018427387905"], "at most 4611686018427387904"),
        (["trainer.seed=-1"], "trainer.seed=-1: must be a whole number from 0 to 4294967295"),
        (["task.metrics=[nope]"], "task.metrics=['nope']: task=classification offers accuracy, top_k_accuracy"),
        (
            ["task=binary", "task.metrics=[auc,nope]"],
            "task.metrics=['auc', 'nope']: task=binary offers auc, accuracy, log_loss",
        ),
        (["trainer.steps=${nope.nope}"], "trainer.steps='${nope.nope}': Interpolation key 'nope.nope' not found"),
        (["trainer.steps=${oc.env:TFDISTX_TEST_UNSET}"], "Environment variable 'TFDISTX_TEST_UNSET' not found"),
    ],
)
def test_a_bad_value_is_one_line_naming_it(overrides, said):
    line = refusal(*overrides)
    assert line.startswith("tfdistx: invalid config: ") and said in line, line


def test_an_empty_run_dir_is_refused():
    with pytest.raises(ConfigError) as caught:
        compose_and_validate(["hydra.run.dir="], notes=False)
    assert "hydra.run.dir='': must name a directory" in caught.value.lines()[0]


def test_each_built_in_task_offers_the_metrics_its_yaml_declares():
    """The config side checks task.metrics against the YAML's `offers`; the class makes them."""
    from hydra.utils import get_class  # imports the task modules (TensorFlow)
    from omegaconf import OmegaConf

    from tfdistx.core.paths import config_dir

    found = sorted((config_dir() / "task").glob("*.yaml"))
    assert len(found) >= 4
    for path in found:
        task = OmegaConf.load(path)
        if path.stem == "auto":  # builds one of the others, as the data's labels say: offers what that one offers
            assert "offers" not in task and task.objective == "eval/loss"
            continue
        assert list(get_class(task._target_).AVAILABLE) == list(task.offers), path.name


def refused(*overrides) -> list:
    """Every `invalid config` line the overrides get, as the command line prints them."""
    with pytest.raises(ConfigError) as caught:
        compose(["hydra.run.dir=/tmp/never-made", *overrides], notes=False)
    return caught.value.lines()


# (overrides, the key and value named, what the line says is allowed)
@pytest.mark.parametrize(
    "overrides, key, phrases",
    [
        (["strategy=foo"], "strategy='foo'", ["mirrored", "one_device"]),
        (["cluster=banana"], "cluster='banana'", ["WxD"]),
        (["model=transformer"], "model='transformer'", ["mlp", "resnet"]),
        (["data=imagenet"], "data='imagenet'", ["mnist", "synthetic"]),
        (["trainer.steps=abc"], "trainer.steps", ["Integer"]),
        (["data.batch_size=-5"], "data.batch_size=-5", ["positive"]),
        (["data.batch_size=0"], "data.batch_size=0", ["positive"]),
        (["strategy=mirrored", "cluster=1x3", "data.batch_size=128"], "data.batch_size=128", ["multiple of 3"]),
        (["strategy=one_device", "cluster=1x4"], "strategy='one_device'", ["strategy=mirrored"]),
        (["strategy=parameter_server", "cluster=2x1"], "strategy='parameter_server'", ["cluster=ps1w2"]),
        (["optimizer.name=adamm"], "optimizer.name='adamm'", ["adadelta, adafactor", "lion", "optimizer._target_"]),
        (["optimizer.schedule=linear"], "optimizer.schedule='linear'", ["warmup_cosine"]),
        (["trainer.nonsense=1"], "trainer.nonsense", []),
        (["model._target_=no_such_package.build"], "model._target_", ["no_such_package"]),
        (["model._target_=nodots"], "model._target_='nodots'", ["a dotted path"]),
        (["checkpoint.max_to_keep=0"], "checkpoint.max_to_keep=0", ["at least 1"]),
        (["checkpoint.every_steps=-1"], "checkpoint.every_steps=-1", ["0 (only at the end) or more"]),
        (["checkpoint.nope=1"], "checkpoint.nope='1'", ["its keys: every_steps, max_to_keep"]),
        (["optimizer.lr=nan"], "optimizer.lr=nan", ["finite"]),
        (["optimizer.lr=inf"], "optimizer.lr=inf", ["finite"]),
        (["optimizer.lr=0"], "optimizer.lr=0", ["positive"]),
        (["optimizer.lr=-1"], "optimizer.lr=-1", ["positive"]),
        (["optimizer.global_clip_norm=0"], "optimizer.global_clip_norm=0", ["or null: no clipping"]),
        (["optimizer.clip_norm=1", "optimizer.global_clip_norm=1"], "optimizer.global_clip_norm=1", ["not both"]),
        (["optimizer.schedule=warmup_cosine", "optimizer.warmup_steps=-1"], "optimizer.warmup_steps=-1", ["0 or more"]),
        (["optimizer=sgd", "optimizer.momentum=-0.5"], "optimizer.momentum=-0.5", ["at least 0, below 1"]),
        (["optimizer.weight_decay=0.1"], "optimizer.weight_decay='0.1'", ["its keys: name, _target_, lr"]),
        (["cluster=ps0w2"], "cluster='ps0w2'", ["at least one parameter server", "cluster=2x1"]),
        (["cluster=0x1"], "cluster.workers=0", ["at least 1"]),
        (["cluster=1x0"], "cluster.devices_per_worker=0", ["at least 1"]),
        (["cluster.max_restarts=-1"], "cluster.max_restarts=-1", ["0 or more"]),
        (["cluster.startup_timeout=0"], "cluster.startup_timeout=0", ["more than 0"]),
        (["cluster.stopped_task_timeout=0"], "cluster.stopped_task_timeout=0.0", ["more than 0"]),
        (["cluster.base_port=80"], "cluster.base_port=80", ["from 1024"]),
        (["cluster.retryable_exit_offset=300"], "cluster.retryable_exit_offset=300", ["from 0 to 213"]),
        (["cluster.launch=ssh"], "cluster.launch='ssh'", ["auto, local, tf_config, jobset, slurm"]),
        (
            ["cluster.notice_signals=[SIGUSR1]"],
            "cluster.notice_signals='SIGUSR1'",
            ["one of USR1, USR2", "SIGTERM always"],
        ),
        (["cluster.notice_signals=[USR1,KILL]"], "cluster.notice_signals='KILL'", ["one of USR1, USR2"]),
        (["cluster.notice_signals=USR1"], "cluster.notice_signals='USR1'", ["not a ListConfig"]),
        (["+cluster.nope=1"], "cluster.nope=1", ["its keys: name, workers"]),
        (
            ["strategy=mirrored", "+strategy.bytes_per_pack=1"],
            "strategy.bytes_per_pack=1",
            ["strategy=mirrored takes strategy.cross_device_ops"],
        ),
        (
            ["strategy=mirrored", "strategy.cross_device_ops=magic"],
            "strategy.cross_device_ops='magic'",
            ["nccl, hierarchical_copy"],
        ),
        (
            ["strategy=multiworker", "cluster=2x1", "strategy.bytes_per_pack=-1"],
            "strategy.bytes_per_pack=-1",
            ["0 or more"],
        ),
        (
            ["strategy=multiworker", "cluster=2x1", "strategy.communication=pigeon"],
            "strategy.communication='pigeon'",
            ["ring, nccl"],
        ),
        (
            ["strategy=multiworker", "cluster=2x1", "strategy.communication=mpi", "cluster.launch=tf_config"],
            "strategy.communication='mpi'",
            [
                "tfdistx's local launcher",
                "cluster.launch=tf_config has them started by a scheduler",
                "use strategy.communication=ring there",
            ],
        ),
        (
            ["strategy=multiworker", "cluster=2x2", "strategy.communication=mpi"],
            "strategy.communication='mpi'",
            ["one replica a worker", "cluster.devices_per_worker=2"],
        ),
        (
            ["strategy=multiworker", "cluster=2x1", "strategy.communication=mpi", "strategy.all_reduce_dtype=bfloat16"],
            "strategy.communication='mpi'",
            ["sums float32 gradients", "all_reduce_dtype=bfloat16"],
        ),
        (
            [
                "strategy=multiworker",
                "cluster.workers=3",
                "cluster.elastic.min_workers=2",
                "strategy.communication=mpi",
            ],
            "strategy.communication='mpi'",
            ["a fixed set of workers", "elastic"],
        ),
        (
            ["strategy=multiworker", "cluster=2x1", "cluster.nice=20"],
            "cluster.nice=20",
            ["from 0 (as any program) to 19"],
        ),
        (
            ["strategy=multiworker", "cluster=2x1", "cluster.nice=-5"],
            "cluster.nice=-5",
            ["from 0 (as any program) to 19"],
        ),
        (
            ["strategy=one_device", "cluster.nice=10"],
            "cluster.nice=10",
            ["trains in this process", "nice -n 10 python -m tfdistx"],
        ),
        (
            ["strategy=multiworker", "cluster=2x1", "cluster.nice=10", "cluster.launch=slurm"],
            "cluster.nice=10",
            ["cluster.launch=slurm has them started by a scheduler", "Slurm's --nice"],
        ),
        (["strategy=multiworker", "cluster=ps1w2"], "strategy='multiworker'", ["use strategy=parameter_server"]),
        (["strategy=mirrored", "cluster=2x1"], "strategy='mirrored'", ["use strategy=multiworker"]),
        (["strategy=central_storage", "cluster=2x1"], "strategy='central_storage'", ["use strategy=multiworker"]),
        (
            ["strategy=parameter_server", "cluster=ps1w2", "trainer.jit_compile=true"],
            "trainer.jit_compile=True",
            ["strategy=parameter_server cannot use XLA"],
        ),
        (["strategy=tpu", "trainer.precision=mixed_float16"], "trainer.precision='mixed_float16'", ["bfloat16"]),
        (["+foo=1"], "foo=1", ["not a tfdistx key", "trainer"]),
        (
            ["model.nonsense=3"],
            "model.nonsense",
            ["model has no key 'nonsense'; its keys: _target_, hidden_units, dropout"],
        ),
        (["logger.nope=1"], "logger.nope='1'", ["its keys: console, tensorboard, csv, mlflow, wandb"]),
        (["data.train_examples=0"], "data.train_examples=0", ["at least 1"]),
        (["data.eval_examples=0"], "data.eval_examples=0", ["at least 1"]),
        (["data.num_classes=1"], "data.num_classes=1", ["at least 2"]),
        (["data.num_classes=1.5"], "data.num_classes=1.5", ["a whole number"]),
        (["data.image_shape=[0]"], "data.image_shape=[0]", ["positive sizes"]),
        (["data.shuffle_buffer=0"], "data.shuffle_buffer=0", ["at least 1"]),
        (["data=synthetic_categorical", "data.vocab_size=1"], "data.vocab_size=1", ["at least 2"]),
        (["trainer.steps=null"], "trainer.steps=None", ["set trainer.steps or trainer.epochs"]),
        (["trainer.steps=null", "trainer.epochs=0"], "trainer.epochs=0", ["at least 1"]),
        (["trainer.steps_per_loop=0"], "trainer.steps_per_loop=0", ["at least 1"]),
        (["trainer.log_every=0"], "trainer.log_every=0", ["at least 1"]),
        (["trainer.eval_every=-1"], "trainer.eval_every=-1", ["0 (only at the end) or more"]),
        (["trainer.jit_compile=maybe"], "trainer.jit_compile='maybe'", ["true, false, auto"]),
        (["trainer.precision=float64"], "trainer.precision='float64'", ["float32, mixed_bfloat16, mixed_float16"]),
        (["trainer.accumulate_steps=0"], "trainer.accumulate_steps=0", ["no accumulation"]),
        (
            ["trainer.objective=eval/nope"],
            "trainer.objective='eval/nope'",
            ["reports eval/loss, eval/accuracy, loss, accuracy"],
        ),
        (
            ["task=regression", "data=synthetic_regression", "trainer.objective=eval/accuracy"],
            "trainer.objective='eval/accuracy'",
            ["task=regression reports eval/loss, eval/rmse"],
        ),
        (
            ["task=regression", "data=synthetic_regression", "task.metrics=[accuracy]"],
            "task.metrics=['accuracy']",
            ["offers rmse, mae, mse"],
        ),
        (
            ["task=multilabel", "data=synthetic_multilabel", "task.metrics=[rmse]"],
            "task.metrics=['rmse']",
            ["offers micro_f1, macro_f1, auc"],
        ),
        (["task=binary", "data.num_classes=2", "task.auc_thresholds=2"], "task.auc_thresholds=2", ["at least 3"]),
        (["data=tfrecord", "data.train_files=null"], "data.train_files=None", ["a glob pattern or a list of files"]),
        (
            ["data=tfrecord", "data.train_files=/nonexistent/train-*"],
            "data.train_files='/nonexistent/train-*'",
            ["no file matches"],
        ),
        (
            ["data=csv", "data.train_files=/nonexistent/train-*"],
            "data.train_files='/nonexistent/train-*'",
            ["no file matches"],
        ),
        (
            ["data=tfrecord", f"data.train_files={sys.executable}", "data.compression=BZ2"],
            "data.compression='BZ2'",
            ["null, GZIP, ZLIB"],
        ),
        (
            [
                "data=tfrecord",
                f"data.train_files={sys.executable}",
                "data.features={image: {dtype: float64, shape: [784]}, label: {dtype: int64, shape: []}}",
            ],
            "data.features.image.dtype='float64'",
            ["float32, int64, string"],
        ),
        (
            [
                "data=tfrecord",
                f"data.train_files={sys.executable}",
                "data.features={image: {dtype: float32, shape: [0]}, label: {dtype: int64, shape: []}}",
            ],
            "data.features.image.shape=[0]",
            ["positive sizes"],
        ),
        (
            ["data=tfrecord", f"data.train_files={sys.executable}", "data.features={label: {dtype: int64, shape: []}}"],
            "data.features=['label']",
            ["at least one feature besides the label"],
        ),
        (["hydra.run.dir=/proc/tfdistx-run"], "hydra.run.dir='/proc/tfdistx-run'", ["not writable"]),
    ],
)
def test_each_bad_value_is_refused_naming_its_key(overrides, key, phrases):
    lines = refused(*overrides)
    named = [line for line in lines if key in line]
    assert named and all(line.startswith("tfdistx: invalid config: ") for line in lines), lines
    for phrase in phrases:
        assert any(phrase in line for line in named), (phrase, lines)


def test_a_run_dir_below_a_file_is_refused(tmp_path):
    (tmp_path / "a_file").write_text("not a directory")
    with pytest.raises(ConfigError) as caught:
        compose([f"hydra.run.dir={tmp_path / 'a_file' / 'run'}"], notes=False)
    assert "hydra.run.dir" in caught.value.lines()[0] and "is not a directory" in caught.value.lines()[0]
    assert not (tmp_path / "a_file").is_dir()


# -- a sweep: every value it names is checked before the first job ------------


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["trainer.steps=5,abc"], "trainer.steps='abc'"),  # the second value of a list
        (["trainer.steps=5,6", "hydra.sweep.dir=/proc/tfdistx-sweep"], "hydra.sweep.dir"),
        (["cluster=1x2,banana"], "cluster='banana'"),
        (["optimizer.lr=0.1,0"], "optimizer.lr=0"),
        (
            ["strategy=mirrored,multiworker"],
            "strategy='multiworker'",
        ),  # multiworker on the default 1x1 cluster is fine...
    ],
)
def test_a_bad_sweep_value_is_refused_before_any_job(overrides, key):
    register_config_names(overrides)  # as the command line does first: cluster=WxD names
    try:
        run_command._check_sweep(overrides)
    except ConfigError as error:
        assert any(key in line for line in error.lines()), error.lines()
    else:
        assert key == "strategy='multiworker'"  # ...so that sweep is accepted
