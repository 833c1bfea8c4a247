"""Where an input pipeline is in its data: seeded example orders that start
at any position without reading what comes before.

`Dataset.skip` resumes a run by reading and dropping every batch already
trained on: time that grows with the step, hours late in a run on a real
file pipeline. Here a pipeline's order is a pure function of (seed, epoch,
position), so a resumed run starts where it stopped:

- `ArrayExamples` (in memory): each epoch is a stateless permutation of all
  the rows, one order whatever the topology: the input pipelines deal its
  batches out in turn (pipeline i of P takes batches i, i+P, ...), so a step
  trains on the same examples under one device, mirrored replicas or
  several workers, and a run resumed on another topology goes on with the
  examples it would have trained. Position n is arithmetic, and the rows of
  a batch are gathered at once.
- `FileExamples` (TFRecord, CSV): each epoch reads the pipeline's files in a
  stateless permuted order and shuffles each window of `window` consecutive
  records with its own stateless seed. Position n skips whole epochs and
  files by their record counts, then reads at most one file's records and
  one window: bounded by the data's layout, never by the step.

Both split the data per input pipeline with a Python or a tensor pipeline id (a
parameter-server worker's index is a tensor: input.py). Files are split by
file when there are at least as many files as pipelines, else by element
(`core/datafiles.py` says which, for `--plan` too). Records are decoded
a window at a time, one op for the whole window.
"""

import logging
from typing import Callable, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from tfdistx.core.datafiles import shards_by_file

log = logging.getLogger(__name__)

_ENDLESS = np.iinfo(np.int64).max


def _pipeline(ctx: Optional[tf.distribute.InputContext]):
    """(number of input pipelines, this one's id): the id may be a tensor."""
    if ctx is None:
        return 1, 0
    return ctx.num_input_pipelines, ctx.input_pipeline_id


def epoch_permutation(n, seed: int, epoch, shuffle: bool):
    order = tf.range(tf.cast(n, tf.int64), dtype=tf.int64)
    if not shuffle:
        return order
    return tf.random.experimental.stateless_shuffle(
        order, seed=tf.stack([tf.constant(seed, tf.int64), tf.cast(epoch, tf.int64)])
    )


