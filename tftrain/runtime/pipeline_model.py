"""Pipelined training of a model cut into stages, one device each (`runtime.strategy=pipeline`).

Each step splits its batch into `microbatches` equal micro-batches. Every micro-batch goes
forward through the stages in order, stage s on its device, and then backward in reverse: the
last stage's tape gives the gradient of the loss with respect to its weights and its inputs,
which is handed to the stage before as `output_gradients`, and so on; each stage's backward ops
run under its device, beside its variables. The order in which a stage runs its passes is the
schedule's (`runtime.pipeline_schedule`, `runtime.pipeline_schedule` module: `1f1b` or
`gpipe`): the step's graph is written in the schedule's order and each pass of a stage depends
on the stage's previous pass (`tf.control_dependencies`), so TensorFlow's dataflow executor,
which starts an op as soon as its inputs exist, runs each stage in that order while different
stages overlap. The gradients are summed over the micro-batches on each stage's device (in
micro-batch order under both schedules) and their mean applied once, so a step is one update
over the whole batch (a loss that averages over the batch gives the one-device gradient;
BatchNormalization sees micro-batch statistics, as in GPipe).

`train.grad_accum_steps` = k runs k such pipelined groups in a `tf.while_loop` and applies
once (the input batches `k * data.batch_size`). Under `mixed_float16` the loss is scaled
before the backward pass and the gradients unscaled before they are applied
(`LossScaleOptimizer`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import tensorflow as tf
import tf_keras as keras

from tftrain.runtime import pipeline_schedule


@dataclasses.dataclass
class _MicroBatch:
    """What one micro-batch's passes hand each other within a step: per stage, the tape, the
    floating inputs it watched, what its backward differentiates and its output; the input
    gradients the last backward left for the stage before."""

    take: Callable[[Any], Any]  # this micro-batch's slice of a batch structure
    stages: dataclasses.InitVar[int]
    upstream: list | None = None

    def __post_init__(self, stages: int):
        self.tapes, self.watched = [None] * stages, [None] * stages
        self.targets, self.outputs = [None] * stages, [None] * stages


class PipelineModel(keras.Model):
    """`stages` (functional models) chained on `devices`, trained with micro-batches."""

    def __init__(self, stages, devices, microbatches: int, groups: int = 1,
                 schedule: str = "1f1b", **kwargs):
        super().__init__(**kwargs)
        pipeline_schedule.check(schedule)
        self.stages = list(stages)
        self.devices = list(devices)
        self.microbatches = microbatches
        self.groups = groups
        self.schedule = schedule

    def call(self, inputs, training=None):
        x = inputs
        for stage, device in zip(self.stages, self.devices):
            with tf.device(device):
                x = stage(x, training=training)
        return x

    def _forward(self, index: int, micro: _MicroBatch, batch) -> list:
        """Stage `index`'s forward pass of one micro-batch of `batch` (x, y, sample_weight),
        under its own tape. Keeps in `micro` the tape, the floating inputs it watched, what its
        backward pass differentiates (its floating outputs, then its regularization; the last
        stage: the scaled loss) and its output; returns the tensors that end the pass."""
        stage, last = self.stages[index], index == len(self.stages) - 1
        x = micro.outputs[index - 1] if index else micro.take(batch[0])
        with tf.GradientTape() as tape:
            floats = [t for t in tf.nest.flatten(x) if t.dtype.is_floating]
            tape.watch(floats)
            out = stage(x, training=True)
            extra = [tf.add_n(stage.losses)] if stage.losses else []
            if last:
                y, weights = micro.take(batch[1]), micro.take(batch[2])
                loss = tf.add_n([self.compiled_loss(y, out, weights), *extra])
                if isinstance(self.optimizer, keras.mixed_precision.LossScaleOptimizer):
                    loss = self.optimizer.get_scaled_loss(loss)
                differentiated = [loss]
            else:
                differentiated = [t for t in tf.nest.flatten(out) if t.dtype.is_floating]
                differentiated += extra
        if last:
            self.compiled_metrics.update_state(y, out, weights)
        micro.tapes[index], micro.watched[index] = tape, floats
        micro.targets[index], micro.outputs[index] = differentiated, out
        return differentiated

    def _backward(self, index: int, micro: _MicroBatch, sums: list) -> list:
        """Stage `index`'s backward pass of one micro-batch: its weights' gradients added into
        `sums[index]`, its inputs' gradients left in `micro.upstream` for the stage before;
        returns the tensors that end the pass."""
        stage, targets, watched = self.stages[index], micro.targets[index], micro.watched[index]
        seeds = None
        if index < len(self.stages) - 1:  # the loss's gradient w.r.t. the next stage's inputs
            seeds = micro.upstream + ([tf.ones_like(targets[-1])] if stage.losses else [])
        variables = stage.trainable_variables
        grads = micro.tapes[index].gradient(targets, variables + watched, output_gradients=seeds)
        for i, g in enumerate(grads[:len(variables)]):
            if g is not None:
                sums[index][i] = sums[index][i] + tf.convert_to_tensor(g)
        micro.upstream = [tf.zeros_like(t) if g is None else tf.convert_to_tensor(g)
                          for t, g in zip(watched, grads[len(variables):])]
        return list(sums[index]) + micro.upstream

    def _group(self, x, y, sample_weight, sums):
        """One pipelined group: every stage's forward and backward of every micro-batch, in
        the schedule's order; the sums grown.

        Each pass runs under a control dependency on its stage's previous pass: without it
        the executor may run every forward before any backward (or in any other order their
        inputs allow), and a stage would hold more activations than the schedule says."""
        size = tf.shape(tf.nest.flatten(x)[0])[0] // self.microbatches
        count = len(self.stages)

        def slicer(m):
            def take(structure):
                if structure is None:
                    return None
                return tf.nest.map_structure(lambda t: t[m * size:(m + 1) * size], structure)
            return take

        micro = [_MicroBatch(slicer(m), count) for m in range(self.microbatches)]
        previous = [[] for _ in range(count)]  # per stage: the tensors that ended its last pass
        for action in pipeline_schedule.schedule(self.schedule, count, self.microbatches):
            s = action.stage
            with tf.device(self.devices[s]), tf.control_dependencies(previous[s]), \
                    tf.name_scope(f"stage_{s}_{action.kind}_{action.microbatch}"):
                if action.kind == pipeline_schedule.FORWARD:
                    previous[s] = self._forward(s, micro[action.microbatch],
                                                (x, y, sample_weight))
                else:
                    previous[s] = self._backward(s, micro[action.microbatch], sums)
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
