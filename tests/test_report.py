"""`tfdistx report`: PNG plots and a Markdown table from real runs and a real sweep."""

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from conftest import QUICK, run_command, tfdistx_env

# Evaluate along the way, so there are eval curves to draw.
CURVES = [*QUICK, "trainer.eval_every=20"]


def report(*args):
    return run_command([sys.executable, "-m", "tfdistx", "report", *map(str, args)], env=tfdistx_env(), timeout=300)


def assert_picture(path: Path):
    """A real PNG with something drawn on it."""
    import matplotlib.image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = matplotlib.image.imread(str(path))
    assert pixels.shape[0] > 200 and pixels.shape[1] > 400
    assert pixels[..., :3].std() > 0.05  # not a blank canvas


def table(markdown: str) -> list:
    """The rows of the report's job table, as dicts keyed by the header."""
    lines = [l for l in markdown.splitlines() if l.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = []
    for line in lines[2:]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        rows.append(dict(zip(header, cells)))
    return rows


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A real 3-job sweep over the learning rate."""
    sweep_dir = tmp_path_factory.mktemp("report") / "sweep"
    cmd = [
        sys.executable,
        "-m",
        "tfdistx",
        "-m",
        "optimizer=sgd",
        "optimizer.lr=0.003,0.03,0.3",
        *CURVES,
        f"hydra.sweep.dir={sweep_dir}",
    ]
    proc = run_command(cmd, tfdistx_env(), cwd=sweep_dir.parent, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return sweep_dir


def summaries(sweep_dir: Path) -> dict:
    return {p.parent.name: json.loads(p.read_text()) for p in sweep_dir.glob("*/summary.json")}


def test_report_of_one_run_draws_its_curves(tfdistx):
    run = tfdistx(*CURVES)
    assert run.returncode == 0, run
    proc = report(run.dir)
    assert proc.returncode == 0, proc.stderr
    assert_picture(run.dir / "curves.png")
    text = (run.dir / "report.md").read_text()
    assert "| final step | 40 |" in text
    assert f"| eval accuracy | {run.summary['eval']['eval/accuracy']:.4f} |" in text
    assert str(run.dir / "curves.png") in proc.stdout


def test_report_of_a_sweep_ranks_the_jobs(sweep, tmp_path):
    out = tmp_path / "report"
    proc = report(sweep, "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert_picture(out / "final_metric.png")
    assert_picture(out / "curves.png")
    assert not (sweep / "report.md").exists()  # --out, not the sweep dir

    done = summaries(sweep)
    accuracy = {job: s["eval"]["eval/accuracy"] for job, s in done.items()}
    text = (out / "report.md").read_text()
    rows = table(text)
    # one row per job, best first, each labelled by what differs: the learning rate
    assert sorted(r["job"] for r in rows) == sorted(done) == ["0", "1", "2"]
    assert [float(r["eval accuracy"]) for r in rows] == sorted((round(a, 4) for a in accuracy.values()), reverse=True)
    for row in rows:
        s = done[row["job"]]
        assert row["overrides"] == f"`optimizer.lr={s['learning_rate']}`"
        assert int(row["final step"]) == s["step"] == 40
        assert float(row["final train loss"]) == pytest.approx(s["train"]["loss"], abs=1e-4)
        assert float(row["examples/s"].replace(",", "")) == pytest.approx(s["examples_per_sec"], abs=1)
        assert row["wall time"].endswith(" s")
    best = rows[0]["job"]
    assert accuracy[best] == max(accuracy.values())
    assert f"**Best: job {best}**" in text.split("| rank")[0]  # named above the table
    assert "Common to all jobs: `optimizer=sgd`" in text


def test_report_writes_into_the_sweep_dir_and_ranks_unfinished_jobs_last(sweep, tmp_path):
    copy = tmp_path / "sweep"
    shutil.copytree(sweep, copy)
    (copy / "0" / "summary.json").unlink()  # job 0 died before its summary
    proc = report(copy)
    assert proc.returncode == 0, proc.stderr
    rows = table((copy / "report.md").read_text())
    assert len(rows) == 3
    assert rows[-1]["job"] == "0 (unfinished)" and rows[-1]["wall time"] == "—"
    assert_picture(copy / "final_metric.png")


def test_report_refuses_bad_input_in_one_line(tmp_path):
    for target in (tmp_path / "missing", tmp_path):  # no such dir; a dir with no runs
        proc = report(target)
        assert proc.returncode == 2, proc
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert str(target) in proc.stderr


def test_report_reads_past_binary_and_wrongly_typed_files(tfdistx, tmp_path):
    good = tfdistx(*QUICK)
    assert good.returncode == 0, good
    sweep = tmp_path / "sweep"
    shutil.copytree(good.dir, sweep / "0")
    (sweep / "1").mkdir()
    (sweep / "1" / "metrics.jsonl").write_bytes(bytes(range(256)) * 4)  # binary
    (sweep / "2").mkdir()
    (sweep / "2" / "summary.json").write_text('{"step": "x", "eval": [1]}')
    (sweep / "2" / "metrics.jsonl").write_text('{"step": 5, "loss": "abc", "accuracy": 0.5}\n')
    proc = report(sweep)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "2/summary.json: skipped: not a tfdistx summary" in proc.stderr
    assert "1/metrics.jsonl: left out" in proc.stderr
    assert (sweep / "final_metric.png").is_file()
    only_bad = report(sweep / "1")
    assert only_bad.returncode == 2 and "no runs in" in only_bad.stderr and "Traceback" not in only_bad.stderr, (
        only_bad.stderr
    )


def test_runs_without_overrides_are_labelled_so_not_by_their_run_dir(tfdistx, tmp_path):
    outputs = tmp_path / "outputs"
    plain = tfdistx(run_dir=outputs / "12-00-00-000001")  # the default job: no overrides at all
    other = tfdistx(*QUICK, run_dir=outputs / "12-00-01-000002")
    assert plain.returncode == 0 and other.returncode == 0, plain
    proc = report(outputs)
    assert proc.returncode == 0, proc.stderr
    rows = {row["job"]: row for row in table((outputs / "report.md").read_text())}
    assert rows["12-00-00-000001"]["overrides"] == "`(no overrides)`", rows
    assert "12-00-00" not in rows["12-00-01-000002"]["overrides"]
