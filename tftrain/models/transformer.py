"""Transformers on token ids: `transformer_lm` (a causal decoder) and `transformer` (an encoder
for text classification).

Both embed int token ids [batch, sequence_length] (`token_embedding`) and add a learned
position embedding (`position_embedding`), then run `num_layers` pre-norm blocks:

    x = x + attention(attention_norm(x))      MatmulAttention (tf_keras MultiHeadAttention
                                              computed with MatMuls: models/attention.py)
    x = x + mlp_out(gelu(mlp_in(mlp_norm(x))))

and a `final_norm`. The decoder's attention is causal (position t sees positions <= t) and its
head gives vocabulary logits at every position ([batch, sequence_length, vocab_size]); the
encoder masks padding (id 0) out of attention and out of the mean pooling that feeds its
head (`outputs.head`: class logits or regression values).

Layer names are stable: block `i`'s layers are `block_{i}_attention_norm`,
`block_{i}_attention` (its projections: `query`, `key`, `value`, `attention_output`, so the
weights are `block_{i}_attention/query/kernel:0`, ...), `block_{i}_mlp_norm`,
`block_{i}_mlp_in` and `block_{i}_mlp_out`; DTensor layout rules address weights by them.

`remat=True` (recomputation, `models.recompute`): the same layers, names and weights, in a model
whose forward pass runs each block's layers under `tf.recompute_grad`: the backward pass
recomputes the block's activations from its input instead of keeping them, so a step keeps each
block's input plus one block's activations at a time, for about a third more compute. Turning it
on or off changes neither the initial weights of a seed nor the checkpoints. A recomputed block
draws no dropout (its recomputation would draw other masks): remat needs `dropout: 0`.
"""
from __future__ import annotations

from tftrain.errors import ConfigError
from tftrain.models.attention import attention_class


def _check(input_shape, vocab_size, sequence_length, width: int, num_heads: int,
           model: str) -> None:
    """ConfigError unless the inputs are token ids, the dataset gave a vocabulary and a length,
    and the widths divide."""
    if len(tuple(input_shape or ())) > 1:
        raise ConfigError(f"model {model!r} reads token ids [batch, sequence_length], but the "
                          f"dataset's inputs have the shape {tuple(input_shape)} per example: "
                          "train it on a text dataset (pipelines text, jsonl)")
    if not vocab_size or not sequence_length:
        raise ConfigError(f"model {model!r} needs a text dataset with vocab_size and "
                          "sequence_length (or max_length) in its manifest's info (pipelines "
                          "text, jsonl); this dataset names "
                          f"{'neither' if not (vocab_size or sequence_length) else 'only one'}")
    if width % num_heads:
        raise ConfigError(f"model {model!r}: model.params.width={width} must be a multiple of "
                          f"model.params.num_heads={num_heads}")


def _embed(ids, vocab_size: int, sequence_length: int, width: int, dropout: float):
    """Token + position embeddings of `ids` [batch, sequence_length]."""
    import tensorflow as tf
    import tf_keras as keras

    tokens = keras.layers.Embedding(vocab_size, width, name="token_embedding")(ids)
    positions = tf.range(tf.shape(ids)[-1])  # a TFOpLambda layer: serializable by name
    x = tokens + keras.layers.Embedding(sequence_length, width,
                                        name="position_embedding")(positions)
    return keras.layers.Dropout(dropout, name="embedding_dropout")(x) if dropout else x


def _block(x, index: int, num_heads: int, mlp_width: int, dropout: float, *,
           causal: bool = False, attention_mask=None):
    """One pre-norm block (attention, then the MLP), each with a residual connection."""
    import tf_keras as keras

    layers = keras.layers
    width = x.shape[-1]
    name = f"block_{index}"
    y = layers.LayerNormalization(epsilon=1e-5, name=f"{name}_attention_norm")(x)
    y = attention_class()(num_heads, width // num_heads, dropout=dropout,
                          name=f"{name}_attention")(
        y, y, attention_mask=attention_mask, use_causal_mask=causal)
    x = layers.Add(name=f"{name}_attention_residual")([x, y])
    y = layers.LayerNormalization(epsilon=1e-5, name=f"{name}_mlp_norm")(x)
    y = layers.Dense(mlp_width, activation="gelu", name=f"{name}_mlp_in")(y)
    y = layers.Dense(width, name=f"{name}_mlp_out")(y)
    if dropout:
        y = layers.Dropout(dropout, name=f"{name}_mlp_dropout")(y)
    return layers.Add(name=f"{name}_mlp_residual")([x, y])


