"""Issue 32's config side, in-process (-m unit): nothing of a user's is
replaced, a config dir does what the README says, and input that would be
silently accepted (a key that does nothing, a run that could never compute
what it was asked for) is refused in one line before TensorFlow starts."""

import threading

import pytest
import yaml

from config_helpers import PREFIX, changed, compose_ok, problems, refused
from tfdistx import cli, rundir
from tfdistx.commands import plan, recipes as recipes_command, run as run_command
from tfdistx.config import userconf
from tfdistx.core.errors import ConfigError

pytestmark = pytest.mark.unit

REMOTE = "data.train_files=gs://bucket/train-*"  # a file source checked without files


@pytest.fixture
def own_conf(tmp_path, monkeypatch):
    monkeypatch.setenv(userconf.ENV, "")  # recorded, so what take_flags adds is undone after the test
    root = tmp_path / "conf"
    (root / "experiment").mkdir(parents=True)
    return root


def exit_code(call) -> int:
    with pytest.raises(SystemExit) as leaving:
        call()
    return leaving.value.code


# -- 6: a run dir that holds files tfdistx did not write --------------------------


def users_directory(path):
    """A project directory of the user's own, with names a run writes."""
    path.mkdir()
    (path / "metrics.jsonl").write_text('{"mine": 1}\n')
    (path / "summary.json").write_text('{"mine": true}\n')
    (path / "checkpoints").mkdir()
    (path / "export").mkdir()
    (path / "train.py").write_text("print('my code')\n")
    return path


def test_a_run_dir_holding_files_tfdistx_did_not_write_is_refused_and_left_alone(tmp_path, capsys):
    mine = users_directory(tmp_path / "project")
    before = sorted(p.name for p in mine.iterdir())
    code = exit_code(lambda: run_command.main(["trainer.steps=2", f"hydra.run.dir={mine}"]))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [
        PREFIX
        + f"hydra.run.dir={str(mine)!r}: holds checkpoints/, export/, metrics.jsonl, summary.json, which a run writes, "
        "and tfdistx did not make it (no .lock): name a new directory, or move them (nothing was changed)"
    ]
    assert sorted(p.name for p in mine.iterdir()) == before  # not even .hydra/ or .lock


def test_a_run_dir_of_unrelated_files_or_of_a_tfdistx_run_is_accepted(tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "README.md").write_text("mine")
    compose_ok(notes)
    earlier = users_directory(tmp_path / "earlier")  # a run's own files: resumed, as always
    (earlier / ".lock").write_text("")
    compose_ok(earlier)
    # a run dir another task of the run wrote first (its tfdistx.log, then .hydra/), before the chief took the lock
    worker_first = tmp_path / "worker_first"
    (worker_first / ".hydra").mkdir(parents=True)
    (worker_first / "tfdistx.log").write_text("")
    compose_ok(worker_first)
    (worker_first / ".hydra" / "config.yaml").write_text("")
    compose_ok(worker_first)
    (worker_first / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"job": {"name": "tfdistx"}}}))
    compose_ok(worker_first)


def test_a_run_dir_whose_hydra_file_another_node_is_rewriting_is_its_own(tmp_path):
    """Every node's agent of a run starts Hydra in the one run dir; each
    rewrites .hydra/hydra.yaml in place. A node that reads it truncated,
    with another node's logs/ already there and the lock not yet taken,
    still knows the run dir for its own run's."""
    shared = tmp_path / "shared"
    (shared / ".hydra").mkdir(parents=True)
    (shared / "logs").mkdir()
    (shared / "logs" / "train-config.yaml").write_text("")
    (shared / ".hydra" / "hydra.yaml").write_text("")  # truncated by another node's Hydra, not yet written again
    writer = threading.Timer(
        0.3,
        lambda: (shared / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"job": {"name": "tfdistx"}}})),
    )
    writer.start()
    try:
        assert rundir.in_the_way(str(shared)) == []  # what compose asks: read as the file was, it would be [logs/]
    finally:
        writer.join()
    compose_ok(shared)


