"""A checkpoint's size and a save's expected time before the run
(core/checkpoint_size.py): `--plan` says them, and the grace a preemption
gives the run follows from them unless the user sets it: the local
launcher's and the pods' (cluster.preemption_grace, a pod's
terminationGracePeriodSeconds) and the Slurm script's --signal lead."""

import math

import pytest
import yaml

from config_helpers import compose_ok
from engine_helpers import train
from tfdistx import cli
from tfdistx.commands.plan import describe
from tfdistx.core import checkpoint_size

pytestmark = pytest.mark.unit

# 784-8192-8192-10 with Adam: the run, about 884 MB a checkpoint
LARGE = ["model.hidden_units=[8192,8192]"]
# 784 x 16384, then four 16384 x 16384 layers, with Adam: about 13 GB, 64 s a save at the stated 200 MB/s
HUGE = ["model.hidden_units=[16384,16384,16384,16384,16384]"]


@pytest.fixture(autouse=True)
def no_scheduler(monkeypatch):
    for name in ("TF_CONFIG", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)


def plan_lines(configs, *overrides) -> list:
    return describe(configs(*overrides)).splitlines()


def test_plan_says_the_checkpoints_size_its_parts_and_a_saves_expected_time(configs):
    lines = plan_lines(configs, *LARGE)
    size = next(line for line in lines if line.startswith("checkpoint "))
    weights = (784 * 8192 + 8192 + 8192 * 8192 + 8192 + 8192 * 10 + 10) * 4
    assert size == (
        f"checkpoint    {(3 * weights) / 1e6:.0f} MB: the model's variables {weights / 1e6:.0f} MB, adam's slots "
        f"{2 * weights / 1e6:.0f} MB (2 per weight), float32 (model=mlp's shapes)"
    )
    save = next(line for line in lines if line.startswith("  save "))
    assert f"about {3 * weights / 200e6:.1f} s at 200 MB/s (a stated rate" in save
    grace = next(line for line in lines if line.startswith("  grace "))
    assert "a preemption gives the run 60 s (derived" in grace  # 2 x 4.4 s + 30 s: the floor


def test_plan_counts_the_optimizers_slots_and_says_when_it_cannot_know_the_size(configs):
    sgd = next(line for line in plan_lines(configs, "optimizer=sgd") if line.startswith("checkpoint "))
    assert "sgd's slots" in sgd and "(1 per weight)" in sgd  # momentum 0.9: one copy
    unknown = next(line for line in plan_lines(configs, "model=resnet") if line.startswith("checkpoint "))
    assert "known once the model is built (model=resnet)" in unknown


def test_a_reruns_plan_reads_the_size_of_the_checkpoint_on_disk(tmp_path):
    trained = train(tmp_path / "run", "model=resnet", "model.depth=8", "model.width=4", "trainer.steps=2")
    [index] = (tmp_path / "run" / "checkpoints").glob("ckpt-2.index")
    written = sum(p.stat().st_size for p in index.parent.glob("ckpt-2.*"))
    assert written == trained.summary["checkpoint"]["bytes"]
    lines = describe(compose_ok(tmp_path / "run", "model=resnet", "model.depth=8", "model.width=4"))
    size = next(line for line in lines.splitlines() if line.startswith("checkpoint "))
    assert size == f"checkpoint    {checkpoint_size._size(written)} (ckpt-2 on disk)"


def exported(capsys, kind: str, *args) -> list:
    with pytest.raises(SystemExit) as leaving:
        cli.main(["export", kind, *args])
    out, err = capsys.readouterr()
    assert leaving.value.code == 0, err
    return list(yaml.safe_load_all(out)) if kind != "slurm" else out


def pod_graces(manifests) -> set:
    """Every terminationGracePeriodSeconds in the manifests."""
    found = set()

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                found.add(value) if key == "terminationGracePeriodSeconds" else walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(manifests)
    return found


@pytest.mark.parametrize("kind", ["tfjob", "jobset", "trainjob"])
def test_the_pods_grace_fits_a_huge_models_save_and_the_users_own_wins(capsys, kind):
    base = ["strategy=multiworker", "cluster=2x1", "--image", "img:1"]
    assert pod_graces(exported(capsys, kind, *base)) == {60}  # the default MLP: today's 60 s
    huge = checkpoint_size.estimate(
        {
            "model": {"_target_": "tfdistx.models.mlp", "hidden_units": [16384] * 5},
            "data": {"image_shape": [28, 28, 1], "num_classes": 10},
            "optimizer": {"name": "adam"},
        }
    )
    expected = math.ceil(2 * huge.seconds + checkpoint_size.GRACE_MARGIN)
    assert expected > 120
    assert pod_graces(exported(capsys, kind, *base, *HUGE)) == {expected}
    assert pod_graces(exported(capsys, kind, *base, *HUGE, "cluster.preemption_grace=45")) == {45}


def signal_option(script: str) -> str:
    return next(line for line in script.splitlines() if line.startswith("#SBATCH --signal="))


def test_the_slurm_notice_fits_a_huge_models_save_and_the_users_own_wins(capsys):
    base = ["strategy=multiworker", "cluster=2x1"]
    assert signal_option(exported(capsys, "slurm", *base)) == "#SBATCH --signal=B:USR1@120"
    grace = pod_graces(exported(capsys, "tfjob", *base, *HUGE, "--image", "img:1")).pop()
    assert signal_option(exported(capsys, "slurm", *base, *HUGE)) == f"#SBATCH --signal=B:USR1@{grace}"
    assert signal_option(exported(capsys, "slurm", *base, *HUGE, "--notice", "90")) == "#SBATCH --signal=B:USR1@90"
    with pytest.raises(SystemExit) as leaving:
        cli.main(["export", "slurm", *base, *HUGE, "--time", "2:00"])
    assert leaving.value.code == 2
    assert f"--time='2:00': must be longer than the notice a checkpoint needs, {grace} s" in capsys.readouterr().err
