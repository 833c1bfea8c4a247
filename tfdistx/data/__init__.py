"""Data: where examples come from and how they reach the replicas.

`sources` (the DataSource contract and the built-in sources), `datasets`
(any TensorFlow Datasets dataset by name), `files`
(TFRecord/CSV files and `data write`), `order` (a resumable example order),
`input` (datasets meet strategies). The built-in sources are re-exported
here because config files name them as `tfdistx.data.NAME`.
"""

from tfdistx.data.datasets import tfds
from tfdistx.data.files import csv, tfrecord
from tfdistx.data.sources import (
    DataSource,
    PipelineFn,
    Served,
    in_memory,
    shard,
    synthetic,
    synthetic_categorical,
    synthetic_multilabel,
    synthetic_regression,
)

__all__ = [
    "DataSource",
    "PipelineFn",
    "Served",
    "csv",
    "in_memory",
    "shard",
    "synthetic",
    "synthetic_categorical",
    "synthetic_multilabel",
    "synthetic_regression",
    "tfds",
    "tfrecord",
]
