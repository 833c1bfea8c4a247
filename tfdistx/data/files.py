"""A user's own data in files: TFRecord or CSV, read where it lies, and
`tfdistx data write`, which turns any data source into such files.

`data=tfrecord` and `data=csv` are DataSources (data/sources.py) whose examples are
`order.FileExamples`: files found by glob (local, or any tf.io.gfile path
such as gs://), split across input pipelines by file, shuffled in windows,
decoded a window at a time (one `tf.io.parse_example` / `decode_csv` for
the whole window, not per record), and resumable at any step without
reading what came before. Record counts come from the manifest the writer leaves
beside the files (`manifest.json`); so does the feature spec when the
config gives none.

Bad files are refused before training with one line that names the file:
no match, not TFRecord (or the wrong compression), a feature missing or of
another dtype or size. A corrupt record found later stops the run the same
way (`input_errors_in_one_line`).
"""

import contextlib
import json
import logging
import os
import re
from typing import List, Optional

import numpy as np
import tensorflow as tf

from tfdistx.core import datafiles
from tfdistx.rundir import DATA_FILES, new_directory
from tfdistx.core.errors import ConfigError
from tfdistx.data.sources import DataSource
from tfdistx.data.order import FileExamples

log = logging.getLogger(__name__)

# What a decode error says about a feature (parse_example's messages).
_FEATURE_IN_ERROR = re.compile(r"(?:Feature|Key|Name): ([\w./-]+)")


def tfrecord(
    train_files,
    eval_files=None,
    features: Optional[dict] = None,
    label: str = "label",
    compression: Optional[str] = None,
    num_classes: Optional[int] = None,
) -> DataSource:
    """tf.train.Example records. `features`: name -> {dtype, shape, var_len}
    (None: the manifest's); `label`: which of them is the label. The other
    features are the model's input: one tensor when there is one, else a
    dict by name."""
    train = _find("data.train_files", train_files)
    manifest = datafiles.read_manifest(train)
    compression = compression or (manifest or {}).get("compression")
    if features is None:
        if not manifest or manifest.get("format") != "tfrecord":
            raise ConfigError.for_key(
                "data.features",
                None,
                f"no {datafiles.MANIFEST} of tfdistx data write beside {train[0]}: "
                "give data.features (name -> {dtype, shape}) and data.label",
            )
        features, label = manifest["features"], manifest["label"]
        num_classes = num_classes or manifest.get("num_classes")
    problems = datafiles.feature_problems(features, label)
    if problems:
        raise ConfigError(problems)
    decode = _example_decoder(features, label)

    def read(files):
        return tf.data.TFRecordDataset(files, compression_type=compression or "")

    return _source(train, eval_files, read, decode, manifest, num_classes, compression)


