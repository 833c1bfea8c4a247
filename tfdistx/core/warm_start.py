"""`checkpoint.init_from` and `checkpoint.init_skip`: what a warm start's
path is, checked before TensorFlow starts.

A path is one of four kinds: a tfdistx run directory (its newest
checkpoint), a checkpoint prefix (`RUN/checkpoints/ckpt-500`, the files
`ckpt-500.index` and `ckpt-500.data-*` beside it), a Keras `.weights.h5`
file or a `.keras` file. The engine loads it (engine/warm_start.py); the
source run's model is rebuilt from that run's own config, which
core/run_spec.py resolves. No TensorFlow here.
"""

import re
import zipfile
from pathlib import Path
from typing import List, Optional, Tuple

import yaml  # PyYAML: a run's saved config, read without OmegaConf (the engine imports this module)

from tfdistx.core import paths
from tfdistx.core.errors import Problem

RUN, CHECKPOINT, KERAS, WEIGHTS = "run", "checkpoint", "keras", "weights"
ALLOWED = (
    "a tfdistx run directory (.hydra/config.yaml and checkpoints), a checkpoint prefix (RUN/checkpoints/ckpt-N, "
    "with ckpt-N.index beside it), a .weights.h5 or a .keras file"
)


def kind(path: str) -> Tuple[Optional[str], Optional[str]]:
    """(kind, None), or (None, why it is none of them)."""
    given = Path(path).expanduser()
    if given.is_dir():
        if (given / ".hydra" / "config.yaml").is_file():
            return RUN, None
        if any(given.glob("ckpt-*.index")):  # RUN/checkpoints: the checkpoints are there, the config one level up
            return (
                None,
                f"is a directory of checkpoints: name one (e.g. {given}/ckpt-N) or the run directory; allowed: "
                f"{ALLOWED}",
            )
        return None, f"is a directory, but not a tfdistx run directory (no .hydra/config.yaml); allowed: {ALLOWED}"
    if Path(f"{given}.index").is_file():
        return CHECKPOINT, None
    if given.is_file():
        if given.name.endswith(".weights.h5"):
            return (
                (WEIGHTS, None)
                if _starts_with(given, _HDF5)
                else (
                    None,
                    "is not a Keras .weights.h5 file (not HDF5: damaged, or "
                    "another kind of file); save one with model.save_weights()",
                )
            )
        if given.suffix == ".keras":
            damage = _not_a_keras_archive(given)
            return (
                (KERAS, None)
                if damage is None
                else (None, f"is not a Keras .keras file ({damage}); save one with model.save()")
            )
        return None, f"is a file of none of the kinds; allowed: {ALLOWED}"
    return None, f"does not exist; allowed: {ALLOWED}"


_HDF5 = b"\x89HDF\r\n\x1a\n"  # the signature an HDF5 file (a .weights.h5) starts with


def _starts_with(path: Path, signature: bytes) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(len(signature)) == signature
    except OSError:
        return False


def _not_a_keras_archive(path: Path) -> Optional[str]:
    """Why `path` cannot be a .keras file (a zip archive holding config.json), or None."""
    try:
        with zipfile.ZipFile(path) as archive:
            return (
                None
                if "config.json" in archive.namelist()
                else "a zip archive without the config.json of a Keras model"
            )
    except (zipfile.BadZipFile, OSError):
        return "not a zip archive: damaged, or another kind of file"


def run_dir_of(path: str, path_kind: str) -> Optional[Path]:
    """The run directory whose saved config builds the source model: the
    path itself, or the run that holds a checkpoint (up to three levels up:
    RUN/checkpoints/ckpt-N, RUN/checkpoints/best/ckpt-N). None: a bare
    checkpoint or a Keras file, built as the current run's model."""
    given = Path(path).expanduser()
    if path_kind == RUN:
        return given
    if path_kind == CHECKPOINT:
        for parent in list(given.absolute().parents)[:3]:
            if (parent / ".hydra" / "config.yaml").is_file():
                return parent
    return None


def checkpoint_dir_of_run(run_dir: Path) -> Path:
    """Where a run keeps its checkpoints: its config's checkpoint.dir, or RUN/checkpoints."""
    try:
        saved = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text()) or {}
        configured = (saved.get("checkpoint") or {}).get("dir")
    except Exception:  # unreadable: resolve reports it in one line (compose.saved_config)
        configured = None
    # an interpolation (${...}) is the run's to resolve: its default place is the one to look
    return Path(
        paths.checkpoint_dir(configured if isinstance(configured, str) and "${" not in configured else None, run_dir)
    )


def resumes(checkpoint_dir: Optional[str], restore: bool) -> bool:
    """Whether a run will resume from checkpoints of its own (then init_from is
    not applied, and a source deleted or changed since must not stop it)."""
    return bool(restore and checkpoint_dir and any(Path(checkpoint_dir).expanduser().glob("ckpt-*.index")))


def problems(init_from, init_skip, resuming: bool = False, set_aside: Tuple[Optional[str], ...] = ()) -> List[Problem]:
    """Every problem of the two keys (the variables themselves are matched
    against init_skip once the model is built). `resuming`: the run resumes
    from its own checkpoints, and the path is not looked at. `set_aside`:
    the run's own directory and checkpoint dir, when it sets their files
    aside before it starts (checkpoint.restore=false): a path in them would
    be gone before the warm start reads it."""
    found = []
    if init_from is not None and not resuming:
        path_kind, why = kind(str(init_from)) if str(init_from).strip() else (None, f"is empty; allowed: {ALLOWED}")
        if why:
            found.append(Problem("checkpoint.init_from", init_from, why))
        elif _inside(init_from, set_aside):
            found.append(
                Problem(
                    "checkpoint.init_from",
                    init_from,
                    f"is in this run's own directory (hydra.run.dir={set_aside[0]!r}), whose checkpoints "
                    "checkpoint.restore=false sets aside before a warm start could read them: start the new run in "
                    f"another directory (hydra.run.dir=NEW checkpoint.init_from={init_from}), or resume this one "
                    "(checkpoint.restore=true)",
                )
            )
        elif path_kind == RUN and not any(checkpoint_dir_of_run(Path(init_from).expanduser()).glob("ckpt-*.index")):
            found.append(
                Problem(
                    "checkpoint.init_from",
                    init_from,
                    f"that run has no checkpoint yet (none in {checkpoint_dir_of_run(Path(init_from).expanduser())})",
                )
            )
    for pattern in init_skip or ():
        try:
            re.compile(str(pattern))
        except re.error as error:
            found.append(Problem("checkpoint.init_skip", pattern, f"is not a regular expression ({error})"))
    if init_skip and init_from is None:
        found.append(
            Problem(
                "checkpoint.init_skip",
                list(init_skip),
                "only applies with checkpoint.init_from: set it, or leave init_skip out",
            )
        )
    return found


def _inside(path, directories) -> bool:
    """Whether `path` is one of `directories` or lies below one."""
    given = Path(path).expanduser().resolve()
    for directory in filter(None, directories):
        there = Path(directory).expanduser().resolve()
        if given == there or there in given.parents:
            return True
    return False