def test_another_hydra_apps_run_dir_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    (theirs / ".hydra").mkdir(parents=True)
    (theirs / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"job": {"name": "my_app"}}}))
    assert refused(theirs) == [
        PREFIX + f"hydra.run.dir={str(theirs)!r}: holds .hydra/, which a run writes, and tfdistx did not "
        "make it (no .lock): name a new directory, or move them (nothing was changed)"
    ]


def test_a_configured_checkpoint_dir_inside_a_users_directory_is_in_the_way(tmp_path):
    mine = tmp_path / "project"
    (mine / "ckpts").mkdir(parents=True)
    (mine / "ckpts" / "model.h5").write_text("mine")
    assert refused(mine, f"checkpoint.dir={mine / 'ckpts'}")[0].startswith(
        PREFIX + f"hydra.run.dir={str(mine)!r}: holds ckpts/, "
    )


# -- 8: a warm start from the run's own directory ---------------------------------


def a_run(path):
    """A tfdistx run dir with a (fake) checkpoint: what warm_start.kind looks at."""
    (path / ".hydra").mkdir(parents=True)
    (path / ".hydra" / "config.yaml").write_text("checkpoint:\n  dir: null\n")
    (path / "checkpoints").mkdir()
    (path / "checkpoints" / "ckpt-5.index").write_text("")
    (path / ".lock").write_text("")
    return path


