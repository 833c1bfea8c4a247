"""Any TensorFlow Datasets dataset by name (`data=tfds data.name=NAME`).

The dataset's features say what it is, read from its DatasetInfo:
- its **features** (the supervised pair's first part, or `features=` by
  name): images (scaled to [0, 1], resized to `image_size` when given), a
  text (token ids of a Keras TextVectorization adapted on the train split),
  or numbers (a table's columns, or a tensor of them: one float vector, a
  class-label column one-hot);
- its **label** (the supervised pair's second part, or `label=`): a class
  label (classification, `num_classes`), several class labels (multilabel,
  multi-hot), or a number (regression). `task=auto` (data=tfds's task)
  takes the task it calls for; `task=NAME` picks one.

What is done to the features before the model (the `Served` layer) is done
again inside the export, so that the exported model takes what the dataset
holds: uint8 pixels, strings, a table's columns by name. What it learnt
from the data (a text's vocabulary) is kept with the run, in `state_dir`,
and read back there by a resumed run, `tfdistx export` and `predict`: the
same token ids whatever the dataset on disk has become.

Nothing of the cluster here: a pipeline is sharded by the InputContext it
is given.
"""

import contextlib
import logging
import re
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import keras
import tensorflow as tf

from tfdistx.data.sources import DataSource, PipelineFn, Served, shard
from tfdistx.core.errors import EXIT_NO_NETWORK, ConfigError, RunFault, first_line

log = logging.getLogger(__name__)

IMAGE, TEXT, NUMBERS = "images", "text", "numbers"  # the kinds of features
VOCABULARY = "vocabulary.txt"  # a text's vocabulary in the state dir: a token a line, without the padding and [UNK]
DOWNLOAD_SITE = "https://storage.googleapis.com"


def tfds(
    name: str,
    train_split: str = "train",
    eval_split: Optional[str] = "test",
    data_dir: Optional[str] = None,
    download: bool = True,
    download_check_url: str = DOWNLOAD_SITE,
    seed: int = 0,
    features: Union[None, str, Sequence[str]] = None,
    label: Optional[str] = None,
    image_size: Optional[Sequence[int]] = None,
    vocab_size: int = 20000,
    sequence_length: int = 256,
    state_dir: Optional[str] = None,
) -> DataSource:
    """A TensorFlow Datasets dataset: its kind of features and labels read
    from its DatasetInfo (above). `state_dir`: where the run keeps what the
    preprocessing learnt (tfdistx passes it)."""
    import tensorflow_datasets

    try:
        with _scratch_tempdir(), _absl_warnings_off():
            builder = tensorflow_datasets.builder(name, data_dir=data_dir)
            prepared = builder.is_prepared()
            builder_dir = builder.data_dir
    except tensorflow_datasets.core.registered.DatasetNotFoundError:
        raise ConfigError.for_key(
            "data.name",
            name,
            "not a tensorflow-datasets dataset (see `tfds.list_builders()`); tfdistx ships mnist, fashion_mnist, "
            "cifar10 as data=NAME, and any other as data=tfds data.name=NAME",
        ) from None
    if download and not prepared:
        _ensure_reachable(name, builder_dir, download_check_url)
        builder.download_and_prepare()

    info = builder.info
    feature_keys, label_key = _keys(name, info, features, label)
    connectors = info.features
    picked = {key: _connector(connectors, key, "data.features") for key in feature_keys}
    kind = _features_kind(name, picked)
    label_connector = _connector(connectors, label_key, "data.label")
    labels, num_classes, to_label = _labels(name, label_key, label_connector)

    def read(split: str, ctx) -> tf.data.Dataset:
        """(raw features, label) of one split, this input pipeline's share."""
        # tfds shards by file for an input pipeline known in Python with enough files; otherwise (a parameter-server
        # worker's index is a tensor; fewer files than pipelines) by element.
        by_file = ctx if ctx is not None and isinstance(ctx.input_pipeline_id, int) else None
        if by_file is not None and _files(info, split) < ctx.num_input_pipelines:
            by_file = None
        read_config = tensorflow_datasets.ReadConfig(input_context=by_file, shuffle_seed=seed)
        try:
            # an ordered dataset (disable_shuffling) is read in its order: tfds refuses to shuffle its files
            ds = builder.as_dataset(split=split, shuffle_files=not info.disable_shuffling, read_config=read_config)
        except AssertionError as error:  # tfds' way of saying "not prepared"
            raise ConfigError.for_key(
                "data.download",
                download,
                f"{name} is not prepared in {builder.data_dir} ({error}); set data.download=true or data.data_dir",
            ) from None
        except ValueError as error:  # a split it does not have, a slice it cannot make
            raise ConfigError.for_key(
                "data.train_split" if split == train_split else "data.eval_split",
                split,
                f"{first_line(error)} (the splits of {name}: {', '.join(info.splits) or 'not known'})",
            ) from None
        if by_file is None and ctx is not None:
            ds = shard(ds, ctx)
        return ds.map(lambda example: (_raw(example, feature_keys, kind), to_label(example[label_key])))

    raw_spec = read(train_split, None).element_spec[0]
    layer, vocabulary = _preprocessing(
        kind, raw_spec, picked, image_size, vocab_size, sequence_length, state_dir, lambda: read(train_split, None)
    )

    def pipeline(split: str) -> PipelineFn:
        def make(ctx):
            return read(split, ctx).map(lambda x, y: (layer(x), y), num_parallel_calls=tf.data.AUTOTUNE)

        return make

    def raw(split: str) -> PipelineFn:
        return lambda ctx: read(split, ctx)

    splits = info.splits
    train_examples = _examples(splits, train_split)
    return DataSource(
        train=pipeline(train_split),
        eval=pipeline(eval_split) if eval_split else None,
        num_classes=num_classes,
        train_examples=train_examples or None,
        labels=labels,
        vocab_size=len(layer.get_vocabulary()) if kind == TEXT else None,
        served=Served(
            features=_batched_spec(raw_spec),
            layer=layer,
            raw_eval=raw(eval_split) if eval_split else None,
            state={VOCABULARY: "\n".join(vocabulary) + "\n"} if vocabulary is not None else {},
            kind=kind,
        ),
    )


