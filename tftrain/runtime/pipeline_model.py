"""Pipelined training of a model cut into stages, one device each (`runtime.strategy=pipeline`).

Each step splits its batch into `microbatches` equal micro-batches. Every micro-batch goes
forward through the stages in order, stage s on its device, and then backward in reverse: the
last stage's tape gives the gradient of the loss with respect to its weights and its inputs,
which is handed to the stage before as `output_gradients`, and so on; each stage's backward ops
run under its device, beside its variables. The order in which a stage runs its passes is the
schedule's (`runtime.pipeline_schedule`, `runtime.pipeline_schedule` module: `1f1b`, `gpipe`
or `interleaved`): the step's graph is written in the schedule's order and each pass of a stage
depends on the stage's previous pass (`tf.control_dependencies`), so TensorFlow's dataflow
executor, which starts an op as soon as its inputs exist, runs each stage in that order while
different stages overlap. Under `interleaved` the model is cut into S x V chunks, chunk c on
stage c % S: the chain is the stage's (its device's), through the passes of all its chunks.
The gradients are summed over the micro-batches on each stage's device (in micro-batch order
under every schedule) and their mean applied once, so a step is one update over the whole batch
(a loss that averages over the batch gives the one-device gradient; BatchNormalization sees
micro-batch statistics, as in GPipe).

`replicas` = R > 1 (`runtime.pipeline_replicas`) trains R copies of the pipeline side by side,
replica r's stage s on device r * S + s (its chunk c on r * S + c % S): each group's batch is
split into R consecutive slices, replica r runs the schedule on slice r, and each stage's
gradient sums are averaged over its R copies (all-reduced: added on replica 0's device of that
stage, divided by R x M, copied to the other copies' devices); one `apply_gradients` then
applies the same averaged gradient to every copy, whose optimizer slots start equal and see
equal gradients, so the copies stay equal (BatchNormalization's moving statistics, updated by
each copy from its own slice, are set to their mean over the copies after the update). The step
is one update over the whole batch, as with one replica. On GPUs a NCCL all-reduce among the R
devices of a stage would avoid sending every copy's sums through one device; the explicit sum
is what runs on either.

`workers` (`runtime.pipeline_workers.Workers`, a run on W > 1 workers): every worker holds the
same S x R devices' copies and trains on its own 1/W of each batch (the backend reads it); each
stage's sums, added over its local copies, are then summed over the W workers on the device of
replica 0's copy (one collective per stage, among the W devices that hold it) and divided by
W x R x M, so every copy on every worker gets the gradient of the whole batch; the moving
statistics are averaged over all W x R copies the same way, and the metrics `fit` reports are
those of the whole batches (their states summed over the workers when read). `synchronize`
sets every copy to the chief's weights before training.

`train.grad_accum_steps` = k runs k such pipelined groups in a `tf.while_loop` and applies
once (the input batches `k * data.batch_size`). Under `mixed_float16` the loss is scaled
before the backward pass and the gradients unscaled before they are applied
(`LossScaleOptimizer`).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import tensorflow as tf
import tf_keras as keras

from tftrain.runtime import pipeline_schedule, pipeline_workers
from tftrain.training import gradients


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


def scope(action, stages: int, virtual: int) -> str:
    """The name scope of an action's ops: `stage_1_forward_0`, under `interleaved`
    `stage_1_chunk_3_forward_0` (stage 1's pass of the model's chunk 3)."""
    chunk = f"chunk_{action.chunk(stages)}_" if virtual > 1 else ""
    return f"stage_{action.stage}_{chunk}{action.kind}_{action.microbatch}"


def _slice(structure, index, size):
    """Examples `index * size` to `(index + 1) * size` of every tensor of a batch structure
    (None stays None)."""
    if structure is None:
        return None
    return tf.nest.map_structure(lambda t: t[index * size:(index + 1) * size], structure)


class PipelineModel(keras.Model):
    """`stages` (functional models) chained on `devices`, trained with micro-batches. With
    `replicas` = R, `stages` and `devices` hold R copies of the pipeline one after another
    (replica r's stage s at r * S + s), trained data-parallel; `call` runs replica 0's. With
    `virtual_stages` = V (`interleaved`), each copy is S x V chunks in model order, chunk c
    on the device of stage c % S (`devices` names each chunk's)."""

    def __init__(self, stages, devices, microbatches: int, groups: int = 1,
                 schedule: str = "1f1b", replicas: int = 1, virtual_stages: int = 1,
                 workers: pipeline_workers.Workers | None = None, **kwargs):
        super().__init__(**kwargs)
        if len(stages) % (replicas * virtual_stages) or len(devices) != len(stages):
            raise ValueError(f"{len(stages)} stages on {len(devices)} devices are not "
                             f"{replicas} equal copies of a pipeline of {virtual_stages} "
                             "chunks per stage")
        self.stages = list(stages)
        self.devices = list(devices)
        self.microbatches = microbatches
        self.groups = groups
        self.schedule = schedule
        self.replicas = replicas
        self.virtual_stages = virtual_stages
        self.workers = workers
        pipeline_schedule.check(schedule, self.pipeline_stages, microbatches, virtual_stages)

    @property
    def pipeline_stages(self) -> int:
        """S, the stages (devices) of one replica; each runs `virtual_stages` of its chunks."""
        return len(self.stages) // (self.replicas * self.virtual_stages)

    def replica(self, index: int) -> tuple[list, list]:
        """Replica `index`'s stages and their devices."""
        count = len(self.stages) // self.replicas
        part = slice(index * count, (index + 1) * count)
        return self.stages[part], self.devices[part]

    def copies(self, index: int) -> list[tuple]:
        """Stage `index`'s copies, one per replica in replica order, with their devices."""
        count = len(self.stages) // self.replicas
        return list(zip(self.stages[index::count], self.devices[index::count]))

    def call(self, inputs, training=None):
        x = inputs
        for stage, device in zip(*self.replica(0)):
            with tf.device(device):
                x = stage(x, training=training)
        return x

    def _forward(self, stages, index: int, micro: _MicroBatch, batch) -> list:
        """Stage `index` (of one replica's `stages`)'s forward pass of one micro-batch of
        `batch` (x, y, sample_weight), under its own tape. Keeps in `micro` the tape, the
        floating inputs it watched, what its backward pass differentiates (its floating
        outputs, then its regularization; the last stage: the scaled loss) and its output;
        returns the tensors that end the pass."""
        stage, last = stages[index], index == len(stages) - 1
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

    def _backward(self, stages, index: int, micro: _MicroBatch, sums: list) -> list:
        """Stage `index` (of one replica's `stages`)'s backward pass of one micro-batch: its
        weights' gradients added into `sums[index]`, its inputs' gradients left in
        `micro.upstream` for the stage before; returns the tensors that end the pass."""
        stage, targets, watched = stages[index], micro.targets[index], micro.watched[index]
        seeds = None
        if index < len(stages) - 1:  # the loss's gradient w.r.t. the next stage's inputs
            seeds = micro.upstream + ([tf.ones_like(targets[-1])] if stage.losses else [])
        variables = stage.trainable_variables
        grads = micro.tapes[index].gradient(targets, variables + watched, output_gradients=seeds)
        for i, g in enumerate(grads[:len(variables)]):
            if g is not None:
                sums[index][i] = sums[index][i] + tf.convert_to_tensor(g)
        micro.upstream = [tf.zeros_like(t) if g is None else tf.convert_to_tensor(g)
                          for t, g in zip(watched, grads[len(variables):])]
        return list(sums[index]) + micro.upstream

    def _pipeline(self, replica: int, x, y, sample_weight, sums):
        """Replica `replica`'s pipeline on (x, y, sample_weight): every chunk's forward and
        backward of every micro-batch, in the schedule's order; its `sums` grown.

        Each pass runs under a control dependency on its stage's previous pass (whichever of
        the stage's chunks that ran): without it the executor may run every forward before
        any backward (or in any other order their inputs allow), and a stage would hold more
        activations than the schedule says."""
        stages, devices = self.replica(replica)
        size = tf.shape(tf.nest.flatten(x)[0])[0] // self.microbatches
        micro = [_MicroBatch(functools.partial(_slice, index=m, size=size), len(stages))
                 for m in range(self.microbatches)]
        count = self.pipeline_stages
        previous = [[] for _ in range(count)]  # per stage (device): what ended its last pass
        for action in pipeline_schedule.schedule(self.schedule, count, self.microbatches,
                                                 self.virtual_stages):
            s, c = action.stage, action.chunk(count)
            with tf.device(devices[c]), tf.control_dependencies(previous[s]), \
                    tf.name_scope(scope(action, count, self.virtual_stages)):
                if action.kind == pipeline_schedule.FORWARD:
                    previous[s] = self._forward(stages, c, micro[action.microbatch],
                                                (x, y, sample_weight))
                else:
                    previous[s] = self._backward(stages, c, micro[action.microbatch], sums)

    def _group(self, x, y, sample_weight, sums):
        """One pipelined group: each replica's pipeline on its consecutive 1/R of the batch,
        growing its own sums (`sums[replica][stage]`)."""
        if self.replicas == 1:
            self._pipeline(0, x, y, sample_weight, sums[0])
            return sums
        share = tf.shape(tf.nest.flatten(x)[0])[0] // self.replicas
        for r in range(self.replicas):
            with tf.name_scope(f"replica_{r}"):
                self._pipeline(r, *(_slice(t, r, share) for t in (x, y, sample_weight)),
                               sums[r])
        return sums

    def _averaged(self, sums, parts: int) -> list:
        """(gradient, variable) for every copy of every stage: the stage's sums added over its
        copies on replica 0's device of it (and over the workers), divided by `parts`, then
        copied to each copy's device, so every copy gets the same gradient."""
        pairs = []
        for s in range(len(self.stages) // self.replicas):
            copies = self.copies(s)
            with tf.device(copies[0][1]):
                means = [tf.add_n(list(each)) for each in zip(*(replica[s] for replica in sums))]
                if self.workers:
                    means = self.workers.sum(means, s, "gradients")
                means = [m / parts for m in means]
            for stage, device in copies:
                with tf.device(device):
                    pairs += zip([tf.identity(m) for m in means], stage.trainable_variables)
        return pairs

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        parts = self.replicas * self.microbatches * self.groups  # of this worker's batch
        size = tf.shape(tf.nest.flatten(x)[0])[0]
        tf.debugging.assert_equal(size % parts, 0, message=(
            f"the batch must split into runtime.pipeline_replicas x runtime.microbatches x "
            f"train.grad_accum_steps = {parts} equal micro-batches"))
        zeros = []  # per replica, per stage: its gradient sums, on its device
        for r in range(self.replicas):
            zeros.append([])
            for stage, device in zip(*self.replica(r)):
                with tf.device(device):
                    zeros[r].append([tf.zeros_like(v) for v in stage.trainable_variables])
        if self.groups == 1:
            sums = self._group(x, y, sample_weight, zeros)
        else:
            group_size = size // self.groups

            def body(g, *flat):
                grown = self._group(*(_slice(t, g, group_size) for t in (x, y, sample_weight)),
                                    tf.nest.pack_sequence_as(zeros, list(flat)))
                return (g + 1, *tf.nest.flatten(grown))

            _, *flat = tf.while_loop(lambda g, *_: g < self.groups, body,
                                     [tf.constant(0), *tf.nest.flatten(zeros)],
                                     parallel_iterations=1)
            sums = tf.nest.pack_sequence_as(zeros, flat)
        grads, variables = zip(*self._averaged(sums, parts * self.worker_count))
        grads = list(grads)
        if isinstance(self.optimizer, keras.mixed_precision.LossScaleOptimizer):
            grads = self.optimizer.get_unscaled_gradients(grads)
        # Each stage's gradient is here once per copy: its global norm counts replica 0's.
        first = {id(v) for stage in self.replica(0)[0] for v in stage.trainable_variables}
        once = [g for g, v in zip(grads, variables) if id(v) in first]
        with gradients.counting_once(self.optimizer, once):
            self.optimizer.apply_gradients(zip(grads, variables))
        self._average_statistics()
        return self._metrics_of_all_workers() if self.workers else self.get_metrics_result()

    def _metrics_of_all_workers(self) -> dict:
        """The metrics' results over every worker's share of the batches so far: each metric's
        state (sums and counts) summed over the workers, its result read, and this worker's
        own state put back (it goes on accumulating its share), as MultiWorkerMirrored's
        metrics sum their replicas' state when read."""
        variables = [v for metric in self.metrics for v in metric.variables]
        last = len(self.stages) // self.replicas - 1  # whose group and device carry them
        with tf.device(self.devices[last]):
            own = [v.read_value() for v in variables]
            summed = self.workers.sum(own, last, "metrics")
        for variable, total in zip(variables, summed):
            variable.assign(total)
        results = {name: tf.identity(value) for name, value in self.get_metrics_result().items()}
        with tf.control_dependencies(list(results.values())):
            for variable, value in zip(variables, own):
                variable.assign(value)
        return results

    def _validate_and_get_metrics_result(self, logs):
        """The logs `fit` reports at an epoch's end: on W workers, the last step's (the metrics
        of every worker's share) rather than the metrics read again here (this worker's own)."""
        if self.workers:
            return logs
        return super()._validate_and_get_metrics_result(logs)

    @property
    def worker_count(self) -> int:
        """W, the workers training copies of this pipeline (1 on one machine)."""
        return self.workers.count if self.workers else 1

    def synchronize(self) -> None:
        """Every copy of every stage, on every worker, set to the chief's replica 0's values
        (its variables of a type the collectives add: weights, moving statistics, the random
        layers' generator states). The workers build their models from the same seed; a run
        must not depend on that."""
        if not self.workers:
            return

        @tf.function
        def synchronized():
            for s in range(len(self.stages) // self.replicas):
                copies = self.copies(s)
                chosen = [i for i, v in enumerate(copies[0][0].variables)
                          if v.dtype.is_floating or v.dtype in (tf.int32, tf.int64)]
                with tf.device(copies[0][1]):
                    mine = [copies[0][0].variables[i].read_value() for i in chosen]
                    if not self.workers.chief:
                        mine = [tf.zeros_like(value) for value in mine]
                    chiefs = self.workers.sum(mine, s, "weights")
                for stage, device in copies:
                    with tf.device(device):
                        for i, value in zip(chosen, chiefs):
                            stage.variables[i].assign(value)

        synchronized()

    def _average_statistics(self) -> None:
        """Each stage's floating non-trainable variables (BatchNormalization's moving
        statistics, which every copy updates from its own slice of the batch) set to their
        mean over the copies, as MirroredStrategy reads them, so the copies stay equal."""
        if self.replicas * self.worker_count == 1:
            return
        for s in range(len(self.stages) // self.replicas):
            copies = self.copies(s)
            kept = [same for same in zip(*(stage.non_trainable_variables for stage, _ in copies))
                    if same[0].dtype.is_floating]
            if not kept:
                continue
            with tf.device(copies[0][1]):
                sums = [tf.add_n([v.read_value() for v in same]) for same in kept]
                if self.workers:
                    sums = self.workers.sum(sums, s, "statistics")
                means = [total / (self.replicas * self.worker_count) for total in sums]
            for same, mean in zip(kept, means):
                for variable, (_, device) in zip(same, copies):
                    with tf.device(device):
                        variable.assign(mean)
