"""`tfdistx report RUN_OR_SWEEP_DIR [--out DIR]`: plots and a table from run directories.

One run (a directory with metrics.jsonl / summary.json):
    curves.png   loss and accuracy against step, train and eval
    report.md    the run's final numbers and the plot

A sweep (a directory whose subdirectories are runs, e.g. multirun/DATE/TIME):
    final_metric.png  the objective (trainer.objective, e.g. eval/accuracy) of
                      every job, best on top and highlighted, labelled by the
                      overrides that differ between jobs
    curves.png        every job's curves overlaid, the best one drawn boldest
    report.md         the best job, then a table of all jobs, best first

Into a directory it did not make (the run or sweep dir, or --out), it
replaces only the files it wrote there itself, unchanged since
(rundir.replace_ours): a report.md or picture of the user's is never
replaced; the command refuses in one line, and writes nothing.

Reads only files (no TensorFlow); draws with matplotlib's Agg backend.
"""

import argparse
import io
import json
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

from tfdistx.core.objective import lower_is_better
from tfdistx.core.values import is_whole
from tfdistx.rundir import FAILED_NAME, not_ours, replace_ours
from tfdistx.whole_files import jsonl_records

EXIT_BAD_INPUT = 2
# Directories inside a run that never hold another run.
_NOT_RUNS = {".hydra", "checkpoints", "tensorboard", "wandb", "__pycache__"}


class ReportError(Exception):
    """Bad input: printed as one line, exit code 2."""


@dataclass
class Job:
    dir: Path
    name: str  # relative to the report's root ("0", "1", ... in a sweep)
    overrides: List[str]
    summary: Optional[dict]
    metrics: List[dict]
    objective_name: str
    label: str = ""  # the overrides that tell this job from the others
    color: Optional[object] = None

    @property
    def finished(self) -> bool:
        return self.summary is not None

    @property
    def failure(self) -> Optional[str]:
        """How the run failed ('exit code 4'), from the FAILED file rundir.py leaves; None if it did not."""
        path = self.dir / FAILED_NAME
        return path.read_text().strip() if path.is_file() else None

    @property
    def unfinished_text(self) -> str:
        """'' for a finished job, else how it ended: failed, or not (yet)."""
        if self.finished:
            return ""
        return f" (failed: {self.failure})" if self.failure else " (unfinished)"

    @property
    def objective(self) -> Optional[float]:
        return self.value(self.objective_name)

    def value(self, key: str) -> Optional[float]:
        """A final metric: from summary.json (eval, then train), else the last logged value."""
        if self.summary:
            for section in ("eval", "train"):
                if key in (self.summary.get(section) or {}):
                    return _number(self.summary[section][key])
        for record in reversed(self.metrics):
            if key in record:
                return _number(record[key])
        return None

    def reported(self) -> set:
        """The metrics `value` finds: summary.json's train and eval, and every logged record's."""
        sections = [(self.summary or {}).get(section) or {} for section in ("train", "eval")]
        return {key for record in [*sections, *self.metrics] for key in record if key != "step"}

    @property
    def step(self) -> Optional[int]:
        if self.summary and "step" in self.summary:
            return self.summary["step"]
        return self.metrics[-1].get("step") if self.metrics else None


# --- finding and reading runs -------------------------------------------------------


def is_run(directory: Path) -> bool:
    return any((directory / name).is_file() for name in ("summary.json", "metrics.jsonl", FAILED_NAME))


def find_runs(root: Path) -> List[Path]:
    """`root` itself when it is a run, else every run below it (not inside another run)."""
    if is_run(root):
        return [root]
    found = []
    for current, dirs, _ in os.walk(root):
        here = Path(current)
        if here != root and is_run(here):
            found.append(here)
            dirs[:] = []
            continue
        dirs[:] = [d for d in dirs if d not in _NOT_RUNS]
    return sorted(found, key=lambda p: _natural(str(p.relative_to(root))))


def load_job(directory: Path, root: Path, objective: Optional[str]) -> Job:
    return Job(
        dir=directory,
        name=str(directory.relative_to(root)) if directory != root else directory.name,
        overrides=_overrides(directory),
        summary=_summary(directory / "summary.json"),
        metrics=_metrics(directory / "metrics.jsonl"),
        objective_name=objective or _configured_objective(directory),
    )


