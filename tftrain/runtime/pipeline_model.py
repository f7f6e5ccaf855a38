"""GPipe training of a model cut into stages, one device each (`runtime.strategy=pipeline`).

Each step splits its batch into `microbatches` equal micro-batches. Every micro-batch goes
forward through the stages in order, stage s on its device, and then backward in reverse: the
last stage's tape gives the gradient of the loss with respect to its weights and its inputs,
which is handed to the stage before as `output_gradients`, and so on; each stage's backward ops
run under its device, beside its variables. All micro-batches are written into one step's
graph, and nothing orders stage s on micro-batch i+1 after stage s+1 on micro-batch i: that is
the GPipe schedule, run by TensorFlow's dataflow executor, which starts an op as soon as its
inputs exist, on its own device. The gradients are summed over the micro-batches on each
stage's device and their mean applied once, so a step is one update over the whole batch
(a loss that averages over the batch gives the one-device gradient; BatchNormalization sees
micro-batch statistics, as in GPipe).

`train.grad_accum_steps` = k runs k such pipelined groups in a `tf.while_loop` and applies
once (the input batches `k * data.batch_size`). Under `mixed_float16` the loss is scaled
before the backward pass and the gradients unscaled before they are applied
(`LossScaleOptimizer`).
"""
from __future__ import annotations

import tensorflow as tf
import tf_keras as keras


class PipelineModel(keras.Model):
    """`stages` (functional models) chained on `devices`, trained with micro-batches."""

    def __init__(self, stages, devices, microbatches: int, groups: int = 1, **kwargs):
        super().__init__(**kwargs)
        self.stages = list(stages)
        self.devices = list(devices)
        self.microbatches = microbatches
        self.groups = groups

    def call(self, inputs, training=None):
        x = inputs
        for stage, device in zip(self.stages, self.devices):
            with tf.device(device):
                x = stage(x, training=training)
        return x

    def _forward(self, x, y, sample_weight):
        """One micro-batch forward through every stage, each under its own tape. Per stage:
        the tape, the floating inputs it watched, and what its backward pass differentiates
        (its floating outputs, then its regularization; the last stage: the scaled loss)."""
        tapes, watched, targets = [], [], []
        last = len(self.stages) - 1
        for index, (stage, device) in enumerate(zip(self.stages, self.devices)):
            with tf.device(device), tf.GradientTape() as tape:
                floats = [t for t in tf.nest.flatten(x) if t.dtype.is_floating]
                tape.watch(floats)
                out = stage(x, training=True)
                extra = [tf.add_n(stage.losses)] if stage.losses else []
                if index == last:
                    y_pred = out
                    loss = tf.add_n([self.compiled_loss(y, y_pred, sample_weight), *extra])
                    if isinstance(self.optimizer, keras.mixed_precision.LossScaleOptimizer):
                        loss = self.optimizer.get_scaled_loss(loss)
                    differentiated = [loss]
                else:
                    differentiated = [t for t in tf.nest.flatten(out) if t.dtype.is_floating]
                    differentiated += extra
            tapes.append(tape)
            watched.append(floats)
            targets.append(differentiated)
            x = out
        return tapes, watched, targets, y_pred

    def _backward(self, tapes, watched, targets, sums):
        """The micro-batch's gradients, last stage first, each stage's under its device, added
        into `sums` (a list per stage)."""
        upstream = None  # the gradient of the loss with respect to the next stage's inputs
        for index in reversed(range(len(self.stages))):
            stage = self.stages[index]
            with tf.device(self.devices[index]):
                seeds = None
                if upstream is not None:
                    seeds = upstream + ([tf.ones_like(targets[index][-1])] if stage.losses else [])
                variables = stage.trainable_variables
                grads = tapes[index].gradient(targets[index], variables + watched[index],
                                              output_gradients=seeds)
                for i, g in enumerate(grads[:len(variables)]):
                    if g is not None:
                        sums[index][i] = sums[index][i] + tf.convert_to_tensor(g)
                upstream = [tf.zeros_like(t) if g is None else tf.convert_to_tensor(g)
                            for t, g in zip(watched[index], grads[len(variables):])]
        return sums

    def _group(self, x, y, sample_weight, sums):
        """One pipelined group: every micro-batch forward and backward; the sums grown."""
        size = tf.shape(tf.nest.flatten(x)[0])[0] // self.microbatches
        for m in range(self.microbatches):
            def take(structure):
                if structure is None:
                    return None
                return tf.nest.map_structure(lambda t: t[m * size:(m + 1) * size], structure)
            xm, ym, wm = take(x), take(y), take(sample_weight)
            tapes, watched, targets, y_pred = self._forward(xm, ym, wm)
            sums = self._backward(tapes, watched, targets, sums)
            with tf.device(self.devices[-1]):
                self.compiled_metrics.update_state(ym, y_pred, wm)
        return sums

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        parts = self.microbatches * self.groups
        size = tf.shape(tf.nest.flatten(x)[0])[0]
        tf.debugging.assert_equal(size % parts, 0, message=(
            f"the batch must split into runtime.microbatches x train.grad_accum_steps = {parts} "
            "equal micro-batches"))
        zeros = []
        for stage, device in zip(self.stages, self.devices):
            with tf.device(device):
                zeros.append([tf.zeros_like(v) for v in stage.trainable_variables])
        if self.groups == 1:
            sums = self._group(x, y, sample_weight, zeros)
        else:
            group_size = size // self.groups
            shapes = [len(z) for z in zeros]

            def body(g, *flat):
                def take(structure):
                    if structure is None:
                        return None
                    return tf.nest.map_structure(
                        lambda t: t[g * group_size:(g + 1) * group_size], structure)
                nested, start = [], 0
                for count in shapes:
                    nested.append(list(flat[start:start + count]))
                    start += count
                grown = self._group(take(x), take(y), take(sample_weight), nested)
                return (g + 1, *[t for stage_sums in grown for t in stage_sums])

            _, *flat = tf.while_loop(lambda g, *_: g < self.groups, body,
                                     [tf.constant(0), *[t for z in zeros for t in z]],
                                     parallel_iterations=1)
            sums, start = [], 0
            for count in shapes:
                sums.append(flat[start:start + count])
                start += count
        grads, variables = [], []
        for stage, device, stage_sums in zip(self.stages, self.devices, sums):
            with tf.device(device):
                grads += [s / parts for s in stage_sums]
            variables += stage.trainable_variables
        if isinstance(self.optimizer, keras.mixed_precision.LossScaleOptimizer):
            grads = self.optimizer.get_unscaled_gradients(grads)
        self.optimizer.apply_gradients(zip(grads, variables))
        return self.get_metrics_result()
