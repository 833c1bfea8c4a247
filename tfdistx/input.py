"""How datasets meet strategies (cf. orbit/utils/common.py).

Each input pipeline (one per worker) builds its own shard and batches it at
the per-replica size: `distribute_datasets_from_function` with an
InputContext, so a global batch of 256 on 4 replicas feeds 64 to each.
"""

from typing import Optional

import tensorflow as tf

from tfdistx.data import DataSource, PipelineFn
from tfdistx.errors import ConfigError


def per_replica_batch(global_batch: int, replicas: int) -> int:
    if global_batch % replicas:
        raise ConfigError.one("data.batch_size", global_batch, f"the global batch must divide across {replicas} replicas: use a multiple of {replicas}")
    return global_batch // replicas


def train_dataset(
    strategy: tf.distribute.Strategy,
    source: DataSource,
    global_batch: int,
    *,
    seed: int,
    shuffle_buffer: int = 10_000,
    cache: bool = False,
    skip_steps: int = 0,
):
    """An endless, shuffled, per-replica-batched distributed dataset.

    The order is a function of `seed` alone, so a resumed run skips the
    `skip_steps` steps it already trained on and sees the batches an
    uninterrupted run would have seen next.
    """
    per_replica_batch(global_batch, strategy.num_replicas_in_sync)

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        ds = _without_autoshard(source.train(ctx))
        if cache:
            ds = ds.cache()
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True).repeat()
        ds = ds.batch(ctx.get_per_replica_batch_size(global_batch), drop_remainder=True)
        if skip_steps:
            # Each step takes one batch per replica this pipeline feeds.
            ds = ds.skip(skip_steps * ctx.num_replicas_in_sync // ctx.num_input_pipelines)
        return ds.prefetch(tf.data.AUTOTUNE)

    return strategy.distribute_datasets_from_function(dataset_fn)


def eval_dataset(
    strategy: tf.distribute.Strategy,
    make: Optional[PipelineFn],
    global_batch: int,
    *,
    steps: Optional[int] = None,
    cache: bool = False,
):
    """One pass over the eval split (or `steps` batches of it), or None."""
    if make is None:
        return None

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        ds = _without_autoshard(make(ctx))
        if cache:
            ds = ds.cache()
        ds = ds.batch(ctx.get_per_replica_batch_size(global_batch))
        if steps:
            ds = ds.take(steps)
        return ds.prefetch(tf.data.AUTOTUNE)

    return strategy.distribute_datasets_from_function(dataset_fn)


def local_eval_dataset(make: Optional[PipelineFn], global_batch: int, *, steps: Optional[int] = None, cache: bool = False):
    """The eval split as a plain dataset, for evaluation on a coordinator."""
    if make is None:
        return None
    ds = make(None)
    if cache:
        ds = ds.cache()
    ds = ds.batch(global_batch)
    return (ds.take(steps) if steps else ds).prefetch(tf.data.AUTOTUNE)


def _without_autoshard(ds: tf.data.Dataset) -> tf.data.Dataset:
    options = tf.data.Options()
    # Sharding is done by the data source (by file or by element); stop
    # tf.data from trying again on top of it.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.with_options(options)
