"""The training input on a tf.data service (`data.service`): the pipeline
runs on the service's workers, and each trainer reads batches from them.

- `distributed_epoch` (dynamic sharding): every trainer reads from one job,
  and the dispatcher hands out the work piece by piece to whichever worker
  asks, so a slow worker (of the service or of training) takes less of it
  and no piece is handed out twice. For in-memory sources the pieces are
  batch indices of the run's one seeded order (order.py): batch k holds the
  same examples as without the service, but which trainer gets it, and
  when, depends on timing. Each example is trained at most once per epoch.
  Other sources are split as tf.data splits them (a file's records, or a
  pipeline function's elements), then shuffled and batched on the workers.
- `parallel_epochs`: each input pipeline (one per trainer) is its own job,
  and every worker runs all of it, in an order of its own (a seed drawn on
  the worker): examples are sampled, each seen once per epoch only in
  expectation, and nothing is reproducible. A resumed run starts a fresh
  order (nothing to skip).

Knows nothing of the cluster: it is given the dispatcher's address.
"""

from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from tfdistx.core.data_service import DISTRIBUTED_EPOCH
from tfdistx.core.errors import ConfigError
from tfdistx.data.order import ArrayExamples, epoch_permutation

_ENDLESS = np.iinfo(np.int64).max


@dataclass(frozen=True)
class Service:
    address: str  # the dispatcher, grpc://host:port
    mode: str  # core/data_service.MODES
    job_name: str  # distributed_epoch: the job shared by the run's trainers


def train_batches(
    service: Service,
    train,
    ctx,
    batch: int,
    *,
    seed: int,
    window: int,
    cache: bool,
    start_batch: int,
    skip_batches: int,
) -> tf.data.Dataset:
    """The endless per-replica batches this trainer reads from the service.

    `start_batch`: batches all trainers together trained on before (a
    resumed run); `skip_batches`: this trainer's share of them, read and
    dropped where the order cannot start at a batch (a pipeline function)."""
    experimental = tf.data.experimental.service
    if service.mode == DISTRIBUTED_EPOCH:
        if isinstance(train, ArrayExamples):
            return _distribute(
                _array_batches(train, batch, seed, window, start_batch),
                experimental.ShardingPolicy.DYNAMIC,
                service,
                service.job_name,
            )
        ds = train(None)  # the whole data: the dispatcher shares it out
        if cache:
            ds = ds.cache()
        ds = ds.shuffle(window, seed=seed, reshuffle_each_iteration=True).repeat().batch(batch, drop_remainder=True)
        ds = _distribute(ds, experimental.ShardingPolicy.DYNAMIC, service, service.job_name)
        return ds.skip(skip_batches) if skip_batches else ds
    mine = train(ctx)  # parallel_epochs: this pipeline's share, all of it on every worker
    if cache:
        mine = mine.cache()

    def in_an_order_of_its_own(_):
        # A seed drawn on the worker when it starts the job: a seed set here would be
        # baked into the graph the workers run, and every worker would yield the same batches.
        drawn = tf.cast(tf.timestamp() * 1e6, tf.int64) % (2**31 - 1)
        # With the run's global seed set, tf.data combines it with a tensor seed by a Python `if`, which a
        # traced function refuses: the global seed is left out here (the drawn seed is random anyway).
        graph = tf.compat.v1.get_default_graph()
        saved, graph.seed = graph.seed, None
        try:
            return (
                mine.shuffle(max(window, 2), seed=drawn, reshuffle_each_iteration=True)
                .repeat()
                .batch(batch, drop_remainder=True)
            )
        finally:
            graph.seed = saved

    ds = tf.data.Dataset.range(1).flat_map(in_an_order_of_its_own)
    # No job name: each trainer's iterator is a job of its own (a parameter-server worker's pipeline id is
    # a tensor, and a job name must be a Python string).
    return _distribute(ds, experimental.ShardingPolicy.OFF, service, None)


def _array_batches(train: ArrayExamples, batch: int, seed: int, window: int, start_batch: int) -> tf.data.Dataset:
    """Batch k of the single-pipeline order (ArrayExamples.batches with no
    InputContext), for k from `start_batch`: the source is a range of batch
    indices, which the dispatcher splits one index at a time."""
    rows, shuffle = train.count, window > 1
    if batch > rows:
        raise ConfigError.for_key(
            "data.batch_size",
            batch,
            f"a per-replica batch larger than the {rows} examples cannot be read from the "
            "tf.data service (data.service): use a smaller batch",
        )
    tensors = tf.nest.map_structure(tf.constant, train.arrays)

    @tf.autograph.experimental.do_not_convert  # as order.ArrayExamples.batches' functions
    def at(k):
        positions = k * batch + tf.range(batch, dtype=tf.int64)
        epochs, within = positions // rows, positions % rows
        first = epochs[0]  # a batch spans at most two epochs (batch <= rows)
        index = tf.where(
            epochs == first,
            tf.gather(epoch_permutation(rows, seed, first, shuffle), within),
            tf.gather(epoch_permutation(rows, seed, first + 1, shuffle), within),
        )
        return tf.nest.map_structure(lambda a: tf.gather(a, index), tensors)

    return tf.data.Dataset.range(start_batch, _ENDLESS).map(at, num_parallel_calls=tf.data.AUTOTUNE)


def _distribute(ds: tf.data.Dataset, policy, service: Service, job) -> tf.data.Dataset:
    return ds.prefetch(tf.data.AUTOTUNE).apply(
        tf.data.experimental.service.distribute(processing_mode=policy, service=service.address, job_name=job)
    )
