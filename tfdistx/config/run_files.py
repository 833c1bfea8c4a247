"""The files the shipped loggers and callbacks write: all inside the run
directory, checked before TensorFlow starts.

A callback that takes a path (callbacks=csv_logger's `filename`, and
Keras' own by their `_target_`: ModelCheckpoint's `filepath`, CSVLogger's
`filename`, TensorBoard's `log_dir`: core/callbacks.PATHS) writes it in the
run dir: a relative path is the run dir's, an absolute one must lie inside
it. A path that would leave it (`../mine.csv`, `/tmp/best.keras`) is
refused, as it could be a file of the user's, which the callback would
replace; so is one of the run's own files (`metrics.jsonl`), which it would
write over. A file of that name already there is kept aside when
callbacks=csv_logger starts a new one (engine/callbacks.py's CSVLogger).
The names these write also count as the run's (`names`): a directory
tfdistx did not make that holds one is refused as a run dir, as one
holding metrics.jsonl is (rundir.in_the_way). A subclass of one of Keras'
is checked when it is built (engine/callbacks.py). No TensorFlow here.
"""

import glob
import os
from typing import Iterator, List, Optional, Tuple

from omegaconf import DictConfig, OmegaConf

from tfdistx import rundir
from tfdistx import loggers as builtin_loggers
from tfdistx.core import callbacks as keras_facts
from tfdistx.core.errors import Problem
from tfdistx.core.targets import current

# The shipped callbacks that write a file: their target -> (the key naming the file, its default, a name to offer).
CALLBACK_FILES = {"tfdistx.engine.callbacks.CSVLogger": ("filename", "keras_log.csv", "keras_log.csv")}


def problems(cfg: DictConfig, run_dir: Optional[str]) -> List[Problem]:
    """A callback's path that would not be the run dir's own."""
    found = []
    for name, key, value, example in _paths(cfg):
        why = rundir.why_not_in_run_dir(value, run_dir, example)
        if why:
            found.append(Problem(f"callbacks.{name}.{key}", value, why))
    return found


def names(cfg: DictConfig, run_dir: Optional[str] = None) -> List[str]:
    """The patterns (rundir.written_names) of the first names of the paths
    the configured loggers and callbacks write in the run dir."""
    # What each built-in logger writes, when it is on (its class says: tfdistx/loggers/).
    group = OmegaConf.to_container(cfg.logger, resolve=True) if OmegaConf.is_dict(cfg.logger) else {}
    written = [
        glob.escape(name) for row in builtin_loggers.built_in() if row.settings(group) is not None for name in row.files
    ]
    paths = []
    for _, _, value, _ in _paths(cfg):
        if isinstance(value, str) and os.path.isabs(value) and run_dir is not None:
            value = rundir.inside(value, run_dir)
        paths.append(value)
    return written + rundir.written_names(paths)


def _paths(cfg: DictConfig) -> Iterator[Tuple[str, str, object, str]]:
    """(name, key, path, a name to offer) of each configured callback that
    writes where a key of its says: a shipped one, or Keras' own by its target."""
    callbacks = cfg.get("callbacks")
    if not OmegaConf.is_dict(callbacks):
        return
    for name, callback in callbacks.items():
        if not OmegaConf.is_dict(callback) or not isinstance(callback.get("_target_"), str):
            continue
        target = current(callback.get("_target_"))
        keras_class = keras_facts.keras_name(target)
        if target in CALLBACK_FILES:
            key, default, example = CALLBACK_FILES[target]
        elif keras_class and keras_facts.path_key([keras_class]) and keras_class not in keras_facts.REFUSED:
            key, default, example = keras_facts.path_key([keras_class])
        else:
            continue
        value = callback.get(key, default)
        if value is None and default is None:  # a key it needs, not given: its target's check says so
            continue
        yield name, key, value, example
