"""The pipeline backend (`runtime.strategy=pipeline`): the model's layers cut into stages, one
device each, trained with micro-batches in the order of `runtime.pipeline_schedule`
(`runtime.pipeline_model`, `runtime.pipeline_schedule`; under `interleaved`, cut into
`runtime.virtual_stages` chunks per stage, chunk c on stage c % S); `runtime.pipeline_replicas`
copies of the whole pipeline on this host, trained data-parallel.

Everything but the model is the one-device story (`StrategyBackend` on the default strategy):
seeds, precision, the input pipeline, evaluation data, the export directory. The ordinary
model is built first (its layers decide the cuts, and it is what gets exported); the stages are
rebuilt from its layers on their devices and start from its weights; after `fit` their weights
are gathered back into it (replica 0's: every copy holds the same weights), and it is
evaluated and exported like any other run's.
"""
from __future__ import annotations

import tensorflow as tf
import tf_keras as keras
from absl import logging

from tftrain import config as config_lib
from tftrain import tasks
from tftrain.data import reader
from tftrain.engine import backends, determinism, run_memory
from tftrain.errors import ConfigError
from tftrain.runtime import pipeline_model, pipeline_schedule, pipeline_stages
from tftrain.runtime import cluster, pipeline_workers
from tftrain.training import optimizers


