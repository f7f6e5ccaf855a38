"""Model FLOPs: what one example costs a training step, counted from the built model's layers.

Counted, per example, as the MFU convention counts them (a multiply-add is 2 FLOPs; the
backward pass is twice the forward, so a training step is 3x the forward pass; recomputation
is not counted, being work the model does not need):

  Dense, EinsumDense   2 x kernel size x the positions it is applied at (a Dense on
                       [T, d] runs T times)
  Conv1D/2D/3D         2 x kernel size x output positions (depthwise and separable alike,
                       from their kernels)
  MultiHeadAttention   its four projections as above, plus 2 x 2 x heads x T x S x key_dim
                       (the scores Q.K and the weighted sum of V); tftrain's MatMul attention
                       (`models.attention`) is named as the layer it computes
  everything else      0 (embeddings are lookups; norms, activations, softmax and adds are
                       elementwise and small beside the matmuls)

A nested model is counted through its layers (a recomputed model, `models.recompute`, has the
plain model's layers: recomputation adds no counted FLOPs). Shapes come from each layer's call in the functional graph, so the model need not
run; a layer whose output shape is unknown is counted as 0 and named.
"""
from __future__ import annotations

import math

MATMUL_LAYERS = ("Dense", "EinsumDense")
ATTENTION_LAYERS = ("MultiHeadAttention",)
CONV_LAYERS = ("Conv1D", "Conv2D", "Conv3D", "DepthwiseConv2D", "SeparableConv2D",
               "Conv1DTranspose", "Conv2DTranspose", "Conv3DTranspose")


def _known(shape) -> list[int] | None:
    dims = list(shape)[1:]
    return None if any(d is None for d in dims) else [int(d) for d in dims]


def _kernel_elements(layer) -> int:
    return sum(math.prod(w.shape) for w in layer.weights
               if "kernel" in w.name or "depthwise" in w.name or "pointwise" in w.name)


def _dense(layer, input_shape, output_shape) -> int:
    """2 x kernel x positions: the output's elements over the kernel's output width."""
    out = _known(output_shape)
    if out is None:
        raise ValueError(layer.name)
    kernel = _kernel_elements(layer)
    width = layer.kernel.shape[-1] if hasattr(layer, "kernel") else out[-1]
    positions = math.prod(out) // max(int(width), 1)
    return 2 * kernel * positions


def _conv(layer, output_shape) -> int:
    out = _known(output_shape)
    if out is None:
        raise ValueError(layer.name)
    channels_last = getattr(layer, "data_format", "channels_last") == "channels_last"
    positions = math.prod(out[:-1] if channels_last else out[1:])
    if type(layer).__name__ == "SeparableConv2D":
        depthwise = math.prod(layer.depthwise_kernel.shape)
        return 2 * (depthwise + math.prod(layer.pointwise_kernel.shape)) * positions
    if type(layer).__name__ == "DepthwiseConv2D":
        return 2 * math.prod(layer.depthwise_kernel.shape) * positions
    return 2 * _kernel_elements(layer) * positions


def _attention(layer, query_shape, value_shape) -> int:
    """The projections (query, key, value, output) and the two attention matmuls."""
    config = layer.get_config()
    heads, key_dim = config["num_heads"], config["key_dim"]
    value_dim = config.get("value_dim") or key_dim
    queries, keys = int(query_shape[1]), int(value_shape[1])
    projections = 0
    for dense, length in ((layer._query_dense, queries), (layer._key_dense, keys),
                          (layer._value_dense, keys), (layer._output_dense, queries)):
        projections += 2 * math.prod(dense.kernel.shape) * length
    return projections + 2 * heads * queries * keys * (key_dim + value_dim)


def forward_flops_per_example(model) -> tuple[int, list[str]]:
    """(FLOPs of one example's forward pass, the layers whose shapes were unknown)."""
    total, unknown = 0, []
    for node in _nodes(model):
        layer = node.layer
        try:
            total += _layer_flops(layer, node)
        except (ValueError, AttributeError, TypeError):
            unknown.append(layer.name)
    return total, unknown


def training_flops_per_example(model) -> int:
    """FLOPs one example costs a training step: 3 x the forward pass."""
    return 3 * forward_flops_per_example(model)[0]


def _nodes(model) -> list:
    return [node for group in getattr(model, "_nodes_by_depth", {}).values() for node in group
            if node.layer is not model]


def _layer_flops(layer, node) -> int:
    kind = type(layer).__name__
    inputs = node.input_tensors if isinstance(node.input_tensors, list) else [node.input_tensors]
    outputs = node.outputs if isinstance(node.outputs, (list, tuple)) else [node.outputs]
    if getattr(layer, "_is_graph_network", False):
        return forward_flops_per_example(layer)[0]
    if kind in MATMUL_LAYERS:
        return _dense(layer, inputs[0].shape, outputs[0].shape)
    if kind in CONV_LAYERS:
        return _conv(layer, outputs[0].shape)
    if kind in ATTENTION_LAYERS:
        return _attention(layer, inputs[0].shape, inputs[-1].shape if len(inputs) > 1
                          else inputs[0].shape)
    return 0
