"""How datasets meet strategies (cf. orbit/utils/common.py).

Each input pipeline (one per worker) builds its own shard and batches it at
the per-replica size: `distribute_datasets_from_function` with an
InputContext, so a global batch of 256 on 4 replicas feeds 64 to each.

Parameter servers are different: the coordinator traces the dataset function
once and every worker runs the same graph, so the InputContext cannot tell
workers apart. There, the worker's index is read on the worker
(`experimental_get_current_worker_index`) and each worker reads its own
shard: across the cluster every example is seen once per epoch in
expectation. (The shuffle seed stays the run's: a seed that depends on a
tensor cannot be used once a global seed is set, and disjoint shards
already give each worker its own order.)
"""

from typing import Optional

import tensorflow as tf

from tfdistx.data import service as service_lib
from tfdistx.data.sources import DataSource, PipelineFn
from tfdistx.core.errors import ConfigError


def per_replica_batch(global_batch: int, replicas: int) -> int:
    if global_batch % replicas:
        raise ConfigError.for_key(
            "data.batch_size",
            global_batch,
            f"the global batch must divide across {replicas} replicas: use a multiple of {replicas}",
        )
    return global_batch // replicas


def train_dataset(
    strategy: tf.distribute.Strategy,
    source: DataSource,
    global_batch: int,
    *,
    seed: int,
    shuffle_buffer: int,  # its default is the config's (schema.PIPELINE_DEFAULTS), not repeated here
    cache: bool = False,
    skip_steps: int = 0,
    ps_workers: int = 0,
    service: Optional[service_lib.Service] = None,
):
    """An endless, shuffled, per-replica-batched distributed dataset.

    The order is a function of `seed` alone, so a resumed run starts after
    the `skip_steps` steps it already trained on and sees the batches an
    uninterrupted run would have seen next: at once for the built-in
    sources (order.py), by reading and dropping batches for a user's
    pipeline function. `ps_workers`: the number of
    parameter-server workers (0: not parameter servers). `service`: read
    the batches from a tf.data service (data/service.py; None: built here).
    """
    per_replica_batch(global_batch, strategy.num_replicas_in_sync)

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        if ps_workers:
            worker = tf.distribute.coordinator.experimental_get_current_worker_index()
            # Each step is one worker's whole batch: one "replica" per step.
            ctx = tf.distribute.InputContext(
                num_input_pipelines=ps_workers, input_pipeline_id=worker, num_replicas_in_sync=1
            )
        if service is not None:  # every step takes one batch per replica from the run's one stream
            ds = service_lib.train_batches(
                service,
                source.train,
                ctx,
                ctx.get_per_replica_batch_size(global_batch),
                seed=seed,
                window=shuffle_buffer,
                cache=cache,
                start_batch=skip_steps * ctx.num_replicas_in_sync,
                skip_batches=batches_to_skip(skip_steps, ctx.num_replicas_in_sync, ctx.num_input_pipelines),
            )
            return _without_autoshard(ds).prefetch(tf.data.AUTOTUNE)
        if hasattr(source.train, "batches"):  # it can start at any example (order.py)
            done = batches_to_skip(skip_steps, ctx.num_replicas_in_sync, ctx.num_input_pipelines)
            batch = ctx.get_per_replica_batch_size(global_batch)
            ds = source.train.batches(ctx, batch, seed=seed, window=shuffle_buffer, start=done * batch)
            return _without_autoshard(ds).prefetch(tf.data.AUTOTUNE)
        ds = _without_autoshard(source.train(ctx))
        if cache:
            ds = ds.cache()
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True).repeat()
        ds = ds.batch(ctx.get_per_replica_batch_size(global_batch), drop_remainder=True)
        skip = batches_to_skip(skip_steps, ctx.num_replicas_in_sync, ctx.num_input_pipelines)
        if skip:
            ds = ds.skip(skip)
        return ds.prefetch(tf.data.AUTOTUNE)

    if not fed_plainly(strategy):
        return strategy.distribute_datasets_from_function(dataset_fn)
    # The strategy still makes the dataset, with the InputContext it gives
    # this worker; the dataset is then iterated as it is, not through the
    # strategy's distributed iterator.
    made = []
    strategy.distribute_datasets_from_function(lambda ctx: made.append(dataset_fn(ctx)) or made[-1])
    return made[0]


def fed_plainly(strategy: tf.distribute.Strategy) -> bool:
    """Whether a multi-worker process with one replica, on a CPU, feeds its
    batches to `strategy.run` as plain tensors. A distributed dataset
    iterates through a MultiDeviceIterator, which hands each batch on
    through a function call per element: measured at about 1 ms a step on
    top of the pipeline's own 0.2 ms for the default MLP's batch of 128
    (benchmarks/bench_multiworker_step.py), most of a 2-worker step's input
    time. With one replica in the process, `strategy.run` gives that
    replica the plain tensors as they are: the same batches, in the same
    order. With several replicas (or a GPU, where the iterator prefetches
    onto the device) the distributed iterator stays."""
    return (
        isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
        and len(strategy.extended.worker_devices) == 1
        and "GPU" not in strategy.extended.worker_devices[0].upper()
    )


def batches_to_skip(steps_done: int, replicas: int, input_pipelines: int) -> int:
    """Batches one input pipeline has fed after `steps_done` steps: each
    step takes one batch per replica, spread evenly over the pipelines.
    (Parameter servers: each step is one worker's batch, so a worker has
    fed steps / workers of them — in expectation, as steps go to whichever
    worker is free.)"""
    return steps_done * replicas // input_pipelines


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


def local_eval_dataset(
    make: Optional[PipelineFn], global_batch: int, *, steps: Optional[int] = None, cache: bool = False
):
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
