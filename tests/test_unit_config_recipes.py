"""Recipes (config/recipes.py) and `tfdistx job tfjob`'s checks
(launch/kubernetes.py), in-process (-m unit): what each shipped recipe
composes to; a user's recipe directory in tmp_path, named by
TFDISTX_RECIPES for the one test; the TFJob built from the composed
config, without printing or applying it."""

import pytest

from config_helpers import PREFIX, compose_ok, refused
from tfdistx.launch import jobset
from tfdistx.launch import kubernetes
from tfdistx.config import recipes
from tfdistx.core.errors import ConfigError
from tfdistx.config.resolve import layout_of

TWO_SGD = """\
# @package _global_
# Two workers of three devices with SGD: a user's own recipe.
defaults:
  - override /strategy: multiworker
  - override /cluster: 2x3
  - override /optimizer: sgd
optimizer:
  lr: 0.02
data:
  batch_size: 96
"""


def recipe_dir(where, **files):
    where.mkdir()
    for name, text in files.items():
        (where / f"{name}.yaml").write_text(text)
    return where


# -- the shipped recipes (moved from tests/test_recipes.py) ---------------------

SHIPPED = sorted(p.stem for p in recipes.shipped_dir().glob("*.yaml"))

# What each shipped recipe promises in its description line.
EXPECTED = {
    "mnist_mlp": dict(
        strategy="one_device", cluster="local", model="tfdistx.models.mlp", data="mnist", batch=128, optimizer="adam"
    ),
    "mnist_mirrored": dict(
        strategy="mirrored", cluster="1x4", model="tfdistx.models.mlp", data="mnist", batch=4 * 128, optimizer="adam"
    ),
    "mnist_multiworker": dict(
        strategy="multiworker", cluster="2x1", model="tfdistx.models.mlp", data="mnist", batch=2 * 64, optimizer="adam"
    ),
    "cifar10_resnet": dict(
        strategy="mirrored",
        cluster="1x2",
        model="tfdistx.models.resnet",
        data="cifar10",
        batch=2 * 128,
        optimizer="sgd",
    ),
}


@pytest.mark.unit
def test_the_expected_recipes_are_shipped():
    assert set(EXPECTED) <= set(SHIPPED)


@pytest.mark.unit
@pytest.mark.parametrize("name", SHIPPED)
def test_every_recipe_composes_validates_and_describes_itself(configs, name):
    cfg = configs(f"recipe={name}")
    path = recipes.find(name)
    assert path.read_text().splitlines()[0] == "# @package _global_"
    assert not recipes.describe(path).startswith("(no description")
    if name in EXPECTED:
        want = EXPECTED[name]
        assert (cfg.strategy.name, cfg.cluster.name, cfg.model._target_, cfg.optimizer.name) == (
            want["strategy"],
            want["cluster"],
            want["model"],
            want["optimizer"],
        )
        assert (cfg.data.name, cfg.data.batch_size) == (want["data"], want["batch"])


@pytest.mark.unit
def test_recipes_scale_the_batch_and_lr_with_replicas(configs):
    mirrored = configs("recipe=mnist_mirrored")
    assert mirrored.data.batch_size == 128 * mirrored.cluster.devices_per_worker
    assert mirrored.optimizer.scale_lr_with_replicas is True
    resnet = configs("recipe=cifar10_resnet")
    assert (resnet.optimizer.schedule, resnet.optimizer.momentum, resnet.model.depth) == ("warmup_cosine", 0.9, 20)


@pytest.mark.unit
def test_the_command_line_beats_the_recipe(configs):
    cfg = configs("recipe=mnist_mirrored", "cluster=1x2", "data.batch_size=256", "optimizer=sgd")
    assert (cfg.strategy.name, cfg.cluster.devices_per_worker, cfg.data.batch_size, cfg.optimizer.name) == (
        "mirrored",
        2,
        256,
        "sgd",
    )
    # the recipe's own keys still apply to the group swapped in on the command line
    assert cfg.optimizer.scale_lr_with_replicas is True


# -- moved from tests/test_errors.py and tests/test_recipes.py (they ran `python -m tfdistx`) --


@pytest.mark.unit
def test_a_user_recipe_that_is_not_yaml(tmp_path, monkeypatch):
    mine = recipe_dir(tmp_path / "recipes", broken="trainer:\n  steps: [1\n")
    monkeypatch.setenv("TFDISTX_RECIPES", str(mine))
    (line,) = refused(tmp_path / "run", "recipe=broken")
    assert line.startswith(PREFIX + f"config file='{mine / 'broken.yaml'}, line 3': is not valid YAML"), line


@pytest.mark.unit
def test_an_unknown_recipe_is_refused_with_the_choices(tmp_path):
    (line,) = refused(tmp_path / "run", "recipe=mnist_mpl")
    assert (
        line.startswith(PREFIX + "recipe='mnist_mpl': allowed: ") and "mnist_mlp" in line and "mnist_mirrored" in line
    ), line


