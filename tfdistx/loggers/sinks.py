"""The loggers that keep a run's metrics: metrics.jsonl, metrics.csv and
TensorBoard (W&B's is wandb_logger.py, MLflow's mlflow_logger.py, the
terminal's progress.py). Each is a callable `(step, metrics)` with a
`close()`; engine/loggers.py opens the ones a run asks for, each by its
maker (a `for_run` where the class takes a path of the run dir)."""

import csv
import json
import logging
import os
from pathlib import Path

from tfdistx.loggers import BuiltInLogger
from tfdistx.whole_files import append_whole, keep_steps_up_to, replacing

log = logging.getLogger(__name__)


class JsonlLogger:
    """metrics.jsonl: one JSON object per log step, each line written whole
    (append_whole: a full disk or a file-size limit leaves no half line).

    On resume, lines past the restored step are dropped first (they were
    logged after the last checkpoint and will be trained and logged again),
    so the file never holds a step twice.
    """

    def __init__(self, path: str, resume_step: int = 0):
        self.path = Path(path)
        if self.path.exists():
            keep_steps_up_to(self.path, resume_step)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def __call__(self, step: int, metrics: dict) -> None:
        append_whole(self.fd, (json.dumps({"step": step, **metrics}) + "\n").encode())

    def close(self) -> None:
        os.close(self.fd)


class CsvLogger(BuiltInLogger):
    """logger.csv: metrics.csv: a row per log step, a column per metric (`step` first),
    for a spreadsheet. A metric first seen after the first row (the eval
    metrics, at the first evaluation) adds a column: the file is rewritten
    once, whole, with the rows so far empty in it. On resume, rows past the
    restored step are dropped first, as metrics.jsonl's lines are."""

    name, files = "csv", ("metrics.csv",)

    def __init__(self, path: Path, resume_step: int = 0):
        self.path = path
        self.columns = ["step"]
        if path.exists():
            columns, rows = self._read()
            self.columns = columns or self.columns
            self._rewrite(
                [row for row in rows if _int_or_none(row.get("step")) is not None and int(row["step"]) <= resume_step]
            )

    @classmethod
    def for_run(cls, run_dir: Path, start_step: int = 0) -> "CsvLogger":
        """logger.csv: the run dir's metrics.csv."""
        return cls(Path(run_dir) / "metrics.csv", resume_step=start_step)

    @classmethod
    def shown(cls, keys) -> str:
        return "metrics.csv"

    def __call__(self, step: int, metrics: dict) -> None:
        row = {"step": step, **metrics}
        new = [key for key in row if key not in self.columns]
        if new:
            rows = self._read()[1] if self.path.exists() else []
            self.columns += new
            self._rewrite(rows + [row])
            return
        with open(self.path, "a", newline="") as file:
            csv.DictWriter(file, self.columns).writerow(row)

    def _read(self):
        with open(self.path, newline="") as file:
            reader = csv.DictReader(file)
            return list(reader.fieldnames or []), list(reader)

    def _rewrite(self, rows) -> None:
        """Written whole, then moved into place: a reader never sees half of it."""
        with replacing(self.path, newline="") as file:
            writer = csv.DictWriter(file, self.columns, restval="")
            writer.writeheader()
            writer.writerows(rows)


def _int_or_none(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


class TensorBoardLogger(BuiltInLogger):
    """logger.tensorboard (on unless turned off): event files TensorBoard reads."""

    name, on = "tensorboard", True

    def __init__(self, logdir: str):
        import tensorflow as tf

        self.tf = tf
        self.writer = tf.summary.create_file_writer(logdir)

    @classmethod
    def for_run(cls, run_dir: Path) -> "TensorBoardLogger":
        """logger.tensorboard: event files in the run dir's tensorboard/."""
        return cls(str(Path(run_dir) / "tensorboard"))

    def __call__(self, step: int, metrics: dict) -> None:
        with self.writer.as_default(step=step):
            for key, value in metrics.items():
                name = key if "/" in key else f"train/{key}"
                self.tf.summary.scalar(name, value)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
