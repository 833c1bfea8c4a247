"""One run per run directory, enforced with a lock.

Two runs writing one directory mix their checkpoints and overrides and lose
metrics; it happens by accident when two runs start in the same second. The
process that owns a run directory (a single run, a local cluster's launcher,
or the chief of a scheduler's cluster) holds an exclusive `flock` on
RUN_DIR/.lock for the whole run. The kernel releases it on every exit,
SIGKILL included, so a crashed run never leaves a stale lock; the file
keeps the holder's pid, host and command for the refusal message. No
TensorFlow here.
"""

import contextlib
import dataclasses
import errno
import fcntl
import fnmatch
import glob
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Union

import yaml  # PyYAML (no TensorFlow, no Hydra): a run's .hydra/hydra.yaml

from tfdistx.core import datafiles
from tfdistx.whole_files import write_whole
from tfdistx.core.errors import (
    EXIT_INTERRUPTED,
    EXIT_INVALID_CONFIG,
    EXIT_NOT_RETRYABLE,
    EXIT_PREEMPTED,
    EXIT_RUN_DIR_LOCKED,
    ConfigError,
    Problem,
    RunFault,
)

LOCK_NAME = ".lock"
FAILED_NAME = "FAILED"  # in a run dir whose run failed; read by `tfdistx report`
LOG_NAME = "tfdistx.log"  # the run's log (Hydra's file handler: hydra.job.name)


@contextlib.contextmanager
def exclusive(run_dir: str):
    """Hold RUN_DIR's lock while inside; a RunFault (exit 7) if another run holds it."""
    path = Path(run_dir) / LOCK_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 4096).decode(errors="replace").strip() or "unknown"
            raise RunFault(
                f"hydra.run.dir={str(run_dir)!r}: another run is using this directory ({_describe(holder)}): "
                f"wait for it to end, or pick another hydra.run.dir (exit {EXIT_RUN_DIR_LOCKED})",
                EXIT_RUN_DIR_LOCKED,
            ) from None
        os.ftruncate(fd, 0)
        os.write(
            fd,
            json.dumps(
                {
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                    "command": " ".join(sys.argv),
                }
            ).encode(),
        )
        yield
    finally:
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def owned(run_dir: str):
    """The run directory's lock, held for one attempt of the run (`Attempt`)."""
    # Nothing of a run there yet (Hydra writes .hydra/ first for a sweep's job; a failed attempt left FAILED).
    new = not Path(run_dir).exists() or all(
        p.name in _STUB | {FAILED_NAME} or _prepared_logs(p) for p in Path(run_dir).iterdir()
    )
    with exclusive(run_dir):
        attempt = Attempt.begin(run_dir, new=new)
        try:
            yield
        except SystemExit as exit:
            attempt.end(exit.code)
            raise
        except KeyboardInterrupt:  # Ctrl-C: the user stopped it, as a shell says it
            attempt.end(EXIT_INTERRUPTED)
            raise
        except BaseException:
            attempt.end(1)
            raise


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One attempt of a run, by the process that owns its run dir while it
    holds the lock: a single run or a local cluster's launcher (`owned`), or
    under agents the node that keeps the rounds. If the attempt is refused
    as a bad config (exit 2: a checkpoint of another model, say), the
    .hydra/ files it replaced are put back, so the run that is there keeps
    its own config; a new run that failed is marked so (`_leave_no_stub`)."""

    run_dir: Path
    new: bool  # no run was there before this attempt
    config_before: dict  # RUN/.hydra/*.yaml as they were: path -> bytes

    @classmethod
    def begin(cls, run_dir, new: Optional[bool] = None, record: Optional[dict] = None) -> "Attempt":
        """`record`: RUN/.hydra/NAME -> text, written here (what Hydra's run_job
        writes there) by an owner known only once its run's other nodes have
        started: under agents, every node starts Hydra in the one run dir, and
        Hydra on each would rewrite the files in place, in any order with the
        owner's reading of them. `new`: by default, whether no config was recorded there."""
        run_dir = Path(run_dir)
        (run_dir / FAILED_NAME).unlink(missing_ok=True)  # this attempt decides
        hydra_dir = run_dir / ".hydra"
        before = {p: p.read_bytes() for p in hydra_dir.glob("*.yaml")} if hydra_dir.is_dir() else {}
        if record:
            hydra_dir.mkdir(parents=True, exist_ok=True)
            for name, text in record.items():
                write_whole(hydra_dir / name, text)
        return cls(run_dir, not before if new is None else new, before)

    def end(self, code) -> None:
        """The attempt ended with exit code `code` (0 or None: it did not fail)."""
        if code == EXIT_INVALID_CONFIG:
            for path, content in self.config_before.items():
                path.write_bytes(content)
        if code not in (0, None):
            _leave_no_stub(self.run_dir, self.new, code)


