"""A run's small files, each written whole or not at all: summary.json,
metrics.csv, topology.json, mlflow.json, the rounds file, metrics.jsonl's
lines. A reader (a user's `cat`, a resumed run, a dashboard) never sees half
of one, and a write that fails (a full disk, a file-size limit, a kill)
leaves the file as it was.

No TensorFlow and no Hydra here: the commands, config/ and cluster/ write
through it before TensorFlow starts.
"""

import contextlib
import json
import os
import secrets
from pathlib import Path
from typing import IO, Iterator, List, Optional, Tuple, Union

PathLike = Union[str, os.PathLike]


@contextlib.contextmanager
def replacing(
    path: PathLike, *, newline: Optional[str] = None, fsync: bool = False, binary: bool = False
) -> Iterator[IO]:
    """A text file to write `path`'s new contents into: a temporary file
    beside it (the same directory, so the rename is atomic; a name of its
    own, `.NAME.tmp-XXXXXXXX`, so nothing of anyone else's is written over),
    moved over `path` with os.replace once the block ends without an error.
    An error leaves `path` as it was and the temporary file removed.

    `fsync`: the contents (and then the directory's entry) reach the disk
    before the call returns, so that a machine that loses power keeps the old
    file or the new one. The file's mode is what `open(path, "w")` would give
    (0o666 less the umask), as is its encoding (the locale's). `binary`: a
    file of bytes (a picture), not text."""
    path = Path(path)
    tmp = _new_file_beside(path)
    try:
        with open(tmp, "wb") if binary else open(tmp, "w", newline=newline) as file:
            yield file
            if fsync:
                file.flush()
                os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if fsync:
        _fsync_directory(path.parent)


def write_whole(path: PathLike, text: Union[str, bytes], *, fsync: bool = False) -> None:
    """`path` holds `text` (or bytes), written whole or not at all (`replacing`)."""
    with replacing(path, fsync=fsync, binary=isinstance(text, bytes)) as file:
        file.write(text)


def write_json(path: PathLike, payload) -> None:
    """Written whole or not at all (a reader never sees half a file)."""
    write_whole(path, json.dumps(payload, indent=2, default=float) + "\n")


def append_jsonl(path: PathLike, record: dict) -> None:
    """One line more, whole or not at all (append_whole)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        append_whole(fd, (json.dumps(record, default=float) + "\n").encode())
    finally:
        os.close(fd)


def append_whole(fd: int, line: bytes) -> None:
    """`line` appended to the file open at `fd` (O_APPEND). A write that
    fails (a full disk, a file-size limit) leaves the file as it was: a line
    cut short would join the next one appended, and both be lost."""
    size = os.fstat(fd).st_size
    try:
        while line:
            line = line[os.write(fd, line) :]
    except OSError:
        os.ftruncate(fd, size)
        raise


def read_jsonl(path: Path) -> List[Tuple[str, dict]]:
    """A JSON-lines file's (line, record) pairs, in order; a line cut short by
    a kill (or not an object) is left out. [] when there is no file."""
    return jsonl_records(path)[0]


def jsonl_records(path: Path) -> Tuple[List[Tuple[str, dict]], int]:
    """read_jsonl's pairs, and how many lines were left out (cut short, or not an object): a reader that
    says so counts them. A file that is not text (bytes that are not UTF-8) is read with those replaced."""
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return [], 0
    pairs, left_out = [], 0
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            left_out += 1
            continue
        if isinstance(record, dict):
            pairs.append((line, record))
        else:
            left_out += 1
    return pairs, left_out


def keep_steps_up_to(path: Path, step: int) -> None:
    """Keep the lines of a JSON-lines file whose step is at most `step` (what
    a resumed run trains again is logged again); the file replaced whole."""
    kept = []
    for line, record in read_jsonl(path):  # without the lines cut short by a crash
        try:
            if record["step"] <= step:
                kept.append(line)
        except (KeyError, TypeError):
            continue
    write_whole(path, "".join(line + "\n" for line in kept))


def _new_file_beside(path: Path) -> str:
    """A new, empty file of its own in `path`'s directory."""
    while True:
        tmp = os.path.join(path.parent, f".{path.name}.tmp-{secrets.token_hex(4)}")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return tmp
        except FileExistsError:
            continue


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
