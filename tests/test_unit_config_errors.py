"""Config checks with no test before, in-process (-m unit): one bad value
each, and the exact line the command line prints for it; or one good value
that must be accepted. Checked with `validate` on a copy of a composed
config (what `compose` runs after Hydra composes), so each case takes
milliseconds. The checks tested before live in test_unit_config_checks.py."""

import math

import pytest

from config_helpers import PREFIX, changed, problems, refused
from tfdistx.config.validate import MAX_STEPS, writable

BIG = MAX_STEPS  # 2**62: the most steps a checkpoint's int64 counter can carry


# (the groups composed, {key: the bad value}, the one line it must produce)
@pytest.mark.unit
@pytest.mark.parametrize(
    "base, change, line",
    [
        # cluster
        ((), {"cluster.startup_timeout": math.inf}, "cluster.startup_timeout=inf: seconds, more than 0"),
        ((), {"cluster.base_port": 33536}, "cluster.base_port=33536: a TCP port from 1024 to 33535"),
        ((), {"cluster.ps": -1}, "cluster.ps=-1: must be 0 or more"),
        (
            (),
            {"cluster.retryable_exit_offset": 214},
            "cluster.retryable_exit_offset=214: from 0 to 213 (exit codes stop at 255); 128 for Kubernetes' "
            "restartPolicy ExitCode",
        ),
        # strategy options
        (
            ("strategy=central_storage",),
            {"strategy.device": "/gpu:0"},
            "strategy.device='/gpu:0': strategy=central_storage takes no options (strategy.device is for "
            "strategy=one_device)",
        ),
        (
            ("strategy=multiworker", "cluster=2x1"),
            {"strategy.bytes_per_pack": 1.5},
            "strategy.bytes_per_pack=1.5: must be a whole number of bytes, 0 or more (0: one pack)",
        ),
        (
            ("strategy=one_device",),
            {"strategy.all_reduce_dtype": "bfloat16"},
            "strategy.all_reduce_dtype='bfloat16': strategy=one_device takes strategy.device "
            "(strategy.all_reduce_dtype is for strategy=mirrored, multiworker)",
        ),
        (
            ("strategy=mirrored",),
            {"strategy.all_reduce_dtype": "int8"},
            "strategy.all_reduce_dtype='int8': allowed: float32, bfloat16, float16",
        ),
        # auto picks a strategy from the cluster, and the cluster must suit the strategy it picked
        (
            (),
            {"cluster.ps": 1, "cluster.workers": 2},
            "strategy='auto': cluster=local (2 worker(s), 1 ps) has parameter servers: use strategy=parameter_server",
        ),
        (
            ("strategy=central_storage",),
            {"trainer.jit_compile": True},
            "trainer.jit_compile=True: strategy=central_storage cannot use XLA: its variables live on the CPU, away "
            "from the device that computes, and XLA compiles only steps whose variables are on their own device; use "
            "false or auto",
        ),
        # the global batch
        (
            ("strategy=multiworker", "cluster=2x1"),
            {"data.batch_size": 129},
            "data.batch_size=129: the global batch must divide across 2 replicas: use a multiple of 2",
        ),
        (
            (),
            {"data.batch_size": True},
            "data.batch_size=True: must be a positive integer (the global batch, split across replicas)",
        ),
        # optimizer
        (
            (),
            {"optimizer.lr": "abc"},
            "optimizer.lr='abc': must be a positive, finite number (a float32: at most 3.4e38)",
        ),
        ((), {"optimizer.beta_2": 1.0}, "optimizer.beta_2=1.0: a decay rate: at least 0, below 1"),
        ((), {"optimizer.epsilon": 0}, "optimizer.epsilon=0: must be a positive, finite number"),
        ((), {"optimizer.min_lr_ratio": 1.5}, "optimizer.min_lr_ratio=1.5: a fraction of optimizer.lr: from 0 to 1"),
        ((), {"optimizer.warmup_steps": 1.5}, "optimizer.warmup_steps=1.5: must be a whole number, 0 or more"),
        (
            (),
            {"optimizer.scale_lr_with_replicas": "yes"},
            "optimizer.scale_lr_with_replicas='yes': allowed: true, false",
        ),
        (
            (),
            {"optimizer.clip_norm": 0},
            "optimizer.clip_norm=0: must be a positive, finite number (or null: no clipping)",
        ),
        (
            ("optimizer=adamw",),
            {"optimizer.weight_decay": -0.01},
            "optimizer.weight_decay=-0.01: must be a finite number, 0 or more",
        ),
        (("optimizer=sgd",), {"optimizer.momentum": 1.5}, "optimizer.momentum=1.5: at least 0, below 1"),
        # trainer
        ((), {"trainer.eval_steps": 0}, f"trainer.eval_steps=0: must be at least 1 and at most {BIG} (or null)"),
        (
            (),
            {"trainer.steps": None, "trainer.epochs": BIG + 1},
            f"trainer.epochs={BIG + 1}: must be at least 1 and at most {BIG} (or null)",
        ),
        ((), {"trainer.seed": 2**32}, "trainer.seed=4294967296: must be a whole number from 0 to 4294967295"),
        ((), {"trainer.jit_compile": 1}, "trainer.jit_compile=1: allowed: true, false, auto"),
        (
            (),
            {"trainer.precision": "bfloat16"},
            "trainer.precision='bfloat16': allowed: float32, mixed_bfloat16, mixed_float16",
        ),
        (
            (),
            {"trainer.steps_per_xla_call": 0},
            "trainer.steps_per_xla_call=0: allowed: auto, or a whole number of steps, at least 1",
        ),
        (
            (),
            {"trainer.steps_per_xla_call": True},
            "trainer.steps_per_xla_call=True: allowed: auto, or a whole number of steps, at least 1",
        ),
        (
            ("strategy=mirrored",),
            {"trainer.steps_per_xla_call": 4},
            "trainer.steps_per_xla_call=4: more than 1 only where XLA compiles "
            "the whole step: strategy=one_device, trainer.jit_compile true or auto",
        ),
        (
            (),
            {"trainer.jit_compile": False, "trainer.steps_per_xla_call": 2},
            "trainer.steps_per_xla_call=2: more than 1 only where XLA "
            "compiles the whole step: strategy=one_device, trainer.jit_compile true or auto",
        ),
        (
            (),
            {"trainer.profile_steps": [10, 5]},
            "trainer.profile_steps=[10, 5]: [START, END]: two whole steps, 0 <= START < "
            "END <= trainer.steps=1000 (the trace covers the steps between), or null: no trace",
        ),
        # task and objective
        (
            (),
            {"task.metrics": "accuracy"},
            "task.metrics='accuracy': task=classification offers accuracy, top_k_accuracy",
        ),
        (
            (),
            {"task.top_k": 1.5},
            "task.top_k=1.5: must be a whole number, at least 1 (and below the number of classes)",
        ),
        (
            ("task=binary", "data.num_classes=2"),
            {"task.auc_thresholds": 2.5},
            "task.auc_thresholds=2.5: must be a whole number, at least 3",
        ),
        (
            ("task=multilabel", "data=synthetic_multilabel"),
            {"task.threshold": 1},
            "task.threshold=1: must be a number between 0 and 1",
        ),
        ((), {"task.metrics": []}, "trainer.objective='eval/accuracy': task=classification reports eval/loss, loss"),
        (
            ("task=binary", "data.num_classes=2"),
            {"trainer.objective": "eval/rmse"},
            "trainer.objective='eval/rmse': task=binary reports eval/loss, eval/auc, eval/accuracy, eval/log_loss, "
            "loss, auc, accuracy, log_loss",
        ),
        # targets
        (
            (),
            {"data._target_": "nosuchpkg_tfdistx.load"},
            "data._target_='nosuchpkg_tfdistx.load': no module named 'nosuchpkg_tfdistx' is importable",
        ),
        (
            (),
            {"model._target_": None},
            "model._target_=None: must be a dotted path to a function or class, e.g. mypkg.models.build",
        ),
        # logger
        (("logger=wandb",), {"logger.wandb.init_timeout": 0}, "logger.wandb.init_timeout=0: seconds, more than 0"),
        # a key no group has
        (
            (),
            {"checkpoint.keep": 2},
            "checkpoint.keep=2: checkpoint has no such key; its keys: every_steps, max_to_keep, dir, restore, export, "
            "keep_best, init_from, init_skip, background",
        ),
    ],
)
def test_one_bad_value_is_one_line(configs, base, change, line):
    assert problems(changed(configs(*base), change)) == [PREFIX + line]