def csv(
    train_files,
    eval_files=None,
    columns: Optional[dict] = None,
    label: str = "label",
    header: bool = True,
    label_dtype: str = "int64",
    feature_shape: Optional[List[int]] = None,
    compression: Optional[str] = None,
    num_classes: Optional[int] = None,
) -> DataSource:
    """Comma-separated rows. `columns`: name -> dtype in file order (None:
    the names from the header, every one float32 but the label, which is
    `label_dtype`). The other columns are the model's input: one float32
    vector when all are numbers (reshaped to `feature_shape` if given: an
    image for a CNN), else a dict by name."""
    train = _find("data.train_files", train_files)
    manifest = datafiles.read_manifest(train)
    if manifest and manifest.get("format") == "csv":  # written by tfdistx data write
        compression = compression or manifest.get("compression")
        label_dtype = manifest["features"][manifest["label"]]["dtype"]
        num_classes = num_classes or manifest.get("num_classes")
    if columns is None:
        if not header:
            raise ConfigError.for_key(
                "data.columns", None, "give the columns (name -> dtype) when the files have no header"
            )
        names = _header(train[0], compression)
        columns = {name: (label_dtype if name == label else "float32") for name in names}
    problems = datafiles.feature_problems({n: {"dtype": d} for n, d in columns.items()}, label)
    if problems:
        raise ConfigError(
            [
                type(p)(p.key.replace("data.features", "data.columns").replace(".dtype", ""), p.value, p.allowed)
                for p in problems
            ]
        )
    names, dtypes = list(columns), [tf.as_dtype(d) for d in columns.values()]
    numeric = all(d != tf.string for n, d in zip(names, dtypes) if n != label)
    if feature_shape and (not numeric or int(np.prod(feature_shape)) != len(names) - 1):
        raise ConfigError.for_key(
            "data.feature_shape",
            list(feature_shape),
            f"must hold the {len(names) - 1} feature columns "
            f"({'all numbers' if numeric else 'some are strings: no shape applies'})",
        )

    def decode(lines):
        values = tf.io.decode_csv(lines, record_defaults=[tf.constant([], d) for d in dtypes])  # every column required
        by_name = dict(zip(names, values))
        target = by_name.pop(label)
        if numeric:
            vector = tf.stack([tf.cast(v, tf.float32) for v in by_name.values()], axis=1)
            return (tf.reshape(vector, [-1, *feature_shape]) if feature_shape else vector), target
        return by_name, target

    def read(files):
        def lines(name):
            return tf.data.TextLineDataset(name, compression_type=compression or "").skip(int(header))

        return tf.data.Dataset.from_tensor_slices(files).flat_map(lines)

    return _source(train, eval_files, read, decode, manifest, num_classes, compression)


def _example_decoder(features: dict, label: str):
    """A batch of serialized tf.train.Examples to (features, label), in one
    parse_example. A var_len feature is padded (or cut) to its shape's length."""
    spec, lengths = {}, {}
    for name, entry in features.items():
        dtype, shape = tf.as_dtype(entry["dtype"]), list(entry.get("shape") or [])
        if entry.get("var_len"):
            spec[name], lengths[name] = tf.io.RaggedFeature(dtype), shape[0]
        else:
            spec[name] = tf.io.FixedLenFeature(shape, dtype)

    def decode(records):
        parsed = tf.io.parse_example(records, spec)
        for name, length in lengths.items():
            parsed[name] = parsed[name].to_tensor(shape=[None, length])
        target = parsed.pop(label)
        return (next(iter(parsed.values())) if len(parsed) == 1 else parsed), target

    return decode


def _source(train: List[str], eval_files, read, decode, manifest, num_classes, compression) -> DataSource:
    evaluation = _find("data.eval_files", eval_files) if eval_files else None
    if num_classes:
        decode = _labels_checked(decode, int(num_classes))
    train_counts = datafiles.manifest_counts(manifest, train)
    for files in filter(None, (train, evaluation)):
        _check_first_record(files[0], read, decode, compression)
    return DataSource(
        train=FileExamples(train, read, decode, train_counts),
        eval=FileExamples(evaluation, read, decode, datafiles.manifest_counts(manifest, evaluation))
        if evaluation
        else None,
        num_classes=num_classes,
        train_examples=sum(train_counts) if train_counts else None,
    )


def _find(key: str, files) -> List[str]:
    """Every file the patterns name (tf.io.gfile: local paths and gs:// alike), sorted."""
    found = []
    for pattern in datafiles.patterns(files):
        found += glob_sorted(key, pattern)
    if not found:
        raise ConfigError.for_key(key, files, "no file matches")
    return sorted(dict.fromkeys(found))


def glob_sorted(key: str, pattern: str) -> List[str]:
    """What one glob matches (tf.io.gfile: local paths, ~ and gs:// alike), sorted; a
    pattern that cannot be listed is refused as `key`'s."""
    pattern = pattern if datafiles.is_remote(pattern) else os.path.abspath(os.path.expanduser(pattern))
    try:
        return sorted(tf.io.gfile.glob(pattern))
    except tf.errors.OpError as error:
        raise ConfigError.for_key(key, pattern, f"cannot be listed: {error.message.splitlines()[0]}") from None


