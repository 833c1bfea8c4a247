"""Predictions from a run's export: the SavedModel's `serving_default`
signature applied to rows of files (TFRecord of tf.train.Example, or CSV
with a header) or to a data source's eval split, written as sharded files.

    tfdistx predict RUN_DIR [--data-files GLOB ...] [--step N] [--out DIR] [--format csv|tfrecord]

The export is strategy-free (engine/export.py rebuilds the model outside any
strategy), so a run trained under any strategy predicts the same way, here,
in one process. The rows are parsed by the export's own input signature:
its names, dtypes and shapes (a one-tensor model's input is `features`);
whatever else the rows hold (a label) is ignored.

Order is kept: the files are read one after another, each in its own
order (no shuffle, no interleave; the parallel decode is deterministic),
and row i of output shard k is row i of input file k. No Hydra here.
"""

import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf

from tfdistx.core import datafiles
from tfdistx.core.errors import ConfigError
from tfdistx.data.files import glob_sorted
from tfdistx.data.sources import DataSource
from tfdistx.rundir import PREDICTIONS, new_directory

FORMATS = tuple(sorted(datafiles.FORMATS))  # those of tfdistx data write: csv, tfrecord
MANIFEST = PREDICTIONS[0]
OUT_KEY = "--out"
FILES_KEY = "--data-files"

# What tf.train.Example holds a dtype as, and the dtype it is parsed in.
_KINDS = {"float_list": "floats", "int64_list": "integers", "bytes_list": "strings"}


@dataclass
class Export:
    """A loaded SavedModel and what its serving signature takes and returns, per row."""

    path: str
    serve: Callable
    inputs: Dict[str, tf.TensorSpec]  # sorted by the signature's input names; shapes without the batch
    outputs: Dict[str, tf.TensorSpec]  # sorted by name; shapes without the batch
    loaded: object = field(repr=False, default=None)  # kept alive: the signature's variables belong to it

    def describe(self, name: str) -> str:
        spec = self.inputs[name]
        return f"{spec.dtype.name} {_shape(spec.shape)}"


def load_export(path: str) -> Export:
    if not tf.io.gfile.exists(os.path.join(path, "saved_model.pb")):
        raise ConfigError.for_key("export", path, "is not a SavedModel (no saved_model.pb)")
    loaded = tf.saved_model.load(path)
    serve = loaded.signatures.get("serving_default")
    if serve is None:
        raise ConfigError.for_key(
            "export", path, f"has no serving_default signature (it has: {', '.join(loaded.signatures) or 'none'})"
        )
    _, named = serve.structured_input_signature
    inputs = {name: tf.TensorSpec(spec.shape[1:], spec.dtype, name=name) for name, spec in sorted(named.items())}
    outputs = {
        name: tf.TensorSpec(spec.shape[1:], spec.dtype, name=name)
        for name, spec in sorted(serve.structured_outputs.items())
    }
    return Export(path, serve, inputs, outputs, loaded)


def fingerprint(path: str) -> Optional[str]:
    """The SavedModel's own checksum (its fingerprint.pb): which model made the predictions."""
    try:
        return str(tf.saved_model.experimental.read_fingerprint(path).saved_model_checksum)
    except Exception:  # an export of a TensorFlow that wrote none
        return None


# -- inputs ----------------------------------------------------------------------


def find_files(patterns: Sequence[str]) -> List[str]:
    """The files the globs name (tf.io.gfile: local and gs:// alike): each
    glob's matches sorted, the globs in the order given, each file once."""
    found = []
    for pattern in patterns:
        matches = [name for name in glob_sorted(FILES_KEY, pattern) if not tf.io.gfile.isdir(name)]
        if not matches:
            raise ConfigError.for_key(FILES_KEY, pattern, "no file matches")
        found += matches
    return list(dict.fromkeys(found))


def file_format(path: str):
    """(format, compression) by the name: .csv, .csv.gz (GZIP), .csv.zz (ZLIB) are CSV; anything else TFRecord."""
    name = path.lower()
    compression = "GZIP" if name.endswith(".gz") else "ZLIB" if name.endswith(".zz") else None
    stem = name[:-3] if compression else name
    return ("csv" if stem.endswith(".csv") else "tfrecord"), compression


