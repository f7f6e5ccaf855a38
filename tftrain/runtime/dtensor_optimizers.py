"""SGD, Adam, AdamW and Adafactor for DTensor whose updates are pure data flow.

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
With `train.ema_decay` (`training.ema`) the weight's average is written once too, from the
weight's new value as a tensor (`_apply_delta`), not from a read of the just-written weight;
it is laid out as its weight is (split over `model` like it, never over `batch`).

With `shard_state=True` (`runtime.shard_optimizer_state`, ZeRO-1) each slot is created with the
layout `dtensor_layouts.slot_spec` gives: besides any split over `model` that its weight has,
split over the mesh's `batch` dimension, so each data-parallel replica keeps and updates 1/batch
of it. A step lays the (all-reduced) gradient out as the slot is (`_to_slot`: each replica
takes its share, no communication), computes the new slot values and the weight's delta there,
and lays the delta out as the weight is (`_to_weight`: the all-gather over `batch`) before the
weight's one write.
"""
from __future__ import annotations

import tensorflow as tf
import tf_keras as keras
from tensorflow.experimental import dtensor

from tftrain.runtime import dtensor_layouts
from tftrain.training import ema, optimizers
from tftrain.training.gradients import GradientNorm

_schedules = keras.optimizers.schedules


class _DataflowUpdates:
    """Mixin for a tf-keras optimizer given `mesh=`: one data-dependent write per variable,
    and (`shard_state=True`) slots split over the mesh's batch dimension."""

    def __init__(self, *args, shard_state: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self._shard_state = shard_state
        self._layouts = {}  # variable key -> its Layout (read in eager mode, used in the step)

    def add_variable_from_reference(self, model_variable, variable_name, shape=None,
                                    initial_value=None):
        """A slot laid out by `dtensor_layouts.slot_spec` (split over `batch` when sharded); the
        weight's average laid out as the weight, starting from its value."""
        if variable_name == "average":
            return self._average_of(model_variable)
        if not self._shard_state:
            return super().add_variable_from_reference(model_variable, variable_name, shape,
                                                       initial_value)
        weight_layout = dtensor.fetch_layout(model_variable)
        self._layouts[self._var_key(model_variable)] = weight_layout
        slot_shape = tuple(model_variable.shape if shape is None else shape)
        dims = dict(zip(self._mesh.dim_names, self._mesh.shape()))
        spec = dtensor_layouts.slot_spec(tuple(weight_layout.sharding_specs), slot_shape, dims,
                                         shard_state=True)
        layout = dtensor.Layout(list(spec), self._mesh)
        dtype = getattr(model_variable, "true_dtype", model_variable.dtype)
        slot = dtensor.DVariable(
            initial_value=dtensor.call_with_layout(tf.zeros, layout, slot_shape, dtype=dtype),
            name=f"{variable_name}/{model_variable._shared_name}", dtype=dtype, trainable=False)
        self._variables.append(slot)
        self._layouts[self._var_key(slot)] = layout
        return slot

    def _average_of(self, model_variable):
        """The average of `model_variable`: its value, in its layout (tf-keras would copy the
        initial value replicated)."""
        average = dtensor.DVariable(
            initial_value=model_variable.read_value(),
            name=f"average/{model_variable._shared_name}", trainable=False)
        self._variables.append(average)
        return average

    def _apply_delta(self, variable, delta):
        """`variable -= delta` as one write, and its average's one write from the same new
        value (with the decay of this step's count, read once)."""
        new = variable - delta
        variable.assign(new)
        if self.use_ema:
            average = self._model_variables_moving_average[
                self._index_dict[self._var_key(variable)]]
            decay = ema.warmup_decay(self.ema_momentum, self._step_count + 1, average.dtype)
            average.assign(decay * average + (1 - decay) * new)

    def _to_slot(self, tensor, slot):
        """`tensor` laid out as `slot` is: each replica keeps its share."""
        if not self._shard_state:
            return tensor
        return dtensor.relayout(tensor, self._layouts[self._var_key(slot)])

    def _update_step(self, gradient, variable):
        """Pins the gradient to its weight's layout first: otherwise DTensor's layout
        propagation pushes a slot's `batch` split back into the op that made the gradient
        (a bias's `BiasAddGrad`), which cannot produce it."""
        if self._shard_state:
            gradient = dtensor.relayout(gradient, self._layouts[self._var_key(variable)])
        return super()._update_step(gradient, variable)

    def _to_weight(self, tensor, variable):
        """`tensor` (a delta in a slot's layout) laid out as `variable` is: the all-gather."""
        if not self._shard_state:
            return tensor
        return dtensor.relayout(tensor, self._layouts[self._var_key(variable)])

    def _gathered(self, tensor):
        """`tensor` replicated over the mesh (Adafactor's row and column means)."""
        if not self._shard_state:
            return tensor
        return dtensor.relayout(tensor, dtensor.Layout.replicated(self._mesh, tensor.shape.rank))

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


class SGD(optimizers.KernelL2, GradientNorm, _DataflowUpdates, keras.dtensor.experimental.optimizers.SGD):
    """tf-keras SGD (momentum, nesterov) with data-flow updates."""

    def update_step(self, gradient, variable):
        """One write to the momentum and one to the variable."""
        lr = self._lr(variable)
        momentum = tf.cast(self.momentum, variable.dtype)
        m = self._slot(self.momentums, variable)
        gradient = self._to_slot(gradient, m)
        new_m = -gradient * lr + m * momentum
        m.assign(new_m)
        step = -gradient * lr + new_m * momentum if self.nesterov else new_m
        self._apply_delta(variable, self._decayed(-self._to_weight(step, variable), variable))


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
        gradient = self._to_slot(gradient, m)
        new_m = m + (gradient - m) * (1 - self.beta_1)
        new_v = v + (tf.square(gradient) - v) * (1 - self.beta_2)
        m.assign(new_m)
        v.assign(new_v)
        if self.amsgrad:
            v_hat = self._slot(self._velocity_hats, variable)
            new_v = tf.maximum(v_hat, new_v)
            v_hat.assign(new_v)
        delta = self._to_weight((new_m * alpha) / (tf.sqrt(new_v) + epsilon), variable)
        self._apply_delta(variable, self._decayed(delta, variable))


class Adam(GradientNorm, _DataflowUpdates, _AdamUpdate,
           keras.dtensor.experimental.optimizers.Adam):
    """tf-keras Adam with data-flow updates."""


class AdamW(GradientNorm, _DataflowUpdates, _AdamUpdate,
            keras.dtensor.experimental.optimizers.AdamW):
    """tf-keras AdamW (decoupled weight decay) with data-flow updates."""


class Adafactor(GradientNorm, _DataflowUpdates, optimizers.FactoredAdafactor):
    """tftrain's Adafactor (factored second moments, written once per step) on a mesh."""

    def _rate_and_step(self, variable):
        """The rate and step count read once for this step (`_internal_apply_gradients`)."""
        return self._lr(variable), tf.cast(self._step_count + 1, variable.dtype)
