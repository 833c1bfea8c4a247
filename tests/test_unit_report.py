"""`tfdistx report` in process: what it writes into a directory it did not
make (a run dir, `--out`), and the objective it is asked to rank by. The
run's files are written as a run writes them (metrics.jsonl, summary.json):
the report reads nothing else. Real runs and a real sweep: test_report.py."""

import hashlib
import json

import pytest

from tfdistx.commands import report

pytestmark = pytest.mark.unit


def a_run(run_dir):
    """A finished run's files, as a run of 40 steps writes them."""
    run_dir.mkdir(parents=True)
    records = [
        {"step": 20, "loss": 2.2, "accuracy": 0.15, "lr": 0.001},
        {"step": 40, "loss": 2.1, "accuracy": 0.2, "lr": 0.001, "eval/loss": 2.15, "eval/accuracy": 0.18},
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = {"step": 40, "train": {"loss": 2.1, "accuracy": 0.2}, "eval": {"eval/loss": 2.15, "eval/accuracy": 0.18}}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


def md5(path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def run_report(capsys, *args) -> tuple:
    code = report.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_report_never_replaces_a_report_or_a_picture_of_the_users(tmp_path, capsys):
    """--out D holding the user's own report.md and curves.png, and a run
    dir holding their report.md: refused in one line naming them, nothing
    changed; a directory holding only what report wrote is brought up to
    date when report runs again, and one of its files the user edited since
    is theirs."""
    run = a_run(tmp_path / "run")
    out = tmp_path / "mine"
    out.mkdir()
    (out / "report.md").write_text("my own notes\n")
    (out / "curves.png").write_bytes(b"my own picture")
    before = {p.name: md5(p) for p in out.iterdir()}
    code, _, err = run_report(capsys, run, "--out", out)
    assert code == 2 and err.strip().splitlines() == [
        f"tfdistx report: {out} holds curves.png, report.md, which tfdistx report did not write (or which changed "
        "since): move them, or write the report elsewhere with --out DIR (nothing was written)"
    ]
    assert {p.name: md5(p) for p in out.iterdir()} == before

    (run / "report.md").write_text("what I found\n")
    code, _, err = run_report(capsys, run)
    assert code == 2 and f"{run} holds report.md, which tfdistx report did not write" in err
    assert (run / "report.md").read_text() == "what I found\n" and not (run / "curves.png").exists()

    (run / "report.md").unlink()
    for _ in range(2):  # its own report, run again: replaced
        code, printed, err = run_report(capsys, run)
        assert code == 0 and err == "" and printed.split() == [str(run / "curves.png"), str(run / "report.md")]
        assert "| final step | 40 |" in (run / "report.md").read_text()
    (run / "report.md").write_text((run / "report.md").read_text() + "\nMy conclusion.\n")
    code, _, err = run_report(capsys, run)
    assert code == 2 and "holds report.md, which tfdistx report did not write (or which changed since)" in err
    assert (run / "report.md").read_text().endswith("My conclusion.\n")


def test_report_refuses_an_objective_no_run_reports_naming_those_they_do(tmp_path, capsys):
    run = a_run(tmp_path / "run")
    code, _, err = run_report(capsys, run, "--objective", "eval/acuracy")
    assert code == 2 and err.strip().splitlines() == [
        "tfdistx report: --objective 'eval/acuracy': no run here reports it; they report: accuracy, "
        "eval/accuracy, eval/loss, loss, lr"
    ]
    assert not (run / "report.md").exists()
    code, _, err = run_report(capsys, run, "--objective", "eval/loss")
    assert code == 0, err


def test_a_run_ranks_by_its_own_objective_and_one_without_a_config_by_the_configs_default(tmp_path):
    """The objective a run is ranked by is its trainer.objective; a run that
    saved no config is ranked by the objective of the config composed with
    no override (the default task's own), not by a second default of the report's."""
    from tfdistx.commands.common import compose

    configured = a_run(tmp_path / "configured")
    (configured / ".hydra").mkdir()
    (configured / ".hydra" / "config.yaml").write_text("trainer:\n  objective: eval/accuracy\n")
    bare = a_run(tmp_path / "bare")
    assert report.load_job(configured, tmp_path, None).objective_name == "eval/accuracy"
    default = report.load_job(bare, tmp_path, None).objective_name
    assert default == str(compose([], notes=False).trainer.objective)