class ArrayExamples:
    """(features, labels) arrays held in memory. Unbatched (`__call__`), a
    pipeline's rows are every P-th row from its id; batched for training
    (`batches`), the pipelines share one order of all the rows."""

    same_order_on_any_topology = True  # a resumed run trains what a whole run would, whatever the pipelines (input.py)

    def __init__(self, arrays):
        self.arrays = arrays
        self.count = len(tf.nest.flatten(arrays)[0])

    def __call__(self, ctx: Optional[tf.distribute.InputContext] = None) -> tf.data.Dataset:
        """The pipeline's examples in their own order, unbatched (evaluation, checks)."""
        pipelines, index = _pipeline(ctx)
        ds = tf.data.Dataset.from_tensor_slices(self.arrays)
        return ds.shard(pipelines, index) if pipelines > 1 else ds

    def batches(self, ctx, batch: int, *, seed: int, window: int, start: int = 0) -> tf.data.Dataset:
        """Endless batches from this pipeline's example `start`; each epoch a
        fresh permutation of all the rows (`window` 1: their own order),
        whose consecutive batches of `batch` go to the pipelines in turn.

        Dealt out batch by batch rather than split row by row, because a
        step's examples are then positions [k G, (k+1) G) of the one order
        (G the global batch) under every topology: a synchronous step takes
        one batch per replica, and each pipeline feeds replicas/pipelines of
        them. With one pipeline this is the order itself.
        """
        shuffle = window > 1
        pipelines, index = _pipeline(ctx)
        count = tf.constant(self.count, tf.int64)
        chunk, stride, phase = tf.constant(batch, tf.int64), tf.constant(pipelines, tf.int64), tf.cast(index, tf.int64)
        # This pipeline's example `start` in the one order: its own batches are every `stride`-th.
        first = (start // batch * pipelines + phase) * chunk + start % batch
        first_epoch = first // count

        # Not converted by AutoGraph, which tf.data applies to the functions it is given: no Python
        # control flow on tensors here, and converting cost each process a tenth of a second.
        @tf.autograph.experimental.do_not_convert
        def epoch(e):
            positions = e * count + tf.range(count, dtype=tf.int64)
            mine = tf.logical_and(positions // chunk % stride == phase, positions >= first)
            # Handed on in chunks of up to `batch` indices: tf.data's overhead per element,
            # paid for every row, would be most of a small model's input time.
            return tf.data.Dataset.from_tensor_slices(
                tf.boolean_mask(epoch_permutation(count, seed, e, shuffle), mine)
            ).batch(batch)

        tensors = tf.nest.map_structure(tf.constant, self.arrays)
        indices = tf.data.Dataset.range(first_epoch, _ENDLESS).flat_map(epoch)
        # rebatch: whole batches across the end of an epoch, as one stream of rows would give.
        return indices.rebatch(batch, drop_remainder=True).map(
            tf.autograph.experimental.do_not_convert(
                lambda picked: tf.nest.map_structure(lambda a: tf.gather(a, picked), tensors)
            ),
            num_parallel_calls=tf.data.AUTOTUNE,
        )


class FileExamples:
    """Records in files, decoded a window at a time.

    `read(filenames)`: the records of a 1-D string tensor of files, in that
    order, undecoded. `decode(records)`: a batch of them to (features,
    labels). `counts`: records per file (from the manifest `tfdistx data
    write` leaves), or None: counted by reading the files when a resumed
    run needs them.
    """

    def __init__(self, files: Sequence[str], read: Callable, decode: Callable, counts: Optional[List[int]] = None):
        self.files, self.read, self.decode = list(files), read, decode
        self._counts = counts
        self._warned = False

    @property
    def counts(self) -> List[int]:
        if self._counts is None:
            log.info(
                "counting the records of %d file(s) to resume (no manifest beside them; `tfdistx data write` writes "
                "one)",
                len(self.files),
            )
            self._counts = [
                int(self.read(tf.constant([f])).reduce(np.int64(0), lambda n, _: n + 1)) for f in self.files
            ]
        return self._counts

    def find_bad_file(self):
        """(file, error) of the first file whose records cannot all be read
        and decoded, or None. Reads everything: only after a failure."""
        for name in self.files:
            try:
                for _ in self.read(tf.constant([name])).batch(1024).map(self.decode):
                    pass
            except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as error:
                return name, error
        return None

    def _share(self, ctx):
        """(files, counts or None, stride, phase): the files this pipeline
        reads, and which of their records are its own (every `stride`-th
        from `phase`)."""
        pipelines, index = _pipeline(ctx)
        files = tf.constant(self.files)
        counts = tf.constant(self._counts, tf.int64) if self._counts is not None else None
        if pipelines == 1:
            return files, counts, 1, 0
        if shards_by_file(len(self.files), pipelines):
            mine = tf.range(index, len(self.files), pipelines)
            return tf.gather(files, mine), None if counts is None else tf.gather(counts, mine), 1, 0
        if not self._warned:
            log.warning(
                "%d input pipelines share %d file(s): each reads them all and keeps every %d-th record "
                "(write at least %d files to split them by file)",
                pipelines,
                len(self.files),
                pipelines,
                pipelines,
            )
            self._warned = True
        return files, counts, pipelines, index

    def __call__(self, ctx: Optional[tf.distribute.InputContext] = None) -> tf.data.Dataset:
        """The pipeline's examples in file order, unbatched (evaluation, checks)."""
        files, _, stride, phase = self._share(ctx)
        ds = self.read(files)
        if stride > 1:
            ds = ds.shard(stride, phase)
        return ds.batch(256).map(self.decode, num_parallel_calls=tf.data.AUTOTUNE).unbatch()

    def batches(self, ctx, batch: int, *, seed: int, window: int, start: int = 0) -> tf.data.Dataset:
        """Endless decoded batches from this pipeline's example `start`.

        `window`: records shuffled together (1: the files' own order).
        """
        if start:
            self.counts  # noqa: B018 (counted once, before the files are split)
        files, counts, stride, phase = self._share(ctx)
        window = max(int(window), 1)
        shuffle = window > 1
        if counts is None:  # a fresh run without counts: no position to find

            def epoch(e):
                ds = self.read(tf.gather(files, epoch_permutation(tf.size(files), seed, e, shuffle)))
                return _chunks(ds.shard(stride, phase) if stride > 1 else ds, self.decode, window, seed, e)

            chunks = tf.data.Dataset.range(0, _ENDLESS).flat_map(epoch)
        else:
            per_epoch = (tf.reduce_sum(counts) - phase + stride - 1) // stride  # this pipeline's records
            first_epoch, offset = start // per_epoch, start % per_epoch

            def epoch(e):
                at = tf.where(e == first_epoch, offset, 0)  # this pipeline's position in the epoch
                window_index = at // window
                # The epoch's files in order, and where the window holding `at` begins in them.
                order = epoch_permutation(tf.size(files), seed, e, shuffle)
                ordered_counts = tf.gather(counts, order)
                ends = tf.cumsum(ordered_counts)
                begin = window_index * window * stride + phase
                first_file = tf.searchsorted(ends, tf.reshape(begin, [1]), side="right")[0]
                into_file = begin - (ends[first_file] - ordered_counts[first_file])
                ds = self.read(tf.gather(files, order)[first_file:]).skip(into_file)
                if stride > 1:
                    ds = ds.shard(stride, 0)  # `begin` is one of this pipeline's records
                return _chunks(ds, self.decode, window, seed, e, window_index, at - window_index * window)

            chunks = tf.data.Dataset.range(first_epoch, _ENDLESS).flat_map(epoch)
        # rebatch: the decoded chunks cut into batches, not handled row by row.
        return chunks.rebatch(batch, drop_remainder=True)


def _chunks(
    records: tf.data.Dataset, decode: Callable, window: int, seed: int, epoch, first_window=0, skip=0
) -> tf.data.Dataset:
    """The records decoded in chunks: each run of `window` records decoded
    at once and its rows shuffled by a seed of its own (epoch, window), so
    that a resumed run sees the same windows in the same order whichever it
    starts from; the first chunk less its first `skip` rows. `window` 1:
    the records' own order. (Decoded, then shuffled: the rows are moved
    once, as numbers, not as serialized records.)"""
    if window <= 1:
        return records.skip(skip).batch(1024).map(decode, num_parallel_calls=tf.data.AUTOTUNE)

    def shuffled(k, chunk):
        rows = decode(chunk)
        key = tf.cast(epoch, tf.int64) * (1 << 32) + k
        order = tf.random.experimental.stateless_shuffle(
            tf.range(tf.size(chunk)), seed=tf.stack([tf.constant(seed, tf.int64), key])
        )
        order = order[tf.where(k == first_window, skip, 0) :]
        return tf.nest.map_structure(lambda column: tf.gather(column, order), rows)

    return records.batch(window).enumerate(start=first_window).map(shuffled, num_parallel_calls=tf.data.AUTOTUNE)
