"""DTensor, the model-parallel runtime: the device mesh, the training input as DTensors, and
the model's weights sharded over the mesh by the layout rules (`runtime.dtensor_layouts`).

DTensor is an alternative to tf.distribute, not a strategy. The engine's `DTensorBackend`
(`tftrain.engine.backends`) uses these pieces: the model is built once as an ordinary model (its
weights' paths decide the layouts, and it is the export), rebuilt under a tf-keras `LayoutMap`
with each weight split as the rules say, starting from the same initial weights, trained with a
DTensor optimizer (an optimizer given `mesh=`), and its trained weights gathered back into the
ordinary model.
"""
from __future__ import annotations

import re

import tensorflow as tf
import tf_keras as keras
from absl import logging
from tensorflow.experimental import dtensor

from tftrain import config_schema as config_lib
from tftrain.data import foreign, reader
from tftrain.training import ema, optimizers
from tftrain.errors import ConfigError
from tftrain.models import attention
from tftrain.tasks import class_weights
from tftrain.runtime import distribute, dtensor_layouts, dtensor_optimizers

# Attributes under which tf-keras layers also list their variables (skipped by LayoutMap too).
_SKIP_ATTRIBUTES = ("_self_tracked_trackables", "_trainable_weights", "_non_trainable_weights",
                    "_captured_weight_regularizer")


def create_mesh(runtime: config_lib.RuntimeConfig):
    """The DTensor mesh of `runtime.mesh` over TPU cores, GPUs or (virtual) CPU devices.

    On CPU, `runtime.cpu_devices=0` splits the CPU into as many devices as the mesh needs.
    Returns the mesh and its {dimension: size}.
    """
    dims = dtensor_layouts.parse_mesh(runtime.mesh)
    size = dtensor_layouts.mesh_size(dims)
    if runtime.tpu:
        device_type = "TPU"
    elif tf.config.list_physical_devices("GPU"):
        device_type = "GPU"
    else:
        device_type = "CPU"
        distribute.configure_cpu_devices(runtime.cpu_devices or size)
    if device_type == "TPU" and runtime.tpu != "local":
        raise ConfigError(f"runtime.strategy=dtensor runs on the TPU cores of this host only "
                          f"(runtime.tpu=local), got runtime.tpu={runtime.tpu!r}")
    dtensor.initialize_accelerator_system(device_type)
    devices = tf.config.list_logical_devices(device_type)
    if len(devices) < size:
        raise ConfigError(f"runtime.mesh={runtime.mesh!r} needs {size} {device_type} devices, but "
                          f"this host has {len(devices)}; make the mesh smaller"
                          + (" or set runtime.cpu_devices" if device_type == "CPU" else ""))
    mesh = dtensor.create_mesh(list(dims.items()), devices=[d.name for d in devices[:size]],
                               device_type=device_type)
    logging.info("DTensor mesh %s over %d %s device(s)", dtensor_layouts.format_mesh(dims), size,
                 device_type)
    return mesh, dims


def make_dataset(mesh, config: config_lib.Config, split: str, training: bool,
                 start_step: int = 0, keep_batches: int = 0, shard_sets=(), **changes):
    """A repeated `DTensorDataset` of `split`: global batches split over the mesh's `batch`
    (training: starting after the `start_step` steps a resumed run already made, reading
    `shard_sets` as `reader.load_distributed` does). `changes`
    replace `reader.load` options; `keep_batches` > 0 reads that many global batches once and
    replays them from memory (what `tftrain doctor` times the model alone on)."""
    replicas = mesh.dim_size(dtensor_layouts.BATCH)
    options = dict(training=training, shuffle_buffer=config.data.shuffle_buffer,
                   cache=config.data.cache, drop_remainder=True, repeat=True,
                   seed=config.train.seed, deterministic=True,
                   start_batch=start_step * replicas,  # each step takes one per replica
                   shard_sets=reader.in_batches(shard_sets, replicas),
                   label_weights=class_weights.for_config(config) if training else None,
                   **foreign.load_kwargs(config.data))
    dataset = reader.load(config.data.dir, split, config.data.batch_size // replicas,
                          **{**options, **changes})
    if keep_batches:
        dataset = reader.replayed(dataset, keep_batches * replicas)
    # DTensorDataset gives each local replica its own copy of the pipeline and shards it with
    # the dataset's auto-shard policy. FILE sharding fails when a split has fewer files than
    # replicas (the default conversion writes one file per small split), so every replica takes
    # every n-th batch of the same deterministic order instead.
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = dataset.with_options(options)
    layouts = tf.nest.map_structure(
        lambda spec: dtensor.Layout.batch_sharded(mesh, dtensor_layouts.BATCH, spec.shape.rank),
        dataset.element_spec)
    return dtensor.DTensorDataset(dataset, mesh=mesh, layouts=layouts,
                                  global_batch_size=config.data.batch_size,
                                  batch_dim=dtensor_layouts.BATCH, dataset_already_batched=True)


def named_variables(model: keras.Model) -> dict:
    """{LayoutMap path (`<layer name>.<attribute>`): variable} of a functional model."""
    found = {}
    for layer in model.layers:
        for path, variable in layer._flatten(  # the traversal tf-keras's LayoutMap uses
                predicate=lambda obj: isinstance(obj, tf.Variable), with_path=True):
            if any(part in _SKIP_ATTRIBUTES for part in path):
                continue
            found.setdefault(layer.name + "." + ".".join(str(part) for part in path), variable)
    return found


