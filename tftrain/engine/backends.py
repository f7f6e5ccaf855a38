"""Where the run's model lives and trains: a `tf.distribute` strategy or a DTensor mesh (and,
in `engine.pipeline_backend`, pipeline stages; `engine.backend_choice` picks one).

`tftrain.engine.train.run` tells one story for both; what differs is asked of the backend, and
only the backend knows which one it is:

- `StrategyBackend`: one device, Mirrored, MultiWorkerMirrored or TPU (`runtime.distribute`).
  The model is built and compiled inside the strategy's scope and is what `fit` trains (or a
  gradient-accumulating wrapper around it); under MultiWorkerMirrored only the chief writes the
  run's files.
- `DTensorBackend`: model parallelism on a mesh (`runtime.strategy=dtensor`, `runtime.dtensor`).
  The ordinary model is built first (its weights' paths decide the layouts, and it is what is
  exported), then a sharded twin trains; its weights are gathered back into the ordinary model
  after `fit`, which is then evaluated on full splits and exported as an ordinary SavedModel.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import tensorflow as tf
import tf_keras as keras
from absl import logging

from tftrain import config as config_lib
from tftrain import models, tasks
from tftrain.tasks import class_weights
from tftrain.callbacks import unfreeze
from tftrain.data import foreign, reader
from tftrain.engine import determinism, grad_accum, precision
from tftrain.training import optimizers
from tftrain.runtime import cluster, distribute, tpu


@runtime_checkable
class Backend(Protocol):
    """Where a run's model lives and trains: what `engine.train`, `doctor` and `check` ask of it.

    A backend is a class with these attributes and methods, and a branch in
    `backend_choice.create` (the pipeline's is its own module, `engine.pipeline_backend`).
    """

    name: str  # summary.json's `strategy`
    num_replicas: int
    num_workers: int
    chief: bool  # multi-worker: only the chief writes the run's files
    # False: a worker whose saves would only repeat the chief's: it writes no backup, no best
    # checkpoint and no TensorBoard logs (and `export_dir` gives it None)
    backs_up: bool
    device_type: str  # "CPU", "GPU" or "TPU": where the replicas compute
    num_devices: int  # the devices the model computes on (replicas, a mesh, pipeline stages)
    random_state: object  # train.deterministic: what the backup saves beside the model, or None

    def set_up(self, config: config_lib.Config) -> str:
        """Seeds, determinism and the precision policy, before any model; the policy's name."""

    def training_data(self, config: config_lib.Config, start_step: int = 0, **changes):
        """The endless training stream from `start_step` on (`changes`: `reader.load` options)."""

    def replayed_data(self, config: config_lib.Config, batches: int):
        """`batches` training steps' batches read once, then replayed from memory forever."""

    def evaluation_data(self, config: config_lib.Config, split: str, *, for_fit: bool = False):
        """`split` for `fit`'s validation (`for_fit`) or for a final evaluation."""

    def validation_steps(self, config: config_lib.Config, dataset) -> int | None:
        """`fit`'s `validation_steps` over `dataset` (a typed `manifest.Manifest`; None: the
        whole split)."""

    def build(self, config: config_lib.Config, manifest: dict, plan) -> tuple:
        """`(model, trainer)` built and compiled: `trainer` is what `fit` trains, `model` is what
        gets exported."""

    def trained_model(self, model, trainer, task):
        """The compiled model to evaluate once training is over."""

    def export_dir(self, path: str) -> str | None:
        """Where this process writes the export meant for `path` (None: it takes no part)."""

    def summary(self, trainer) -> dict:
        """The backend's part of `summary.json`."""


def input_shape(data: config_lib.DataConfig):
    """The shape of one example's inputs, from the first example of the evaluation split."""
    return batch_spec(data)[0].shape[1:]


def batch_spec(data: config_lib.DataConfig):
    """`(inputs, labels)` TensorSpecs of a batch of the evaluation split."""
    return reader.load(data.dir, data.eval_split, 1, training=False,
                       **foreign.load_kwargs(data)).element_spec[:2]


def create_step_variables(trainer: keras.Model, model: keras.Model, labels) -> None:
    """Creates the optimizer's slots and the compiled loss's and metrics' variables now, inside
    the strategy's scope: created by the first step instead, they make its `tf.function` trace
    twice (once to lift the variables out, once more without them), which costs seconds on a
    large model. `labels` is a batch's labels' spec; `model` is the functional model inside
    `trainer` (its outputs' shapes pick the metrics, as the first step's would)."""
    trainer.optimizer.build(unfreeze.variables_to_train(trainer, model))
    trainer.compiled_loss.build(model.output)
    trainer.compiled_metrics.build(model.output, labels)


def use_xla(jit_compile: str) -> bool:
    """`runtime.jit_compile` for `compile`: auto is XLA on GPUs, where it usually pays (fused
    kernels), and not on CPUs, measured: XLA's CPU backend does not use the 16-bit matmul units
    that oneDNN uses (bfloat16 matmuls 1.04x float32 through XLA, 3.65x through oneDNN on an AMX
    CPU), and in float32 it was 1.14-1.69x slower for the digits CNN (bench/train.py) while it
    helps some MLPs (bench/precision.py), plus its compile time. `tftrain check` and `doctor`
    say when `true` costs a mixed-precision run its units. TPUStrategy compiles with XLA
    whatever this says."""
    if jit_compile == "auto":
        return bool(tf.config.list_logical_devices("GPU"))
    return jit_compile == "true"


def build_plain_model(config: config_lib.Config, manifest: dict, task,
                      spec=None) -> keras.Model:
    """The model of `model.name` with `task`'s head, for the dataset of `manifest` (inputs
    shaped as in `spec`, a `batch_spec`, read from the data when not given)."""
    inputs = (spec or batch_spec(config.data))[0].shape[1:]
    return models.build_model(config.model.name, config.model.params, inputs,
                              task.outputs(), dataset_info=manifest.get("info"))


def training_input_kwargs(config: config_lib.Config) -> dict:
    """`reader.load`'s keyword arguments for the training input (what `tftrain doctor` times too)."""
    data = config.data
    return dict(training=True, shuffle_buffer=data.shuffle_buffer, cache=data.cache, repeat=True,
                seed=config.train.seed, autotune=data.autotune,
                service_address=data.service_address, service_mode=data.service_mode,
                label_weights=class_weights.for_config(config), **foreign.load_kwargs(data))


def build_and_compile(config: config_lib.Config, manifest: dict, plan,
                      **compile_kwargs) -> tuple[keras.Model, keras.Model]:
    """The model and its compiled trainer (the model itself, or a gradient-accumulating wrapper).

    Call it inside the strategy's scope. The input shape comes from one example of the
    evaluation split, the head, loss and metrics from the task (`tftrain.tasks`);
    `compile_kwargs` go to `compile` (`jit_compile` defaults to what `runtime.jit_compile`
    says for the devices of this process).
    """
    compile_kwargs.setdefault("jit_compile", use_xla(config.runtime.jit_compile))
    task = tasks.from_config(config, manifest)
    spec = batch_spec(config.data)
    model = build_plain_model(config, manifest, task, spec)
    trainer = grad_accum.wrap(model, config.train.grad_accum_steps)
    trainer.compile(
        optimizer=optimizers.make_optimizer(config.train, plan.schedule_epoch_steps,
                                             plan.total_steps, plan.examples_per_step),
        loss=task.loss(), metrics=task.metrics(),
        steps_per_execution=config.train.steps_per_execution, **compile_kwargs)
    create_step_variables(trainer, model, spec[1])
    return model, trainer


def _device_type(strategy) -> str:
    """The kind of device the replicas compute on ("CPU", "GPU" or "TPU")."""
    try:
        devices = strategy.extended.worker_devices
    except RuntimeError:  # the default strategy: TensorFlow's own placement (a GPU if any)
        devices = [device.name for device in tf.config.list_logical_devices()]
    for kind in ("TPU", "GPU"):
        if any(f"{kind}:" in device.upper() for device in devices):
            return kind
    return "CPU"


class StrategyBackend:
    """A `tf.distribute` strategy: one device, Mirrored, MultiWorkerMirrored or TPU.

    `strategy`, `policy` and `jit_compile` replace what the config says (`tftrain check` builds
    the run on this machine's default strategy, under the target's policy and compiler).
    """

    def __init__(self, config: config_lib.Config, strategy=None, *, policy: str | None = None,
                 jit_compile: bool | None = None):
        self.strategy = strategy or distribute.create_strategy(config.runtime)
        self.name = distribute.strategy_name(self.strategy)
        self.num_replicas = self.strategy.num_replicas_in_sync
        self.num_workers = cluster.num_workers() if strategy is None else 1
        self.chief = cluster.is_chief(self.strategy)  # multi-worker: only the chief writes
        self.backs_up = True  # MultiWorkerMirrored: the others take part in the chief's save
        self.device_type = _device_type(self.strategy)
        self.num_devices = self.num_replicas
        self.random_state = None  # train.deterministic: the random layers' generators
        self._policy, self._jit_compile = policy, jit_compile
        config_lib.check_divisible(config.data.batch_size, self.num_replicas)

    def set_up(self, config: config_lib.Config) -> str:
        """Seeds, determinism and the precision policy (before any model is built); returns the
        policy's name."""
        keras.utils.set_random_seed(config.train.seed)
        if config.train.deterministic:
            determinism.enable()
        return precision.set_policy(self._policy or config.runtime.mixed_precision, self.strategy)

    def training_data(self, config: config_lib.Config, start_step: int = 0, **changes):
        """The endless training stream, split over the replicas, from `start_step` on."""
        return reader.load_distributed(
            self.strategy, config.data.dir, config.data.train_split,
            config.data.batch_size * config.train.grad_accum_steps, start_step=start_step,
            **{**training_input_kwargs(config), **changes})

    def replayed_data(self, config: config_lib.Config, batches: int):
        """Global batches of the host pipeline (local, no tf.data service), held in memory and
        repeated; Keras splits them over the replicas as it does any dataset."""
        kept = reader.load(config.data.dir, config.data.train_split,
                           config.data.batch_size * config.train.grad_accum_steps,
                           **{**training_input_kwargs(config), "service_address": ""})
        return reader.replayed(kept, batches)

    def evaluation_data(self, config: config_lib.Config, split: str, *, for_fit: bool = False):
        """`split` in global batches, for `fit`'s validation (`for_fit`) or a final evaluation."""
        del for_fit  # Keras splits a dataset of global batches over the replicas either way
        return reader.load_distributed(self.strategy, config.data.dir, split,
                                       config.data.batch_size, training=False,
                                       drop_remainder=self.name == "tpu",  # static shapes
                                       **foreign.load_kwargs(config.data))

    def validation_steps(self, config: config_lib.Config, dataset):
        """`fit`'s `validation_steps`: `train.validation_steps` batches, else (None) the whole
        split."""
        return config.train.validation_steps or None

    def build(self, config: config_lib.Config, manifest: dict, plan):
        """`(model, trainer)` built and compiled inside the strategy's scope (see
        `build_and_compile`); `model` is what gets exported."""
        tpu.check_ready(config, self.strategy)  # TPU only: static shapes, batch split, bf16, ...
        compile_kwargs = {} if self._jit_compile is None else {"jit_compile": self._jit_compile}
        with self.strategy.scope():
            model, trainer = build_and_compile(config, manifest, plan, **compile_kwargs)
            if config.train.deterministic:  # their generator state is saved with the backup
                self.random_state = determinism.random_generators(trainer)
        return model, trainer

    def trained_model(self, model: keras.Model, trainer: keras.Model, task) -> keras.Model:
        """The compiled model to evaluate once training is over: the trainer itself."""
        return trainer

    def export_dir(self, path: str) -> str:
        """Where this process writes the export meant for `path` (the chief: `path` itself;
        the other workers take part in the save into a temporary directory)."""
        return cluster.write_dir_for(path, self.strategy)

    def summary(self, trainer: keras.Model) -> dict:
        """The backend's part of `summary.json`."""
        return {"strategy": self.name, "num_replicas": self.num_replicas,
                "num_workers": self.num_workers, "jit_compile": bool(trainer.jit_compile)}


class DTensorBackend:
    """A DTensor mesh (`runtime.mesh`): the model's weights split over its `model` dimension,
    the batch over `batch`. One process; no tf.distribute strategy is created."""

    def __init__(self, config: config_lib.Config):
        from tftrain.runtime import dtensor, dtensor_layouts

        self._dtensor, self._layouts = dtensor, dtensor_layouts
        self.mesh, self.dims = dtensor.create_mesh(config.runtime)
        self.name = "dtensor"
        self.num_replicas = self.dims[dtensor_layouts.BATCH]
        self.num_workers = 1
        self.chief = True
        self.backs_up = True
        self.device_type = self.mesh.device_type()
        self.num_devices = dtensor_layouts.mesh_size(self.dims)
        self.random_state = None
        self._config = config
        self._plan_layouts: dict = {}
        self._model: keras.Model | None = None

    def set_up(self, config: config_lib.Config) -> str:
        """Seeds and float32 (DTensor needs tf.random.Generator-based random layers)."""
        keras.backend.experimental.enable_tf_random_generator()
        keras.utils.set_random_seed(config.train.seed)
        keras.mixed_precision.set_global_policy("float32")
        return "float32"

    def training_data(self, config: config_lib.Config, start_step: int = 0, **changes):
        """The endless training stream as DTensors split over `batch`, from `start_step` on."""
        return self._dtensor.make_dataset(self.mesh, config, config.data.train_split,
                                          training=True, start_step=start_step, **changes)

    def replayed_data(self, config: config_lib.Config, batches: int):
        """`batches` steps of DTensor batches read once, then replayed from memory."""
        return self._dtensor.make_dataset(self.mesh, config, config.data.train_split,
                                          training=True, keep_batches=batches)

    def evaluation_data(self, config: config_lib.Config, split: str, *, for_fit: bool = False):
        """`fit`'s validation: a repeated DTensor dataset of `split` (read `validation_steps`
        batches); a final evaluation: `split` whole, ordinary batches for the gathered model."""
        if for_fit:
            return self._dtensor.make_dataset(self.mesh, config, split, training=False)
        return reader.load(config.data.dir, split, config.data.batch_size, training=False,
                           **foreign.load_kwargs(config.data))

    def validation_steps(self, config: config_lib.Config, dataset) -> int:
        """The full global batches of the evaluation split (the DTensor dataset repeats)."""
        whole = max(1, dataset.examples(config.data.eval_split) // config.data.batch_size)
        return min(whole, config.train.validation_steps or whole)

    def build(self, config: config_lib.Config, manifest: dict, plan):
        """`(model, trainer)`: the ordinary model (the export), and its sharded twin compiled
        with a DTensor optimizer, starting from the same weights."""
        task = tasks.from_config(config, manifest)
        model = build_plain_model(config, manifest, task)
        self._plan_layouts = self._dtensor.resolve_layouts(
            model, config.model.name, config.runtime.layout_rules, self.dims)
        sharded = self._dtensor.build_sharded(model, self.mesh, self._plan_layouts)
        sharded.compile(optimizer=self._dtensor.make_optimizer(
                            config.train, plan, self.mesh,
                            shard_state=config.runtime.shard_optimizer_state),
                        loss=task.loss(),
                        metrics=self._dtensor.metrics_on_mesh(task.metrics(), self.mesh),
                        steps_per_execution=config.train.steps_per_execution)
        self._model = model
        return model, sharded

    def trained_model(self, model: keras.Model, trainer: keras.Model, task) -> keras.Model:
        """The ordinary model with the trained (sharded) weights gathered into it, compiled
        with the task's loss and metrics, evaluated on full splits."""
        self._dtensor.copy_weights(trainer, model)
        logging.info("gathered the trained weights into the ordinary model")
        model.compile(loss=task.loss(), metrics=task.metrics())
        return model

    def export_dir(self, path: str) -> str:
        """One process: the export is written where it belongs."""
        return path

    def summary(self, trainer: keras.Model) -> dict:
        """The backend's part of `summary.json`: the mesh, the layouts and the bytes per device."""
        layouts = self._layouts
        weights = self._dtensor.weights_of(self._model)
        return {
            "strategy": "dtensor", "num_replicas": self.num_replicas, "num_workers": 1,
            "jit_compile": bool(trainer.jit_compile),
            "dtensor": {
                "mesh": layouts.format_mesh(self.dims),
                "device_type": self.mesh.device_type(),
                "layouts": {path: ",".join(spec) for path, spec in self._plan_layouts.items()},
                "memory": layouts.memory_report(
                    weights, self._plan_layouts, self.dims, self._config.train.optimizer,
                    self._config.runtime.shard_optimizer_state,
                    ema=self._config.train.ema_decay > 0),
            },
        }