# -- what the dataset's features and label are ---------------------------------------


def _keys(name: str, info, features, label) -> Tuple[List[str], str]:
    """The feature keys and the label key: `features`/`label` as given, else the supervised pair's."""
    supervised = info.supervised_keys
    if supervised is None and {"image", "label"} <= set(info.features.keys()):
        supervised = ("image", "label")  # a dataset built without supervised_keys, like tfds.testing's DummyMnist
    if features is None or label is None:
        if supervised is None:
            have = ", ".join(info.features.keys())
            missing = " and ".join(
                key for key, value in (("data.features", features), ("data.label", label)) if value is None
            )
            raise ConfigError.for_key(
                "data.name",
                name,
                f"has no supervised (features, label) pair: name its keys with {missing} (its features: {have})",
            )
        x, y = supervised[0], supervised[1]
        if features is None:
            features = list(x.values()) if isinstance(x, dict) else list(x) if isinstance(x, (tuple, list)) else x
        if label is None:
            if not isinstance(y, str):
                raise ConfigError.for_key(
                    "data.label", None, f"{name}'s supervised label is several features ({y}): name one with data.label"
                )
            label = y
    keys = [features] if isinstance(features, str) else list(features)
    if not keys or not all(isinstance(key, str) for key in keys):
        raise ConfigError.for_key("data.features", features, "a feature's name, or a list of them")
    if label in keys:
        raise ConfigError.for_key("data.label", label, "is also one of data.features: the label is not an input")
    return keys, label


def _connector(connectors, key: str, what: str):
    try:
        return connectors[key]
    except KeyError:
        raise ConfigError.for_key(
            what, key, f"no such feature; the dataset's features: {', '.join(connectors.keys())}"
        ) from None


def _features_kind(name: str, picked: Dict[str, Any]) -> str:
    """images, text or numbers: one kind for all the picked features."""
    kinds = {key: _kind(connector) for key, connector in picked.items()}
    bad = {key: kind for key, kind in kinds.items() if kind is None}
    if bad:
        key = next(iter(bad))
        raise ConfigError.for_key(
            "data.features",
            key,
            f"{name}'s feature {key!r} is {type(picked[key]).__name__} {_shape_text(picked[key])}: tfdistx reads "
            "images, a text, or numbers (pick others with data.features, or use a data._target_ of your own)",
        )
    found = set(kinds.values())
    if len(found) > 1 or (found & {IMAGE, TEXT} and len(kinds) > 1):
        raise ConfigError.for_key(
            "data.features",
            list(picked),
            f"{name}'s features are {', '.join(f'{k}: {v}' for k, v in kinds.items())}: tfdistx reads one image, one "
            "text, or numbers (pick with data.features)",
        )
    return found.pop()


def _kind(connector) -> Optional[str]:
    import tensorflow_datasets

    features = tensorflow_datasets.features
    if isinstance(connector, features.Image):
        return IMAGE
    if isinstance(connector, features.FeaturesDict):
        inner = {_kind(value) for value in connector.values()}
        return NUMBERS if inner == {NUMBERS} else None
    if not isinstance(connector, features.Tensor):
        return None
    if connector.tf_dtype == tf.string:
        return TEXT if tuple(connector.shape) == () else None
    if isinstance(connector, features.ClassLabel) or (
        (connector.tf_dtype.is_floating or connector.tf_dtype.is_integer or connector.tf_dtype == tf.bool)
        and None not in tuple(connector.shape)
    ):
        return NUMBERS
    return None