def _summary(path: Path) -> Optional[dict]:
    """summary.json, or None (said once) when it is not a tfdistx summary."""
    if not path.is_file():
        return None
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as error:  # UnicodeDecodeError is a ValueError: a binary file
        return _skipped(path, str(error).splitlines()[0][:100])
    if (
        not isinstance(summary, dict)
        or not _is_step(summary.get("step", 0))
        or not all(isinstance(summary.get(section) or {}, dict) for section in ("train", "eval"))
    ):
        return _skipped(path, "not a tfdistx summary (a JSON object with a whole-number step and train/eval metrics)")
    return summary


def _metrics(path: Path) -> List[dict]:
    """metrics.jsonl's records; lines cut short by a kill, or of the wrong type, are left out."""
    try:
        pairs, bad = jsonl_records(path)
    except OSError:
        return []
    records = []
    for _, record in pairs:
        if _is_step(record.get("step")):
            records.append({key: value for key, value in record.items() if key == "step" or _number(value) is not None})
        else:
            bad += 1
    if bad > 1 or (bad and not records):  # one cut line is a killed run's, not worth a word
        print(f"tfdistx report: {path}: left out {bad} line(s) that are not metric records", file=sys.stderr)
    return records


def _is_step(value) -> bool:
    return is_whole(value) and value >= 0


def _skipped(path: Path, reason: str) -> None:
    print(f"tfdistx report: {path}: skipped: {reason}", file=sys.stderr)
    return None


def _overrides(directory: Path) -> List[str]:
    path = directory / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return []
    from omegaconf import OmegaConf

    try:
        # hydra.run.dir / hydra.sweep.dir say where, not what: not an override worth showing
        return [str(o) for o in OmegaConf.load(path) if not str(o).startswith(("hydra.run.", "hydra.sweep."))]
    except Exception:
        return []


def _configured_objective(directory: Path) -> str:
    """The run's trainer.objective; the config's own default where it saved no config (config/compose.py)."""
    from tfdistx.config.compose import saved_objective  # deferred: Hydra, for the report of a sweep or a run only

    return saved_objective(directory)


# --- ranking and labels -------------------------------------------------------------


def ranked(jobs: List[Job], lower: bool) -> List[Job]:
    """Best first; unfinished jobs (no summary.json) and jobs without the objective last."""

    def key(job):
        value = job.objective
        missing = value is None or math.isnan(value)
        return (not job.finished, missing, 0.0 if missing else (value if lower else -value), _natural(job.name))

    return sorted(jobs, key=key)


def best_of(jobs: List[Job]) -> Optional[Job]:
    """The first of the ranked jobs, when it finished and has the objective."""
    first = jobs[0] if jobs else None
    if first is None or not first.finished or first.objective is None or math.isnan(first.objective):
        return None
    return first


def label_jobs(jobs: List[Job]) -> List[str]:
    """Give each job the overrides not shared by all jobs; returns the shared ones."""
    shared = set.intersection(*(set(j.overrides) for j in jobs)) if jobs else set()
    for job in jobs:
        own = [_short(o) for o in job.overrides if o not in shared]
        job.label = " ".join(own) if own else "(no overrides)"  # the job's name is shown beside it
    return [o for o in jobs[0].overrides if o in shared] if jobs else []


def _short(override: str) -> str:
    """`optimizer.lr=0.0012345678` -> `optimizer.lr=0.001235`: sampled values stay readable."""
    key, sep, value = override.partition("=")
    try:
        number = float(value)
    except ValueError:
        return override
    if len(value) > 8 and not math.isnan(number):
        return f"{key}{sep}{number:.4g}"
    return override


# --- drawing --------------------------------------------------------------------------


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _panels(objective: str) -> List[str]:
    """Metric families to draw: loss, accuracy, and the objective's if it is another."""
    base = objective.split("/", 1)[1] if objective.startswith("eval/") else objective
    return ["loss", "accuracy"] + ([base] if base not in ("loss", "accuracy") else [])