def _blocks(x, num_layers: int, num_heads: int, mlp_width: int, dropout: float,
            *, causal: bool = False, attention_mask=None):
    """`num_layers` blocks."""
    for index in range(num_layers):
        x = _block(x, index, num_heads, mlp_width, dropout, causal=causal,
                   attention_mask=attention_mask)
    return x


def _model_class(remat: bool, dropout: float):
    """The functional model class: `models.recompute`'s when `remat` (refused with dropout)."""
    import tf_keras as keras

    from tftrain.models.recompute import recomputed_model_class

    if not remat:
        return keras.Model
    if dropout:
        raise ConfigError(f"model.params.remat=true recomputes each block, and a block with "
                          f"dropout ({dropout}) would draw other masks when recomputed: set "
                          "model.params.dropout=0 (or remat=false)")
    return recomputed_model_class()


def transformer_lm(input_shape, outputs, vocab_size=None, sequence_length=None, width=64,
                   num_layers=2, num_heads=4, mlp_width=256, dropout=0.0, remat=False):
    """A causal Transformer decoder: logits over the vocabulary at every position.

    `vocab_size` and `sequence_length` come from the dataset (the text pipeline's info);
    `outputs` is the language-model task's spec (`vocab_size` logits). `width` is the model
    width, `mlp_width` the MLP's hidden width; `remat` recomputes each block's activations in
    the backward pass (see the module's docstring).
    """
    from tftrain.models.outputs import as_output_spec
    import tf_keras as keras

    outputs = as_output_spec(outputs)
    vocab_size = vocab_size or outputs.size
    sequence_length = sequence_length or (input_shape[0] if input_shape else None)
    _check(input_shape, vocab_size, sequence_length, width, num_heads, "transformer_lm")
    ids = keras.Input(shape=(sequence_length,), dtype="int32", name="inputs")
    model_class = _model_class(remat, dropout)
    x = _embed(ids, vocab_size, sequence_length, width, dropout)
    x = _blocks(x, num_layers, num_heads, mlp_width, dropout, causal=True)
    x = keras.layers.LayerNormalization(epsilon=1e-5, name="final_norm")(x)
    return model_class(ids, outputs.head(x), name="transformer_lm")


def transformer(input_shape, outputs, vocab_size=None, sequence_length=None, width=64,
                num_layers=2, num_heads=4, mlp_width=256, dropout=0.1, remat=False):
    """A Transformer encoder for text classification (or regression): padding (id 0) masked
    out of attention and of the mean pooling before the task's head (`outputs.head`);
    `remat` as for `transformer_lm`."""
    from tftrain.models.outputs import as_output_spec
    import tensorflow as tf
    import tf_keras as keras

    outputs = as_output_spec(outputs)
    sequence_length = sequence_length or (input_shape[0] if input_shape else None)
    _check(input_shape, vocab_size, sequence_length, width, num_heads, "transformer")
    ids = keras.Input(shape=(sequence_length,), dtype="int32", name="inputs")
    present = tf.cast(tf.not_equal(ids, 0), tf.float32)  # [batch, length]: 1 for a real token
    attention_mask = present[:, tf.newaxis, :]  # every query attends to the real tokens only
    model_class = _model_class(remat, dropout)
    x = _embed(ids, vocab_size, sequence_length, width, dropout)
    x = _blocks(x, num_layers, num_heads, mlp_width, dropout, attention_mask=attention_mask)
    x = keras.layers.LayerNormalization(epsilon=1e-5, name="final_norm")(x)
    if x.dtype != tf.float32:  # a mixed policy: pool the bf16/fp16 features in float32
        x = tf.cast(x, tf.float32)
    weights = present[:, :, tf.newaxis]
    pooled = tf.reduce_sum(x * weights, axis=1) / tf.maximum(tf.reduce_sum(weights, axis=1), 1.0)
    if dropout:
        pooled = keras.layers.Dropout(dropout, name="pooled_dropout")(pooled)
    return model_class(ids, outputs.head(pooled), name="transformer")