def mark_as_a_runs(run_dir) -> None:
    """RUN/.lock made, not taken: the mark of a tfdistx run dir
    (`in_the_way`), for a run whose owner is known only later (an agent's
    node, once it knows it keeps the rounds) while the other nodes already
    write their logs there."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    os.close(os.open(Path(run_dir) / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644))


# What a run that failed before training wrote anything leaves: nothing worth keeping.
_STUB = {".hydra", LOG_NAME, LOCK_NAME}

# What a run (and `tfdistx evaluate`, `export`, `predict` of it) writes in its directory. Not tfdistx.log:
# Hydra appends to it, and every task of a run opens it first thing, before the owner takes the lock.
RUN_WRITES = (
    ".hydra",
    "metrics.jsonl",
    "summary.json",
    "checkpoints",
    "export",
    "tensorboard",
    "evaluations.jsonl",
    "logs",
    "preprocessing",
    FAILED_NAME,
)
RUN_WRITES_PREFIXES = ("predictions", "export-step-")
# What a scheduler's script (`tfdistx job slurm`'s) makes in the run dir's logs/ before the run starts: the
# agents' secret (launch/agent/run_secret.py) and the tasks' exit codes (commands/ending.py). A logs/ of these alone
# is the run's own, not in its way.
RUN_SECRET = "logs/rendezvous.key"
EXIT_CODES = "logs/exit-codes"
_PREPARED_LOGS = {Path(RUN_SECRET).name, Path(EXIT_CODES).name}
JOB_NAME = "tfdistx"  # hydra.job.name (conf/config.yaml), which Hydra records in .hydra/hydra.yaml


def in_the_way(run_dir: str, checkpoint_dir=None, also=()) -> list:
    """What a run would write over in `run_dir`, a directory tfdistx did not
    make: the names there that a run writes (and `checkpoint_dir`'s, when it
    lies inside; and `also`, the patterns (fnmatch's, as written_names makes
    them) of what its loggers and callbacks write). [] for a new directory,
    a tfdistx run dir (resumed), or one of unrelated files (a project's code
    and notes)."""
    run = Path(run_dir)
    if not run.is_dir() or (run / LOCK_NAME).exists():
        return []
    job = _hydra_job(run)
    if job == JOB_NAME:
        return []
    names = set(RUN_WRITES)
    if checkpoint_dir and run.resolve() in Path(checkpoint_dir).resolve().parents:
        names.add(Path(checkpoint_dir).resolve().relative_to(run.resolve()).parts[0])
    if (
        job is None
    ):  # no other Hydra app's: a task of this run writing its .hydra/ this moment (hydra.yaml comes second)
        names.discard(".hydra")
    return sorted(
        f"{p.name}/" if p.is_dir() else p.name
        for p in run.iterdir()
        if (p.name in names and not _prepared_logs(p))
        or p.name.startswith(RUN_WRITES_PREFIXES)
        or any(fnmatch.fnmatchcase(p.name, pattern) for pattern in also)
    )


def _prepared_logs(path: Path) -> bool:
    """A logs/ holding only what a scheduler's script made there for this run (_PREPARED_LOGS)."""
    return path.name == "logs" and path.is_dir() and {p.name for p in path.iterdir()} <= _PREPARED_LOGS


