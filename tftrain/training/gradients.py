"""The gradient's global norm, measured at every update and clipped to `train.clip_global_norm`.

`GradientNorm` is a mixin of every optimizer tftrain builds (`training.optimizers`,
`runtime.dtensor_optimizers`). It works in tf-keras's `_clip_gradients`, which
`apply_gradients` calls once per update with the gradients it is about to apply: under a
`tf.distribute` strategy after they were all-reduced (clipping each replica's own gradient
before the reduction would clip a different vector: tensorflow/tensorflow#33929), under
`mixed_float16` after `LossScaleOptimizer` removed the loss scale (a step whose gradients are
not finite never gets here: the loss-scale optimizer skips it and lowers the scale), with
gradient accumulation once per update (the accumulated mean), and under DTensor on the
sharded gradients, whose squared sums DTensor reduces over the shards. Pipeline stages apply
every stage's gradient at once, and with replicas each stage's gradient once per copy: the
pipeline names the gradients that count once (`counting_once`), so the norm is the whole
model's, over every stage, counted once.

Each update writes the norm, the largest finite norm so far and the clipped updates (a share of
the optimizer's `iterations`: every update applied was measured) into variables of the
optimizer: they are saved with its backup and restored on resume, and
`callbacks.gradient_norm` reads them into the step logs, TensorBoard and summary.json. A
non-finite norm makes the update non-finite; the divergence guard acts on it
(`train.on_nan`) at that step.
"""
from __future__ import annotations

import contextlib

import tensorflow as tf


class GradientNorm:
    """Mixin for a tf-keras optimizer: measures the global norm of each update's gradients
    and, with `clip_global_norm` > 0, scales them down to at most that norm.

    Args (keyword, besides the optimizer's own):
        clip_global_norm: the largest global norm an update applies; 0 measures only.
    """

    def __init__(self, *args, clip_global_norm: float = 0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.clip_global_norm = float(clip_global_norm)
        self._counted_once = None  # the gradients the norm counts (`counting_once`), or None
        self.gradient_norm = None  # built by `build`: the last update's norm
        self.max_gradient_norm = None
        self.clipped_updates = None

    def build(self, var_list):
        """The optimizer's own variables, then (once) the norm's."""
        super().build(var_list)
        if self.gradient_norm is None:
            self.gradient_norm = self._statistic("gradient_norm", tf.float32)
            self.max_gradient_norm = self._statistic("max_gradient_norm", tf.float32)
            self.clipped_updates = self._statistic("clipped_updates", tf.int64)

    def _statistic(self, name: str, dtype) -> tf.Variable:
        """A scalar written once per update with the same value on every replica (kept apart
        from `self.variables`, which counts the slots of the weights)."""
        mesh = getattr(self, "_mesh", None)
        with tf.init_scope():
            initial = tf.zeros([], dtype)
            if mesh is not None:  # a DTensor optimizer: a variable on the mesh, replicated
                from tensorflow.experimental import dtensor

                replicated = dtensor.Layout.replicated(mesh, rank=0)
                return dtensor.DVariable(dtensor.copy_to_mesh(initial, replicated), name=name,
                                         trainable=False)
            return tf.Variable(initial, name=name, trainable=False,
                               aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

    def _clip_gradients(self, grads):
        grads = super()._clip_gradients(grads)  # tf-keras's clipnorm/clipvalue (tftrain sets none)
        grads = self._deduplicate_sparse_grad(grads)  # an embedding's repeated rows, summed
        counted = grads if self._counted_once is None else self._counted_once
        norm = global_norm(counted)
        clip = self.clip_global_norm
        if clip > 0:
            scale = clip / tf.maximum(norm, clip)  # NaN when the norm is: the guard acts on it
            grads = [None if g is None else _scaled(g, scale) for g in grads]
        finite = tf.math.is_finite(norm)
        # Each written once, from values read before the write (DTensor orders nothing else).
        self.max_gradient_norm.assign(
            tf.where(finite, tf.maximum(self.max_gradient_norm.read_value(), norm),
                     self.max_gradient_norm.read_value()))
        self.gradient_norm.assign(norm)
        self.clipped_updates.assign_add(tf.cast(norm > clip, tf.int64) if clip > 0
                                        else tf.constant(0, tf.int64))
        return grads

    def get_config(self):
        return {**super().get_config(), "clip_global_norm": self.clip_global_norm}


def global_norm(grads) -> tf.Tensor:
    """The square root of the sum of squares of every entry of `grads` (tensors, IndexedSlices
    with unique indices, or None), in float32 whatever their dtype."""
    squares = [tf.reduce_sum(tf.square(tf.cast(_values(g), tf.float32)))
               for g in grads if g is not None]
    return tf.sqrt(tf.add_n(squares)) if squares else tf.constant(0.0)


def _values(gradient):
    return gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient


def _scaled(gradient, scale):
    scale = tf.cast(scale, gradient.dtype)
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(gradient.values * scale, gradient.indices, gradient.dense_shape)
    return gradient * scale


def measuring(optimizer) -> GradientNorm | None:
    """The `GradientNorm` inside `optimizer` (a `LossScaleOptimizer`'s inner one), or None."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    return inner if isinstance(inner, GradientNorm) else None


@contextlib.contextmanager
def counting_once(optimizer, grads):
    """Within it, `optimizer` measures (and clips by) the global norm of `grads` alone, not of
    every gradient it is given: the pipeline passes each stage's gradient once per copy."""
    inner = measuring(optimizer)
    if inner is None:
        yield
        return
    inner._counted_once = list(grads)
    try:
        yield
    finally:
        inner._counted_once = None


def summary(optimizer) -> dict:
    """summary.json's `gradients`: the last update's global norm, the largest finite one, and
    how many updates (and which fraction of them) were clipped."""
    inner = measuring(optimizer)
    if inner is None or inner.gradient_norm is None:
        return {}
    measured = int(inner.iterations.numpy())  # every applied update was measured
    clipped = int(inner.clipped_updates.numpy())
    return {"clip_global_norm": inner.clip_global_norm,
            "last_norm": float(inner.gradient_norm.numpy()),
            "max_norm": float(inner.max_gradient_norm.numpy()),
            "clipped_steps": clipped,
            "clipped_fraction": round(clipped / measured, 6) if measured else 0.0}
