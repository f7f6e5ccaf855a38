"""SGD, Adam and AdamW for DTensor whose updates are pure data flow.

In TensorFlow 2.21 a compiled DTensor function does not reliably order a variable read after
an earlier write to the same variable in that function: tf-keras's update steps write a slot
(`m.assign(...)`) and then read it for the weight update (`variable.assign_add(m)`), and under
DTensor that read returns the slot's value from the *previous* step (so SGD applies each
gradient one step late and the first step not at all; Adam the same with both moments). The
learning rate (`_current_learning_rate`) and the step count have the same problem.

These optimizers write each variable once per step, with a value computed from reads made
before that write (data dependencies, which DTensor keeps): the step count and learning rate
are read once, each slot's new value is computed, written, and the same tensor feeds the
weight update, into which AdamW's weight decay is folded. The arithmetic is tf-keras's.
"""
from __future__ import annotations

import tensorflow as tf
import tf_keras as keras

_schedules = keras.optimizers.schedules


class _DataflowUpdates:
    """Mixin for a tf-keras optimizer given `mesh=`: one data-dependent write per variable."""

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        """Makes sparse gradients (Embedding) dense first: DTensor has no layout propagation
        for the scatter ops of sparse updates (`ResourceScatterAdd`) in TensorFlow 2.21."""
        grads_and_vars = [(tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g, v)
                          for g, v in grads_and_vars]
        return super().apply_gradients(grads_and_vars, *args, **kwargs)

    def _compute_current_learning_rate(self):
        pass  # computed from this step's count in _internal_apply_gradients

    def _apply_weight_decay(self, variables):
        pass  # folded into each variable's single update (`_decayed`)

    def _internal_apply_gradients(self, grads_and_vars):
        step = self.iterations.read_value()
        if isinstance(self._learning_rate, _schedules.LearningRateSchedule):
            lr = tf.cast(self._learning_rate(step), tf.float32)
            self._current_learning_rate.assign(lr)  # what tf-keras reports as learning_rate
        else:
            lr = tf.identity(self._learning_rate)
        self._step_count, self._step_lr = step, lr
        for grad, variable in grads_and_vars:
            self._update_step(grad, variable)
        return self.iterations.assign(step + 1)

    def _lr(self, variable):
        return tf.cast(self._step_lr, variable.dtype)

    def _decayed(self, delta, variable):
        """`delta` (subtracted from `variable`) plus the decoupled weight decay, if any."""
        if not self.weight_decay or not self._use_weight_decay(variable):
            return delta
        return delta + variable * tf.cast(self.weight_decay, variable.dtype) * self._lr(variable)

    def _slot(self, slots, variable):
        return slots[self._index_dict[self._var_key(variable)]]


class SGD(_DataflowUpdates, keras.dtensor.experimental.optimizers.SGD):
    """tf-keras SGD (momentum, nesterov) with data-flow updates."""

    def update_step(self, gradient, variable):
        """One write to the momentum and one to the variable."""
        lr = self._lr(variable)
        momentum = tf.cast(self.momentum, variable.dtype)
        m = self._slot(self.momentums, variable)
        new_m = -gradient * lr + m * momentum
        m.assign(new_m)
        step = -gradient * lr + new_m * momentum if self.nesterov else new_m
        variable.assign_sub(self._decayed(-step, variable))


class _AdamUpdate:
    """Adam's (and AdamW's) dense update with data-flow moments."""

    def update_step(self, gradient, variable):
        """One write to each moment and one to the variable."""
        lr = self._lr(variable)
        local_step = tf.cast(self._step_count + 1, variable.dtype)
        beta_1_power = tf.pow(tf.cast(self.beta_1, variable.dtype), local_step)
        beta_2_power = tf.pow(tf.cast(self.beta_2, variable.dtype), local_step)
        alpha = lr * tf.sqrt(1 - beta_2_power) / (1 - beta_1_power)
        epsilon = self.epsilon
        if getattr(self, "adaptive_epsilon", False):
            epsilon = self.epsilon * tf.sqrt(1 - beta_2_power)
        m = self._slot(self._momentums, variable)
        v = self._slot(self._velocities, variable)
        new_m = m + (gradient - m) * (1 - self.beta_1)
        new_v = v + (tf.square(gradient) - v) * (1 - self.beta_2)
        m.assign(new_m)
        v.assign(new_v)
        if self.amsgrad:
            v_hat = self._slot(self._velocity_hats, variable)
            new_v = tf.maximum(v_hat, new_v)
            v_hat.assign(new_v)
        variable.assign_sub(self._decayed((new_m * alpha) / (tf.sqrt(new_v) + epsilon),
                                          variable))


class Adam(_DataflowUpdates, _AdamUpdate, keras.dtensor.experimental.optimizers.Adam):
    """tf-keras Adam with data-flow updates."""


class AdamW(_DataflowUpdates, _AdamUpdate, keras.dtensor.experimental.optimizers.AdamW):
    """tf-keras AdamW (decoupled weight decay) with data-flow updates."""