def why_not_in_run_dir(path, run_dir: Optional[str] = None, example: str = "keras_log.csv") -> Optional[str]:
    """Why `path`, which a callback is told to write (relative: to the run
    dir; absolute: inside it), is not one of the run dir's own to write, or
    None: a path that leaves the run dir (`../mine.csv`, `/tmp/x.csv`, a
    link that leads out), where a file of the user's may be, or one of the
    run's own files, which it would replace. `example`: a name to offer
    instead (a file's, or a directory's)."""
    allowed = f"a path inside the run dir, e.g. {example}"
    if not isinstance(path, str) or not path.strip():
        return f"must be {allowed}"
    relative = inside(path, run_dir) if os.path.isabs(path) and run_dir is not None else path
    if relative is None or os.path.isabs(relative) or os.path.normpath(relative).split(os.sep)[0] == os.pardir:
        return f"would be written outside the run dir, where tfdistx does not write: name {allowed}"
    first = Path(os.path.normpath(relative)).parts[0] if os.path.normpath(relative) != os.curdir else os.curdir
    if (
        first in RUN_WRITES
        or first.startswith(RUN_WRITES_PREFIXES)
        or first in (LOCK_NAME, LOG_NAME, WRITTEN_NAME, os.curdir)
    ):
        return (
            f"is the run's own {'directory' if first == os.curdir else first}, which this would replace: name {allowed}"
        )
    if run_dir is not None:
        run = Path(run_dir).resolve()
        if run not in (run / relative).resolve().parents:
            return f"leads outside the run dir (to {(run / relative).resolve()}): name {allowed}"
    return None


def inside(path: str, run_dir: str) -> Optional[str]:
    """`path` (absolute) relative to the run dir when it lies inside it, else None."""
    run, target = os.path.abspath(run_dir), os.path.abspath(path)
    return os.path.relpath(target, run) if os.path.commonpath([run, target]) == run and target != run else None


def written_names(paths) -> List[str]:
    """The patterns (fnmatch's, as `in_the_way` takes them) of the first
    names, in a run dir, of the relative `paths` its loggers and callbacks
    write: a name a callback fills in as it writes (ModelCheckpoint's
    `best-{epoch:02d}.keras`) stands for every name it can take
    (`best-*.keras`)."""
    names = []
    for path in paths:
        if isinstance(path, str) and path and not os.path.isabs(path):
            first = Path(os.path.normpath(path)).parts[0]
            names.append("*".join(glob.escape(part) for part in re.split(r"\{[^{}]*\}", first)))
    return names


def _hydra_job(run: Path):
    """The job name a Hydra app recorded in RUN/.hydra/hydra.yaml, or None
    (none there, or not yet whole). With RUN/.lock, which the process that
    owns a run takes before it writes anything (`exclusive`), the mark of
    a tfdistx run dir: another task of the run may get there first.

    Every node's agent of a run starts Hydra in the one run dir, and Hydra
    rewrites .hydra/hydra.yaml in place (truncated, then written): a file
    there that is not whole is read again until it is, for up to
    HYDRA_FILE_WAIT seconds, or a node that read it at that moment would
    take its own run dir for a stranger's."""
    path = run / ".hydra" / "hydra.yaml"
    deadline = time.monotonic() + HYDRA_FILE_WAIT
    while True:
        try:
            return yaml.safe_load(path.read_text())["hydra"]["job"]["name"]
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError, yaml.YAMLError, KeyError, TypeError):
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)


HYDRA_FILE_WAIT = 2.0  # Hydra writes the few kilobytes of hydra.yaml in milliseconds


