"""An elastic run's rounds, each said in one line and kept in the rounds
file (logs/rounds.json, which summary.json gets as `rounds`).

Where a round starts is read from the run's files, not asked of training:
the newest checkpoint's step (from its file names) for a round that
resumes, the last step in metrics.jsonl for one a parameter-server
coordinator goes on with. No TensorFlow here.
"""

import json
from pathlib import Path
from typing import Callable, Dict, List

from tfdistx.checkpoint_files import newest_step  # file names only: no TensorFlow
from tfdistx.rundir import keep_aside
from tfdistx.whole_files import write_whole


class Rounds:
    def __init__(self, path: str, checkpoint_dir: str, metrics_file: str, say: Callable[[str], None]):
        self.path, self.checkpoint_dir, self.metrics_file, self.say = (
            Path(path),
            checkpoint_dir,
            Path(metrics_file),
            say,
        )
        self.kept: List[dict] = self._read()  # a rerun goes on counting

    def _read(self) -> List[dict]:
        """The rounds a run in this directory had; a file that cannot be read is kept aside, never written over."""
        if not self.path.is_file():
            return []
        try:
            kept = json.loads(self.path.read_text())
            if isinstance(kept, list) and all(isinstance(r, dict) and isinstance(r.get("members"), dict) for r in kept):
                return kept
        except (OSError, ValueError):
            pass
        self.say(f"{self.path} cannot be read: kept as {keep_aside(self.path)}; counting rounds from 1")
        return []

    def start(self, members: Dict[str, str], reason: str, resumed: bool = True) -> None:
        """A round of `members` (task -> host), formed for `reason`: it resumes
        from the newest checkpoint, or (not `resumed`) training goes on."""
        step = newest_checkpoint_step(self.checkpoint_dir) if resumed else last_logged_step(self.metrics_file)
        workers = sum(task.startswith("worker:") for task in members)
        before = sum(task.startswith("worker:") for task in self.kept[-1]["members"]) if self.kept else None
        number = len(self.kept) + 1
        self.kept.append({"round": number, "members": dict(members), "first_step": step + 1, "reason": reason})
        write_whole(self.path, json.dumps(self.kept, indent=1))  # whole or not at all
        size = f"{before} -> {workers}" if before is not None else f"{workers}"
        if not resumed:
            start = f"going on after step {step} (the coordinator gives the steps to the workers it has)"
        else:
            start = f"resuming from step {step}" if step else "from step 0"
        self.say(f"round {number}: {size} workers ({reason}), {start}")


def newest_checkpoint_step(checkpoint_dir: str) -> int:
    return newest_step(checkpoint_dir) or 0


def last_logged_step(metrics_file: Path) -> int:
    """The last step metrics.jsonl holds (0: none yet); a line cut short by a crash is skipped."""
    lines = metrics_file.read_text().splitlines() if metrics_file.is_file() else []
    for line in reversed(lines):
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            continue
    return 0
