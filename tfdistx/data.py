"""Data sources: what to train on, before any strategy is involved.

A data `_target_` returns a DataSource: functions that build the *unbatched*
(features, label) pipelines for one input pipeline (an InputContext, or None
for a single pipeline), plus the shapes a model needs. Batching, shuffling,
prefetching and how the pipelines meet replicas is `input.py`'s job, so a
user's own data function (`data._target_=mypkg.make_data`) only has to say
where the examples come from.
"""

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import tensorflow as tf

from tfdistx.errors import ConfigError

PipelineFn = Callable[[Optional[tf.distribute.InputContext]], tf.data.Dataset]


@dataclass
class DataSource:
    train: PipelineFn
    eval: Optional[PipelineFn]
    input_shape: tuple
    num_classes: int
    train_examples: Optional[int] = None


def shard(dataset: tf.data.Dataset, context: Optional[tf.distribute.InputContext]) -> tf.data.Dataset:
    """Give each input pipeline its own slice of an in-memory dataset."""
    if context is None or context.num_input_pipelines == 1:
        return dataset
    return dataset.shard(context.num_input_pipelines, context.input_pipeline_id)


def synthetic(
    image_shape: Sequence[int] = (28, 28, 1),
    num_classes: int = 10,
    train_examples: int = 8192,
    eval_examples: int = 1024,
    seed: int = 0,
) -> DataSource:
    """Uniform random images labelled by a fixed random linear rule.

    The rule makes the task learnable (loss falls, accuracy rises well above
    chance), so a short run shows whether training works, with no download.
    """
    rng = np.random.default_rng(seed)
    shape = tuple(int(d) for d in image_shape)
    rule = rng.standard_normal((int(np.prod(shape)), num_classes)).astype(np.float32)

    def make(n: int):
        images = rng.random((n, *shape), dtype=np.float32)
        labels = np.argmax((images.reshape(n, -1) - 0.5) @ rule, axis=1).astype(np.int64)
        return images, labels

    train, evaluation = make(train_examples), make(eval_examples)
    return DataSource(
        train=lambda ctx: shard(tf.data.Dataset.from_tensor_slices(train), ctx),
        eval=lambda ctx: shard(tf.data.Dataset.from_tensor_slices(evaluation), ctx),
        input_shape=shape,
        num_classes=num_classes,
        train_examples=train_examples,
    )


def synthetic_categorical(
    num_fields: int = 8,
    vocab_size: int = 100_000,
    num_classes: int = 2,
    train_examples: int = 8192,
    eval_examples: int = 1024,
    seed: int = 0,
) -> DataSource:
    """Rows of hashed categorical ids (click-log shaped) for wide & deep.

    Ids are Zipf-distributed, as real categorical features are; the label is
    a fixed random function of the ids, so the embeddings have something to learn.
    """
    rng = np.random.default_rng(seed)
    weights = rng.standard_normal((vocab_size, num_classes)).astype(np.float32)

    def make(n: int):
        ids = (rng.zipf(1.3, size=(n, num_fields)) % vocab_size).astype(np.int64)
        labels = np.argmax(weights[ids].sum(axis=1), axis=1).astype(np.int64)
        return ids, labels

    train, evaluation = make(train_examples), make(eval_examples)
    return DataSource(
        train=lambda ctx: shard(tf.data.Dataset.from_tensor_slices(train), ctx),
        eval=lambda ctx: shard(tf.data.Dataset.from_tensor_slices(evaluation), ctx),
        input_shape=(num_fields,),
        num_classes=num_classes,
        train_examples=train_examples,
    )


def tfds(
    name: str,
    train_split: str = "train",
    eval_split: Optional[str] = "test",
    data_dir: Optional[str] = None,
    download: bool = True,
    download_check_url: str = "https://storage.googleapis.com",
    seed: int = 0,
) -> DataSource:
    """An image-classification dataset from tensorflow-datasets, scaled to [0, 1]."""
    import tensorflow_datasets as tensorflow_datasets

    try:
        builder = tensorflow_datasets.builder(name, data_dir=data_dir)
    except tensorflow_datasets.core.registered.DatasetNotFoundError:
        raise ConfigError.one("data.name", name, "not a tensorflow-datasets dataset (see `tfds.list_builders()`); tfdistx ships mnist, fashion_mnist, cifar10") from None
    if download and not builder.is_prepared():
        _ensure_reachable(name, builder.data_dir, download_check_url)
        builder.download_and_prepare()

    features = builder.info.features
    image_key = "image" if "image" in features else next(iter(features))

    def pipeline(split: str) -> PipelineFn:
        def make(ctx):
            read_config = tensorflow_datasets.ReadConfig(input_context=ctx, shuffle_seed=seed)
            try:
                ds = builder.as_dataset(split=split, as_supervised=True, shuffle_files=True, read_config=read_config)
            except AssertionError as error:  # tfds' way of saying "not prepared"
                raise ConfigError.one("data.download", download, f"{name} is not prepared in {builder.data_dir} ({error}); set data.download=true or data.data_dir") from None
            return ds.map(lambda x, y: (tf.cast(x, tf.float32) / 255.0, y), num_parallel_calls=tf.data.AUTOTUNE)

        return make

    splits = builder.info.splits
    train_examples = splits[train_split].num_examples if train_split in splits else None
    return DataSource(
        train=pipeline(train_split),
        eval=pipeline(eval_split) if eval_split else None,
        input_shape=tuple(features[image_key].shape),
        num_classes=features["label"].num_classes,
        train_examples=train_examples or None,
    )


def _ensure_reachable(name: str, data_dir: str, url: str) -> None:
    """Fail in seconds, not minutes, when a download cannot work.

    Offline, tfds retries every file for minutes before it gives up; compute
    nodes and CI machines often have no network at all.
    """
    import requests

    try:
        requests.head(url, timeout=5)
    except requests.RequestException as error:
        reason = type(error).__name__
        raise ConfigError.one(
            "data.name", name,
            f"not downloaded to {data_dir} and the download site is unreachable ({reason}): "
            "use data=synthetic, or set data.data_dir to a directory holding a prepared copy",
        ) from None