def _leave_no_stub(run_dir: Path, created: bool, code) -> None:
    """A failed run is not left looking like a run: a directory it created
    and wrote nothing of its own into is removed (the error was on the
    terminal); one with more in it (a cluster's task logs, checkpoints)
    gets a FAILED file with the exit code, which `tfdistx report` shows.
    A preempted run (exit 42) did not fail: it saved, and the same command
    resumes it, so it gets no FAILED file (the report says unfinished); nor
    does one stopped by Ctrl-C (130), which saved too once it trained.
    A run dir that was there before is left as it was."""
    if not created:  # a run that was there before keeps its own state
        return
    if {p.name for p in run_dir.iterdir()} <= _STUB:
        shutil.rmtree(run_dir, ignore_errors=True)
    elif code not in (EXIT_PREEMPTED, EXIT_INTERRUPTED) and not (run_dir / "summary.json").exists():
        (run_dir / FAILED_NAME).write_text(f"exit code {code}\n")


def set_aside_previous_run(run_dir: str, checkpoint_dir: str) -> list:
    """A run directory whose run is not continued (`checkpoint.restore=false`,
    or no checkpoint there can be read): its checkpoints, metrics, summary
    and export are renamed *.replaced-STAMP, kept, instead of being
    truncated or mixed with the new run's. Returns what was moved."""
    run = Path(run_dir)
    moved = []
    for path in [Path(checkpoint_dir), run / "metrics.jsonl", run / "summary.json", run / "export"]:
        if path.exists() and (path.is_file() or any(path.iterdir())):
            moved.append(keep_aside(path))
    return moved


def keep_aside(path: Path, keep_suffix: bool = True) -> str:
    """Rename `path` to NAME.replaced-STAMP[.SUFFIX] beside it, never over
    another: the one way tfdistx makes room for what it writes.
    `keep_suffix=False`: NAME.SUFFIX.replaced-STAMP, where a kept file must
    not look like a live one (a recipe directory reads every *.yaml)."""
    path = Path(path)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    stem, suffix = (path.stem, path.suffix) if keep_suffix else (path.name, "")
    for n in range(1000):
        target = path.with_name(f"{stem}.replaced-{stamp}{f'-{n}' if n else ''}{suffix}")
        if not os.path.lexists(target):
            path.rename(target)
            return str(target)
    raise FileExistsError(f"{path}: too many kept copies named {stem}.replaced-{stamp}*")


def _output_problems(key: str, directory: str, protected, made_by) -> list:
    """Whether a command may write a whole directory at `directory`: a new
    path, an empty directory, or one the same command wrote before (it
    holds the file `made_by[0]`), which is then kept aside (keep_aside).
    Anything else there is refused (nothing is changed), and so is a
    directory in `protected` (a run dir, its checkpoints) or one that
    holds one of them."""
    target = Path(directory).resolve()
    for kept in map(lambda p: Path(p).resolve(), protected):
        if target == kept or target in kept.parents:
            return [
                Problem(key, str(directory), f"would replace {kept}, which holds the run's files: name a new directory")
            ]
    if not target.exists() or (target.is_dir() and not any(target.iterdir())):
        return []
    if target.is_dir() and (target / made_by[0]).is_file():
        return []  # an earlier one of ours: kept aside when the new one is in place
    return [Problem(key, str(directory), f"exists and is not {made_by[1]}: name a new directory (nothing was changed)")]


# The directories commands write whole (new_directory): the file that marks an earlier one of theirs, and what it is
# called.
SAVED_MODEL = ("saved_model.pb", "a SavedModel")
PREDICTIONS = ("predictions.json", "predictions written by tfdistx predict")
DATA_FILES = (datafiles.MANIFEST, "data written by tfdistx data write")


