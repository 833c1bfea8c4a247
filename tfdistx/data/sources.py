"""Data sources: what to train on, before any strategy is involved.

A data `_target_` returns a DataSource: functions that build the *unbatched*
(features, label) pipelines for one input pipeline (an InputContext, or None
for a single pipeline). Features are one tensor or a dict of named tensors;
labels any shape. The shapes a model needs are read from the pipeline itself. Batching, shuffling,
prefetching and how the pipelines meet replicas is `input.py`'s job, so a
user's own data function (`data._target_=mypkg.make_data`) only has to say
where the examples come from.

The built-in sources hand over more than a pipeline function: `train` is
an `order.ArrayExamples` or `order.FileExamples`, which can also start
an endless shuffled stream at any example (`batches`), so a resumed run
need not read and drop what it already trained on. A plain function is
resumed with `Dataset.skip`.
"""

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf

from tfdistx.core.errors import ConfigError
from tfdistx.data.order import ArrayExamples

PipelineFn = Callable[[Optional[tf.distribute.InputContext]], tf.data.Dataset]


@dataclass
class DataSource:
    """What a data `_target_` returns: where the examples come from. tfdistx
    does the rest.

    Fields:
        train: the pipeline function (below) of the training examples.
        eval: the pipeline function of the evaluation examples, or None (the
            run is not evaluated).
        input_shape: not used: the features' shapes and dtypes are read
            from `train(None).element_spec`.
        num_classes: classification: how many classes the labels count (the
            model's output width); None for the other tasks.
        train_examples: how many training examples there are, or None. Only
            `trainer.epochs` needs it (steps = epochs * train_examples // the
            global batch); with it, a global batch larger than the data is
            refused before training.

    A pipeline function is

        fn(input_context: Optional[tf.distribute.InputContext]) -> tf.data.Dataset

    and returns single, unbatched `(features, label)` examples: features one
    tensor or a dict of named tensors, labels of any shape the task accepts;
    one pass over the data (a finite dataset). tfdistx calls it

    - once per input pipeline (one per worker), with that pipeline's
      InputContext: return that pipeline's share only, e.g. with
      `tfdistx.data.shard(dataset, input_context)` or by file. tfdistx turns
      tf.data's auto-sharding off, so a pipeline that is not sharded feeds
      every worker every example. Under parameter servers the context's
      `input_pipeline_id` is a tensor (the worker's index is known only on
      the worker): `Dataset.shard` takes it, a Python `if` on it cannot.
    - with None, for one pipeline of all the examples: to read the element
      spec the model is built for, for evaluation on a parameter-server
      coordinator, and for `tfdistx data write` and `tfdistx predict`. Build
      it cheaply: often only its element_spec is read.

    What tfdistx does with the dataset (data/input.py), so the function must
    not: for `train`, `cache()` (with `data.cache=true`), `shuffle` with a
    buffer of `data.shuffle_buffer` examples (seeded by `trainer.seed`,
    reshuffled every epoch), `repeat()` forever, `batch` at the per-replica
    batch size (the global batch / replicas, `drop_remainder=True`),
    `skip` of the batches already trained on when a run resumes, and
    `prefetch(AUTOTUNE)`; then `distribute_datasets_from_function` (or
    `ClusterCoordinator.create_per_worker_dataset` under parameter
    servers). For `eval`: `cache()` (with `data.cache=true`), `batch` at the
    per-replica batch size keeping the last, smaller batch, one pass (or
    `trainer.eval_steps` batches), `prefetch`; never shuffled.

    So: do not `.batch()` (every element is one example), do not
    `.repeat()` (training repeats it; an evaluation must end), and shard by
    the context. Shuffling and prefetching are not needed; a function may
    still shuffle its files (seeded), but must give the same order every
    time it is built, or a resumed run (which reads and drops the batches
    already trained on) does not continue where it stopped.
    """

    train: PipelineFn
    eval: Optional[PipelineFn]
    input_shape: Optional[tuple] = None  # not needed: the features' specs come from `train`
    num_classes: Optional[int] = None  # classification: how many classes the labels count
    train_examples: Optional[int] = None
    labels: Optional[str] = None  # what the labels are (CLASS, CLASSES, VALUES), for task=auto; None: not said
    vocab_size: Optional[int] = None  # features of token ids: how many ids (a text model's embedding rows)
    served: Optional["Served"] = None  # what is done to the raw examples before the model, again in the export

    # What labels can be (`labels`), each calling for its task (task=auto: tfdistx/tasks/auto.py).
    CLASS: ClassVar[str] = "a class id"  # classification, with num_classes
    CLASSES: ClassVar[str] = "multi-hot class labels"  # multilabel
    VALUES: ClassVar[str] = "real values"  # regression

    @property
    def element_spec(self):
        """(features spec, label spec) of one unbatched example."""
        return self.train(None).element_spec


@dataclass
class Served:
    """What a source does to its raw examples before the model (a text to
    token ids, pixels to [0, 1], a table's columns to one vector), which the
    export does too, so that the served model takes what the data holds.

    Fields:
        features: the raw features' spec as the export's inputs, batched:
            a TensorSpec (named `features`) or a dict of them by name.
        layer: a Keras layer from raw features to the model's, on one
            example or a batch (the pipelines map it; the export calls it
            before the model).
        raw_eval: the eval split's (raw features, label) examples, a
            pipeline function: what `tfdistx predict` reads from the source.
        state: what the layer learnt from the data (file name -> text, a
            text's vocabulary): kept with the run in <run dir>/preprocessing,
            which the source reads back (its `state_dir`).
        kind: what the features are, in a word (images, text, numbers).
    """

    features: Any
    layer: Any
    raw_eval: Optional[PipelineFn] = None
    state: Mapping[str, str] = field(default_factory=dict)
    kind: str = ""


