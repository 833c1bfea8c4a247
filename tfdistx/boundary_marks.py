"""What a launched chief tells its supervisor about the last loop boundary
it keeps in memory (engine/commit.py), by empty files in the task's scratch
directory (checkpoint_files.SCRATCH_ENV), which both know and which the
supervisor removes as the task ends.

- HOLDS: the chief holds a loop boundary's state. When a peer of its
  synchronous cluster is lost, its call fails (a peer whose process is
  gone: at once, its connections closed) and it saves that state before it
  leaves, so that the loss costs at most one loop: its supervisor gives it
  the time (cluster/supervisor.py) instead of stopping it with the round.
- SAVING: its call has failed for a lost peer, and it is saving that state now.

Files, not a signal or a pipe: the supervisor must know before it decides
what to stop, whatever the chief is doing then (inside a TensorFlow call
that holds the interpreter, say), and a file is there to look at without
asking the process. Without a scratch directory (a task a scheduler
placed, with no supervisor above it) nothing is marked.

No TensorFlow here: the supervisor reads them.
"""

import os
from pathlib import Path

from tfdistx.checkpoint_files import SCRATCH_ENV

HOLDS = "holds-the-last-loop-boundary"
SAVING = "saving-the-last-loop-boundary"


def mark(name: str) -> None:
    """This task's mark `name`, in its scratch directory, if its launcher gave it one."""
    scratch = os.environ.get(SCRATCH_ENV)
    if not scratch:
        return
    try:
        Path(scratch).mkdir(parents=True, exist_ok=True)
        (Path(scratch) / name).touch()
    except OSError:  # a full disk: the supervisor then stops it as it did before; nothing else depends on the mark
        pass


def marked(scratch: Path, name: str) -> bool:
    """Whether the task whose scratch directory is `scratch` has marked `name`."""
    return (scratch / name).exists()