def _header(path: str, compression: Optional[str]) -> List[str]:
    line = next(iter(tf.data.TextLineDataset(path, compression_type=compression or "").take(1)), None)
    if line is None:
        raise ConfigError.for_key("data.train_files", path, "is empty: no header row")
    return [name.strip() for name in line.numpy().decode().split(",")]


def _check_first_record(path: str, read, decode, compression) -> None:
    """Decode the first records of one file now, so that a wrong format or
    feature spec is refused before training, in one line naming the file."""
    try:
        decode(next(iter(read(tf.constant([path])).batch(2))))
    except StopIteration:
        raise ConfigError.for_key("data.train_files", path, "holds no records") from None
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as error:
        raise _bad_file(path, error, compression) from None


def _labels_checked(decode, num_classes: int):
    """Class ids outside [0, num_classes) are refused where they are read,
    naming the file (input_errors_in_one_line), not deep in the loss: the
    loss on CPU fails with no file named, and on a GPU it silently trains
    on garbage."""

    def checked(records):
        features, labels = decode(records)
        if labels.dtype.is_integer:
            tf.debugging.assert_non_negative(labels, message="label: a class id below 0")
            tf.debugging.assert_less(
                labels,
                tf.cast(num_classes, labels.dtype),
                message=f"label: a class id of {num_classes} or more (data.num_classes={num_classes})",
            )
        return features, labels

    return checked


def _bad_file(path: str, error: Exception, compression) -> ConfigError:
    reason = (getattr(error, "message", None) or str(error)).strip().splitlines()[0]
    reason = re.sub(r"\{\{function_node [^}]*\}\}|\[Op:\w+\]( name:)?", "", reason).strip()  # TensorFlow's op names
    reason = re.sub(
        r"^Error in user-defined function passed to \w+:\d+ transformation with iterator: [\w:]+: ", "", reason
    )
    reason = re.sub(r"assertion failed: \[([^\]]*)\].*", r"\1", reason)  # _labels_checked's message, not the tensors
    if isinstance(error, tf.errors.DataLossError) or "corrupted record" in reason:
        if "corrupted record at 0" in reason:
            return ConfigError.for_key(
                "data file",
                path,
                f"not readable as TFRecord from its first byte ({reason}): "
                f"not TFRecord, or not compressed as data.compression={compression or 'null'} says",
            )
        return ConfigError.for_key(
            "data file", path, f"a corrupt record, not readable as TFRecord ({reason.replace('at ', 'at byte ')})"
        )
    named = _FEATURE_IN_ERROR.search(reason)
    key = f"data.features.{named.group(1)}" if named else "data file"
    return ConfigError.for_key(key, path, f"its records do not match the config: {reason[:300]}")


@contextlib.contextmanager
def input_errors_in_one_line(source: DataSource):
    """A record that cannot be read or decoded mid-run (corrupt, or a file
    unlike the first) ends the run as a config error naming the file, not
    as a page of traceback. Found by reading the files again, only then."""
    try:
        yield
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError):
        for split in (source.train, source.eval):
            found = split.find_bad_file() if isinstance(split, FileExamples) else None
            if found:
                raise _bad_file(*found, None) from None
        raise


# -- the writer: tfdistx data write --------------------------------------------