# (the groups composed, {key: a value at the edge of what is allowed})
@pytest.mark.unit
@pytest.mark.parametrize(
    "base, change",
    [
        ((), {"cluster.base_port": 33535}),  # the highest: a Slurm job shifts it by up to 64 x 499
        ((), {"cluster.retryable_exit_offset": 213}),  # 213 + 42 = 255, the highest exit code
        ((), {"trainer.steps": BIG}),
        ((), {"trainer.seed": 2**32 - 1}),
        ((), {"trainer.jit_compile": "auto", "trainer.precision": "mixed_bfloat16"}),
        ((), {"trainer.objective": "accuracy"}),  # a metric of the training batches
        ((), {"task.metrics": ["top_k_accuracy"], "task.top_k": 1, "trainer.objective": "eval/top_k_accuracy"}),
        (("strategy=one_device",), {"strategy.device": "/cpu:0"}),  # a strategy option that takes any value
    ],
)
def test_a_value_at_the_edge_is_accepted(configs, base, change):
    assert problems(changed(configs(*base), change)) == []


@pytest.mark.unit
def test_every_problem_of_one_group_is_named_at_once(configs):
    cfg = changed(configs(), {"optimizer.beta_1": 1.0, "optimizer.beta_2": -1.0, "optimizer.epsilon": -1.0})
    assert problems(cfg) == [
        PREFIX + "optimizer.beta_1=1.0: a decay rate: at least 0, below 1",
        PREFIX + "optimizer.beta_2=-1.0: a decay rate: at least 0, below 1",
        PREFIX + "optimizer.epsilon=-1.0: must be a positive, finite number",
    ]


