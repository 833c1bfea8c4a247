"""Hydra multirun: the basic launcher, the Optuna sweeper and the joblib launcher."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import QUICK, tfdistx_env


def multirun(sweep_dir: Path, *args, timeout=600):
    cmd = [sys.executable, "-m", "tfdistx", "-m", *args, f"hydra.sweep.dir={sweep_dir}"]
    return subprocess.run(cmd, capture_output=True, text=True, env=tfdistx_env(), cwd=sweep_dir.parent, timeout=timeout)


def jobs(sweep_dir: Path) -> dict:
    """job number -> (summary, overrides, composed config)."""
    found = {}
    for job in sorted(p for p in sweep_dir.iterdir() if p.is_dir()):
        found[job.name] = (
            json.loads((job / "summary.json").read_text()),
            yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text()),
            yaml.safe_load((job / ".hydra" / "config.yaml").read_text()),
        )
    return found


def test_multirun_runs_every_combination_in_its_own_dir(tmp_path):
    sweep = tmp_path / "sweep"
    proc = multirun(sweep, "optimizer=adam,sgd", "optimizer.lr=1e-3,1e-2", *QUICK)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = jobs(sweep)
    assert sorted(found) == ["0", "1", "2", "3"]
    combinations = {(cfg["optimizer"]["name"], cfg["optimizer"]["lr"]) for _, _, cfg in found.values()}
    assert combinations == {("adam", 1e-3), ("adam", 1e-2), ("sgd", 1e-3), ("sgd", 1e-2)}
    for summary, overrides, cfg in found.values():
        assert summary["step"] == 40 and summary["learning_rate"] == pytest.approx(cfg["optimizer"]["lr"])
        assert f"optimizer={cfg['optimizer']['name']}" in overrides
    assert (sweep / "multirun.yaml").is_file()


@pytest.mark.parametrize(
    "objective, best", [("eval/accuracy", max), pytest.param("eval/loss", min, marks=pytest.mark.slow)]
)
def test_optuna_sweep_optimizes_the_objective_the_right_way(tmp_path, objective, best):
    """No hydra.sweeper.direction given: accuracy is maximized, a loss minimized,
    and `tfdistx report` names the same best job as Optuna."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="pip install '.[test]' (hydra-optuna-sweeper)")
    sweep = tmp_path / "optuna"
    proc = multirun(
        sweep,
        "hydra/sweeper=optuna",
        "hydra.sweeper.n_trials=3",
        "hydra.sweeper.sampler.seed=0",
        "optimizer.lr=interval(0.0005,0.05)",
        f"trainer.objective={objective}",
        *QUICK,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"Directions: ['{'maximize' if best is max else 'minimize'}']" in proc.stdout + proc.stderr
    assert (
        "setup plugin alembic" not in proc.stdout + proc.stderr and "\x1b[" not in proc.stdout + proc.stderr
    )  # plain, quiet logs
    found = jobs(sweep)
    assert sorted(found) == ["0", "1", "2"]
    # the entrypoint returned trainer.objective and optuna kept the best
    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    values = {name: summary["eval"][objective] for name, (summary, _, _) in found.items()}
    winner = best(values, key=values.get)
    assert results["best_value"] == pytest.approx(values[winner])
    assert results["best_params"]["optimizer.lr"] == pytest.approx(found[winner][2]["optimizer"]["lr"])
    lrs = [cfg["optimizer"]["lr"] for _, _, cfg in found.values()]
    assert all(0.0005 <= lr <= 0.05 for lr in lrs) and len(set(lrs)) == 3
    report = subprocess.run(
        [sys.executable, "-m", "tfdistx", "report", str(sweep)], capture_output=True, text=True, env=tfdistx_env()
    )
    assert report.returncode == 0, report.stderr
    assert f"**Best: job {winner}**" in (sweep / "report.md").read_text()


def test_joblib_launcher_runs_recipe_jobs_in_parallel_processes(tmp_path):
    """Each job in its own process: one-device and 4-replica jobs can share a sweep."""
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher", reason="pip install '.[test]' (hydra-joblib-launcher)")
    sweep = tmp_path / "joblib"
    # Bounded well under loky's 300 s idle timeout: a sweep that ended without stopping joblib's
    # worker pool waited that long on its idle workers after the last job was done.
    proc = multirun(
        sweep,
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "recipe=mnist_mlp,mnist_mirrored",
        "data=synthetic",
        *QUICK,
        timeout=200,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = {overrides[0]: summary for summary, overrides, _ in jobs(sweep).values()}
    assert set(found) == {"recipe=mnist_mlp", "recipe=mnist_mirrored"}
    assert (found["recipe=mnist_mlp"]["replicas"], found["recipe=mnist_mlp"]["learning_rate"]) == (
        1,
        pytest.approx(1e-3),
    )
    assert (found["recipe=mnist_mirrored"]["replicas"], found["recipe=mnist_mirrored"]["learning_rate"]) == (
        4,
        pytest.approx(4e-3),
    )
    assert "joblib" in (sweep / "multirun.yaml").read_text()
