"""Recomputation (`model.params.remat`) as a pure memory switch.

`recomputed_model_class()` is a functional `tf_keras.Model` class: built on a graph of layers
exactly as `keras.Model(inputs, outputs)` is, it has the same layers, created in the same order,
so the same seed gives the same initial weights, the same variable names and the same checkpoint
paths; a backup or an export written with recomputation resumes or loads without it, and the
reverse. Only its forward pass differs: the layers of each block (named `block_{i}_...`) run as
one function under `tf.recompute_grad`, so the backward pass recomputes a block's activations
from the block's inputs instead of keeping them, for about a third more compute. Inference
(`training` False or None: evaluation, generation, an export's serving signatures) runs the
plain graph: without a backward pass there is nothing to spare, and tracing it is cheaper.

A recomputed block must draw no random numbers (its recomputation would draw others): the
Transformers refuse `remat` with dropout.
"""
from __future__ import annotations

import functools
import re

BLOCK_NAME = re.compile(r"block_(\d+)_")  # block i's layers: block_{i}_attention_norm, ...


@functools.cache
def recomputed_model_class():
    """`Recomputed`, defined (and registered for loading) once, on first use: this module
    imports tf_keras lazily."""
    import tensorflow as tf
    import tf_keras as keras
    from tf_keras.src.engine import functional

    @keras.saving.register_keras_serializable(package="tftrain")
    class Recomputed(functional.Functional):
        """A functional model whose blocks are recomputed in the backward pass."""

        def _run_internal_graph(self, inputs, training=None, mask=None):
            if training is None or training is False:  # inference: no backward pass to spare
                return super()._run_internal_graph(inputs, training=training, mask=mask)
            values = _Values()
            for reference, value in zip(self.inputs, self._flatten_to_reference_inputs(inputs)):
                values[str(id(reference))] = self._conform_to_reference_input(
                    value, ref_input=reference)
            for unit in _units(self):
                if len(unit.nodes) == 1:  # a layer outside the blocks (or a one-layer block)
                    _run_nodes(unit.nodes, values)
                    continue
                outside = [values.get(key) for key in unit.inputs]

                def block(*tensors, unit=unit):
                    inner = _Values(zip(unit.inputs, tensors))
                    _run_nodes(unit.nodes, inner)
                    return [inner.get(key) for key in unit.outputs]

                values.update(zip(unit.outputs, tf.recompute_grad(block)(*outside)))
            outputs = [dict.__getitem__(values, str(id(x))) for x in self.outputs]
            return tf.nest.pack_sequence_as(self._nested_outputs, outputs)

    return Recomputed


class _Values(dict):
    """Tensor id -> computed tensor, handed to `Node.map_arguments`, which pops each input from
    a list (Keras keeps one copy per use, to free them early in eager mode)."""

    def __getitem__(self, key):
        return [dict.__getitem__(self, key)]


class _Unit:
    """A node run on its own, or a block's nodes run together (in graph order): the tensor ids
    they read from outside and those they produce for the rest of the model."""

    def __init__(self, nodes, inputs=(), outputs=()):
        self.nodes, self.inputs, self.outputs = nodes, list(inputs), list(outputs)


def _run_nodes(nodes, values: _Values) -> None:
    """Calls each node's layer on the tensors in `values`, adding its outputs to them."""
    import tensorflow as tf

    for node in nodes:
        args, kwargs = node.map_arguments(values)
        values.update(zip(node.flat_output_ids, tf.nest.flatten(node.layer(*args, **kwargs))))


def _units(model) -> list[_Unit]:
    """`model`'s nodes in an order that computes every input before its use, each block's nodes
    grouped into one unit. Built on each trace (not cached: loading a model rebuilds its graph)."""
    nodes = [node for depth in sorted(model._nodes_by_depth, reverse=True)
             for node in model._nodes_by_depth[depth] if not node.is_input]
    blocks: dict[str, _Unit] = {}
    units = []
    for node in nodes:
        match = BLOCK_NAME.match(node.layer.name)
        if match is None:
            units.append(_Unit([node], node.flat_input_ids, node.flat_output_ids))
        elif match.group(1) in blocks:
            blocks[match.group(1)].nodes.append(node)
        else:
            blocks[match.group(1)] = _Unit([node])
            units.append(blocks[match.group(1)])  # its nodes, inputs and outputs filled in below
    model_outputs = {str(id(x)) for x in model.outputs}
    for unit in blocks.values():
        made = {key for node in unit.nodes for key in node.flat_output_ids}
        unit.inputs = list(dict.fromkeys(key for node in unit.nodes
                                         for key in node.flat_input_ids if key not in made))
        inside = {id(node) for node in unit.nodes}
        read_outside = {key for node in nodes if id(node) not in inside
                        for key in node.flat_input_ids} | model_outputs
        unit.outputs = [key for node in unit.nodes for key in node.flat_output_ids
                        if key in read_outside]
    return _ordered(units, {str(id(x)) for x in model.inputs})


def _ordered(units: list[_Unit], available: set) -> list[_Unit]:
    """`units` in an order where each one's inputs exist before it runs (the graph's depth
    order, with a block placed once all it reads from outside is computed)."""
    available, pending, ordered = set(available), list(units), []
    while pending:
        for unit in pending:
            if all(key in available for key in unit.inputs):
                break
        else:
            raise ValueError("recomputation: a block reads a tensor computed after it (its "
                             "layers are not one contiguous block of the model)")
        pending.remove(unit)
        ordered.append(unit)
        available.update(unit.outputs)
    return ordered
