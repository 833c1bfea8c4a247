"""Warm start, the best checkpoint and early stopping in a real multi-worker
cluster (processes on loopback): every worker loads the same source, saves
the best checkpoint at the same step and stops at the same step. The same
features in one process: test_unit_warm_start.py."""

import json

from conftest import EXPORTED, QUICK
from test_cluster import digests

WORSENS = [
    "optimizer.lr=0.03",
    "trainer.eval_every=5",
    "trainer.log_every=5",
    "trainer.steps_per_loop=5",
    "trainer.deterministic=true",
]


def test_a_multiworker_run_warm_starts_keeps_its_best_and_stops_early(tfdistx, tmp_path):
    source = tfdistx(*QUICK, "strategy=one_device", "checkpoint.export=false", run_dir=tmp_path / "source")
    assert source.returncode == 0, source
    args = [
        *QUICK,
        EXPORTED,
        *WORSENS,
        "strategy=multiworker",
        "cluster=2x1",
        f"checkpoint.init_from={source.dir}",
        "checkpoint.init_skip=[head/]",
        "data.num_classes=5",
        "checkpoint.keep_best=true",
        "trainer.early_stopping.patience=2",
    ]
    run = tfdistx(*args)
    assert run.returncode == 0, run
    logs = {task: (run.dir / "logs" / f"{task}.log").read_text() for task in ("worker-0", "worker-1")}
    for text in logs.values():  # each worker loaded the source itself
        assert "warm start from ckpt-40 of" in text and "2 variables loaded, 2 left freshly initialised" in text, text[
            -2000:
        ]
    history = [(m["step"], m["eval/accuracy"]) for m in run.metrics if "eval/accuracy" in m]
    best_step, best_value = history[[v for _, v in history].index(max(v for _, v in history))]
    summary = run.summary
    assert summary["init_from"] == str(source.dir) and summary["workers"] == 2
    assert summary["best"] == {
        "step": best_step,
        "value": best_value,
        "objective": "eval/accuracy",
        "checkpoint": str(run.dir / "checkpoints" / "best" / f"ckpt-{best_step}"),
    }
    stop = summary["stopped_early"]["step"]
    assert stop == summary["step"] == history[-1][0] < 40 and stop > best_step
    for text in logs.values():  # both stopped there, with equal weights
        assert f"stopped early at step {stop}" in text
    found = digests(run.dir)
    assert set(found) == {"worker-0", "worker-1"} and len(set(found.values())) == 1, found
    assert (run.dir / "export" / "saved_model.pb").is_file() and f"exported ckpt-{best_step}" in run.stdout

    before = (run.dir / "summary.json").read_text()
    again = tfdistx(*args)  # a rerun trains nothing: patience was spent
    assert again.returncode == 0, again
    assert f"stopped early at step {stop}" in again.stdout and (run.dir / "summary.json").read_text() == before
    [evaluation] = [json.loads(line) for line in (run.dir / "evaluations.jsonl").read_text().splitlines()]
    assert evaluation["step"] == stop
