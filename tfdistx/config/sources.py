"""What the config side knows of tfdistx's data sources, as facts that need
no TensorFlow: the source's own checks (validate.py asks) and its line in
`--plan` (plan.py asks). Nothing here is per source: a built-in source's
YAML (conf/data/NAME.yaml) says it by the keys it has, the same keys its
function takes:
- sizes (SIZES: num_classes, train_examples, ...) are checked where given;
- `train_files` (and `eval_files`): file data, whose files and features are
  checked and whose split across workers `--plan` says;
- `eval_files` or `eval_split` names its eval split (null: none);
- `num_targets`: its labels are real values (regression targets);
- `label` (without files): it reads its features and label by name (data=tfds).
A user's own source (data._target_=mypkg.load) is checked by its
signature when it is built.
"""

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from omegaconf import DictConfig, OmegaConf

from tfdistx.core import datafiles
from tfdistx.core.errors import Problem
from tfdistx.core.targets import current
from tfdistx.core.values import is_whole

# Sizes the built-in sources take, and their least sensible value: checked
# here so that a 0 is named, not answered by numpy from deep inside.
SIZES = {
    "train_examples": 1,
    "eval_examples": 1,
    "num_classes": 2,
    "num_labels": 1,
    "num_targets": 1,
    "num_features": 1,
    "num_fields": 1,
    "dense_features": 0,
    "vocab_size": 2,
    "sequence_length": 1,
    "shuffle_buffer": 1,
}


def size_problems(data: DictConfig) -> list:
    problems = []
    for key, least in SIZES.items():
        value = data.get(key)
        if value is not None and (not is_whole(value) or value < least):
            problems.append(Problem(f"data.{key}", value, f"must be a whole number, at least {least}"))
    shape = data.get("image_shape")
    if shape is not None and (
        not OmegaConf.is_list(shape) or not shape or not all(is_whole(d) and d >= 1 for d in shape)
    ):
        problems.append(Problem("data.image_shape", shape, "must be a list of positive sizes, e.g. [28, 28, 1]"))
    size = data.get("image_size")
    if size is not None and (
        not OmegaConf.is_list(size) or len(size) != 2 or not all(is_whole(d) and d >= 1 for d in size)
    ):
        problems.append(Problem("data.image_size", _plain(size), "[HEIGHT, WIDTH], two positive sizes, or null"))
    return problems


def named_problems(data: DictConfig) -> list:
    """A source that reads its features and label by name (data=tfds): a name, or (features) a list of them."""
    problems = size_problems(data)
    features, label = data.get("features"), data.get("label")
    if features is not None and not (
        isinstance(features, str)
        or (OmegaConf.is_list(features) and features and all(isinstance(f, str) for f in features))
    ):
        problems.append(Problem("data.features", _plain(features), "a feature's name, a list of them, or null"))
    if label is not None and not isinstance(label, str):
        problems.append(Problem("data.label", _plain(label), "a feature's name, or null"))
    return problems


def _plain(value):
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def file_problems(data: DictConfig) -> list:
    problems = size_problems(data) + datafiles.file_problems(data)
    if "features" in data:
        problems += datafiles.feature_problems(data.features, data.get("label"))
    return problems


def files_plan(data: Mapping[str, Any], pipelines: int) -> str:
    """How the train files split across the input pipelines (one per worker)."""
    found = datafiles.local_matches(data["train_files"])
    if found is None:
        return (
            f"data          {data['train_files']}: listed at start (tf.io.gfile), split by file across {pipelines} "
            "worker(s) when there are enough"
        )
    counts = datafiles.manifest_counts(datafiles.read_manifest(found), found)
    size = f"{sum(counts):,} records; " if counts else "no manifest: records counted when a run resumes; "
    return (
        f"data          {size}"
        f"{datafiles.sharding_text(len(found), pipelines, 'worker' if pipelines > 1 else 'input pipeline')}"
    )


@dataclass(frozen=True)
class Source:
    checks: Callable[[DictConfig], list] = lambda data: []
    plan_line: Optional[Callable[[Mapping[str, Any], int], str]] = None  # replaces the generic `data` line of --plan
    eval_key: Optional[str] = None  # the key naming its eval split, which null leaves out; None: it always has one
    labels: Optional[str] = None  # what its labels are, when no task for classes can learn them ("real values")


BUILT_IN = "tfdistx.data."
FILE_KEY = "train_files"
EVAL_KEYS = ("eval_files", "eval_split")  # the first the source has names its eval split
REAL_VALUES_KEY = "num_targets"


def of(data: Mapping[str, Any]) -> Source:
    """The facts of the data group's source, from its keys (a user's own: no checks of ours)."""
    if not current(data.get("_target_", "")).startswith(BUILT_IN):
        return Source()
    files = FILE_KEY in data
    return Source(
        file_problems if files else named_problems if "label" in data else size_problems,
        files_plan if files else None,
        eval_key=next((key for key in EVAL_KEYS if key in data), None),
        labels="real values" if REAL_VALUES_KEY in data else None,
    )


def no_eval_split(data: DictConfig) -> Optional[str]:
    """The key that leaves a built-in source without an eval split
    (`data.eval_files`, set to null), or None: it has one, or it is a
    user's source (known once built: engine/build.py)."""
    key = of(data).eval_key
    return f"data.{key}" if key and not data.get(key) else None
