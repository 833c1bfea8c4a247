"""The gradients in another dtype for the one all-reduce (`strategy.all_reduce_dtype`).

update.py casts each gradient down before the sum over replicas and back to
its variable's dtype after it, before the optimizer: in 16 bits the bytes
each replica sends halve (docs/scaling.md), and every gradient is rounded to
8 (bfloat16) or 11 (float16) significant bits, its sum too.

A dense gradient is summed in the 16-bit dtype: TF's collective reduce and
its other reductions take both. A sparse one (IndexedSlices: embedding rows)
is not summed but gathered, its rows listed together (they add up when the
optimizer applies them, in float32 again). TF's all-gather between
replicas (CollectiveGatherV2) takes float16 but not bfloat16 (measured:
"DataType bfloat16 not in list of allowed values"), so bfloat16 rows travel
as fours of 16-bit values bitcast into int64s, which a gather moves
unchanged, and are read back after it: the same bytes, no arithmetic. Not
int32 pairs: MirroredStrategy reduces int32 values on the host, apart from
the float gradients beside them, and refuses the mix (measured: "Inputs to
batch_reduce_to must be either all on the host or all on the compute
devices"). Rows narrower than three values (wide_deep's wide table: one)
would take more bytes padded to an int64 than in float32: they travel in
float32, rounded to bfloat16 all the same.
"""

import tensorflow as tf


def cast_down(gradient, dtype: tf.DType):
    """`gradient` as it goes into the all-reduce; sparse: its values cast, its rows kept."""
    if not isinstance(gradient, tf.IndexedSlices):
        return tf.cast(gradient, dtype)
    values = tf.cast(gradient.values, dtype)
    if dtype != tf.bfloat16:
        return tf.IndexedSlices(values, gradient.indices, gradient.dense_shape)
    if values.shape[-1] is not None and values.shape[-1] < 3:  # 4 or 8 bytes a row in float32, 8 packed
        return tf.IndexedSlices(tf.cast(values, tf.float32), gradient.indices, gradient.dense_shape)
    packed = _as_int64(values)
    # The gathered slices keep the dense shape they were given: one that matches the values travelling.
    dense_shape = tf.concat([gradient.dense_shape[:-1], tf.shape(packed, out_type=gradient.dense_shape.dtype)[-1:]], 0)
    return tf.IndexedSlices(packed, gradient.indices, dense_shape)


def cast_back(summed, gradient, variable):
    """The all-reduce's result for `gradient` (as it was before `cast_down`), in `variable`'s dtype."""
    if not isinstance(summed, tf.IndexedSlices):
        return tf.cast(summed, variable.dtype)
    values = summed.values
    if values.dtype == tf.int64:  # bfloat16 values packed by cast_down
        values = _from_int64(values, width=tf.shape(gradient.values)[-1])
        values.set_shape([None, *gradient.values.shape[1:]])  # the rows gathered from every replica, as wide as before
    return tf.IndexedSlices(tf.cast(values, variable.dtype), summed.indices, gradient.dense_shape)


def _as_int64(values: tf.Tensor) -> tf.Tensor:
    """16-bit values [..., d] -> int64 [..., ceil(d / 4)], four values in each (d padded with 0s to a multiple of 4)."""
    width = tf.shape(values)[-1]
    padding = tf.concat([tf.zeros([tf.rank(values) - 1, 2], tf.int32), [[0, -width % 4]]], 0)
    fours = tf.reshape(tf.pad(values, padding), tf.concat([tf.shape(values)[:-1], [(width + 3) // 4, 4]], 0))
    return tf.bitcast(fours, tf.int64)


def _from_int64(packed: tf.Tensor, width) -> tf.Tensor:
    fours = tf.bitcast(packed, tf.bfloat16)  # [..., ceil(d / 4), 4]
    return tf.reshape(fours, tf.concat([tf.shape(packed)[:-1], [-1]], 0))[..., :width]
