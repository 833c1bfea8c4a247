"""Weights & Biases as its users use it, in real runs, offline (no key, no
network): a sweep's runs grouped by the sweep and named by their
overrides, with their model artifact and objective; a run preempted, then
killed, each time resumed, is one W&B run with every step of metrics.jsonl
once. Each read back from W&B's own record files (wandb_files.py)."""

import json
import os
import signal
import subprocess
import sys

import pytest
import yaml

import wandb_files
from conftest import EXPORTED, QUICK, metric_lines, run_command, start_tfdistx, tfdistx_env, wait_until
from test_cluster import can_isolate


def no_key(tmp_path) -> dict:
    """No API key anywhere W&B looks: offline, W&B's own files in tmp_path."""
    return {
        "HOME": str(tmp_path / "home"),
        "NETRC": str(tmp_path / "no-netrc"),
        "WANDB_API_KEY": None,
        "WANDB_MODE": None,
    }


def jsonl(run_dir) -> list:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_sweeps_runs_are_one_wandb_group_each_named_by_its_overrides_with_its_model(tmp_path):
    """`-m logger=wandb optimizer.lr=1e-3,3e-3,1e-2`: three W&B runs, one group (the sweep's directory), each named
    by its overrides (Hydra's override_dirname), each with the numbers of its metrics.jsonl digit for digit, the
    final and best objective in its summary, and (log_model) its export as a model artifact. About 25 s: the
    three runs in one process, one after another."""
    sweep = tmp_path / "sweep"
    sweep_run = run_command(
        [
            sys.executable,
            "-m",
            "tfdistx",
            "-m",
            *QUICK,
            EXPORTED,
            "trainer.eval_every=20",
            "logger=wandb",
            "logger.wandb.log_model=true",
            "optimizer.lr=1e-3,3e-3,1e-2",
            f"hydra.sweep.dir={sweep}",
        ],
        env=tfdistx_env(**no_key(tmp_path)),
        cwd=tmp_path,
        timeout=600,
    )
    assert sweep_run.returncode == 0, sweep_run.stderr[-3000:]
    names = set()
    for job in ("0", "1", "2"):
        run_dir = sweep / job
        (one,) = wandb_files.attempts(run_dir)
        override_dirname = yaml.safe_load((run_dir / ".hydra" / "hydra.yaml").read_text())["hydra"]["job"][
            "override_dirname"
        ]
        # Hydra's override_dirname, without the `++` tfdistx puts before a logger's key (as the user typed it)
        assert one.group == str(sweep) and one.name == override_dirname.replace("++", "") and one.job_type == "train"
        names.add(one.name)
        records = jsonl(run_dir)
        keys = [key for key in records[-1] if key != "step"]
        assert [{"_step": row["step"], **{k: row[k] for k in keys if k in row}} for row in records] == [
            {k: v for k, v in row.items() if k == "_step" or k in keys} for row in one.history
        ]
        evaluated = [row["eval/accuracy"] for row in records if "eval/accuracy" in row]
        assert one.summary["objective"] == "eval/accuracy"
        assert one.summary["objective/final"] == evaluated[-1] and one.summary["objective/best"] == max(evaluated)
        (model,) = one.artifacts
        assert model.type == "model" and model.name == f"model-{one.run_id}"
        assert {entry.path for entry in model.manifest.contents} >= {"saved_model.pb", "variables/variables.index"}
    assert len(names) == 3 and all(
        any(f"optimizer.lr={lr}," in name for name in names) for lr in ("0.001", "0.003", "0.01")
    )


def test_a_run_preempted_then_killed_and_resumed_each_time_is_one_wandb_run_with_every_step_once(tmp_path):
    """SIGTERM (a checkpoint at the step, exit 42), the same command again, SIGKILL mid-run, the same command to the
    end: three attempts, one W&B run (its id kept in the run dir), every step of metrics.jsonl once in W&B's files,
    with its numbers digit for digit. What the kill kept from W&B's file is sent again from metrics.jsonl; what W&B
    holds past the checkpoint the run resumes from is not sent twice. About 25 s (three processes, 20 CPU s)."""
    run_dir = tmp_path / "run"
    args = [
        "trainer.steps=600",
        "trainer.steps_per_loop=10",
        "trainer.log_every=10",
        "trainer.eval_every=0",
        "checkpoint.every_steps=50",
        "data.batch_size=32",
        "logger.tensorboard=false",
        "trainer.jit_compile=false",
        "logger=wandb",
    ]
    env = no_key(tmp_path)
    proc = start_tfdistx(args, run_dir, env=env, stdout=subprocess.DEVNULL)
    try:
        wait_until(lambda: metric_lines(run_dir) >= 10, 300, "10 records", [proc])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=300) == 42
    finally:
        proc.kill()
        proc.wait()
    preempted_at = jsonl(run_dir)[-1]["step"]
    proc = start_tfdistx(args, run_dir, env=env, stdout=subprocess.DEVNULL)
    try:  # past a checkpoint of this attempt's, and on: the kill lands between two checkpoints
        wait_until(lambda: metric_lines(run_dir) >= preempted_at // 10 + 18, 300, "18 more records", [proc])
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    last = run_command(
        [sys.executable, "-m", "tfdistx", *args, f"hydra.run.dir={run_dir}"],
        env=tfdistx_env(**env),
        timeout=600,
    )
    assert last.returncode == 0, last.stderr[-3000:]
    found = wandb_files.attempts(run_dir)
    run_id = (run_dir / "wandb" / "tfdistx-run-id").read_text().strip()
    # The killed attempt's file may hold no record at all (W&B writes it in 32 KiB blocks): its name says its run.
    assert len(found) == 3 and all(one.path.name == f"run-{run_id}.wandb" for one in found)
    assert {one.run_id for one in found if one.run_id} == {run_id}
    records = jsonl(run_dir)
    assert [row["step"] for row in records] == list(range(10, 601, 10))
    assert wandb_files.steps(found, keys=("loss", "accuracy")) == [
        {"step": row["step"], "loss": row["loss"], "accuracy": row["accuracy"]} for row in records
    ]


def test_a_keyed_run_without_a_route_trains_offline_at_once(tmp_path):
    """An API key, and no route anywhere (a network namespace of its own, no interface up): W&B's host cannot be
    resolved, and the run logs offline at once, with one warning, where W&B's own init retried it for the whole
    init_timeout (600 s here: this run, given 120 s, would not have finished). About 8 s."""
    if not can_isolate():
        pytest.skip("this machine does not allow a private network namespace (unshare --user --net)")
    run_dir = tmp_path / "run"
    env = tfdistx_env(**{**no_key(tmp_path), "WANDB_API_KEY": "0" * 40, "WANDB_BASE_URL": None})
    run = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--net", sys.executable, "-m", "tfdistx", *QUICK, "logger=wandb"]
        + ["logger.wandb.init_timeout=600", f"hydra.run.dir={run_dir}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    warnings = [line for line in (run.stdout + run.stderr).splitlines() if "W&B is unreachable" in line]
    assert len(warnings) == 1 and "logging offline" in warnings[0] and "Traceback" not in run.stderr, run.stderr
    (one,) = wandb_files.attempts(run_dir)
    assert [row["_step"] for row in one.history] == [20, 40] and one.path.parent.name.startswith("offline-run-")