@pytest.mark.unit
def test_a_checkpoint_dir_that_cannot_be_made_is_named(tmp_path, configs):
    (tmp_path / "a_file").write_text("not a directory")
    cfg = changed(configs(), {"checkpoint.dir": str(tmp_path / "a_file" / "ckpt")})
    assert problems(cfg) == [
        PREFIX + f"checkpoint.dir='{tmp_path / 'a_file' / 'ckpt'}': cannot create the directory here: "
        f"{tmp_path / 'a_file'} is not a directory"
    ]


@pytest.mark.unit
@pytest.mark.parametrize(
    "path, said",
    [
        (None, "must name a directory: an empty one would write the run into the current directory"),
    ],
)
def test_writable_refuses_an_empty_path(path, said):
    assert [str(p) for p in writable("checkpoint.dir", path)] == [f"checkpoint.dir={path!r}: {said}"]


@pytest.mark.unit
def test_writable_accepts_a_new_directory_below_a_writable_one(tmp_path):
    assert writable("hydra.run.dir", str(tmp_path / "not" / "yet" / "made")) == []
    assert not (tmp_path / "not").exists()  # looked at, not made


# -- composed as the command line does (the check is in the composition) --


@pytest.mark.unit
@pytest.mark.parametrize(
    "overrides, line",
    [
        (
            ["hydra/launcher=nope"],
            "hydra/launcher='nope': allowed: basic, joblib, submitit_local, submitit_slurm, tfdistx_slurm",
        ),
        (
            ["task=ranking"],
            "task='ranking': allowed: auto, binary, classification, multilabel, regression; "
            "or your own: --config-dir DIR with DIR/task/ranking.yaml",
        ),
    ],
)
def test_an_unknown_group_option_names_the_options(tmp_path, overrides, line):
    assert refused(tmp_path / "run", *overrides) == [PREFIX + line]


