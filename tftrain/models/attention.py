"""Multi-head attention whose products are matrix multiplications, not einsums.

tf_keras's MultiHeadAttention projects with `EinsumDense` and multiplies queries, keys and values
with `tf.einsum`. On CPUs TensorFlow's Einsum kernel is slower than MatMul / BatchMatMulV2 on the
same shapes, and in bfloat16 it has no fast kernel (on an AVX2 VM under load a
[8, 256, 512] x [512, 8, 64] projection took 716 ms as a bfloat16 einsum and 48 ms as a
bfloat16 MatMul; `bench/precision.py` measures whole steps), while MatMul is the op whose
bfloat16 kernel uses AMX and AVX512-BF16 units through oneDNN. `MatmulAttention` is that layer
with the same weights (names, shapes, checkpoint paths), the same masks and the same results,
computed as reshaped MatMuls (the projections) and BatchMatMulV2 (scores and the weighted sum
of values).

Both layers are saved under their tf-keras parents' names (`MultiHeadAttention`, `EinsumDense`),
whose configs they share: any tf-keras rebuilds a SavedModel of tftrain's Transformers from its
config, without tftrain and without the traced call of every layer (tracing them was most of a
Transformer's export). tftrain loads them back as these layers (`saved_classes`).
"""
from __future__ import annotations

import functools
import math
import re


def _contraction(equation: str) -> int | None:
    """How many trailing input dims `equation` contracts with the kernel's leading dims, when
    the einsum is that plain product (`abc,cde->abde`, `abcd,cde->abe`); None otherwise."""
    match = re.fullmatch(r"([a-z]+),([a-z]+)->([a-z]+)", equation)
    if not match:
        return None
    inputs, kernel, output = match.groups()
    contracted = "".join(c for c in inputs if c in kernel and c not in output)
    count = len(contracted)
    if not count or not inputs.endswith(contracted) or not kernel.startswith(contracted):
        return None
    if output != inputs[:-count] + kernel[count:]:
        return None
    return count


def _saved_as_parent(cls):
    """`cls` named as its tf-keras parent: tf-keras saves a layer's class by that name."""
    cls.__name__ = cls.__qualname__ = cls.__bases__[0].__name__
    return cls


@functools.cache
def projection_class():
    """`MatmulProjection`: an `EinsumDense` computed as one MatMul (defined once, on first use:
    this module imports tf_keras lazily)."""
    import tensorflow as tf
    import tf_keras as keras

    @_saved_as_parent
    class MatmulProjection(keras.layers.EinsumDense):
        """`EinsumDense` whose product, when it is a plain contraction of the input's last dims
        with the kernel's first ones, runs as [positions, in] x [in, out] MatMul."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            # found once here, not in `call`, which Keras rewrites with AutoGraph (with every
            # function it calls) in each process that builds the layer
            self.contracted_dims = _contraction(self.equation)

        def call(self, inputs):
            count = self.contracted_dims
            if count is None:
                return super().call(inputs)
            kernel = tf.convert_to_tensor(self.kernel)
            contracted = math.prod(int(d) for d in self.kernel.shape[:count])
            flat = tf.reshape(inputs, [-1, contracted]) @ tf.reshape(kernel, [contracted, -1])
            outer = tf.shape(inputs)[:-count]
            result = tf.reshape(flat, tf.concat([outer, tf.shape(kernel)[count:]], 0))
            if self.bias is not None:
                result += self.bias
            return self.activation(result) if self.activation is not None else result

    return MatmulProjection


@functools.cache
def attention_class():
    """`MatmulAttention` (defined once, on first use)."""
    import tensorflow as tf
    import tf_keras as keras

    projection = projection_class()

    @_saved_as_parent
    class MatmulAttention(keras.layers.MultiHeadAttention):
        """tf_keras `MultiHeadAttention` computed with MatMul and BatchMatMulV2 (see the
        module's docstring); its config, weights and outputs are the parent's."""

        def _build_from_signature(self, query, value, key=None):
            super()._build_from_signature(query, value, key)
            for name in ("_query_dense", "_key_dense", "_value_dense", "_output_dense"):
                setattr(self, name, projection.from_config(getattr(self, name).get_config()))

        def _compute_attention(self, query, key, value, attention_mask=None, training=None):
            if query.shape.rank != 4 or self._attention_axes != (1,):
                return super()._compute_attention(query, key, value, attention_mask, training)
            query = tf.multiply(query, 1.0 / math.sqrt(float(self._key_dim)))
            heads_first = [0, 2, 1, 3]  # [B, T, N, H] -> [B, N, T, H]
            scores = tf.matmul(tf.transpose(query, heads_first), tf.transpose(key, heads_first),
                               transpose_b=True)  # [B, N, T, S]
            scores = self._masked_softmax(scores, attention_mask)
            dropped = self._dropout_layer(scores, training=training)
            output = tf.matmul(dropped, tf.transpose(value, heads_first))  # [B, N, T, H]
            return tf.transpose(output, heads_first), scores

    return MatmulAttention


@functools.cache
def staged_attention_class():
    """`MatmulAttention` for a pipeline stage, whose causal mask is made from the tensors at
    run time. The parent makes it from static shapes, and TensorFlow's runtime folds it (and
    the additive mask the softmax makes of it) into constants held as long as the step's
    function lives, one per call of the layer. One call per step costs one (what a model run
    whole or exported holds, and what its converters fold away); a pipelined step calls each
    layer once per micro-batch, so its memory grew with the micro-batches (1 MiB per stage and
    micro-batch at 512 tokens)."""
    import tensorflow as tf

    class StagedAttention(attention_class()):
        def _compute_causal_mask(self, query, value=None):
            """The parent's causal mask ([1, T, S], true where s <= t), made from the tensors
            at run time. A comparison of a float tensor with itself is one no optimizer folds
            (it is false at NaN: `is_nan` covers those)."""
            def positions(tensor):  # [1, length, 1]: 1, 2, ..., length
                first = tensor[:1, :, :1]
                ones = tf.logical_or(tf.equal(first, first), tf.math.is_nan(first))
                return tf.cumsum(tf.cast(ones, tf.int32), axis=1)

            rows = positions(query)
            columns = rows if value is None else positions(value)
            return tf.greater_equal(rows, tf.transpose(columns, [0, 2, 1]))

    return StagedAttention


def staged_classes() -> dict:
    """`saved_classes` with attention as `staged_attention_class` (pipeline stages)."""
    return {**saved_classes(), "MultiHeadAttention": staged_attention_class()}


def saved_classes() -> dict:
    """`custom_objects` for tf-keras's `load_model` and `from_config`: the saved class names of
    tftrain's layers (and those earlier tftrain versions saved them under), mapped to them."""
    attention, projection = attention_class(), projection_class()
    return {"MultiHeadAttention": attention, "tftrain>MatmulAttention": attention,
            "tftrain>MatmulProjection": projection}