@dataclass(frozen=True)
class RowNames:
    """How the rows of files name what the model takes, beyond the
    signature's own names: the run's configuration says (commands/predict.py)."""

    aliases: Mapping[str, str] = field(
        default_factory=dict
    )  # serving input -> the name in the files (`features` -> `image`)
    labels: Sequence[str] = ("label",)  # CSV columns never taken as features
    var_len: Sequence[str] = ()  # features of variable length in the records, padded or cut to the input's shape


def file_rows(path: str, export: Export, batch: int, names: RowNames = RowNames()) -> tf.data.Dataset:
    """Batches of the model's inputs (a dict by input name) from one file,
    in the file's order. The first record (or the header) is checked now:
    a feature the model takes and the file lacks is refused, naming both."""
    fmt, compression = file_format(path)
    decode = (_csv_decoder if fmt == "csv" else _tfrecord_decoder)(path, compression, export, names)
    records = (
        tf.data.TextLineDataset(path, compression_type=compression or "").skip(1)
        if fmt == "csv"
        else tf.data.TFRecordDataset(path, compression_type=compression or "")
    )
    return records.batch(batch).map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).prefetch(2)


def source_rows(source: DataSource, export: Export, batch: int, what: str) -> tf.data.Dataset:
    """Batches of the model's inputs from a data source's eval split (its own
    order; the labels dropped): its raw examples where the export does the
    source's preprocessing itself (data/sources.Served)."""
    if source.eval is None:
        raise ConfigError.for_key("data", what, "has no eval split to predict on: give --data-files GLOB")
    dataset = (
        source.served.raw_eval(None) if source.served is not None and source.served.raw_eval else source.eval(None)
    )
    features, _ = dataset.element_spec
    if isinstance(features, dict):
        missing = [name for name in export.inputs if name not in features]
        if missing:
            raise ConfigError.for_key(
                "data",
                what,
                f"gives no feature {missing[0]!r}, which the model takes "
                f"({export.describe(missing[0])}); it gives: {', '.join(sorted(features))}",
            )
        pick = lambda x: {name: x[name] for name in export.inputs}  # noqa: E731
    elif len(export.inputs) == 1:
        pick = lambda x: {next(iter(export.inputs)): x}  # noqa: E731
    else:
        raise ConfigError.for_key("data", what, f"gives one tensor; the model takes {', '.join(export.inputs)}")

    def inputs(x, _):
        return {name: tf.cast(value, export.inputs[name].dtype) for name, value in pick(x).items()}

    # Examples of varying shapes (images of any size, which the export resizes) go to the model one at a time.
    varying = any(not spec.shape.is_fully_defined() for spec in tf.nest.flatten(dataset.element_spec[0]))
    return dataset.map(inputs).batch(1 if varying else batch).prefetch(2)


def _parsed_as(dtype: tf.DType) -> tf.DType:
    return tf.string if dtype == tf.string else tf.float32 if dtype.is_floating else tf.int64


def _kind(dtype: tf.DType) -> str:
    return {tf.string: "bytes_list", tf.float32: "float_list", tf.int64: "int64_list"}[_parsed_as(dtype)]


def _size(shape) -> int:
    return int(np.prod(shape.as_list())) if shape.rank else 1


def _shape(shape) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape.as_list()) + "]"


def _fixed(export: Export, name: str, path: str) -> None:
    if not export.inputs[name].shape.is_fully_defined():
        raise ConfigError.for_key(
            FILES_KEY,
            path,
            f"the model's input {name!r} has shape {_shape(export.inputs[name].shape)}: "
            "predict reads rows of a fixed shape from files (predict from the run's data source instead)",
        )