@pytest.mark.parametrize("init_from", ["{run}", "{run}/checkpoints/ckpt-5"])
def test_init_from_the_runs_own_directory_is_refused_once_before_anything_is_set_aside(tmp_path, capsys, init_from):
    run = a_run(tmp_path / "R")
    init_from = init_from.format(run=run)
    code = exit_code(
        lambda: run_command.main(
            ["checkpoint.restore=false", f"checkpoint.init_from={init_from}", f"hydra.run.dir={run}"]
        )
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [
        PREFIX
        + f"checkpoint.init_from={init_from!r}: is in this run's own directory (hydra.run.dir={str(run)!r}), whose "
        "checkpoints checkpoint.restore=false sets aside before a warm start could read them: start the new run in "
        f"another directory (hydra.run.dir=NEW checkpoint.init_from={init_from}), or resume this one "
        "(checkpoint.restore=true)"
    ]
    assert sorted(p.name for p in run.iterdir()) == [".hydra", ".lock", "checkpoints"]
    # resuming, init_from is not applied: accepted as before
    compose_ok(run, f"checkpoint.init_from={init_from}")


# -- 10: a config dir's option named like a shipped one ---------------------------


def test_a_users_option_with_a_shipped_options_name_is_refused_everywhere(own_conf, tmp_path, monkeypatch, capsys):
    (own_conf / "model").mkdir()
    shadow = own_conf / "model" / "mlp.yaml"
    shadow.write_text("# my mlp\n_target_: tfdistx.models.mlp\nhidden_units: [7]\n")
    (own_conf / "model" / "small.yaml").write_text("# mine\n_target_: tfdistx.models.mlp\nhidden_units: [3]\n")
    monkeypatch.setenv(userconf.ENV, str(own_conf))
    line = (
        PREFIX
        + f"--config-dir (TFDISTX_CONFIG_PATH)={str(shadow)!r}: has the name of the shipped option model=mlp, which it "
        "would replace in every run: rename it, e.g. model/my_mlp.yaml (and pick it with model=my_mlp)"
    )
    assert refused(tmp_path / "run", "trainer.steps=5") == [line]  # a run that never names it
    assert refused(tmp_path / "run", "model=small") == [line]
    assert exit_code(lambda: run_command.main(["--plan"])) == 2
    assert capsys.readouterr().err.strip() == line
    assert recipes_command.main(["show", "mnist_mlp"]) == 2
    assert capsys.readouterr().err.strip() == line
    assert exit_code(lambda: cli.main(["job", "tfjob", "--image", "img"])) == 2
    assert capsys.readouterr().err.strip() == line
    # `tfdistx recipes` lists it, refused, in the same words
    assert recipes_command.main([]) == 0
    listed = next(text for text in capsys.readouterr().out.splitlines() if text.strip().startswith("model=mlp"))
    assert listed.endswith(f"[refused: {line[len(PREFIX) :]}]")


def test_a_users_primary_config_is_refused(own_conf, tmp_path, monkeypatch):
    (own_conf / "config.yaml").write_text("defaults:\n  - tfdistx_schema\n")
    monkeypatch.setenv(userconf.ENV, str(own_conf))
    assert refused(tmp_path / "run") == [
        PREFIX
        + f"--config-dir (TFDISTX_CONFIG_PATH)={str(own_conf / 'config.yaml')!r}: has the name of tfdistx's primary "
        "config config.yaml, which it would replace in every run: rename it, e.g. my_config.yaml"
    ]


# -- 11: job tfjob carries the config dirs -------------------------------------


def test_export_tfjob_carries_the_config_dirs_with_one_warning(own_conf, tmp_path, monkeypatch, capsys):
    (own_conf / "experiment" / "mine.yaml").write_text("# @package _global_\ntrainer:\n  steps: 7\n")
    other = tmp_path / "other"
    (other / "data").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(userconf.ENV, str(other))
    assert (
        exit_code(lambda: cli.main(["job", "tfjob", "--config-dir", "conf", "experiment=mine", "--image", "img"])) == 0
    )
    out, err = capsys.readouterr()
    container = yaml.safe_load(out.split("\n", 1)[1])["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"][
        "containers"
    ][0]
    assert container["args"][:3] == ["--config-dir", "conf", "experiment=mine"]
    assert {"name": userconf.ENV, "value": str(other)} in container["env"]
    warnings = [line for line in err.splitlines() if "the pods compose" in line]
    assert warnings == [
        f"tfdistx: WARNING: the pods compose with --config-dir conf and {userconf.ENV}={other}: the image (or the "
        "volume) must hold each of these directories at that path, relative to the pod's working directory"
    ]


# -- 15: unknown keys below a group, an experiment without its header -------------


def test_a_key_under_early_stopping_is_checked_like_any_other(tmp_path):
    assert refused(tmp_path / "run", "+trainer.early_stopping.foo=1") == [
        PREFIX + "trainer.early_stopping.foo=1: trainer.early_stopping has no such key; its keys: patience, min_delta"
    ]


def test_an_experiment_without_its_package_line_is_named(own_conf, tmp_path, monkeypatch):
    plain = own_conf / "experiment" / "plain.yaml"
    plain.write_text("# mine\ntrainer:\n  steps: 3\n")
    monkeypatch.setenv(userconf.ENV, str(own_conf))
    assert refused(tmp_path / "run", "experiment=plain") == [
        PREFIX
        + f"experiment='plain': {plain} does not start with '# @package _global_': an experiment's keys are the run's "
        "top level (trainer:, data: ...): make that its first line"
    ]


# -- 16: what could never be computed, and keys that do nothing --------------------


@pytest.mark.parametrize(
    "base, change, line",
    [
        (
            ("data=csv", REMOTE),
            {"checkpoint.keep_best": True},
            "checkpoint.keep_best=True: keeps the best checkpoint by trainer.objective=eval/accuracy, and "
            "data=tfdistx.data.csv has no eval split (data.eval_files=None): give data.eval_files, or a training "
            "metric as the objective (e.g. trainer.objective=loss)",
        ),
        (
            ("data=tfrecord", REMOTE),
            {"trainer.early_stopping.patience": 3},
            "trainer.early_stopping.patience=3: counts evaluations of trainer.objective=eval/accuracy, and "
            "data=tfdistx.data.tfrecord has no eval split (data.eval_files=None): give data.eval_files, or a training "
            "metric as the objective (e.g. trainer.objective=loss)",
        ),
        (
            (),
            {"data.service.mode": "parallel_epochs"},
            "data.service.mode='parallel_epochs': applies to a tf.data service, and data.service.workers=0 runs the "
            "input pipeline in the trainers: set data.service.workers=N, or leave data.service.mode out",
        ),
        (
            (),
            {"trainer.early_stopping.min_delta": 0.01},
            "trainer.early_stopping.min_delta=0.01: applies only with trainer.early_stopping.patience, which is null "
            "(never stop early): set the patience too, or leave min_delta out",
        ),
        (
            ("data=synthetic_regression",),
            {
                "task": {
                    "_target_": "tfdistx.tasks.binary.Binary",
                    "name": "binary",
                    "objective": "eval/auc",
                    "metrics": ["auc"],
                    "labels": "0 and 1",
                }
            },  # conf/task/binary.yaml's labels
            "task='binary': the labels of data=tfdistx.data.synthetic_regression are real values; binary takes labels "
            "0 and 1: use task=regression",
        ),
    ],
)
def test_what_would_do_nothing_is_one_line(configs, base, change, line):
    assert problems(changed(configs(*base), change)) == [PREFIX + line]


@pytest.mark.parametrize(
    "base, change",
    [
        (
            ("data=csv", REMOTE),
            {"checkpoint.keep_best": True, "trainer.objective": "loss"},
        ),  # a training metric needs no eval split
        (("data=csv", REMOTE, "data.eval_files=gs://bucket/eval-*"), {"checkpoint.keep_best": True}),
        ((), {"data.service.mode": None}),  # the default value
        ((), {"trainer.early_stopping.min_delta": 0.01, "trainer.early_stopping.patience": 2}),
    ],
)
def test_what_does_something_is_accepted(configs, base, change):
    assert problems(changed(configs(*base), change)) == []


def test_the_local_process_cap_counts_the_sidecar_evaluator(configs, monkeypatch):
    import os

    monkeypatch.setattr(os, "cpu_count", lambda: 1)  # the cap is max(8, 4 x cores): 8 here
    cfg = configs("strategy=multiworker", "cluster=8x1", "cluster.evaluator=true", "data.batch_size=128")
    with pytest.raises(ConfigError) as caught:
        plan.describe(cfg)
    assert caught.value.lines() == [
        PREFIX
        + "cluster='8x1': a local cluster of 9 processes (with the sidecar evaluator) on this machine's 1 cores: at "
        "most 8 here; a larger cluster runs under Slurm or Kubernetes"
    ]
    assert "placement     local cluster" in plan.describe(
        configs("strategy=multiworker", "cluster=7x1", "cluster.evaluator=true", "data.batch_size=126")
    )


# -- 19: a user's own option's keys ------------------------------------------------


def test_an_own_option_an_experiment_picks_takes_keys_its_file_lacks(own_conf, tmp_path, monkeypatch):
    (own_conf / "data").mkdir()
    (own_conf / "data" / "const.yaml").write_text("_target_: user_plugins.constant_data\nbatch_size: 64\n")
    (own_conf / "experiment" / "e.yaml").write_text("# @package _global_\ndefaults:\n  - override /data: const\n")
    monkeypatch.setenv(userconf.ENV, str(own_conf))
    assert compose_ok(tmp_path / "run", "experiment=e", "data.num_classes=3").data.num_classes == 3


def test_a_key_a_users_target_may_take_is_refused_with_the_plus_that_adds_it(own_conf, tmp_path, monkeypatch):
    """An experiment that sets data._target_ in place keeps the default data
    option's keys: a key that option lacks is Hydra's to refuse, and the line
    says how to give it to the user's own target."""
    (own_conf / "experiment" / "inline.yaml").write_text(
        "# @package _global_\ndata:\n  _target_: user_plugins.constant_data\n"
    )
    monkeypatch.setenv(userconf.ENV, str(own_conf))
    assert refused(tmp_path / "run", "experiment=inline", "data.features=4") == [
        PREFIX
        + "data.features='4': data has no key 'features'; its keys: _target_, batch_size, image_shape, num_classes, "
        "train_examples, eval_examples, seed, cache, shuffle_buffer, service; for your own target "
        "user_plugins.constant_data, add it with +data.features=4 (or put it in the YAML)"
    ]
