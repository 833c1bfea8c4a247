"""The seams the README draws, held by what a fresh process loads: the
engine and what it trains (engine/, data/, tasks/, models.py) load no Hydra
or OmegaConf; the config side and the launches (config/, core/, cluster/, launch/)
load no TensorFlow or Keras; the spec and the fact tables (core/) load
neither. Each side is imported whole in one fresh interpreter;
when one loads what it must not, each of its modules is imported alone to
name the one that does."""

import subprocess
import sys
from pathlib import Path

import pytest

import tfdistx

pytestmark = pytest.mark.unit

PACKAGE = Path(tfdistx.__file__).parent


def modules(*places: str) -> list:
    names = []
    for place in places:
        path = PACKAGE / place
        files = [path] if path.suffix == ".py" else sorted(path.rglob("*.py"))
        for file in files:
            parts = file.relative_to(PACKAGE.parent).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def loaded(names: list, forbidden: tuple) -> list:
    """Which of `forbidden` a fresh interpreter has loaded after importing `names`."""
    code = (
        f"import importlib, sys\n"
        f"for name in {names!r}:\n    importlib.import_module(name)\n"
        f"print(' '.join(m for m in {forbidden!r} if m in sys.modules))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.split()


@pytest.mark.parametrize(
    "places, forbidden",
    [
        (("engine", "data", "tasks", "models.py"), ("hydra", "omegaconf")),
        (("config", "core", "cluster", "launch", "rundir.py", "sigterm.py", "machine.py"), ("tensorflow", "keras")),
        (
            ("core", "checkpoint_files.py", "whole_files.py", "log_files.py"),
            ("tensorflow", "keras", "hydra", "omegaconf"),
        ),
    ],
    ids=[
        "the engine loads no Hydra",
        "the config side loads no TensorFlow",
        "the spec and the files both sides share load neither",
    ],
)
def test_each_side_of_the_seam_loads_nothing_of_the_other(places, forbidden):
    names = modules(*places)
    assert names and loaded(names, forbidden) == [], {
        name: found for name in names if (found := loaded([name], forbidden))
    }


def test_the_engine_and_the_launcher_read_the_spec_never_the_config_side():
    """engine/, data/, tasks/, models.py and cluster/ (placement, the
    launcher, the manifests) import from core/ (plain data and the facts),
    never from config/ (the Hydra side, the one reader of a composed config),
    not even inside a function, where it would go unseen until that call."""
    import ast

    offenders = []
    for name in modules("engine", "data", "tasks", "models.py", "cluster"):
        path = PACKAGE.parent / (name.replace(".", "/") + ".py")
        path = path if path.exists() else path.with_suffix("") / "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            imported = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            offenders += [
                f"{name}:{node.lineno} {m}"
                for m in imported
                if m == "tfdistx.config" or m.startswith("tfdistx.config.")
            ]
    assert offenders == []
