"""Facts about file data that need no TensorFlow: which files a pattern
names, the manifest `tfdistx data write` leaves beside them, and how files
are split across input pipelines. Validation, `--plan` and the engine
(`data/order.py`, `data/files.py`) all ask here, so each answer is given once.
"""

import collections.abc
import glob
import json
import os
from typing import Dict, List, Optional, Sequence, Union

from tfdistx.core.errors import Problem

MANIFEST = "manifest.json"
FORMATS = ("tfrecord", "csv")
COMPRESSIONS = (None, "GZIP", "ZLIB")
DTYPES = ("float32", "int64", "string")  # what a tf.train.Example holds


def is_remote(path: str) -> bool:
    """gs://, s3://, hdfs://...: left to tf.io.gfile, which knows them."""
    return "://" in path


def patterns(files: Union[str, Sequence[str], None]) -> List[str]:
    if files is None:
        return []
    return [files] if isinstance(files, str) else [str(f) for f in files]


def is_patterns(files) -> bool:
    """A glob pattern, or a non-empty list of them (a ListConfig is a Sequence too)."""
    if isinstance(files, str):
        return bool(files)
    return isinstance(files, collections.abc.Sequence) and bool(files) and all(isinstance(f, str) and f for f in files)


def local_matches(files) -> Optional[List[str]]:
    """The files the local patterns name, sorted; None when some are remote
    (those are listed by tf.io.gfile once TensorFlow runs)."""
    names = patterns(files)
    if any(is_remote(p) for p in names):
        return None
    found = []
    for pattern in names:
        found += sorted(glob.glob(os.path.expanduser(pattern)))
    return sorted(dict.fromkeys(found))


def shards_by_file(num_files: int, pipelines: int) -> bool:
    """Each input pipeline reads its own files when there are enough of
    them; else every pipeline reads every file and keeps its share of the
    records."""
    return num_files >= pipelines


def sharding_text(num_files: int, pipelines: int, who: str = "input pipeline") -> str:
    """For `--plan`: how `num_files` files are split across `pipelines`."""
    if pipelines <= 1:
        return f"{num_files} file(s), read by one {who}"
    if shards_by_file(num_files, pipelines):
        least, most = num_files // pipelines, -(-num_files // pipelines)
        each = f"{least}" if least == most else f"{least}-{most}"
        return f"{num_files} files split by file: each of {pipelines} {who}s reads {each} of them"
    return (
        f"{num_files} file(s) for {pipelines} {who}s: split by element (each reads every file and keeps every "
        f"{pipelines}-th record); write at least {pipelines} files to split them by file"
    )


def read_manifest(files: Sequence[str]) -> Optional[dict]:
    """The manifest in the directory of the first file, if there is one."""
    if not files or is_remote(files[0]):
        return None
    path = os.path.join(os.path.dirname(files[0]), MANIFEST)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def manifest_counts(manifest: Optional[dict], files: Sequence[str]) -> Optional[List[int]]:
    """Records per file, when the manifest lists every one of `files`."""
    if not manifest:
        return None
    known: Dict[str, int] = {}
    for split in manifest.get("splits", {}).values():
        known.update(split.get("files", {}))
    names = [os.path.basename(f) for f in files]
    return [int(known[n]) for n in names] if all(n in known for n in names) else None


def feature_problems(features, label) -> List[Problem]:
    """`data.features` must map names to {dtype, shape, var_len}, and name the label."""
    if features is None:
        return []
    if not hasattr(features, "items") or not features:
        return [
            Problem(
                "data.features",
                features,
                "a mapping of name -> {dtype, shape}, e.g. {image: {dtype: float32, shape: [784]}}",
            )
        ]
    problems = []
    for name, spec in features.items():
        key = f"data.features.{name}"
        if not hasattr(spec, "get"):
            problems.append(Problem(key, spec, "must be {dtype: float32|int64|string, shape: [...], var_len: false}"))
            continue
        if spec.get("dtype") not in DTYPES:
            problems.append(Problem(f"{key}.dtype", spec.get("dtype"), f"allowed: {', '.join(DTYPES)}"))
        shape = spec.get("shape", [])
        if (
            not isinstance(shape, collections.abc.Sequence)
            or isinstance(shape, str)
            or not all(isinstance(d, int) and d >= 1 for d in shape)
        ):
            problems.append(Problem(f"{key}.shape", shape, "a list of positive sizes ([] for a scalar)"))
        elif spec.get("var_len") and len(shape) != 1:
            problems.append(
                Problem(f"{key}.shape", shape, "a var_len feature is padded or cut to one length: give [N]")
            )
    if label not in features:
        problems.append(Problem("data.label", label, f"not one of data.features: {', '.join(features)}"))
    elif len(features) < 2:
        problems.append(Problem("data.features", list(features), "needs at least one feature besides the label"))
    return problems


def file_problems(data) -> List[Problem]:
    """What is wrong with a file data group (data=tfrecord, data=csv), before TensorFlow."""
    problems = []
    if data.get("compression") not in COMPRESSIONS:
        problems.append(Problem("data.compression", data.get("compression"), "allowed: null, GZIP, ZLIB"))
    for key in ("train_files", "eval_files"):
        value = data.get(key)
        if value is None and key == "eval_files":
            continue
        if not is_patterns(value):
            problems.append(
                Problem(
                    f"data.{key}",
                    value,
                    f"give a glob pattern or a list of files, e.g. data.{key}='/data/{key[:-6]}-*.tfrecord'",
                )
            )
            continue
        matches = local_matches(value)
        if matches is not None and not matches:
            problems.append(
                Problem(f"data.{key}", value, "no file matches (relative paths are from the directory tfdistx runs in)")
            )
    return problems
