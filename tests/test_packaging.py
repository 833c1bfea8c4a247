"""The wheel carries the config tree and the recipes: an installed tfdistx
runs from any directory, not only from a checkout. (Which TensorFlow each
install selects: test_unit_packaging.py.)"""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_ships_configs_and_recipes_and_runs_from_elsewhere(tmp_path):
    # Built from a copy: setuptools writes build/ and *.egg-info beside the sources, and a build/lib left in the
    # checkout would outlive the suite and put its stale modules into the next wheel.
    source = tmp_path / "source"
    shutil.copytree(
        ROOT,
        source,
        symlinks=True,
        ignore=shutil.ignore_patterns(
            ".git",
            ".venv",
            "build",
            "dist",
            "*.egg-info",
            "outputs",
            "multirun",
            "wandb",
            "site",
            "__pycache__",
            ".*_cache",
        ),
    )
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    wheel = next(tmp_path.glob("tfdistx-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped_recipes = {p.name for p in (ROOT / "recipes").glob("*.yaml")}
    assert {
        "tfdistx/conf/config.yaml",
        "tfdistx/conf/model/mlp.yaml",
        "tfdistx/conf/hydra/launcher/tfdistx_slurm.yaml",
    } <= names
    assert {f"tfdistx/conf/recipe/{name}" for name in shipped_recipes} <= names
    # every module of the package (a subpackage left out of pyproject's list would not ship: the run below
    # cannot show it where the checkout is installed editable, whose finder supplies what the wheel lacks)
    assert {str(p.relative_to(ROOT)) for p in (ROOT / "tfdistx").rglob("*.py")} - names == set()

    site = tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # TMPDIR: the session's scratch dir (conftest.py), where TensorFlow's autograph files and their __pycache__ go
    env = {
        "PYTHONPATH": str(site),
        "PATH": "/usr/bin:/bin",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "HOME": str(tmp_path),
        "TMPDIR": os.environ["TMPDIR"],
    }
    where = subprocess.run(
        [sys.executable, "-c", "import tfdistx; print(tfdistx.__file__)"],
        capture_output=True,
        text=True,
        env=env,
        cwd=elsewhere,
    )
    assert where.stdout.startswith(str(site)), where
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "tfdistx",
            "recipe=mnist_mlp",
            "data=synthetic",
            "trainer.steps=20",
            "trainer.steps_per_loop=10",
            "trainer.log_every=10",
            "logger.tensorboard=false",
            "hydra.run.dir=run",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=elsewhere,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads((elsewhere / "run" / "summary.json").read_text())["step"] == 20
