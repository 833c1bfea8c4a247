"""What the config side knows of each built-in data source, as facts that
need no TensorFlow: the source's own checks (validate.py asks) and its line
in `--plan` (plan.py asks). A new built-in source adds its row to SOURCES;
a user's own source is checked by its signature when it is built.
"""

from dataclasses import dataclass
from typing import Callable, Optional

from omegaconf import DictConfig, OmegaConf

from tfdistx.config import datafiles
from tfdistx.config.errors import Problem
from tfdistx.config.targets import current

# Sizes the built-in sources take, and their least sensible value: checked
# here so that a 0 is named, not answered by numpy from deep inside.
SIZES = {"train_examples": 1, "eval_examples": 1, "num_classes": 2, "num_labels": 1, "num_targets": 1, "num_features": 1,
         "num_fields": 1, "dense_features": 0, "vocab_size": 2, "shuffle_buffer": 1}


def size_problems(data: DictConfig) -> list:
    problems = []
    for key, least in SIZES.items():
        value = data.get(key)
        if value is not None and (not _is_int(value) or value < least):
            problems.append(Problem(f"data.{key}", value, f"must be a whole number, at least {least}"))
    shape = data.get("image_shape")
    if shape is not None and (not OmegaConf.is_list(shape) or not shape or not all(_is_int(d) and d >= 1 for d in shape)):
        problems.append(Problem("data.image_shape", shape, "must be a list of positive sizes, e.g. [28, 28, 1]"))
    return problems


def file_problems(data: DictConfig) -> list:
    problems = size_problems(data) + datafiles.file_problems(data)
    if "features" in data:
        problems += datafiles.feature_problems(data.features, data.get("label"))
    return problems


def files_plan(data: DictConfig, pipelines: int) -> str:
    """How the train files split across the input pipelines (one per worker)."""
    found = datafiles.local_matches(data.train_files)
    if found is None:
        return f"data          {data.train_files}: listed at start (tf.io.gfile), split by file across {pipelines} worker(s) when there are enough"
    counts = datafiles.manifest_counts(datafiles.read_manifest(found), found)
    size = f"{sum(counts):,} records; " if counts else "no manifest: records counted when a run resumes; "
    return f"data          {size}{datafiles.sharding_text(len(found), pipelines, 'worker' if pipelines > 1 else 'input pipeline')}"


@dataclass(frozen=True)
class Source:
    checks: Callable[[DictConfig], list] = lambda data: []
    plan_line: Optional[Callable[[DictConfig, int], str]] = None  # replaces the generic `data` line of --plan
    eval_key: Optional[str] = None  # the key naming its eval split, which null leaves out; None: it always has one
    labels: Optional[str] = None  # what its labels are, when no task for classes can learn them ("real values")


SOURCES = {
    **{f"tfdistx.data.{name}": Source(size_problems) for name in ("synthetic", "synthetic_categorical", "synthetic_multilabel")},
    "tfdistx.data.synthetic_regression": Source(size_problems, labels="real values"),
    "tfdistx.data.tfds": Source(size_problems, eval_key="eval_split"),
    "tfdistx.data.tfrecord": Source(file_problems, files_plan, eval_key="eval_files"),
    "tfdistx.data.csv": Source(file_problems, files_plan, eval_key="eval_files"),
}


def of(data: DictConfig) -> Source:
    """The row of the data group's source (a user's own: no checks of ours)."""
    return SOURCES.get(current(data.get("_target_", "")), Source())


def no_eval_split(data: DictConfig) -> Optional[str]:
    """The key that leaves a built-in source without an eval split
    (`data.eval_files`, set to null), or None: it has one, or it is a
    user's source (known once built: engine/build.py)."""
    key = of(data).eval_key
    return f"data.{key}" if key and not data.get(key) else None


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
