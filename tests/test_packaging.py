"""The wheel carries the config tree and the recipes: an installed tfdistx
runs from any directory, not only from a checkout."""

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_ships_configs_and_recipes_and_runs_from_elsewhere(tmp_path):
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    wheel = next(tmp_path.glob("tfdistx-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped_recipes = {p.name for p in (ROOT / "recipes").glob("*.yaml")}
    assert {"tfdistx/conf/config.yaml", "tfdistx/conf/model/mlp.yaml", "tfdistx/conf/hydra/launcher/tfdistx_slurm.yaml"} <= names
    assert {f"tfdistx/conf/recipe/{name}" for name in shipped_recipes} <= names

    site = tmp_path / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                             capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-3000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "2", "HOME": str(tmp_path)}
    where = subprocess.run([sys.executable, "-c", "import tfdistx; print(tfdistx.__file__)"], capture_output=True, text=True, env=env, cwd=elsewhere)
    assert where.stdout.startswith(str(site)), where
    run = subprocess.run([sys.executable, "-m", "tfdistx", "recipe=mnist_mlp", "data=synthetic", "trainer.steps=20", "trainer.steps_per_loop=10",
                          "trainer.log_every=10", "logger.tensorboard=false", "hydra.run.dir=run"],
                         capture_output=True, text=True, env=env, cwd=elsewhere, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads((elsewhere / "run" / "summary.json").read_text())["step"] == 20


# -- exactly one TensorFlow, whatever the platform and extras ----------------------

PLATFORMS = {  # the markers pip evaluates, as each platform reports them
    "linux-x86_64": {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"},
    "linux-aarch64": {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "aarch64"},
    "macos-arm64": {"sys_platform": "darwin", "platform_system": "Darwin", "platform_machine": "arm64"},
    "windows-amd64": {"sys_platform": "win32", "platform_system": "Windows", "platform_machine": "AMD64"},
}


def selected(extras, platform) -> list:
    """The project's requirements pip selects for `extras` on `platform` (no download)."""
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    chosen = []
    for extra in ["", *extras]:
        lines = project["dependencies"] if not extra else project["optional-dependencies"][extra]
        env = {"python_version": "3.11", "python_full_version": "3.11.7", "os_name": "posix", "implementation_name": "cpython",
               **PLATFORMS[platform], "extra": extra}
        chosen += [r for r in map(Requirement, lines) if r.marker is None or r.marker.evaluate(env)]
    return chosen


@pytest.mark.unit
@pytest.mark.parametrize("platform", list(PLATFORMS))
@pytest.mark.parametrize("extras", [[], ["gpu"], ["test"], ["gpu", "test", "sweep"]])
def test_every_install_selects_exactly_one_tensorflow(extras, platform):
    from tfdistx.machine import TENSORFLOW_DISTRIBUTIONS

    tensorflows = {r.name for r in selected(extras, platform) if r.name in TENSORFLOW_DISTRIBUTIONS}
    assert tensorflows == {"tensorflow"}, (extras, platform, tensorflows)


@pytest.mark.unit
@pytest.mark.parametrize("platform, cuda", [("linux-x86_64", True), ("linux-aarch64", True), ("macos-arm64", False)])
def test_the_gpu_extra_adds_the_cuda_libraries_to_the_same_tensorflow(platform, cuda):
    tensorflow = [r for r in selected(["gpu"], platform) if r.name == "tensorflow"]
    assert {str(r.specifier) for r in tensorflow} == {"==2.21.0"}  # one version, whichever line asks
    assert any("and-cuda" in r.extras for r in tensorflow) is cuda
