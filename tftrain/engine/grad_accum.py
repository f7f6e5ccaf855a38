"""Gradient accumulation: one optimizer update per k micro-batches (`train.grad_accum_steps`).

`wrap(model, k)` returns a thin Keras model around `model` whose `train_step` receives k
micro-batches at once (the input pipeline batches `k * data.batch_size`), splits them, runs
forward and backward on one micro-batch at a time in a `tf.while_loop` (so only one
micro-batch's activations are alive), sums the gradients and applies their mean once. Batch B
with k=4 therefore trains like batch 4B, with the memory of batch B.

Doing all k micro-batches inside one step keeps the optimizer call out of any conditional,
so it works unchanged under every `tf.distribute` strategy (each replica accumulates its own
gradients; the optimizer all-reduces once per update) and with `LossScaleOptimizer`, whose
`compute_gradients` scales the loss and unscales the gradients of each micro-batch. Step
counts (`steps_per_epoch`, `train.steps`, backups, schedules) count updates, not micro-batches.
"""
from __future__ import annotations

import tensorflow as tf
import tf_keras as keras


class GradAccumModel(keras.Model):
    """Trains `inner` with gradients accumulated over `steps` micro-batches per update."""

    def __init__(self, inner: keras.Model, steps: int, **kwargs):
        super().__init__(name=f"{inner.name}_grad_accum", **kwargs)
        self.inner = inner
        self.steps = steps

    def call(self, inputs, training=None):
        return self.inner(inputs, training=training)

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        k = self.steps
        size = tf.shape(tf.nest.flatten(x)[0])[0]
        tf.debugging.assert_equal(
            size % k, 0, message=f"the batch must split into grad_accum_steps={k} micro-batches")
        micro = size // k
        variables = self.trainable_variables

        def take(structure, i):
            if structure is None:
                return None
            return tf.nest.map_structure(lambda t: t[i * micro:(i + 1) * micro], structure)

        def body(i, *sums):
            xi, yi, wi = take(x, i), take(y, i), take(sample_weight, i)
            with tf.GradientTape() as tape:
                y_pred = self(xi, training=True)
                loss = self.compute_loss(xi, yi, y_pred, wi)
            grads = [g for g, _ in self.optimizer.compute_gradients(loss, variables, tape)]
            self.compiled_metrics.update_state(yi, y_pred, wi)
            return (i + 1, *[s if g is None else s + tf.convert_to_tensor(g)
                             for s, g in zip(sums, grads)])

        zeros = [tf.zeros_like(v) for v in variables]
        _, *sums = tf.while_loop(lambda i, *_: i < k, body, [tf.constant(0), *zeros],
                                 parallel_iterations=1)
        self.optimizer.apply_gradients(zip([s / k for s in sums], variables))
        return self.get_metrics_result()


def wrap(model: keras.Model, steps: int) -> keras.Model:
    """`model` itself when `steps` is 1, else a `GradAccumModel` around it (export `model`)."""
    if steps == 1:
        return model
    wrapped = GradAccumModel(model, steps)
    # Build it (BackupAndRestore needs built models) by calling it once on a dummy batch.
    wrapped(tf.nest.map_structure(lambda t: tf.zeros([1, *t.shape[1:]], t.dtype), model.input))
    return wrapped
