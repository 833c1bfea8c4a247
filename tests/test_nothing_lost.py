"""Nothing a user made is lost by a command, a rerun or a damaged file: a
command writes new paths, or replaces only what it made itself and keeps the
rest aside (*.replaced-STAMP). Real runs, real files on disk."""

import json
import logging
import sys

from conftest import EXPORTED, QUICK, files, free_ports, refused_in_one_line, run_command, tfdistx_env
from tfdistx.commands import export as export_command


def export(*args) -> int:
    """`tfdistx export ARGS` in this process (commands/export.main, as the CLI
    calls it): its exit code; a refusal's one line is on stderr."""
    level = logging.getLogger("tensorflow").level
    try:
        return export_command.main([str(arg) for arg in args])
    except SystemExit as refused:
        return refused.code
    finally:
        logging.getLogger("tensorflow").setLevel(
            level
        )  # a refusal quietens TensorFlow's logger for the rest of its process


def test_export_never_replaces_a_run_or_its_checkpoints_and_keeps_earlier_exports(tfdistx, tmp_path, capsys):
    run = tfdistx(*QUICK, EXPORTED, "checkpoint.every_steps=20")
    assert run.returncode == 0, run
    before = files(run.dir)
    for out in (run.dir, run.dir / "checkpoints", run.dir / ".hydra", tmp_path):
        assert export(run.dir, "--out", out) == 2, f"--out {out} was not refused"
        refused = capsys.readouterr().err
        assert f"--out='{out}'" in refused and "Traceback" not in refused, refused
        assert files(run.dir) == before, f"--out {out} changed the run"

    # --step N writes beside the run's own export, which stays the final step's
    assert export(run.dir, "--step", 20) == 0, capsys.readouterr().err[-2000:]
    assert (run.dir / "export-step-20" / "saved_model.pb").is_file()
    assert files(run.dir / "export") == {
        k.relative_to("export"): v for k, v in before.items() if k.parts[0] == "export"
    }

    # writing over an earlier export keeps it aside, whole
    assert export(run.dir, "--step", 40, "--out", run.dir / "export-step-20") == 0, capsys.readouterr().err[-2000:]
    kept = list(run.dir.glob("export-step-20.replaced-*"))
    assert len(kept) == 1 and (kept[0] / "saved_model.pb").is_file()
    assert not list(run.dir.glob(".export*tmp*"))  # no temporary left beside


def test_rerunning_a_finished_run_keeps_its_summary_and_export(tfdistx):
    first = tfdistx(*QUICK)
    assert first.returncode == 0, first
    before = files(first.dir)
    again = tfdistx(*QUICK)
    assert again.returncode == 0, again
    assert "finished at step 40" in again.stdout + again.stderr
    after = files(first.dir)
    evaluations = after.pop(next(k for k in after if k.name == "evaluations.jsonl"))
    assert after == before  # summary.json, metrics.jsonl, checkpoints and export byte for byte
    restored = json.loads(
        evaluations.decode().splitlines()[-1]
    )  # the final checkpoint restored evaluates as the run did
    assert restored["step"] == 40 and {k: restored[k] for k in first.summary["eval"]} == first.summary["eval"]


def test_a_run_whose_checkpoints_cannot_be_read_starts_over_beside_them(tfdistx):
    first = tfdistx(*QUICK, "checkpoint.every_steps=20")
    assert first.returncode == 0, first
    for data in (first.dir / "checkpoints").glob("ckpt-*.data-*"):
        data.write_bytes(b"\0" * 16)
    old_summary, old_metrics = (first.dir / "summary.json").read_bytes(), (first.dir / "metrics.jsonl").read_bytes()
    second = tfdistx(*QUICK, "trainer.steps=20")
    assert second.returncode == 0, second
    assert second.summary["step"] == 20 and not second.summary["resumed"]
    assert next(first.dir.glob("summary.replaced-*.json")).read_bytes() == old_summary
    assert next(first.dir.glob("metrics.replaced-*.jsonl")).read_bytes() == old_metrics
    kept = next(first.dir.glob("checkpoints.replaced-*"))
    assert sorted(p.name for p in kept.glob("*.index")) == ["ckpt-20.index", "ckpt-40.index"]
    assert sorted(p.name for p in (first.dir / "checkpoints").glob("*.index")) == ["ckpt-20.index"]


def test_an_empty_run_dir_is_refused_and_nothing_is_written_here(tfdistx, tmp_path):
    here = tmp_path / "cwd"
    here.mkdir()
    run = tfdistx(*QUICK, run_dir="", cwd=here)
    refused_in_one_line(run, "hydra.run.dir=''", "must name a directory")
    assert list(here.iterdir()) == []


def test_data_write_keeps_an_earlier_write_aside_and_refuses_other_directories(tmp_path):
    def write(out, shards):
        return run_command(
            [
                sys.executable,
                "-m",
                "tfdistx",
                "data",
                "write",
                "data=synthetic",
                "data.train_examples=64",
                "data.eval_examples=16",
                "--out",
                str(out),
                "--shards",
                str(shards),
            ],
            env=tfdistx_env(),
            timeout=300,
        )

    out = tmp_path / "data"
    assert write(out, 4).returncode == 0
    assert write(out, 2).returncode == 0
    assert sorted(p.name for p in out.glob("train-*")) == [
        "train-00000-of-00002.tfrecord",
        "train-00001-of-00002.tfrecord",
    ]
    kept = list(tmp_path.glob("data.replaced-*"))
    assert len(kept) == 1 and len(list(kept[0].glob("train-*"))) == 4  # the first write, whole, not mixed in

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    refused = write(mine, 2)
    assert refused.returncode == 2 and "is not data written by tfdistx data write" in refused.stderr, refused.stderr[
        -2000:
    ]
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_a_refused_rerun_under_agents_leaves_the_runs_config_as_the_run_wrote_it(tfdistx):
    """Under agents every node starts Hydra in the one run dir, and the node
    that owns it is known only later (the one keeping the rounds). A rerun
    with another model is refused (exit 2, the checkpoint is another
    model's) and the run's .hydra/ files, which that refusal tells the user
    to read, are byte for byte the run's own; the run's own command then
    goes on from its checkpoint. One agent, on loopback."""
    agent = [
        "strategy=multiworker",
        "cluster.workers=1",
        "cluster.launch=agent",
        f"cluster.agent.store=127.0.0.1:{free_ports(1)[0]}",
    ]
    first = tfdistx(*QUICK, "checkpoint.every_steps=20", *agent)
    assert first.returncode == 0, first
    config = files(first.dir / ".hydra")
    assert config and "- trainer.steps=40" in (first.dir / ".hydra" / "overrides.yaml").read_text()
    refused = tfdistx(*QUICK, "model=cnn", "trainer.steps=60", *agent)
    assert refused.returncode == 2 and "was saved by another model" in refused.stdout + refused.stderr, refused
    assert (
        files(first.dir / ".hydra") == config and not (first.dir / "FAILED").exists()
    )  # a run that was there is not a failed one
    again = tfdistx(*QUICK, "checkpoint.every_steps=20", "trainer.steps=60", *agent)
    assert again.returncode == 0 and json.loads((first.dir / "summary.json").read_text())["step"] == 60, again
    assert "- trainer.steps=60" in (first.dir / ".hydra" / "overrides.yaml").read_text()