def _labels(name: str, key: str, connector):
    """(what the labels are, num_classes, the label's conversion): a class label, several, or numbers."""
    import tensorflow_datasets

    features = tensorflow_datasets.features
    if isinstance(connector, features.ClassLabel) and tuple(connector.shape) == ():
        return DataSource.CLASS, connector.num_classes, lambda y: y
    if isinstance(connector, features.Sequence) and isinstance(connector.feature, features.ClassLabel):
        classes = connector.feature.num_classes
        return (
            DataSource.CLASSES,
            None,
            lambda y: tf.reduce_max(tf.one_hot(tf.reshape(tf.cast(y, tf.int64), [-1]), classes), axis=0),
        )
    if (
        isinstance(connector, features.Tensor)
        and (connector.tf_dtype.is_floating or connector.tf_dtype.is_integer or connector.tf_dtype == tf.bool)
        and None not in tuple(connector.shape)
    ):
        if connector.tf_dtype == tf.bool and len(connector.shape) == 1:  # a multi-hot vector
            return DataSource.CLASSES, None, lambda y: tf.cast(y, tf.float32)
        return DataSource.VALUES, None, lambda y: tf.cast(y, tf.float32)
    raise ConfigError.for_key(
        "data.label",
        key,
        f"{name}'s {key!r} is {type(connector).__name__} {_shape_text(connector)}: a label is a class label, "
        "several class labels, or numbers (name another with data.label)",
    )


def _shape_text(connector) -> str:
    try:
        return f"{connector.tf_dtype.name} {tuple(connector.shape)}"
    except AttributeError:  # a FeaturesDict, a Sequence
        return ""


def _raw(example: dict, keys: List[str], kind: str):
    """The raw features of an example: one tensor (an image, a text, a tensor of numbers), or a table's
    columns by name (named as the export's inputs are: `export_name`)."""
    if len(keys) == 1 and not isinstance(example[keys[0]], dict):
        return example[keys[0]]
    columns = {}
    for key in keys:
        value = example[key]
        if isinstance(value, dict):
            for name, column in _flat(value).items():
                columns[export_name(name)] = column
        else:
            columns[export_name(key)] = value
    return columns