class PipelineBackend(backends.StrategyBackend):
    """Stages on `runtime.pipeline_stages` devices, `runtime.microbatches` per step, run in
    the order of `runtime.pipeline_schedule`; `runtime.pipeline_replicas` copies of them."""

    def __init__(self, config: config_lib.Config):
        runtime = config.runtime
        pipeline_schedule.check(runtime.pipeline_schedule, runtime.pipeline_stages,
                                runtime.microbatches, runtime.virtual_stages)
        self.devices = pipeline_stages.devices(config.runtime)
        member = cluster.use(runtime.cluster)
        # Refused before the collectives start: each worker stops at once, none waits on a peer.
        _check_split_over_workers(config, member.num_workers)
        self.workers = pipeline_workers.start(runtime, member)  # None on one machine
        super().__init__(config, tf.distribute.get_strategy(), jit_compile=False)
        self.name = "pipeline"
        self.num_workers = self.workers.count if self.workers else 1
        self.chief = self.workers is None or self.workers.chief
        self.backs_up = self.chief  # the others' variables are theirs alone, equal to the chief's
        self.num_replicas = config.runtime.pipeline_replicas * self.num_workers  # data-parallel
        self.device_type = "GPU" if "GPU" in self.devices[0] else "CPU"
        self.num_devices = len(self.devices) * self.num_workers
        self._stages: list = []
        self._plan: list = []
        self._rules = config.runtime.stage_rules

    def training_data(self, config: config_lib.Config, start_step: int = 0, **changes):
        """The endless training stream from `start_step` on; on W workers, this worker's 1/W of
        every batch (of every accumulated group's batch), sliced before it is parsed: the
        workers read the same stream of whole batches, so together they train on exactly the
        batches one process would."""
        if self.workers is None:
            return super().training_data(config, start_step, **changes)
        groups = config.train.grad_accum_steps
        return reader.load(config.data.dir, config.data.train_split,
                           config.data.batch_size * groups, start_batch=start_step,
                           worker_slice=reader.WorkerSlice(self.workers.index, self.workers.count,
                                                           groups),
                           **{**backends.training_input_kwargs(config), **changes})

    def export_dir(self, path: str) -> str | None:
        """The chief exports to `path`; another worker not at all (its weights are the chief's,
        and no collective needs it)."""
        return path if self.chief else None

    def build(self, config: config_lib.Config, manifest: dict, plan):
        """`(model, trainer)`: the ordinary model (on the host) and the stages built from it on
        their devices, wrapped in a compiled `PipelineModel`."""
        task = tasks.from_config(config, manifest)
        with tf.device("/device:CPU:0"):
            model = backends.build_plain_model(config, manifest, task)
        runtime = config.runtime  # interleaved: S x V chunks, chunk c on stage c % S
        self._plan = pipeline_stages.plan(model, runtime.pipeline_stages, runtime.stage_rules,
                                          runtime.virtual_stages)
        devices = pipeline_stages.chunk_devices(self.devices, runtime.pipeline_stages,
                                                runtime.virtual_stages)
        self._stages = pipeline_stages.build(model, self._plan, devices)
        count = len(self._plan)
        for index, stage in enumerate(self._plan):
            logging.info("%s %d on %s: %d layers (%s .. %s), %s parameters",
                         "chunk" if runtime.virtual_stages > 1 else "stage", index,
                         ", ".join(devices[index::count]), len(stage.layers),
                         stage.layers[0], stage.layers[-1], f"{stage.parameters:,}")
        trainer = pipeline_model.PipelineModel(
            self._stages, devices, runtime.microbatches, config.train.grad_accum_steps,
            runtime.pipeline_schedule, replicas=runtime.pipeline_replicas,
            virtual_stages=runtime.virtual_stages, workers=self.workers,
            name=f"{model.name}_pipeline")
        trainer.compile(optimizer=optimizers.make_optimizer(config.train, plan.schedule_epoch_steps,
                                                            plan.total_steps,
                                                            plan.examples_per_step),
                        loss=task.loss(), metrics=task.metrics(), jit_compile=False,
                        steps_per_execution=config.train.steps_per_execution)
        # Built (BackupAndRestore needs built models) by one example through the stages.
        trainer(tf.nest.map_structure(lambda t: tf.zeros([1, *t.shape[1:]], t.dtype), model.input))
        if config.train.deterministic:
            self.random_state = determinism.random_generators(trainer)
        trainer.synchronize()  # every worker starts from the chief's weights
        return model, trainer

    def trained_model(self, model: keras.Model, trainer: keras.Model, task) -> keras.Model:
        """The ordinary model with the stages' trained weights (replica 0's) gathered into
        it, compiled with the task's loss and metrics."""
        stages, _ = trainer.replica(0)
        pipeline_stages.gather(stages, model)
        logging.info("gathered the %d stages' weights into the ordinary model", len(stages))
        model.compile(loss=task.loss(), metrics=task.metrics())
        return model

    def summary(self, trainer: keras.Model) -> dict:
        """The backend's part of `summary.json`: each stage's device (replica 0's), layers and
        bytes (under `interleaved`, each chunk's, in model order); the schedule, its bubble and
        the most micro-batches each stage (device) held at once; the replicas and the devices
        of each one's stages."""
        slots = run_memory.optimizer_state(trainer.optimizer)
        optimizer = run_memory.bytes_by_device(slots)
        virtual, count = trainer.virtual_stages, trainer.pipeline_stages
        stages = []
        for stage, model, device in zip(self._plan, self._stages, trainer.devices):
            placed = {v.device for v in model.weights}
            weights = sum(run_memory.bytes_by_device(model.weights).values())
            held = (sum(optimizer.get(d, 0) for d in placed) if virtual == 1 else
                    _chunk_optimizer_bytes([v for v in slots if v.device in placed], model))
            stages.append({"device": device, "layers": list(stage.layers),
                           "parameters": stage.parameters,
                           "receives": list(stage.inputs), "sends": list(stage.outputs),
                           "bytes": {"weights": weights, "optimizer": held}})
        microbatches, kind = trainer.microbatches, trainer.schedule
        actions = pipeline_schedule.schedule(kind, count, microbatches, virtual)
        replicas = [list(dict.fromkeys(trainer.replica(r)[1])) for r in range(trainer.replicas)]
        return {"strategy": "pipeline", "num_replicas": self.num_replicas,
                "num_workers": self.num_workers,
                "jit_compile": False,
                "pipeline": {"stages": stages, "replicas": trainer.replicas,
                             "replica_devices": replicas, "virtual_stages": virtual,
                             "microbatches": microbatches, "schedule": kind,
                             "bubble_fraction": round(pipeline_schedule.bubble_fraction(
                                 kind, count, microbatches, virtual), 4),
                             "max_in_flight": pipeline_schedule.max_in_flight(actions, count),
                             "balanced_by": "stage_rules" if self._rules else
                             "parameter bytes"}}


def _check_split_over_workers(config: config_lib.Config, workers: int) -> None:
    """On W > 1 workers the batch must split into W x R x M equal micro-batches."""
    runtime = config.runtime
    parts = workers * runtime.pipeline_replicas * runtime.microbatches
    if workers > 1 and config.data.batch_size % parts:
        raise ConfigError(
            f"data.batch_size={config.data.batch_size} must split over {workers} workers x "
            f"runtime.pipeline_replicas={runtime.pipeline_replicas} x runtime.microbatches="
            f"{runtime.microbatches} = {parts} equal micro-batches: make it a multiple of {parts}")


def _chunk_optimizer_bytes(slots, chunk) -> int:
    """The bytes of the optimizer `slots` (those on `chunk`'s device) of `chunk`'s weights (a
    slot is named after its weight: `m/<layer>/kernel`): a stage holds several chunks."""
    names = [f"/{layer.name}/" for layer in chunk.layers if layer.trainable_weights]
    return sum(run_memory.bytes_by_device(
        [v for v in slots if any(name in v.name for name in names)]).values())