def _first_record(path: str, compression: Optional[str]) -> Optional[bytes]:
    try:
        for record in tf.data.TFRecordDataset(path, compression_type=compression or "").take(1):
            return record.numpy()
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as error:
        raise ConfigError.for_key(
            FILES_KEY,
            path,
            f"not readable as TFRecord ({_reason(error)}): a TFRecord file "
            f"{'compressed with ' + compression if compression else 'not compressed'}, or a .csv/.csv.gz with a header",
        ) from None
    if tf.io.gfile.stat(path).length:  # a few bytes that are not a whole record: not an empty TFRecord file
        raise ConfigError.for_key(
            FILES_KEY,
            path,
            f"holds {tf.io.gfile.stat(path).length} bytes but no TFRecord record: not TFRecord "
            f"({'compressed with ' + compression if compression else 'not compressed'}), or a .csv/.csv.gz with a "
            "header",
        )
    return None


def _tfrecord_decoder(path: str, compression: Optional[str], export: Export, names: RowNames):
    """A batch of serialized tf.train.Examples to the model's inputs, in one parse_example."""
    first = _first_record(path, compression)
    held = {}
    if first is not None:
        try:
            held = dict(tf.train.Example.FromString(first).features.feature)
        except Exception:  # protobuf's DecodeError
            raise ConfigError.for_key(FILES_KEY, path, "its records are not tf.train.Example") from None
    spec, keys, lengths = {}, {}, {}
    for name, want in export.inputs.items():
        key = name if name in held or first is None else names.aliases.get(name, name)
        if first is not None and key not in held:
            raise ConfigError.for_key(
                FILES_KEY,
                path,
                f"its records have no feature {name!r}, which the model takes "
                f"({export.describe(name)}); they hold: {', '.join(sorted(held)) or 'no features'}",
            )
        _fixed(export, name, path)
        var_len = key in names.var_len or name in names.var_len
        if key in held:
            kind = held[key].WhichOneof("kind")
            values = len(getattr(held[key], kind).value) if kind else 0
            if kind and kind != _kind(want.dtype):
                raise ConfigError.for_key(
                    FILES_KEY, path, f"feature {key!r} holds {_KINDS[kind]}; the model takes {export.describe(name)}"
                )
            if not var_len and kind and values != _size(want.shape):
                raise ConfigError.for_key(
                    FILES_KEY,
                    path,
                    f"feature {key!r} holds {values} value(s) per record; the model takes "
                    f"{export.describe(name)}: {_size(want.shape)}",
                )
        keys[name] = key
        if var_len and want.shape.rank == 1:
            spec[key], lengths[name] = tf.io.RaggedFeature(_parsed_as(want.dtype)), want.shape[0]
        else:
            spec[key] = tf.io.FixedLenFeature(want.shape, _parsed_as(want.dtype))

    def decode(records):
        parsed = tf.io.parse_example(records, spec)
        inputs = {}
        for name, key in keys.items():
            value = parsed[key]
            if name in lengths:
                value = value.to_tensor(shape=[None, lengths[name]])
            inputs[name] = tf.cast(value, export.inputs[name].dtype)
        return inputs

    return decode


def _csv_header(path: str, compression: Optional[str]) -> List[str]:
    try:
        line = next(iter(tf.data.TextLineDataset(path, compression_type=compression or "").take(1)), None)
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as error:
        raise ConfigError.for_key(
            FILES_KEY,
            path,
            f"cannot be read as {'GZIP' if compression == 'GZIP' else 'ZLIB' if compression else 'plain'} "
            f"text ({_reason(error)})",
        ) from None
    if line is None:
        raise ConfigError.for_key(FILES_KEY, path, "is empty: a CSV file starts with a header row naming its columns")
    return [name.strip() for name in line.numpy().decode(errors="replace").split(",")]