@pytest.mark.unit
def test_a_missing_user_recipe_dir_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("TFDISTX_RECIPES", str(tmp_path / "nowhere"))
    assert refused(tmp_path / "run", "recipe=mnist_mlp") == [
        PREFIX + f"TFDISTX_RECIPES='{tmp_path / 'nowhere'}': {tmp_path / 'nowhere'} is not a directory of recipe files"
    ]


# -- a user's recipes -------------------------------------------------------------


@pytest.mark.unit
def test_recipes_dir_that_is_a_file_is_refused(tmp_path, monkeypatch):
    (tmp_path / "recipes.yaml").write_text(TWO_SGD)
    monkeypatch.setenv("TFDISTX_RECIPES", str(tmp_path / "recipes.yaml"))
    assert refused(tmp_path / "run") == [
        PREFIX
        + f"TFDISTX_RECIPES='{tmp_path / 'recipes.yaml'}': {tmp_path / 'recipes.yaml'} is not a directory of recipe "
        "files"
    ]


@pytest.mark.unit
def test_a_user_recipe_composes_with_the_cluster_its_defaults_name(tmp_path, monkeypatch):
    """`override /cluster: 2x3` has no file: the recipe's topology is registered as the command line's are."""
    monkeypatch.setenv("TFDISTX_RECIPES", str(recipe_dir(tmp_path / "recipes", two_sgd=TWO_SGD)))
    cfg = compose_ok(tmp_path / "run", "recipe=two_sgd")
    assert (
        cfg.strategy.name,
        cfg.cluster.workers,
        cfg.cluster.devices_per_worker,
        cfg.optimizer.name,
        cfg.optimizer.lr,
        cfg.data.batch_size,
    ) == ("multiworker", 2, 3, "sgd", 0.02, 96)


@pytest.mark.unit
def test_the_first_recipe_dir_shadows_the_later_ones_and_the_shipped(tmp_path, monkeypatch):
    first = recipe_dir(tmp_path / "first", mnist_mlp="# @package _global_\n# mine\noptimizer:\n  lr: 0.5\n")
    second = recipe_dir(tmp_path / "second", mnist_mlp="# @package _global_\n# theirs\noptimizer:\n  lr: 0.25\n")
    monkeypatch.setenv("TFDISTX_RECIPES", f"{first}:{second}")
    assert recipes.find("mnist_mlp") == first / "mnist_mlp.yaml"
    assert compose_ok(tmp_path / "run", "recipe=mnist_mlp").optimizer.lr == 0.5
    shadowed = [r for r in recipes.available() if r["name"] == "mnist_mlp"]
    assert [(r["path"], r["shadowed_by"]) for r in shadowed] == [
        (first / "mnist_mlp.yaml", None),
        (second / "mnist_mlp.yaml", first / "mnist_mlp.yaml"),
        (recipes.shipped_dir() / "mnist_mlp.yaml", first / "mnist_mlp.yaml"),
    ]


@pytest.mark.unit
@pytest.mark.parametrize(
    "text, described, is_global",
    [
        (TWO_SGD, "Two workers of three devices with SGD: a user's own recipe.", True),
        ("\n# @package _global_\n#\n# after a blank comment\ntrainer:\n  steps: 5\n", "after a blank comment", True),
        ("trainer:\n  steps: 5\n# too late\n", "(no description: start the file with a comment line)", False),
    ],
)
def test_a_recipe_describes_itself_by_its_first_comment(tmp_path, text, described, is_global):
    (tmp_path / "r.yaml").write_text(text)
    assert (recipes.describe(tmp_path / "r.yaml"), recipes.is_global(tmp_path / "r.yaml")) == (described, is_global)


# -- `tfdistx job tfjob`: moved from tests/test_kubernetes.py ----------------------


def tfjob(cfg, overrides=(), name="tfdistx", volume=None, gpus=False):
    return kubernetes.tfjob(
        layout_of(cfg), kubernetes.PodOptions(tuple(overrides), name, "img", volume=volume, gpus=gpus)
    )


@pytest.mark.unit
def test_a_tpu_cannot_be_exported_as_a_tfjob(configs):
    with pytest.raises(ConfigError) as caught:
        tfjob(configs("strategy=tpu"), ["strategy=tpu"])
    assert caught.value.lines() == [
        PREFIX + "strategy='tpu': cannot be exported as a TFJob: a TPU is reached through its own "
        "resolver (strategy.tpu), not a TFJob's TF_CONFIG: run it on a TPU VM"
    ]