def single_examples(source: DataSource, target: str) -> DataSource:
    """`source`, refused (ConfigError) when its pipeline yields batches:
    the first dimension of every part of its elements (features and label)
    is of unknown size, as `.batch()` leaves them. tfdistx batches them
    again, and the model would fail on its kernel's shape, blamed on it."""
    shapes = [spec.shape for spec in tf.nest.flatten(source.element_spec)]
    if shapes and all(shape.rank and shape[0] is None for shape in shapes):
        raise ConfigError.for_key(
            "data._target_",
            target,
            f"its pipeline yields batches (the first dimension of every part of its "
            f"elements is of unknown size: {', '.join(str(tuple(shape)) for shape in shapes)}); a pipeline "
            "function must yield single examples, which tfdistx batches: remove its .batch()",
        )
    return source


def shard(dataset: tf.data.Dataset, context: Optional[tf.distribute.InputContext]) -> tf.data.Dataset:
    """Give each input pipeline its own slice of an in-memory dataset.

    The pipeline id may be a tensor: a parameter-server worker's index is
    only known on the worker (input.py).
    """
    if context is None or context.num_input_pipelines == 1:
        return dataset
    return dataset.shard(context.num_input_pipelines, context.input_pipeline_id)


def in_memory(train, evaluation, **info) -> DataSource:
    """A DataSource over (features, labels) arrays held in memory: a resumed
    run starts at its step without reading the examples before (order.py)."""
    return DataSource(train=ArrayExamples(train), eval=ArrayExamples(evaluation), **info)


def generated(make: Callable, train_examples: int, eval_examples: int, **info) -> DataSource:
    """A synthetic source: `make(n)` draws n examples, the train split's first
    (so a seed gives the same splits whatever else changes), then eval's."""
    return in_memory(make(train_examples), make(eval_examples), train_examples=train_examples, **info)


def _normal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """Standard normal float32s: the synthetic sources' features and weights."""
    return rng.standard_normal(shape).astype(np.float32)


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
    rule = _normal(rng, int(np.prod(shape)), num_classes)

    def make(n: int):
        images = rng.random((n, *shape), dtype=np.float32)
        labels = np.argmax((images.reshape(n, -1) - 0.5) @ rule, axis=1).astype(np.int64)
        return images, labels

    return generated(make, train_examples, eval_examples, num_classes=num_classes)


def synthetic_categorical(
    num_fields: int = 8,
    vocab_size: int = 100_000,
    dense_features: int = 4,
    train_examples: int = 8192,
    eval_examples: int = 1024,
    seed: int = 0,
) -> DataSource:
    """Click-log shaped rows for wide & deep and the binary task.

    Features are a dict: `categorical`, hashed ids in [0, vocab_size),
    Zipf-distributed as real categorical features are, and `dense`, a few
    normal floats. The label (click: 1.0, none: 0.0) is drawn from a fixed
    random logistic function of both, so AUC well above 0.5 is learnable but
    not 1.0.
    """
    rng = np.random.default_rng(seed)
    id_weights = _normal(rng, vocab_size)
    dense_weights = _normal(rng, dense_features)

    def make(n: int):
        ids = (rng.zipf(1.3, size=(n, num_fields)) % vocab_size).astype(np.int64)
        dense = _normal(rng, n, dense_features)
        logit = id_weights[ids].sum(axis=1) / np.sqrt(num_fields) + dense @ dense_weights / np.sqrt(
            max(dense_features, 1)
        )
        clicks = (rng.random(n) < 1.0 / (1.0 + np.exp(-2.0 * logit))).astype(np.float32)
        return {"categorical": ids, "dense": dense}, clicks

    return generated(make, train_examples, eval_examples)


def synthetic_multilabel(
    num_features: int = 32,
    num_labels: int = 8,
    train_examples: int = 8192,
    eval_examples: int = 1024,
    seed: int = 0,
) -> DataSource:
    """Feature vectors tagged with any subset of `num_labels` labels (multi-hot).

    Label j is on where a fixed random projection of the features exceeds a
    per-label threshold, so labels are correlated and unevenly frequent.
    """
    rng = np.random.default_rng(seed)
    projection = _normal(rng, num_features, num_labels) / np.sqrt(num_features)
    thresholds = rng.uniform(-0.5, 1.0, num_labels).astype(np.float32)

    def make(n: int):
        x = _normal(rng, n, num_features)
        return x, (x @ projection > thresholds).astype(np.float32)

    return generated(make, train_examples, eval_examples)


def synthetic_regression(
    num_features: int = 16,
    num_targets: int = 1,
    noise: float = 0.1,
    train_examples: int = 8192,
    eval_examples: int = 1024,
    seed: int = 0,
) -> DataSource:
    """Feature vectors and real targets: a fixed random smooth function plus
    Gaussian noise. One target is a scalar label; several, a vector."""
    rng = np.random.default_rng(seed)
    w1 = _normal(rng, num_features, 32) / np.sqrt(num_features)
    w2 = _normal(rng, 32, num_targets) / np.sqrt(32)

    def make(n: int):
        x = _normal(rng, n, num_features)
        y = np.tanh(x @ w1) @ w2 + noise * _normal(rng, n, num_targets)
        return x, (y[:, 0] if num_targets == 1 else y)

    return generated(make, train_examples, eval_examples)
