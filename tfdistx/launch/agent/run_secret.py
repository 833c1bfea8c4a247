"""The run's secret, which every beat to the agents' rendezvous proves
(launch/agent/keeper_wire.py) so that only the run's own agents are placed in
its rounds: an agent placed in a round receives the model's variables and
adds its numbers into everyone's gradients.

Where it comes from, on every node alike:
- `cluster.agent.token_file`, a file the scheduler gives every node (the
  JobSet that `tfdistx job jobset` writes mounts it from the Kubernetes
  Secret the export writes beside it; `job slurm`'s script makes one per
  job in the shared run directory and names it);
- else RUN_DIR/logs/rendezvous.key, made by the first agent that finds none
  (mode 0600: readable by the run's own user only) and read by the others.
  It is written whole into a file of its own and then linked into place,
  which fails if another agent linked its own first (atomic on a local file
  system and on NFS alike): every agent reads the one that won.

No TensorFlow here.
"""

import os
import secrets
from pathlib import Path
from typing import Optional

from tfdistx.rundir import RUN_SECRET
from tfdistx.core.errors import ConfigError

SECRET_FILE = RUN_SECRET  # in the run directory, when cluster.agent.token_file is not given
SECRET_BYTES = 32  # made: 256 random bits, written in hex
MIN_CHARACTERS = 16  # given: at least this many characters (bytes) of secret
ALLOWED = (
    f"a file holding the run's secret, the same on every node: at least {MIN_CHARACTERS} characters "
    f"(e.g. `python -c 'import secrets; print(secrets.token_hex({SECRET_BYTES}))' > FILE; chmod 600 FILE`); "
    f"or null: {SECRET_FILE} in the run directory, made by the first agent"
)


def of_run(run_dir: str, token_file: Optional[str]) -> bytes:
    """The run's secret: `token_file`'s, or the run directory's (made if there is none yet)."""
    if token_file is not None:
        return _read(Path(token_file), "cluster.agent.token_file", token_file)
    path = Path(run_dir) / SECRET_FILE
    if not path.exists():
        _make(path)
    return _read(path, "cluster.agent.token_file", None)


def _make(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    made = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(made, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, (secrets.token_hex(SECRET_BYTES) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(made, path)
    except FileExistsError:
        pass  # another agent's was first: it is the run's
    finally:
        os.unlink(made)


def _read(path: Path, key: str, value) -> bytes:
    try:
        secret = path.read_bytes().strip()
    except OSError as error:
        raise ConfigError.for_key(key, value, f"{path}: cannot be read ({error.strerror}): {ALLOWED}") from None
    if len(secret) < MIN_CHARACTERS:
        raise ConfigError.for_key(key, value, f"{path} holds {len(secret)} character(s): {ALLOWED}")
    return secret
