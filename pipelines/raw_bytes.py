"""Fixed-size arrays stored as their raw bytes: decoded a whole batch at once, sizes checked.

`image_encoding=raw` (image pipelines) and `x_encoding=raw` (`numpy`) store each example's array
as the bytes of its dtype, little-endian, in C order: no decode at read time but one
`tf.io.decode_raw` of the batch. A record whose bytes are not the array's size (a shard changed
after its conversion) fails with `SIZE_MISMATCH` in the error, which
`tftrain.data.reader.damaged_record_message` turns into one line.
"""
from __future__ import annotations

import math

# The words of the assertion a record of the wrong size fails with.
SIZE_MISMATCH = "of the wrong size"


def decode_batch(encoded, dtype, shape, what: str, shape_text: str):
    """A batch of records (`encoded`, strings) -> a `[batch, *shape]` tensor of `dtype`.

    `what` and `shape_text` name the record and its expected shape in the error, e.g.
    "image_encoding=raw image" and "image_size 32x32x3".
    """
    import tensorflow as tf

    dtype = tf.as_dtype(dtype)
    size = math.prod(shape) * dtype.size
    batch = encoded.shape[0] if encoded.shape[0] is not None else -1  # keep a static batch size
    lengths = tf.strings.length(encoded)
    wrong = tf.not_equal(lengths, size)
    right_size = tf.debugging.Assert(tf.logical_not(tf.reduce_any(wrong)), [
        f"{what} {SIZE_MISMATCH}: {size} bytes ({shape_text}) expected, found",
        tf.boolean_mask(lengths, wrong)[:1]])
    with tf.control_dependencies([right_size]):
        return tf.reshape(tf.io.decode_raw(encoded, dtype, little_endian=True), [batch, *shape])