def _series(job: Job, key: str):
    points = [(r["step"], r[key]) for r in job.metrics if key in r and _number(r[key]) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def plot_run(job: Job, path: Path) -> None:
    plt = _pyplot()
    panels = _panels(job.objective_name)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for ax, family in zip(axes[0], panels):
        for key, style, name in ((family, "-", "train"), (f"eval/{family}", "--o", "eval")):
            steps, values = _series(job, key)
            if len(steps) == 1:  # a line of one point is invisible: draw the point
                style = style.replace("--o", "o").replace("-", "o")
            if steps:
                ax.plot(steps, values, style, label=f"{name} {family}", markersize=4, linewidth=2)
                ax.annotate(
                    f"{values[-1]:.4g}", (steps[-1], values[-1]), textcoords="offset points", xytext=(4, 4), fontsize=9
                )
        ax.set_title(family)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend()
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="grey")
    fig.suptitle(f"{job.dir}  (step {job.step})", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


def plot_final_metric(jobs: List[Job], objective: str, lower: bool, path: Path) -> None:
    """Horizontal bars, best on top and green: the one picture to pick the best job from."""
    plt = _pyplot()
    best = best_of(jobs)
    fig, ax = plt.subplots(figsize=(10, 1.6 + 0.45 * len(jobs)))
    names = [f"job {j.name}: {j.label}" for j in jobs]
    values = [j.objective if j.objective is not None and not math.isnan(j.objective) else 0.0 for j in jobs]
    colors = [BEST_COLOUR if j is best else ("tab:blue" if j.finished else "lightgrey") for j in jobs]
    positions = list(range(len(jobs)))[::-1]  # first (best) at the top
    ax.barh(positions, values, color=colors, height=0.65)
    ax.set_yticks(positions, [_ellipsize(n, 70) for n in names], fontsize=9)
    top = max([abs(v) for v in values] + [1e-12])
    for y, job, value in zip(positions, jobs, values):
        text = "no result" if job.objective is None else _fmt(value)
        text += "   ← best" if job is best else (" " + job.unfinished_text if job.unfinished_text else "")
        ax.text(value + top * 0.01, y, text, va="center", fontsize=9, fontweight="bold" if job is best else None)
    ax.set_xlim(min(0.0, min(values) * 1.1), top * 1.3)
    ax.set_xlabel(f"final {objective} ({'lower' if lower else 'higher'} is better)")
    ax.grid(axis="x", alpha=0.3)
    verdict = f"best: job {best.name} ({_ellipsize(best.label, 60)})" if best else "no finished job"
    ax.set_title(f"Final {objective} per job — {verdict}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


def plot_curves(jobs: List[Job], objective: str, path: Path) -> None:
    """Every job's curves on shared axes: train solid, eval dashed; one colour per job."""
    plt = _pyplot()
    from matplotlib.lines import Line2D

    panels = _panels(objective)
    best = best_of(jobs)
    _colour(jobs, plt, best)
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.6), squeeze=False)
    for ax, family in zip(axes[0], panels):
        shown = []
        for job in reversed(jobs):  # the best drawn last, on top
            bold = job is best
            for key, style in ((family, "-"), (f"eval/{family}", "--")):
                steps, values = _series(job, key)
                if steps:
                    ax.plot(
                        steps,
                        values,
                        style,
                        color=job.color,
                        linewidth=3 if bold else 1.4,
                        alpha=1.0 if bold else 0.75,
                        marker="o" if style == "--" or len(steps) == 1 else None,
                        markersize=3 if len(steps) > 1 else 6,
                    )
                    shown.append(values)
        _focus(ax, shown)
        ax.set_title(family)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    handles = [
        Line2D(
            [],
            [],
            color=j.color,
            linewidth=3 if j is best else 1.5,
            label=_ellipsize(f"job {j.name}: {j.label}" + ("  (best)" if j is best else ""), 60),
        )
        for j in jobs
    ]
    handles += [
        Line2D([], [], color="black", linestyle="-", label="train"),
        Line2D([], [], color="black", linestyle="--", marker="o", markersize=3, label="eval"),
    ]
    columns = min(3, len(handles))
    fig.legend(handles=handles, loc="lower center", ncol=columns, fontsize=9, frameon=False)
    rows = math.ceil(len(handles) / columns)
    fig.suptitle(f"Curves of {len(jobs)} jobs" + (f" (best: job {best.name}, bold green)" if best else ""), fontsize=11)
    fig.tight_layout(rect=(0, min(0.6, 0.06 * rows + 0.02), 1, 1))
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


BEST_COLOUR = "tab:green"