def _flat(row: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in row.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}/"))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def export_name(key: str) -> str:
    """A feature's name as an input of the export (a SavedModel's input names take letters, digits and _):
    `fixed acidity` -> `fixed_acidity`, `features/cut` -> `features_cut`."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", key)
    return name if re.match(r"[A-Za-z]", name) else f"f_{name}"


def _files(info, split: str) -> int:
    """How many files a split is read from (0: not known)."""
    try:
        return int(info.splits[split].num_shards)
    except Exception:  # a slice tfds cannot size, or splits not known (tfds.testing.mock_data)
        return 0


def _examples(splits, split: str) -> Optional[int]:
    try:
        return int(splits[split].num_examples)
    except Exception:  # splits not known (a dataset mocked without its metadata), or a split it lacks
        return None


def _batched_spec(spec):
    """One example's spec as the export's input signature: a batch of them, named."""
    if isinstance(spec, dict):
        return {name: tf.TensorSpec([None, *s.shape], s.dtype, name=name) for name, s in spec.items()}
    return tf.TensorSpec([None, *spec.shape], spec.dtype, name="features")


# -- the preprocessing: in the pipelines, and again in the export --------------------------


def _preprocessing(kind, raw_spec, picked, image_size, vocab_size, sequence_length, state_dir, train):
    """(the Keras layer from raw features to the model's, the text's vocabulary or None)."""
    if kind == IMAGE:
        shape = tuple(raw_spec.shape)
        if image_size is None and None in shape:
            raise ConfigError.for_key(
                "data.image_size",
                None,
                f"the images are of varying sizes ({_dims(shape)}): set data.image_size=[HEIGHT,WIDTH] to resize them",
            )
        return ImagePixels(size=image_size), None
    if kind == TEXT:
        kept = Path(state_dir, VOCABULARY) if state_dir else None
        if kept is not None and kept.is_file():  # the run's own: the token ids its model was trained on
            vocabulary = kept.read_text().splitlines()
            layer = keras.layers.TextVectorization(
                vocabulary=vocabulary, output_sequence_length=int(sequence_length), name="tokens"
            )
        else:
            layer = keras.layers.TextVectorization(
                max_tokens=int(vocab_size), output_sequence_length=int(sequence_length), name="tokens"
            )
            layer.adapt(train().map(lambda x, y: x).batch(1024))
        return layer, layer.get_vocabulary(include_special_tokens=False)
    if isinstance(raw_spec, dict):
        columns = [(name, classes, tuple(raw_spec[name].shape)) for name, classes in _columns(picked)]
    else:
        columns = [(None, 0, tuple(raw_spec.shape))]
    return TableColumns(columns=columns), None


def _dims(shape) -> str:
    return "x".join("?" if d is None else str(d) for d in shape)


def _columns(picked: Dict[str, Any]) -> List[Tuple[str, int]]:
    """The table's columns in order, as `_raw` names them: (export name, classes: a class label's count, one-hot;
    0 for numbers). A FeaturesDict's columns are its own features' (diamonds' `features`: carat, cut ...)."""
    import tensorflow_datasets

    found = []

    def add(path: str, connector, top: bool) -> None:
        if isinstance(connector, tensorflow_datasets.features.FeaturesDict):
            for inner, value in connector.items():
                add(inner if top else f"{path}/{inner}", value, False)
        else:
            classes = connector.num_classes if isinstance(connector, tensorflow_datasets.features.ClassLabel) else 0
            found.append((export_name(path), int(classes)))

    for key, connector in picked.items():
        add(key, connector, True)
    return found


class ImagePixels(keras.layers.Layer):
    """Pixels as the model takes them: float32 in [0, 1] (integer images
    scaled by their dtype's largest value), resized to `size` when given
    (bilinear). On one image or a batch."""

    def __init__(self, size: Optional[Sequence[int]] = None, **kwargs):
        super().__init__(dtype="float32", **kwargs)
        self.size = [int(d) for d in size] if size else None

    def call(self, images):
        scale = float(images.dtype.max) if images.dtype.is_integer else 1.0
        pixels = tf.cast(images, tf.float32) / scale
        return tf.image.resize(pixels, self.size) if self.size else pixels


class TableColumns(keras.layers.Layer):
    """A table's row as one float32 vector: each column of numbers as it is
    (a tensor flattened), each class-label column one-hot. `columns`: (name,
    classes, one example's shape) in order, classes 0 for numbers; a name
    of None: the features are that one tensor. On one row or a batch (a
    column of more dimensions than its example's)."""

    def __init__(self, columns: Sequence[Tuple[Optional[str], int, Sequence[int]]], **kwargs):
        super().__init__(dtype="float32", **kwargs)
        self.columns = [(name, int(classes), tuple(int(d) for d in shape)) for name, classes, shape in columns]

    def call(self, row):
        parts = []
        for name, classes, shape in self.columns:
            value = row if name is None else row[name]
            batched = value.shape.rank > len(shape)
            if classes:
                parts.append(tf.one_hot(tf.cast(value, tf.int64), classes))
            else:
                size = 1
                for d in shape:
                    size *= d
                parts.append(tf.reshape(tf.cast(value, tf.float32), [-1, size] if batched else [size]))
        return tf.concat(parts, axis=-1)


# -- reading: offline first -----------------------------------------------------------------


@contextlib.contextmanager
def _absl_warnings_off():
    """tensorflow-datasets warns through absl that a dataset not yet
    downloaded has no dataset_info.json in its folder: a line before
    tfdistx's own, which says what is missing and what to do."""
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        yield
    finally:
        absl.setLevel(level)


@contextlib.contextmanager
def _scratch_tempdir():
    """tensorflow-datasets makes a temp dir (`/tmp/tmpXXXXtfds`) for an
    unprepared builder's info and never removes it: one per run. Its temp
    dirs go into one of ours for the call, removed after."""
    with tempfile.TemporaryDirectory(prefix="tfdistx-tfds-") as scratch:
        saved, tempfile.tempdir = tempfile.tempdir, scratch
        try:
            yield
        finally:
            tempfile.tempdir = saved


def _ensure_reachable(name: str, data_dir: str, url: str) -> None:
    """Fail in seconds, not minutes, when a download cannot work.

    Offline, tfds retries every file for minutes before it gives up; compute
    nodes and CI machines often have no network at all.
    """
    import requests

    try:
        requests.head(url, timeout=5)
    except requests.RequestException as error:  # the machine's fault, not the config's: its own exit code, not 2
        reason = type(error).__name__
        raise RunFault(
            f"data={name} is not downloaded to {data_dir}, and the download site is unreachable from this machine "
            f"({reason}): download it once on a machine with a network and set data.data_dir to that copy, "
            f"or use data=synthetic (exit {EXIT_NO_NETWORK})",
            EXIT_NO_NETWORK,
        ) from None