def _csv_columns(path: str, header: List[str], export: Export, names: RowNames) -> Dict[str, List[str]]:
    """The header's columns that make each of the model's inputs, in order.
    An input NAME of shape [] is the column NAME; of any other shape, the
    columns NAME_0 ... NAME_{n-1} of its values flattened (as `tfdistx data
    write` writes them). A one-tensor model (`features`) without such
    columns takes every column but the label, in file order."""
    columns = {}
    for name, want in export.inputs.items():
        _fixed(export, name, path)
        size = _size(want.shape)
        key = names.aliases.get(name, name) if name not in header and f"{name}_0" not in header else name
        wanted = [key] if want.shape.rank == 0 else [f"{key}_{j}" for j in range(size)]
        if size == 1 and key in header:
            wanted = [key]
        if all(c in header for c in wanted):
            columns[name] = wanted
            continue
        if len(export.inputs) == 1:
            rest = [c for c in header if c not in set(names.labels)]
            if len(rest) != size:
                raise ConfigError.for_key(
                    FILES_KEY,
                    path,
                    f"has {len(rest)} column(s) besides the label ({_listed(rest)}); the model takes "
                    f"{export.describe(name)}: {size} value(s) (columns {wanted[0]}..., or every column but "
                    f"{' and '.join(names.labels)})",
                )
            columns[name] = rest
            continue
        missing = next(c for c in wanted if c not in header)
        raise ConfigError.for_key(
            FILES_KEY,
            path,
            f"has no column {missing!r} for the model's input {name!r} ({export.describe(name)}); "
            f"its header: {_listed(header)}",
        )
    return columns


def _listed(names: Sequence[str], most: int = 8) -> str:
    return ", ".join(names[:most]) + (f", ... ({len(names)} in all)" if len(names) > most else "") if names else "none"


def _csv_decoder(path: str, compression: Optional[str], export: Export, names: RowNames):
    """A batch of CSV lines to the model's inputs, in one decode_csv of the columns used."""
    header = _csv_header(path, compression)
    columns = _csv_columns(path, header, export, names)
    dtype_of = {c: _csv_dtype(export.inputs[name].dtype) for name, cs in columns.items() for c in cs}
    used = sorted({header.index(c) for c in dtype_of})  # decode_csv's select_cols: ascending
    position = {header[i]: k for k, i in enumerate(used)}
    defaults = [tf.constant([], dtype_of[header[i]]) for i in used]  # every used column required

    def decode(lines):
        values = tf.io.decode_csv(lines, record_defaults=defaults, select_cols=used)
        inputs = {}
        for name, cs in columns.items():
            want = export.inputs[name]
            if want.shape.rank == 0:
                value = values[position[cs[0]]]
            else:
                value = tf.reshape(tf.stack([values[position[c]] for c in cs], axis=1), [-1, *want.shape.as_list()])
            inputs[name] = tf.cast(value, want.dtype)
        return inputs

    return decode


def _csv_dtype(dtype: tf.DType) -> tf.DType:
    return (
        tf.string
        if dtype == tf.string
        else tf.float64
        if dtype == tf.float64
        else tf.float32
        if dtype.is_floating
        else tf.int64
    )


def _reason(error: Exception) -> str:
    reason = (getattr(error, "message", None) or str(error)).strip().splitlines()[0]
    reason = re.sub(r"\{\{function_node [^}]*\}\}|\[Op:\w+\]( name:)?", "", reason).strip()
    return reason[:300]


# -- outputs ---------------------------------------------------------------------


def columns(export: Export) -> List[str]:
    """The CSV header of the outputs, each flattened: NAME for one value a
    row, NAME_0 ... NAME_{n-1} otherwise (`probabilities_0`...)."""
    header = []
    for name, spec in export.outputs.items():
        header += [name] if spec.shape.rank == 0 else [f"{name}_{j}" for j in range(_size(spec.shape))]
    return header


class _CsvShard:
    def __init__(self, path: str, export: Export):
        self._file = open(path, "w")
        self._file.write(",".join(columns(export)) + "\n")

    def write(self, arrays: List[np.ndarray]) -> None:
        rows = len(arrays[0])
        cells = [_text(a.reshape(rows, -1)) for a in arrays]
        self._file.writelines(",".join(row) + "\n" for row in np.concatenate(cells, axis=1).tolist())

    def close(self) -> None:
        self._file.close()


def _text(block: np.ndarray) -> np.ndarray:
    """Cells as text: floats in their shortest form that reads back to the same float32."""
    if block.dtype == object or block.dtype.kind == "S":
        return np.vectorize(lambda v: v.decode() if isinstance(v, bytes) else str(v), otypes=[object])(block).astype(
            str
        )
    if block.dtype == bool:
        block = block.astype(np.int64)
    return block.astype(str)


