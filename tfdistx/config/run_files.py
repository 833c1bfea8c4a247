"""The files the shipped loggers and callbacks write: all inside the run
directory, checked before TensorFlow starts.

A shipped callback that takes a file name (callbacks=csv_logger's
`filename`) writes it in the run dir: a name that would leave it
(`../mine.csv`, an absolute path) is refused, and so is one of the run's
own files (`metrics.jsonl`), which it would write over. A file of that
name already there is kept aside when the callback starts a new one
(engine/callbacks.py's CSVLogger). The names these write also count as
the run's (`names`): a directory tfdistx did not make that holds one is
refused as a run dir, as one holding metrics.jsonl is (rundir.in_the_way).
No TensorFlow here.
"""

import os
from pathlib import Path
from typing import List, Optional

from omegaconf import DictConfig, OmegaConf

from tfdistx import rundir
from tfdistx import loggers as builtin_loggers
from tfdistx.spec.errors import Problem
from tfdistx.spec.targets import current

# The shipped callbacks that write a file: their target -> (the key naming the file, its default).
CALLBACK_FILES = {"tfdistx.engine.callbacks.CSVLogger": ("filename", "keras_log.csv")}


def problems(cfg: DictConfig, run_dir: Optional[str]) -> List[Problem]:
    """A shipped callback's file that would not be the run dir's own."""
    found = []
    for name, callback in _callbacks(cfg):
        key, default = CALLBACK_FILES[current(callback.get("_target_"))]
        value = callback.get(key, default)
        why = rundir.why_not_in_run_dir(value, run_dir)
        if why:
            found.append(Problem(f"callbacks.{name}.{key}", value, why))
    return found


def names(cfg: DictConfig) -> List[str]:
    """The first names of the paths the configured loggers and shipped callbacks write in the run dir."""
    # What each built-in logger writes, when it is on (its class says: tfdistx/loggers/).
    group = OmegaConf.to_container(cfg.logger, resolve=True) if OmegaConf.is_dict(cfg.logger) else {}
    written = [name for row in builtin_loggers.built_in() if row.settings(group) is not None for name in row.files]
    for _, callback in _callbacks(cfg):
        key, default = CALLBACK_FILES[current(callback.get("_target_"))]
        value = callback.get(key, default)
        if isinstance(value, str) and value and not os.path.isabs(value):
            written.append(Path(os.path.normpath(value)).parts[0])
    return written


def _callbacks(cfg: DictConfig):
    """(name, keys) of the configured callbacks that are shipped ones writing a file."""
    callbacks = cfg.get("callbacks")
    if not OmegaConf.is_dict(callbacks):
        return []
    return [
        (name, callback)
        for name, callback in callbacks.items()
        if OmegaConf.is_dict(callback)
        and isinstance(callback.get("_target_"), str)
        and current(callback.get("_target_")) in CALLBACK_FILES
    ]