@pytest.mark.unit
@pytest.mark.parametrize(
    "name, longest, ok",
    [
        ("My_Job", kubernetes.MAX_NAME, False),  # moved: --name My_Job
        ("mnist-2", kubernetes.MAX_NAME, True),
        ("a" * 52, kubernetes.MAX_NAME, True),  # its services' "-worker-999" must still fit 63 characters
        ("a" * 53, kubernetes.MAX_NAME, False),
    ],
)
def test_a_tfjob_name_must_be_a_dns_label(name, longest, ok):
    if ok:
        jobset.check_name("--name", name, longest)
        return
    with pytest.raises(ConfigError) as caught:
        jobset.check_name("--name", name, longest)
    assert caught.value.lines() == [
        PREFIX + f"--name={name!r}: must be a DNS label: lowercase letters, digits and '-', "
        f"starting with a letter, at most {longest} characters"
    ]


@pytest.mark.unit
@pytest.mark.parametrize(
    "spec, source",
    [
        ("pvc:runs", {"persistentVolumeClaim": {"claimName": "runs"}}),
        ("hostPath:/srv/runs", {"hostPath": {"path": "/srv/runs", "type": "DirectoryOrCreate"}}),
        ("nfs:/exports/runs", None),  # moved: --volume nfs:/exports/runs
        ("hostPath:srv/runs", None),
    ],
)
def test_a_tfjob_volume(spec, source):
    if source is not None:
        assert kubernetes.volume_source(spec) == source
        return
    with pytest.raises(ConfigError) as caught:
        kubernetes.volume_source(spec)
    assert caught.value.lines() == [
        PREFIX + f"--volume={spec!r}: allowed: pvc:CLAIM_NAME (or CLAIM_NAME) or hostPath:/ABSOLUTE/PATH"
    ]


@pytest.mark.unit
@pytest.mark.parametrize("spec", ["pvc:Bad_Claim!", "Runs", "pvc:runs-", "pvc:" + "a" * 254])
def test_a_volume_claim_kubernetes_would_refuse_is_refused_at_export(spec):
    with pytest.raises(ConfigError) as caught:
        kubernetes.volume_source(spec)
    assert caught.value.lines() == [
        PREFIX + f"--volume={spec!r}: a claim's name: lowercase letters, digits, '-' and '.', starting "
        "and ending with a letter or digit, at most 253 characters"
    ]


@pytest.mark.unit
def test_parameter_servers_need_their_strategy_to_be_exported(tmp_path):
    """Moved: `job tfjob cluster=ps2w4` (strategy auto) is refused as a run is."""
    assert refused(tmp_path / "run", "cluster=ps2w4") == [
        PREFIX
        + "strategy='auto': cluster=ps2w4 (4 worker(s), 2 ps) has parameter servers: use strategy=parameter_server"
    ]


@pytest.mark.unit
@pytest.mark.parametrize(
    "overrides, replicas",
    [
        ((), {"Worker": 1}),  # a one-process strategy: one pod
        (("strategy=multiworker", "cluster=3x1", "data.batch_size=96"), {"Worker": 3}),
        (("strategy=parameter_server", "cluster=ps2w4", "trainer.steps=4000"), {"Chief": 1, "PS": 2, "Worker": 4}),
    ],
)
def test_a_tfjob_has_the_replicas_of_the_strategy(configs, overrides, replicas):
    manifest = tfjob(configs(*overrides), overrides)
    assert {kind: spec["replicas"] for kind, spec in manifest["spec"]["tfReplicaSpecs"].items()} == replicas


@pytest.mark.unit
def test_only_training_pods_ask_for_gpus(configs):
    overrides = ("strategy=parameter_server", "cluster=ps1w2", "trainer.steps=2000")
    specs = tfjob(configs(*overrides), overrides, gpus=True)["spec"]["tfReplicaSpecs"]
    limits = {kind: spec["template"]["spec"]["containers"][0].get("resources") for kind, spec in specs.items()}
    assert limits == {"Chief": None, "PS": None, "Worker": {"limits": {"nvidia.com/gpu": 1}}}


@pytest.mark.unit
@pytest.mark.parametrize(
    "overrides, launch, run_dir, offset, args",
    [
        (
            ["cluster=2x1"],
            "tf_config",
            "/mnt/tfdistx/job",
            128,
            [
                "cluster=2x1",
                "cluster.launch=tf_config",
                "cluster.retryable_exit_offset=128",
                "hydra.run.dir=/mnt/tfdistx/job",
            ],
        ),
        (["trainer.steps=5"], None, None, 128, ["trainer.steps=5", "cluster.retryable_exit_offset=128"]),
        (
            ["hydra.run.dir=/mine"],
            None,
            "/mnt/tfdistx/job",
            128,
            ["hydra.run.dir=/mine", "cluster.retryable_exit_offset=128"],
        ),  # the user's kept
        # a JobSet's pods: placed by their labels, and its failure policy lists the exit codes as they are
        (
            ["cluster=2x1"],
            "jobset",
            "/mnt/tfdistx/job",
            0,
            ["cluster=2x1", "cluster.launch=jobset", "hydra.run.dir=/mnt/tfdistx/job"],
        ),
    ],
)
def test_a_pods_arguments(overrides, launch, run_dir, offset, args):
    assert kubernetes.pod_args(overrides, launch, run_dir, offset) == args