class _TFRecordShard:
    def __init__(self, path: str, export: Export):
        self._writer = tf.io.TFRecordWriter(path)
        self._names = list(export.outputs)

    def write(self, arrays: List[np.ndarray]) -> None:
        rows = len(arrays[0])
        flat = [a.reshape(rows, -1) for a in arrays]
        for i in range(rows):
            feature = {name: _feature(block[i]) for name, block in zip(self._names, flat)}
            self._writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())

    def close(self) -> None:
        self._writer.close()


def _feature(values: np.ndarray) -> tf.train.Feature:
    if values.dtype == object or values.dtype.kind == "S":
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=list(values)))
    if values.dtype.kind == "f":
        return tf.train.Feature(float_list=tf.train.FloatList(value=values.astype(np.float32)))
    return tf.train.Feature(int64_list=tf.train.Int64List(value=values.astype(np.int64)))


@dataclass
class Part:
    """One input: a file (or the data source's eval split) and its batches of inputs."""

    name: str
    rows: tf.data.Dataset
    is_file: bool = True


def predict(
    export: Export,
    parts: Callable[[], List[Part]],
    out: str,
    fmt: str,
    protected=(),
    progress: Optional[Callable[[int, int, int, bool], None]] = None,
    about: Optional[dict] = None,
) -> dict:
    """Write one shard of predictions per part, in order, and predictions.json;
    returns that manifest. `parts` is called once the output directory is
    known to be writable (it reads every file's first record or header, so
    a bad file is refused before any prediction). `out` is written beside and
    moved in whole (rundir.new_directory: an earlier predict's is kept aside,
    any other directory refused). `progress(done, total, rows, finished)`
    after each batch and each part."""
    if fmt not in FORMATS:
        raise ConfigError.for_key("--format", fmt, f"one of {', '.join(FORMATS)}")
    if fmt == "csv":
        unknown = [name for name, spec in export.outputs.items() if not spec.shape.is_fully_defined()]
        if unknown:
            raise ConfigError.for_key(
                "--format",
                fmt,
                f"the model's output {unknown[0]!r} has shape "
                f"{_shape(export.outputs[unknown[0]].shape)}, not a fixed number of columns: use --format tfrecord",
            )
    progress = progress or (lambda *_: None)
    with new_directory(OUT_KEY, out, protected, made_by=PREDICTIONS) as tmp:
        found = parts()
        total, written, started = len(found), [], time.monotonic()
        rows_so_far = 0
        for k, part in enumerate(found):
            shard = f"predictions-{k:05d}-of-{total:05d}.{fmt}"
            writer = (_CsvShard if fmt == "csv" else _TFRecordShard)(os.path.join(tmp, shard), export)
            rows = 0
            try:
                for batch in part.rows:
                    outputs = export.serve(**batch)
                    arrays = [outputs[name].numpy() for name in export.outputs]
                    writer.write(arrays)
                    rows += len(arrays[0])
                    progress(k, total, rows_so_far + rows, False)
            except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as error:
                raise ConfigError.for_key(
                    FILES_KEY if part.is_file else "data", part.name, f"cannot be read to its end: {_reason(error)}"
                ) from None
            finally:
                writer.close()
            rows_so_far += rows
            written.append({"file" if part.is_file else "source": part.name, "rows": rows, "predictions": shard})
            progress(k + 1, total, rows_so_far, True)
        manifest = {
            **(about or {}),
            "export": {
                "path": os.path.abspath(export.path),
                **((about or {}).get("export") or {}),
                "saved_model_checksum": fingerprint(export.path),
            },
            "format": fmt,
            "rows": rows_so_far,
            "inputs": written,
            "model_inputs": {
                name: {"shape": spec.shape.as_list(), "dtype": spec.dtype.name} for name, spec in export.inputs.items()
            },
            "outputs": {
                name: {"shape": spec.shape.as_list(), "dtype": spec.dtype.name} for name, spec in export.outputs.items()
            },
            "seconds": round(time.monotonic() - started, 3),
        }
        with open(os.path.join(tmp, MANIFEST), "w") as f:
            json.dump(manifest, f, indent=1)
    return manifest