@pytest.mark.unit
def test_the_last_of_two_values_given_is_the_one_named(tmp_path):
    assert refused(tmp_path / "run", "trainer.log_every=10", "trainer.log_every=0") == [
        PREFIX + "trainer.log_every=0: must be at least 1"
    ]


GROUPS = "callbacks, checkpoint, cluster, data, logger, model, optimizer, recipe, strategy, task, trainer"


@pytest.mark.unit
@pytest.mark.parametrize(
    "overrides, line",
    [
        (
            ["modle=cnn"],
            f"modle='cnn': not a group or key of the config: the groups are {GROUPS}; the closest: model=cnn",
        ),
        (
            ["trainr.steps=3"],
            f"trainr.steps='3': not a group or key of the config: the groups are {GROUPS}; the closest: "
            "trainer.steps=3",
        ),
        (["xyzzy=1"], f"xyzzy='1': not a group or key of the config: the groups are {GROUPS}"),
        # `+` for a key the config has: Hydra's answer offers a `++optimizer.beta_2=...` the user never wrote
        (
            ["optimizer.name=lion", "+optimizer.beta_2=0.98"],
            "optimizer.beta_2='0.98': the config has this key already: set it without "
            "the leading +, as optimizer.beta_2=0.98 (+KEY=VALUE adds a key the config does not have)",
        ),
    ],
)
def test_a_misspelt_group_or_a_needless_plus_is_named_as_typed(tmp_path, overrides, line):
    assert refused(tmp_path / "run", *overrides) == [PREFIX + line]


# -- Hydra's own messages, kept whole in one line --


@pytest.mark.unit
@pytest.mark.parametrize(
    "override, line",
    [
        # a list without brackets: Hydra's three ways out, for this key and these values
        (
            "logger=wandb,csv",
            "logger='wandb,csv': Ambiguous value: to use it as a list, write logger=[wandb,csv]; to use it as a "
            "string, quote the value: logger='wandb,csv'; to sweep over it, add --multirun to your command line",
        ),
        # a quoting mistake: Hydra's words and where it stopped
        (
            "trainer.steps='3",
            "trainer.steps=\"'3\": Hydra cannot parse this override: LexerNoViableAltException: trainer.steps='3 "
            "(at column 15); See https://hydra.cc/docs/1.2/advanced/override_grammar/basic for details",
        ),
        (
            "logger=[wandb,csv",
            "logger='[wandb,csv': Hydra cannot parse this override: no viable alternative at input '[wandb,csv'; "
            "See https://hydra.cc/docs/1.2/advanced/override_grammar/basic for details",
        ),
        (
            "trainer.steps=range(1,3)",
            "trainer.steps='range(1,3)': Sweep parameters 'trainer.steps=range(1,3)' requires --multirun",
        ),
    ],
)
def test_hydras_own_message_is_kept_whole_in_one_line(tmp_path, override, line):
    lines = refused(tmp_path / "run", override)
    assert lines == [PREFIX + line] and "None" not in lines[0]


@pytest.mark.unit
def test_first_line_is_the_line_that_says_what_went_wrong():
    """core/errors.first_line, the one reading of an error for a one-line message (loggers, warm starts, the
    model's first call, XLA, TFDS, MLflow all use it)."""
    from tfdistx.core.errors import first_line

    keras_wrapped = ValueError(
        "Exception encountered when calling Dense.call().\n\n\x1b[1mInput 0 is incompatible Inputs received: "
        "<tf.Tensor shape=(2, 3)>\x1b[0m\n\nArguments received by Dense.call(): ..."
    )
    assert first_line(keras_wrapped) == "Input 0 is incompatible (in Dense.call())"
    assert first_line(OSError("\n  disk full  \nmore")) == "disk full"
    assert first_line(RuntimeError("")) == "RuntimeError"
    assert first_line(ValueError("x" * 500), most=160) == "x" * 160
