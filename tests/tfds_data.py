"""TensorFlow Datasets datasets prepared offline into a data_dir, from
examples that `tfds.testing.mock_data` generates from each dataset's own
code (its `MockPolicy.USE_CODE`: the builder's features, no metadata
download), written by tensorflow-datasets' own `store_as_tfds_dataset`
under the dataset's name, config and version: the registered builder then
reads them as a prepared copy, as a user's `data.data_dir` on a machine
without a network (real files, real splits, real slices, by file or by
element across workers), in every process of a local cluster, which an
in-process mock could not reach.

Checked here, tensorflow-datasets 4.9.10, offline (a network namespace of
its own): mock_data's code policy builds examples for mnist, fashion_mnist,
cifar10, beans, tf_flowers, cats_vs_dogs, imdb_reviews, ag_news_subset,
yelp_polarity_reviews, glue/sst2, diamonds, wine_quality, titanic, iris.
The tests use one of each kind: tf_flowers (images of varying sizes, 5
classes, a train split only), imdb_reviews (a text, 2 classes, train and
test) and diamonds (a table: 6 float and 3 class-label columns; its label,
the price, a number; a train split only)."""

from pathlib import Path
from typing import Sequence

# name -> the splits the real dataset has (the mocked copy has the same, each of `examples` examples)
SPLITS = {
    "tf_flowers": ("train",),
    "imdb_reviews": ("train", "test"),
    "diamonds": ("train",),
    "mnist": ("train", "test"),
}


def prepare(data_dir: Path, names: Sequence[str], examples: int = 96) -> Path:
    """Each dataset prepared into `data_dir` (made once: a dataset already there is kept)."""
    import tensorflow_datasets as tfds

    for name in names:
        with tfds.testing.mock_data(num_examples=examples, policy=tfds.testing.MockPolicy.USE_CODE):
            builder = tfds.builder(name)
            info, config = builder.info, builder.builder_config
            generated = {split: builder.as_dataset(split=split) for split in SPLITS[name]}
        target = Path(data_dir, builder.name, *([config.name] if config else []), str(builder.version))
        if target.is_dir():
            continue
        # the generated examples are a pure function of the features: read outside the mock
        tfds.dataset_builders.store_as_tfds_dataset(
            name=builder.name,
            version=str(builder.version),
            features=info.features,
            split_datasets=generated,
            config=config.name if config else None,
            data_dir=str(data_dir),
            disable_shuffling=True,
        )
    return Path(data_dir)