def weights_of(model: keras.Model) -> list[dtensor_layouts.Weight]:
    """The model's weights as the layout rules see them."""
    layer_class = {}
    for layer in model.layers:
        for variable in layer.weights:
            layer_class[id(variable)] = type(layer).__name__
    return [dtensor_layouts.Weight(path, tuple(v.shape), layer_class.get(id(v), ""), v.dtype.size,
                                   v.trainable)
            for path, v in named_variables(model).items()]


def resolve_layouts(model: keras.Model, model_name: str, user_rules: dict, dims: dict) -> dict:
    """{path: spec} of the weights to shard (see `dtensor_layouts.resolve`)."""
    rules = dtensor_layouts.make_rules(model_name, user_rules, dims)
    plan = dtensor_layouts.resolve(weights_of(model), rules, dims)
    for path, spec in plan.items():
        logging.info("DTensor layout %s: %s", path, ",".join(spec))
    return plan


def build_sharded(model: keras.Model, mesh, plan: dict) -> keras.Model:
    """Rebuilds `model` (from its config) with the weights of `plan` sharded, then copies the
    ordinary model's weights into it, so both start from the same point."""
    layout_map = keras.dtensor.experimental.LayoutMap(mesh=mesh)
    for path, spec in plan.items():
        layout_map["^" + re.escape(path) + "$"] = dtensor.Layout(list(spec), mesh)
    try:
        config = model.get_config()
    except NotImplementedError:
        config = None
    if config is None or not hasattr(type(model), "from_config"):
        raise ConfigError(f"model {model.name!r} cannot be rebuilt from its config: "
                          "runtime.strategy=dtensor needs a functional or sequential tf_keras "
                          "model")
    with layout_map.scope():
        sharded = type(model).from_config(config, custom_objects=attention.saved_classes())
    plain_vars, sharded_vars = named_variables(model), named_variables(sharded)
    if set(plain_vars) != set(sharded_vars):
        raise ConfigError(f"model {model.name!r} rebuilt from its config has other weights "
                          f"({sorted(set(plain_vars) ^ set(sharded_vars))[:5]})")
    for path, variable in sharded_vars.items():
        expected = list(plan.get(path, [dtensor.UNSHARDED] * variable.shape.rank))
        got = dtensor.fetch_layout(variable).sharding_specs
        if got != expected:
            raise ConfigError(f"weight {path} got layout {got}, expected {expected}")
        variable.assign(dtensor.relayout(
            dtensor.copy_to_mesh(plain_vars[path].read_value(),
                                 dtensor.Layout.replicated(mesh, variable.shape.rank)),
            dtensor.fetch_layout(variable)))
    return sharded


def gather(variable) -> "tf.Tensor":
    """The full value of a (possibly sharded) DTensor variable, as an ordinary tensor."""
    mesh = dtensor.fetch_layout(variable).mesh
    replicated = dtensor.relayout(variable.read_value(),
                                  dtensor.Layout.replicated(mesh, variable.shape.rank))
    return dtensor.unpack(replicated)[0]


def copy_weights(sharded: keras.Model, model: keras.Model) -> None:
    """Copies the trained (sharded) weights into the ordinary model, by path."""
    sharded_vars = named_variables(sharded)
    for path, variable in named_variables(model).items():
        variable.assign(gather(sharded_vars[path]))


def metrics_on_mesh(metrics: list, mesh) -> list:
    """The task's metrics rebuilt with their variables on the mesh (replicated DVariables).

    A metric built without a mesh keeps ordinary variables, which a DTensor train function
    updates wrongly (accuracy and perplexity came out several times too low). tf-keras only
    takes `mesh=` in the constructors of its own metrics, so each metric is re-created from its
    config with the mesh set before its `__init__` adds the variables. Names (strings) are
    left to `compile`, which gives the metrics it builds the model's mesh.
    """
    rebuilt = []
    for metric in metrics:
        if isinstance(metric, keras.metrics.Metric):
            config, cls = metric.get_config(), type(metric)
            metric = cls.__new__(cls)
            metric._mesh = mesh  # read by Metric.add_weight
            metric.__init__(**config)
        rebuilt.append(metric)
    return rebuilt


def make_optimizer(train_config: config_lib.TrainConfig, plan, mesh, shard_state: bool = False):
    """The optimizer of `train.optimizer`, with the run's schedule, as a DTensor optimizer
    (given `mesh=`) whose updates DTensor applies exactly (`dtensor_optimizers`); with
    `shard_state` (runtime.shard_optimizer_state) its slots are split over `batch`."""
    lr = optimizers.make_schedule(train_config, plan.schedule_epoch_steps, plan.total_steps,
                                  plan.examples_per_step)
    common = {"mesh": mesh, "shard_state": shard_state,
              "clip_global_norm": train_config.clip_global_norm}
    decay = train_config.ema_decay  # the weights' average, written by the single-write update
    if train_config.optimizer == "sgd":
        return ema.make(dtensor_optimizers.SGD, decay, lr, momentum=train_config.momentum,
                        l2=train_config.weight_decay, **common)
    if train_config.optimizer == "adamw":
        return ema.make(dtensor_optimizers.AdamW, decay, lr,
                        weight_decay=train_config.weight_decay, **common)
    if train_config.optimizer == "adafactor":
        return ema.make(dtensor_optimizers.Adafactor, decay, lr, **common)
    return ema.make(dtensor_optimizers.Adam, decay, lr, **common)
