"""The W&B logger in-process, offline (no key, no network, no TensorFlow):
what a resumed run sends, the run's summary, and a host W&B cannot reach.
Read back from W&B's own record files (wandb_files.py). The real runs
(a sweep's runs grouped and named, a preempted and a killed run resumed)
are test_wandb.py's."""

import json
import socket
from pathlib import Path

import pytest

import wandb_files
from tfdistx.loggers.sinks import JsonlLogger
from tfdistx.loggers.wandb_logger import WandbLogger, kept_id, objective_summary, unreachable

pytestmark = pytest.mark.unit

CONFIG = {"trainer": {"objective": "eval/accuracy"}}


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """No key anywhere W&B looks, W&B's own files in tmp_path."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL", "WANDB_DIR"):
        monkeypatch.delenv(name, raising=False)


def attempt(run_dir: Path, start_step: int, steps, value=lambda step: step / 100):
    """One attempt of a run: metrics.jsonl cut back to `start_step` (as a resume does), then `steps` logged."""
    run_dir.mkdir(exist_ok=True)
    jsonl = JsonlLogger(str(run_dir / "metrics.jsonl"), resume_step=start_step)
    logger = WandbLogger.for_run(run_dir, CONFIG, start_step=start_step)
    for step in steps:
        metrics = {"loss": value(step), "eval/accuracy": 1 - value(step)}
        jsonl(step, metrics)
        logger(step, metrics)
    logger.close()
    jsonl.close()
    import wandb

    wandb.teardown()  # as the attempt's process ends: W&B's service writes the rest of its file, and stops


def test_a_resume_from_a_checkpoint_older_than_what_wandb_holds_sends_each_step_once(tmp_path, offline):
    """W&B holds steps 10-60 (the first attempt ended cleanly); the run resumes from its checkpoint at 20 and
    trains 30-80 again: 30-60 are not sent again (W&B refuses a step lower than its last), 70 and 80 are. One W&B
    run, every step of metrics.jsonl once, steps 30-60 with the values W&B first had."""
    run_dir = tmp_path / "run"
    attempt(run_dir, 0, range(10, 61, 10))
    attempt(run_dir, 20, range(30, 81, 10), value=lambda step: step / 1000)
    found = wandb_files.attempts(run_dir)
    assert len(found) == 2 and {one.run_id for one in found} == {kept_id(run_dir)}
    sent = wandb_files.steps(found)
    assert [row["step"] for row in sent] == [10, 20, 30, 40, 50, 60, 70, 80]
    assert [row["loss"] for row in sent] == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.07, 0.08]
    jsonl = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert jsonl == [row["step"] for row in sent]


def test_a_resume_sends_the_steps_of_metrics_jsonl_that_wandb_lacks(tmp_path, offline):
    """An attempt whose W&B file lost its last records (a hard kill: W&B writes its file in 32 KiB blocks) left
    metrics.jsonl with steps W&B does not hold: the resumed run sends them first, from metrics.jsonl."""
    run_dir = tmp_path / "run"
    attempt(run_dir, 0, range(10, 31, 10))
    jsonl = JsonlLogger(str(run_dir / "metrics.jsonl"), resume_step=30)
    for step in (40, 50):  # logged to metrics.jsonl by an attempt whose W&B records never reached its file
        jsonl(step, {"loss": step / 100, "eval/accuracy": 1 - step / 100})
    jsonl.close()
    attempt(run_dir, 50, (60,))
    sent = wandb_files.steps(wandb_files.attempts(run_dir))
    assert [(row["step"], row["loss"]) for row in sent] == [
        (10, 0.1),
        (20, 0.2),
        (30, 0.3),
        (40, 0.4),
        (50, 0.5),
        (60, 0.6),
    ]


def test_the_summary_holds_the_final_and_the_best_objective():
    records = [{"step": 10, "eval/accuracy": 0.5}, {"step": 20, "loss": 1.0}, {"step": 30, "eval/accuracy": 0.4}]
    assert objective_summary("eval/accuracy", records) == {
        "objective": "eval/accuracy",
        "objective/final": 0.4,
        "objective/best": 0.5,
        "objective/best_step": 10,
    }
    assert (
        objective_summary("eval/loss", [{"step": 5, "eval/loss": 2.0}, {"step": 6, "eval/loss": 3.0}])["objective/best"]
        == 2.0
    )
    assert objective_summary("eval/accuracy", [{"step": 5, "loss": 2.0}]) == {}


def test_a_host_that_refuses_is_unreachable_at_once_and_a_listening_one_is_not():
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(1)
        port = listening.getsockname()[1]
        assert unreachable(f"http://127.0.0.1:{port}", 5) is None
    # Closed now: refused, said at once (not after the 600 s a W&B init would retry for).
    assert unreachable(f"http://127.0.0.1:{port}", 600) == f"127.0.0.1:{port}: Connection refused"
    assert unreachable("https://nowhere.invalid", 30).startswith("nowhere.invalid:443: ")
