"""What Keras' shipped callbacks do under tfdistx, and which it refuses
(before TensorFlow starts, by their `_target_`; again when built, for a
subclass of one), each with what does the job instead. Plain data: the
engine reads it too, so nothing of Hydra here either. The docs' table
(docs/own-project.md: Keras' callbacks) says the same; a test holds them
together. No TensorFlow, no Keras here: the classes are known by name.
"""

from typing import Iterable, Mapping, Optional

from tfdistx.core.errors import Problem
from tfdistx.core.targets import current

# Where a user names Keras' callbacks from: its public API, TensorFlow's alias of it, and Keras' own modules.
_KERAS_PREFIXES = ("keras.callbacks.", "tf.keras.callbacks.", "tensorflow.keras.callbacks.", "keras.src.callbacks.")

# Refused whatever their keys: tfdistx does their job itself, and running them would undo it.
REFUSED = {
    "BackupAndRestore": "tfdistx resumes every run from its own checkpoints, exactly (weights, optimizer, step, data "
    "position, callbacks' state): drop it; checkpoint.every_steps sets how often a checkpoint is saved",
    "SwapEMAWeights": "it swaps the optimizer's averages in for Keras' evaluate (on_test_begin), which tfdistx does "
    "not call: not supported",
}
# Refused with one key set so: (key, value, why and what to use instead).
REFUSED_WITH = {
    "EarlyStopping": (
        "restore_best_weights",
        True,
        "tfdistx keeps the best weights itself, on every worker and across a resume: set checkpoint.keep_best=true "
        "(its export is the best checkpoint's, by trainer.objective) and drop restore_best_weights",
    ),
}


# Keras' callbacks that write where a key of theirs says: the key, its default (None: none), and a name to offer.
# Under tfdistx the path is the run dir's (relative: to it; absolute: inside it), as callbacks=csv_logger's is: a
# path out of the run dir could be a file of the user's, which the callback would replace, and a rerun (a resume)
# replaces what the run itself wrote there.
PATHS = {
    "ModelCheckpoint": ("filepath", None, "best.keras"),
    "CSVLogger": ("filename", None, "keras_log.csv"),
    "TensorBoard": ("log_dir", "logs", "keras_tensorboard"),
    "OrbaxCheckpoint": ("directory", None, "orbax"),
    "BackupAndRestore": ("backup_dir", None, "backup"),  # refused (REFUSED): a subclass built all the same is checked
}


def path_key(names: Iterable[str]) -> Optional[tuple]:
    """(key, default, example) of the first of these Keras class names that writes where a key says; None: none does."""
    return next((PATHS[name] for name in names if name in PATHS), None)


def keras_name(path: str) -> Optional[str]:
    """The class name of a Keras callback a `_target_` names (None: not Keras')."""
    path = current(path)
    if not path.startswith(_KERAS_PREFIXES):
        return None
    return path.rpartition(".")[2]


def refusal(names: Iterable[str], keys: Mapping) -> Optional[str]:
    """Why a callback of (any of) these Keras class names, with these keys, is refused; None: it is not."""
    for name in names:
        if name in REFUSED:
            return f"keras.callbacks.{name} is not used by tfdistx: {REFUSED[name]}"
        if name in REFUSED_WITH:
            key, value, why = REFUSED_WITH[name]
            if keys.get(key) == value:
                return f"keras.callbacks.{name} with {key}={value}: {why}"
    return None


def problems(callbacks: Optional[Mapping]) -> list:
    """The `callbacks` group's entries that name a refused Keras callback."""
    found = []
    for name, entry in callbacks.items() if isinstance(callbacks, Mapping) else ():
        if not isinstance(entry, Mapping) or "_target_" not in entry:
            continue
        keras_class = keras_name(str(entry["_target_"]))
        why = refusal([keras_class], entry) if keras_class else None
        if why:
            found.append(Problem(f"callbacks.{name}._target_", str(entry["_target_"]), why))
    return found
