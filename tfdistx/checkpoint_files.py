"""Which checkpoints a directory holds, found by their files. No TensorFlow
here: the commands check `--step N` before TensorFlow starts
(engine/checkpointing.py, which restores and saves them, re-exports these).
"""

import os
import re
from pathlib import Path
from typing import List, Optional

from tfdistx.core.errors import ConfigError

BEST = "best"  # the best checkpoint's directory, inside the checkpoint directory
# Where a non-chief task keeps its own checkpoints (engine/checkpointing.py), when its launcher gives it a
# place: the local launcher's tasks get one inside the run (cluster/processes.py), removed as each task ends,
# so that a task the launcher killed leaves nothing behind. Without it, the system's temp directory.
SCRATCH_ENV = "TFDISTX_SCRATCH_DIR"
_NAME = re.compile(r"ckpt-(\d+)(\..*)?")  # ckpt-150, ckpt-150.index, ckpt-150.data-00000-of-00001


def step_of(path) -> Optional[int]:
    """The step a checkpoint's name says (`…/ckpt-150`, or one of its files,
    `ckpt-150.index`); None for a name that is not a checkpoint's. The one
    place a step is read from a file name."""
    match = _NAME.fullmatch(os.path.basename(str(path)))
    return int(match.group(1)) if match else None


def newest_step(directory) -> Optional[int]:
    """The step of the newest checkpoint in `directory`; None when it holds none (or is not there)."""
    paths = on_disk(str(directory))
    return step_of(paths[-1]) if paths else None


def on_disk(directory: str) -> List[str]:
    """The checkpoints in `directory`, oldest first, found by their files.

    Not from CheckpointManager's `checkpoint` state file: a state file that
    is damaged, or names a checkpoint that is gone, must not hide the intact
    checkpoints beside it (they would be trained over from scratch).
    """
    steps = [step_of(index) for index in Path(directory).glob("ckpt-*.index")]
    return [os.path.join(directory, f"ckpt-{step}") for step in sorted(s for s in steps if s is not None)]


def find(directory: str, step: Optional[int] = None, prefer_best: bool = False) -> str:
    """The newest checkpoint in `directory` (`prefer_best`: the one in best/,
    when there is one, as a keep_best run exports), or the one saved at
    `step` (the user's `--step`, which may also name the one in best/);
    ConfigError when there is none."""
    paths = on_disk(directory)
    best = on_disk(
        os.path.join(directory, BEST)
    )  # the best checkpoint (keep_best), which max_to_keep may have rotated out of paths
    if step is None and prefer_best and best:
        return best[-1]
    if step is None and paths:
        return paths[-1]
    found = next((p for p in paths + best if step_of(p) == step), None)
    if found is None:
        kept = ", ".join(str(step_of(p)) for p in paths) or "none"
        kept += f"; the best: {step_of(best[-1])}" if best else ""
        raise ConfigError.for_key(
            "--step" if step is not None else "checkpoint.dir",
            step if step is not None else directory,
            f"no such checkpoint in {directory} (steps kept: {kept})",
        )
    return found
