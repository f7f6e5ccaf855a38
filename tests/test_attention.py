"""MatmulAttention: tf_keras's MultiHeadAttention computed with MatMul and BatchMatMulV2 (the
ops with fast bfloat16 kernels) gives the same weights, outputs and gradients, and leaves no
einsum in a Transformer's training step; bench/precision.py measures what it buys."""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tftrain import models
from tftrain.models.attention import _contraction, attention_class, staged_attention_class


@pytest.mark.parametrize("causal,lengths", [(True, None), (False, [10, 7, 3])])
def test_outputs_and_gradients_equal_tf_keras_multi_head_attention(causal, lengths):
    keras.utils.set_random_seed(3)
    x = tf.random.normal([3, 10, 16])
    mask = None if lengths is None else tf.sequence_mask(lengths, 10)[:, tf.newaxis, :]
    stock = keras.layers.MultiHeadAttention(4, 4, value_dim=6, name="attention")
    ours = attention_class()(4, 4, value_dim=6, name="attention")

    def loss_and_grads(layer):
        with tf.GradientTape() as tape:
            out = layer(x, x, attention_mask=mask, use_causal_mask=causal)
            loss = tf.reduce_sum(out * tf.range(16, dtype=tf.float32))
        return out, tape.gradient(loss, layer.trainable_weights)

    stock_out, _ = loss_and_grads(stock)
    ours(x, x)  # built
    assert [w.name for w in ours.weights] == [w.name for w in stock.weights]
    assert [w.shape for w in ours.weights] == [w.shape for w in stock.weights]
    ours.set_weights(stock.get_weights())
    stock_out, stock_grads = loss_and_grads(stock)
    ours_out, ours_grads = loss_and_grads(ours)
    np.testing.assert_allclose(ours_out, stock_out, atol=1e-5)
    for mine, theirs in zip(ours_grads, stock_grads):
        np.testing.assert_allclose(mine, theirs, atol=1e-4)
    assert type(ours).from_config(ours.get_config()).get_config() == ours.get_config()


@pytest.mark.parametrize("query_length,value_length", [(5, 5), (4, 7), (6, 3)])
def test_a_stages_causal_mask_is_the_parents_made_from_the_tensors(query_length, value_length):
    query = tf.random.normal([2, query_length, 8]).numpy()
    query[0, 1, 0] = np.nan  # a NaN among the values changes no position
    value = tf.random.normal([2, value_length, 8])
    stock = keras.layers.MultiHeadAttention(2, 4)
    ours = staged_attention_class()(2, 4)
    expected = stock._compute_causal_mask(tf.constant(query), value).numpy()
    assert expected.shape == (1, query_length, value_length)
    np.testing.assert_array_equal(ours._compute_causal_mask(tf.constant(query), value), expected)
    same = ours._compute_causal_mask(tf.constant(query)).numpy()
    np.testing.assert_array_equal(same, np.tril(np.ones((1, query_length, query_length), bool)))

    # Traced with static shapes, no op of the mask reads a shape (what the runtime would fold)
    graph = tf.function(ours._compute_causal_mask).get_concrete_function(
        tf.TensorSpec([2, query_length, 8]), tf.TensorSpec([2, value_length, 8])).graph
    kinds = {op.type for op in graph.get_operations()}
    assert not kinds & {"Shape", "Fill"} and "Equal" in kinds, kinds


def test_only_plain_contractions_become_matmuls():
    assert _contraction("abc,cde->abde") == 1  # query, key and value projections
    assert _contraction("abcd,cde->abe") == 2  # the output projection
    assert _contraction("abc,cd->abd") == 1
    assert _contraction("abc,dce->abde") is None  # contracted dim not leading in the kernel
    assert _contraction("ab...,bc->a...c") is None  # ellipsis: left to einsum


def _train_step_ops(model):
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = loss_fn(x, model(x, training=True))
        return tape.gradient(loss, model.trainable_variables)

    ids = tf.TensorSpec([2, 16], tf.int32)
    graph = step.get_concrete_function(ids).graph
    ops = list(graph.get_operations())
    for function in graph._functions.values():  # the gradient's and the layers' functions
        ops += list(function.graph.get_operations()) if hasattr(function, "graph") else []
    return ops


@pytest.mark.parametrize("remat", [False, True])
def test_a_bf16_transformer_lm_step_has_no_einsum_and_multiplies_in_bf16(remat):
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = models.build_model(
            "transformer_lm", {"width": 32, "num_layers": 2, "num_heads": 4, "mlp_width": 64,
                               "remat": remat}, (16,), 50, {"vocab_size": 50, "sequence_length": 16})
        ops = _train_step_ops(model)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert not [op.name for op in ops if op.type == "Einsum"]
    products = [op for op in ops if op.type in ("MatMul", "BatchMatMulV2")]
    float32 = [op.name for op in products if op.get_attr("T") != tf.bfloat16]
    assert len(products) > 12 * 2  # each block's 6 projections and 2 attention products, twice
    assert float32 and all("logits" in name for name in float32)  # the head only (the loss's)


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_the_text_classifier_builds_and_steps_under_a_mixed_policy(policy):
    keras.mixed_precision.set_global_policy(policy)  # it failed to build: a bf16 x float32 Mul
    try:
        model = models.build_model(
            "transformer", {"width": 32, "num_layers": 1, "num_heads": 4, "mlp_width": 64},
            (16,), 3, {"vocab_size": 50, "sequence_length": 16})
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True))
        ids = np.random.default_rng(0).integers(0, 50, size=(8, 16)).astype("int32")
        ids[:, 10:] = 0  # padding
        history = model.fit(ids, np.arange(8) % 3, epochs=1, verbose=0)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert model.output.dtype == tf.float32 and np.isfinite(history.history["loss"][0])