def write(
    source: DataSource,
    out: str,
    shards: int,
    eval_shards: int = 1,
    fmt: str = "tfrecord",
    compression: Optional[str] = None,
) -> dict:
    """Write `source`'s train (and eval) examples into `shards` files each
    (round robin, so shard sizes differ by at most one), plus a manifest.
    Returns the manifest. `out` must be new, empty or an earlier `data
    write`'s (kept aside whole once the new files are complete: shards of
    two writes never mix under one glob)."""
    with new_directory("--out", out, made_by=DATA_FILES) as tmp:
        feature_spec, label_spec = source.element_spec
        names = _feature_names(feature_spec)
        features = {name: _spec_entry(spec) for name, spec in zip(names, tf.nest.flatten(feature_spec))}
        features["label"] = _spec_entry(label_spec)
        manifest = {
            "format": fmt,
            "compression": compression,
            "features": features,
            "label": "label",
            "num_classes": source.num_classes,
            "splits": {},
        }
        suffix = {"tfrecord": ".tfrecord", "csv": ".csv"}[fmt] + {None: "", "GZIP": ".gz", "ZLIB": ".zz"}[compression]
        for split, make, n in (("train", source.train, shards), ("eval", source.eval, eval_shards)):
            if make is None:
                continue
            paths = [os.path.join(tmp, f"{split}-{k:05d}-of-{n:05d}{suffix}") for k in range(n)]
            counts = _write_split(make(None), paths, names, fmt, compression, features)
            manifest["splits"][split] = {"files": {os.path.basename(p): c for p, c in zip(paths, counts)}}
            log.info("%s: %d examples in %d file(s)", split, sum(counts), n)
        with open(os.path.join(tmp, datafiles.MANIFEST), "w") as f:
            json.dump(manifest, f, indent=1)
    return manifest


def _feature_names(feature_spec) -> List[str]:
    """In tf.nest.flatten's order: a dict's sorted keys."""
    return sorted(feature_spec) if isinstance(feature_spec, dict) else ["features"]


def _spec_entry(spec: tf.TensorSpec) -> dict:
    dtype = "string" if spec.dtype == tf.string else "float32" if spec.dtype.is_floating else "int64"
    return {"dtype": dtype, "shape": [int(d) for d in spec.shape]}


def _write_split(dataset, paths, names, fmt, compression, features) -> List[int]:
    counts = [0] * len(paths)
    if fmt == "tfrecord":
        options = tf.io.TFRecordOptions(compression_type=compression or "")
        writers = [tf.io.TFRecordWriter(p, options) for p in paths]
    else:
        writers = [_CsvWriter(p, compression, _csv_header(names, features)) for p in paths]
    i = 0
    try:
        for batch_features, batch_labels in dataset.batch(1024).as_numpy_iterator():
            columns = [*(batch_features[n] for n in names)] if isinstance(batch_features, dict) else [batch_features]
            columns.append(batch_labels)
            for row in range(len(batch_labels)):
                k = i % len(paths)
                values = [c[row] for c in columns]
                writers[k].write(_example(names + ["label"], values, features) if fmt == "tfrecord" else values)
                counts[k] += 1
                i += 1
    finally:
        for w in writers:
            w.close()
    return counts


def _example(names, values, features) -> bytes:
    feature = {}
    for name, value in zip(names, values):
        flat = np.asarray(value).reshape(-1)
        kind = features[name]["dtype"]
        if kind == "float32":
            feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=flat.astype(np.float32)))
        elif kind == "int64":
            feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=flat.astype(np.int64)))
        else:
            feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=list(flat)))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _csv_header(names, features) -> List[str]:
    header = []
    for name in names + ["label"]:
        size = int(np.prod(features[name]["shape"])) if features[name]["shape"] else 0
        header += [f"{name}_{j}" for j in range(size)] if size else [name]
    return header


class _CsvWriter:
    def __init__(self, path, compression, header):
        import gzip
        import zlib

        self._zlib = zlib.compressobj() if compression == "ZLIB" else None
        self._raw = open(path, "wb")
        self._out = gzip.GzipFile(fileobj=self._raw, mode="wb") if compression == "GZIP" else self._raw
        self._write_line(",".join(header))

    def _write_line(self, line: str) -> None:
        data = (line + "\n").encode()
        self._out.write(self._zlib.compress(data) if self._zlib else data)

    def write(self, values) -> None:
        self._write_line(",".join(",".join(_csv_cell(v) for v in np.asarray(value).reshape(-1)) for value in values))

    def close(self) -> None:
        if self._zlib:
            self._raw.write(self._zlib.flush())
        if self._out is not self._raw:
            self._out.close()
        self._raw.close()


def _csv_cell(v) -> str:
    if isinstance(v, bytes):
        return v.decode()
    return repr(float(v)) if isinstance(v, (np.floating, float)) else str(v)