def check_new_directory(key: str, directory: str, protected=(), made_by=SAVED_MODEL) -> None:
    """What new_directory refuses, asked before any work (a command asks
    before TensorFlow starts): a ConfigError as _output_problems says, or
    for a place nothing can be made in (/proc/x, a path under a file, one
    without permission); a RunFault (exit 3) for a full, over-quota or
    read-only disk. Nothing is left: the directories a probe makes are removed."""
    problems = _output_problems(key, directory, protected, made_by)
    if problems:
        raise ConfigError(problems)
    place = Path(directory).absolute().parent
    while not os.path.lexists(place):  # the parents new_directory will make: probed where they would start
        place = place.parent
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".tfdistx-probe-", dir=place))
    except OSError as error:
        cause = cannot_write(error)
        if cause:
            raise RunFault(
                f"cannot write {key}={str(directory)!r} ({cause}): nothing was written", EXIT_NOT_RETRYABLE
            ) from None
        raise ConfigError.for_key(
            key,
            str(directory),
            f"cannot be written: making a directory in {place} fails "
            f"({error.strerror or type(error).__name__}): name a directory you can write (nothing was changed)",
        ) from None


@contextlib.contextmanager
def new_directory(key: str, directory: str, protected=(), made_by=SAVED_MODEL):
    """Yields an empty directory beside `directory` to write into; once the
    block has succeeded it becomes `directory` (whatever was there kept
    aside), so `directory` is never half-written and a failure leaves
    nothing: a full disk is a RunFault (exit 3). Refused as
    check_new_directory says, before anything is written.

    The directory written into, `.NAME.tmp-XXXXXXXX`, is locked (flock)
    while it is written: one that a killed command left is unlocked, and
    the next command that writes NAME removes it."""
    check_new_directory(key, directory, protected, made_by)
    parent, name = os.path.split(os.path.abspath(directory))
    made = [
        p for p in [Path(parent), *Path(parent).parents] if not os.path.lexists(p)
    ]  # deepest first: removed on a failure
    os.makedirs(parent, exist_ok=True)
    prefix = f".{name}.tmp-"
    _remove_left_behind(parent, prefix)
    tmp, lock = _locked_directory(parent, prefix)
    try:
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide it from a server or reader running as another user
        yield tmp
        if os.path.exists(directory):
            if any(Path(directory).iterdir()):
                logging.getLogger(__name__).warning(
                    "%s held an earlier one: kept as %s", directory, keep_aside(Path(directory))
                )
            else:
                os.rmdir(directory)
        os.replace(tmp, directory)
        made = []
    except Exception as error:
        cause = None if isinstance(error, (ConfigError, RunFault)) else cannot_write(error)
        if cause is None:
            raise
        raise RunFault(
            f"cannot write {key}={str(directory)!r} ({cause}): nothing was written"
            f"{' (the one there is unchanged)' if os.path.exists(directory) else ''}. "
            "Free some space and run the command again.",
            EXIT_NOT_RETRYABLE,
        ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        os.close(lock)  # releases the lock
        for created in made:  # a failure leaves no parent it made (unless something else is in it now)
            with contextlib.suppress(OSError):
                created.rmdir()


# What a command wrote into a directory it did not make (a report into a run dir, or --out): each file's
# name -> the sha256 of what it wrote there, so that it replaces only those, unchanged since.
WRITTEN_NAME = ".tfdistx-written.json"


def not_ours(directory, names) -> List[str]:
    """The `names` in `directory` that a command may not replace: there,
    and not what tfdistx wrote there itself (recorded in WRITTEN_NAME), or
    changed since (a user's edit of a report is theirs). [] for a new
    directory, or when every one is missing or ours."""
    directory = Path(directory)
    written = _written(directory)
    return [
        name
        for name in names
        if os.path.lexists(directory / name)
        and not ((directory / name).is_file() and _digest((directory / name).read_bytes()) in written.get(name, ()))
    ]


def replace_ours(directory, files: Mapping[str, Union[str, bytes]]) -> List[Path]:
    """Write each of `files` (name -> contents) into `directory`, whole
    (whole_files.write_whole), recording what was written, so that the same
    command may replace them later (not_ours). The record is written before
    the files and after them, so a kill at any moment leaves every file
    there recognised. Refused first (FileExistsError naming them) when one
    of them is not_ours."""
    directory = Path(directory)
    theirs = not_ours(directory, files)
    if theirs:
        raise FileExistsError(", ".join(theirs))
    written = _written(directory)
    new = {name: _digest(data.encode() if isinstance(data, str) else data) for name, data in files.items()}
    for name, digest in new.items():  # what is there now (ours, or none) and what comes: both known while it is written
        there = directory / name
        written[name] = ([_digest(there.read_bytes())] if there.is_file() else []) + [digest]
    _record(directory, written)
    paths = []
    for name, data in files.items():
        write_whole(directory / name, data)
        paths.append(directory / name)
    _record(directory, {**written, **{name: [digest] for name, digest in new.items()}})
    return paths


def _written(directory: Path) -> Dict[str, List[str]]:
    try:
        record = json.loads((directory / WRITTEN_NAME).read_text())
    except (OSError, ValueError):  # none there, or not ours: nothing is known to be ours
        return {}
    if not isinstance(record, dict):
        return {}
    return {
        name: [d for d in digests if isinstance(d, str)]
        for name, digests in record.items()
        if isinstance(digests, list)
    }


def _record(directory: Path, written: Dict[str, List[str]]) -> None:
    write_whole(directory / WRITTEN_NAME, json.dumps(written, indent=1, sort_keys=True) + "\n")


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _locked_directory(parent: str, prefix: str):
    """(a new directory `prefix`XXXXXXXX in `parent`, a descriptor holding its flock)."""
    while True:
        tmp = tempfile.mkdtemp(prefix=prefix, dir=parent)  # a name of its own: nothing of anyone else's is touched
        try:
            lock = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:  # taken for a left-behind one before it was locked: make another
            continue
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.isdir(tmp) and os.stat(tmp).st_ino == os.fstat(lock).st_ino:
            return tmp, lock
        os.close(lock)  # removed between mkdtemp and the lock, as above


def _remove_left_behind(parent: str, prefix: str) -> None:
    """Remove the `prefix`* directories in `parent` that nobody is writing:
    a command's directory is locked from its first moment to its last
    (_locked_directory), so one whose lock can be taken was left by a
    killed command. Only real directories of this user, never a link."""
    for left in Path(parent).glob(prefix + "*"):
        info = left.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            continue
        try:
            fd = os.open(left, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:  # gone meanwhile
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(left, ignore_errors=True)  # removed while locked: no command can take it up meanwhile
        except BlockingIOError:
            pass  # a live command's: it writes there now
        finally:
            os.close(fd)


# The OS's word for a disk nothing more can be written to, as Python and TensorFlow report it.
_CANNOT_WRITE = {
    errno.ENOSPC: "No space left on device",
    errno.EDQUOT: "Disk quota exceeded",
    errno.EROFS: "Read-only file system",
    errno.EFBIG: "File too large",
}


def cannot_write(error: BaseException) -> Optional[str]:
    """The OS's word for it when `error`, or an error behind it, is a disk
    that cannot be written (full, over quota, read-only, a file-size limit); else None."""
    seen = set()
    while error is not None and id(error) not in seen:  # a chain of causes can loop back
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in _CANNOT_WRITE:
            return _CANNOT_WRITE[error.errno]
        for text in _CANNOT_WRITE.values():
            if text in str(error):  # TensorFlow's errors carry the OS's text, not its errno
                return text
        error = error.__cause__ or error.__context__
    return None


def _describe(holder: str) -> str:
    try:
        info = json.loads(holder)
        return f"pid {info['pid']} on {info['host']}, started {info['started']}: {info['command'][:200]}"
    except (ValueError, KeyError, TypeError):
        return holder[:200]