def _colour(jobs: List[Job], plt, best: Optional[Job]) -> None:
    """The best job green (as its bar), the others distinct colours without green."""
    palette = plt.get_cmap("tab10" if len(jobs) <= 10 else "tab20")
    greens = {2} if palette.N == 10 else {4, 5}
    others = iter([palette(i) for i in range(palette.N) if i not in greens] * (len(jobs) // 8 + 1))
    for job in jobs:
        job.color = BEST_COLOUR if job is best else next(others)


def _focus(ax, series: List[list]) -> None:
    """Y limits that one early spike (a curve's first point) cannot flatten the rest with."""
    values = [v for s in series for v in s[1:] if math.isfinite(v)]
    if not values:
        return
    low, high = min(values), max(values)
    span = high - low
    # a first point far outside the rest (an early spike) is left off the scale
    values += [s[0] for s in series if s and math.isfinite(s[0]) and low - span <= s[0] <= high + span]
    low, high = min(values), max(values)
    pad = (high - low) * 0.08 or abs(high) * 0.05 or 0.05
    ax.set_ylim(low - pad, high + pad)


# --- Markdown -------------------------------------------------------------------------


def run_markdown(job: Job) -> str:
    s = job.summary or {}
    rows = [
        ("final step", _fmt(job.step, "d")),
        ("train loss", _fmt(job.value("loss"))),
        ("eval loss", _fmt(job.value("eval/loss"))),
        ("eval accuracy", _fmt(job.value("eval/accuracy"))),
        (f"objective ({job.objective_name})", _fmt(job.objective)),
        ("examples/s", _fmt(s.get("examples_per_sec"), ",.0f")),
        ("wall time", _duration(s.get("wall_time_sec"))),
        (
            "strategy",
            f"{s.get('strategy', '—')} ({s.get('replicas', '?')} replica(s), {s.get('workers', '?')} worker(s))",
        ),
        ("global batch", _fmt(s.get("global_batch"), "d")),
        ("resumed", str(s.get("resumed", "—"))),
    ]
    lines = [f"# tfdistx report: `{job.dir}`", ""]
    if job.overrides:
        lines += ["Overrides: " + " ".join(f"`{o}`" for o in job.overrides), ""]
    if not job.finished:
        if job.failure:
            lines += [f"**Failed:** {job.failure}; the error is at the end of tfdistx.log (and logs/).", ""]
        else:
            lines += ["**Unfinished:** no summary.json (the run was stopped, or is still running).", ""]
    lines += ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    lines += ["", "![loss and accuracy curves](curves.png)", ""]
    return "\n".join(lines)


def sweep_markdown(root: Path, jobs: List[Job], shared: List[str], objective: str, lower: bool) -> str:
    best = best_of(jobs)
    direction = "lower" if lower else "higher"
    lines = [f"# tfdistx report: `{root}`", ""]
    lines += [f"{len(jobs)} jobs, ranked by final `{objective}` ({direction} is better)."]
    if shared:
        lines += ["", "Common to all jobs: " + " ".join(f"`{o}`" for o in shared)]
    lines += [""]
    if best is not None:
        tied = [j.name for j in jobs[1:] if j.finished and j.objective == best.objective]
        lines += [
            f"**Best: job {best.name}** — `{best.label}` — {objective} {_fmt(best.objective)} (run dir "
            f"`{_rel(best.dir, root)}`)" + (f", tied with job {', '.join(tied)}" if tied else "")
        ]
    else:
        lines += ["**No job has finished with a result for the objective.**"]
    lines += ["", "![final metric per job](final_metric.png)", "", "![curves of all jobs](curves.png)", ""]
    extra = objective not in ("eval/accuracy",)
    header = (
        ["rank", "job", "overrides", "final step", "final train loss", "eval accuracy"]
        + ([objective] if extra else [])
        + ["examples/s", "wall time"]
    )
    lines += [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---:" if h not in ("job", "overrides") else "---" for h in header) + "|",
    ]
    for rank, job in enumerate(jobs, 1):
        s = job.summary or {}
        cells = [
            str(rank),
            f"{job.name}" + job.unfinished_text,
            f"`{job.label}`".replace("|", "\\|"),
            _fmt(job.step, "d"),
            _fmt(job.value("loss")),
            _fmt(job.value("eval/accuracy")),
        ]
        cells += [_fmt(job.objective)] if extra else []
        cells += [_fmt(s.get("examples_per_sec"), ",.0f"), _duration(s.get("wall_time_sec"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# --- the command -------------------------------------------------------------------------


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tfdistx report",
        description="Plots (PNG) and a Markdown table for a run directory or a sweep (multirun) directory.",
    )
    parser.add_argument("path", help="a run dir (outputs/DATE/TIME) or a sweep dir (multirun/DATE/TIME)")
    parser.add_argument("--out", help="where to write the report (default: into PATH)")
    parser.add_argument(
        "--objective", help="metric to rank jobs by (default: the runs' trainer.objective, e.g. eval/accuracy)"
    )
    parser.add_argument(
        "--lower-is-better",
        action="store_true",
        default=None,
        help="rank ascending (default: ascending for losses and errors, else descending)",
    )
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        for path in report(Path(args.path), Path(args.out) if args.out else None, args.objective, args.lower_is_better):
            print(path)
    except ReportError as error:
        print(f"tfdistx report: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


def report(
    root: Path, out: Optional[Path] = None, objective: Optional[str] = None, lower: Optional[bool] = None
) -> List[Path]:
    """Write the report for a run or sweep dir; returns the files written."""
    if not root.exists():
        raise ReportError(f"no such directory: {root}")
    if not root.is_dir():
        raise ReportError(f"not a directory: {root} (give a run or sweep directory)")
    runs = find_runs(root)
    jobs = [load_job(d, root, objective) for d in runs]
    jobs = [j for j in jobs if j.metrics or j.summary or j.failure]
    if not jobs:
        raise ReportError(f"no runs in {root}: no readable metrics.jsonl or summary.json in it or its subdirectories")
    out = out or root
    try:
        out.mkdir(parents=True, exist_ok=True)
        if not os.access(out, os.W_OK):
            raise PermissionError(f"{out} is not writable")
    except OSError as error:
        raise ReportError(f"cannot write the report into {out}: {error}") from None

    if objective is not None and all(job.value(objective) is None for job in jobs):
        reported = sorted({key for job in jobs for key in job.reported()})
        raise ReportError(
            f"--objective {objective!r}: no run here reports it; "
            + (f"they report: {', '.join(reported)}" if reported else "they report no metric yet")
        )
    objective = objective or jobs[0].objective_name
    lower = lower_is_better(objective) if lower is None else lower
    one_run = runs == [root]
    names = RUN_FILES if one_run else SWEEP_FILES
    theirs = not_ours(out, names)
    if theirs:  # a report.md of the user's own (or one of ours they have edited since) is theirs: never replaced
        raise ReportError(
            f"{out} holds {', '.join(theirs)}, which tfdistx report did not write (or which changed since): "
            "move them, or write the report elsewhere with --out DIR (nothing was written)"
        )
    pictures = {}
    if one_run:
        job = jobs[0]
        pictures["curves.png"] = _drawn(plot_run, job)
        text = run_markdown(job)
    else:
        for job in jobs:
            job.objective_name = objective
        shared = label_jobs(jobs)
        jobs = ranked(jobs, lower)
        pictures["final_metric.png"] = _drawn(plot_final_metric, jobs, objective, lower)
        pictures["curves.png"] = _drawn(plot_curves, jobs, objective)
        text = sweep_markdown(root, jobs, shared, objective, lower)
    try:
        return replace_ours(out, {**pictures, "report.md": text})
    except OSError as error:
        raise ReportError(f"cannot write the report into {out}: {error}") from None


# What a report writes: a run's, a sweep's. Into a directory it did not make, it replaces only what it wrote there
# before, unchanged since (rundir.replace_ours): `report` run again on the same directory brings its report up to date.
RUN_FILES = ("curves.png", "report.md")
SWEEP_FILES = ("final_metric.png", "curves.png", "report.md")


def _drawn(plot, *args) -> bytes:
    """A plot's PNG, drawn in memory: written beside the others only once all are drawn."""
    into = io.BytesIO()
    plot(*args, into)
    return into.getvalue()


# --- small helpers ---------------------------------------------------------------------


def _number(value) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _fmt(value, spec: str = ".4f") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return format(int(value) if spec in ("d", ",d") else value, spec)


def _duration(seconds) -> str:
    if seconds is None:
        return "—"
    seconds = float(seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def _ellipsize(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _natural(text: str):
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root)) + "/"
    except ValueError:
        return str(path)
