"""Recipes: `recipe=NAME` runs, `tfdistx recipes` list/show/copy, a user's own recipe dir.
(What each shipped recipe composes to, in-process: test_unit_config_recipes.py.)"""

import sys

import pytest
import yaml

from conftest import QUICK, run_command, tfdistx_env
from test_unit_config_recipes import SHIPPED
from tfdistx.config import recipes


def tfdistx_cli(*args, env=None, cwd=None, timeout=300):
    return run_command(
        [sys.executable, "-m", "tfdistx", *args], env=tfdistx_env(**(env or {})), cwd=cwd, timeout=timeout
    )


def assert_one_clean_line(proc):
    assert proc.returncode == 2, proc
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


# --- the shipped recipes, trained ------------------------------------------------


def test_mnist_mlp_recipe_trains_on_synthetic_data(tfdistx):
    run = tfdistx("recipe=mnist_mlp", "data=synthetic", *QUICK)
    assert run.returncode == 0, run
    summary = run.summary
    assert (summary["step"], summary["strategy"], summary["replicas"], summary["global_batch"]) == (
        40,
        "one_device",
        1,
        32,
    )
    config = yaml.safe_load((run.dir / ".hydra" / "config.yaml").read_text())
    assert config["model"]["hidden_units"] == [128] and config["data"]["_target_"] == "tfdistx.data.synthetic"
    assert "recipe=mnist_mlp" in (run.dir / ".hydra" / "overrides.yaml").read_text()


def test_mnist_mirrored_recipe_runs_four_replicas_with_scaled_lr(tfdistx):
    run = tfdistx("recipe=mnist_mirrored", "data=synthetic", *QUICK)
    assert run.returncode == 0, run
    summary = run.summary
    assert (summary["strategy"], summary["replicas"], summary["per_replica_batch"]) == ("mirrored", 4, 8)
    assert summary["learning_rate"] == pytest.approx(4e-3)


# --- tfdistx recipes list / show / copy ---------------------------------------


def test_recipes_lists_every_recipe_with_its_description():
    for args in (["recipes"], ["recipes", "list"]):
        proc = tfdistx_cli(*args)
        assert proc.returncode == 0, proc.stderr
        for name in SHIPPED:
            line = next(l for l in proc.stdout.splitlines() if l.split()[:1] == [name])
            assert recipes.describe(recipes.find(name)) in line


def test_recipes_show_prints_the_composed_config_with_overrides():
    proc = tfdistx_cli("recipes", "show", "mnist_mirrored", "cluster=1x2", "trainer.epochs=1")
    assert proc.returncode == 0, proc.stderr
    cfg = yaml.safe_load(proc.stdout)
    assert (
        cfg["strategy"]["name"],
        cfg["cluster"]["devices_per_worker"],
        cfg["data"]["batch_size"],
        cfg["trainer"]["epochs"],
    ) == ("mirrored", 2, 512, 1)
    assert "hydra" not in cfg


def test_recipes_show_refuses_an_unknown_recipe_or_override():
    assert_one_clean_line(tfdistx_cli("recipes", "show", "nope"))
    bad = tfdistx_cli("recipes", "show", "mnist_mlp", "trainer.steps=abc")
    assert_one_clean_line(bad)
    assert "trainer.steps" in bad.stderr


def test_recipes_copy_writes_the_file_for_editing(tmp_path):
    proc = tfdistx_cli("recipes", "copy", "cifar10_resnet", str(tmp_path / "mine"))
    assert proc.returncode == 0, proc.stderr
    copied = tmp_path / "mine" / "cifar10_resnet.yaml"
    assert copied.read_text() == recipes.find("cifar10_resnet").read_text()
    assert f"TFDISTX_RECIPES={tmp_path / 'mine'}" in proc.stdout  # how to run the copy

    again = tfdistx_cli("recipes", "copy", "cifar10_resnet", str(tmp_path / "mine"))
    assert_one_clean_line(again)
    assert "--force" in again.stderr
    copied.write_text(copied.read_text() + "# my edit\n")
    forced = tfdistx_cli("recipes", "copy", "cifar10_resnet", str(tmp_path / "mine"), "--force")
    assert forced.returncode == 0 and copied.read_text() == recipes.find("cifar10_resnet").read_text()
    kept = list((tmp_path / "mine").glob("cifar10_resnet.yaml.replaced-*"))  # not a *.yaml: not listed as a recipe
    assert len(kept) == 1 and kept[0].read_text().endswith(
        "# my edit\n"
    )  # --force replaced the file, and kept the edits
    renamed = tfdistx_cli("recipes", "copy", "cifar10_resnet", str(tmp_path / "mine" / "resnet56.yaml"))
    assert renamed.returncode == 0 and (tmp_path / "mine" / "resnet56.yaml").is_file()


# --- a user's own recipe directory ----------------------------------------------

USER_RECIPE = """\
# @package _global_
# Two mirrored replicas with SGD: a user's own recipe.
defaults:
  - override /strategy: mirrored
  - override /cluster: 1x2
  - override /optimizer: sgd
optimizer:
  lr: 0.02
"""


def test_a_user_recipe_dir_is_listed_shown_and_run(tfdistx, tmp_path):
    mine = tmp_path / "my_recipes"
    mine.mkdir()
    (mine / "two_sgd.yaml").write_text(USER_RECIPE)
    env = {"TFDISTX_RECIPES": str(mine)}

    listed = tfdistx_cli("recipes", env=env)
    assert listed.returncode == 0, listed.stderr
    assert "Two mirrored replicas with SGD: a user's own recipe." in listed.stdout
    assert str(mine) in listed.stdout and "mnist_mlp" in listed.stdout  # shipped ones still there

    shown = yaml.safe_load(tfdistx_cli("recipes", "show", "two_sgd", env=env).stdout)
    assert (shown["optimizer"]["name"], shown["optimizer"]["lr"], shown["cluster"]["name"]) == ("sgd", 0.02, "1x2")

    run = tfdistx("recipe=two_sgd", *QUICK, env=env)
    assert run.returncode == 0, run
    assert (run.summary["strategy"], run.summary["replicas"], run.summary["learning_rate"]) == (
        "mirrored",
        2,
        pytest.approx(0.02),
    )


def test_an_edited_copy_shadows_the_shipped_recipe(tmp_path):
    mine = tmp_path / "my_recipes"
    assert tfdistx_cli("recipes", "copy", "mnist_mlp", str(mine)).returncode == 0
    edited = mine / "mnist_mlp.yaml"
    edited.write_text(edited.read_text().replace("lr: 1e-3", "lr: 0.005"))
    env = {"TFDISTX_RECIPES": str(mine)}

    listed = tfdistx_cli("recipes", env=env).stdout
    assert f"shadowed by {edited}" in listed
    composed = tfdistx_cli("recipe=mnist_mlp", "data=synthetic", "--cfg", "job", env=env)
    assert composed.returncode == 0, composed.stderr
    assert yaml.safe_load(composed.stdout)["optimizer"]["lr"] == 0.005
