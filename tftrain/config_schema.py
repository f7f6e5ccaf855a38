"""The experiment config's schema: typed dataclasses, their choices, and strict setting.

A leaf of the package (it imports no other tftrain layer but errors), so every layer can name the
config's types. Reading YAML, overrides and validation against what exists (models, tasks,
layouts) are `tftrain.config`'s, which re-exports everything here.
"""
from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, Optional

import yaml

from tftrain.errors import ConfigError

STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker_mirrored", "tpu", "dtensor", "pipeline")
# runtime.cluster: where the multi-worker cluster is described (tftrain/runtime/cluster.py)
CLUSTERS = ("auto", "tf_config", "slurm", "kubernetes")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16", "auto")
JIT_COMPILE = ("auto", "true", "false")  # XLA for the train/eval steps; auto: on GPUs only
OPTIMIZERS = ("sgd", "adam", "adamw", "adafactor")
SERVICE_MODES = ("parallel_epochs", "distributed_epoch")
CACHE_MODES = ("none", "records", "decoded")  # what tftrain.data.load keeps in memory
DATA_FORMATS = ("tftrain", "tfrecord")  # a tftrain dataset, or TFRecords other tools wrote
LR_SCHEDULES = ("constant", "step", "cosine", "plateau")
ON_NAN = ("stop", "rollback")  # train.on_nan: what a NaN/Inf loss does (callbacks/divergence.py)
# train.monitor: auto is the task's own (val_accuracy for classifiers, val_rmse for regression,
# val_loss for language models)
MONITORS = ("auto", "val_accuracy", "val_loss", "accuracy", "loss", "val_rmse", "val_mae",
            "val_r2", "rmse", "mae", "r2", "val_perplexity", "perplexity", "val_bits_per_byte",
            "bits_per_byte")
# task.type: auto follows the dataset's label (tftrain/tasks/registry.py)
TASK_TYPES = ("auto", "classification", "regression", "language_model")
# task.loss: auto is the task's default (classification and language_model: crossentropy,
# regression: mse)
TASK_LOSSES = {"classification": ("crossentropy",), "regression": ("mse", "mae", "huber"),
               "language_model": ("crossentropy",)}



@dataclasses.dataclass
class DataConfig:
    """Where the TFRecord dataset is and how it is read."""

    dir: str = "data/digits"  # dataset directory (shards + dataset.json); gs:// works
    pipeline: str = "digits"  # creates `dir` from `source` the first time it is needed
    source: str = ""  # raw input for that conversion (unused by `digits`)
    pipeline_options: dict = dataclasses.field(default_factory=dict)  # the pipeline's options
    # tftrain: `dir` holds dataset.json (or is converted into while absent or empty).
    # tfrecord: `dir` holds TFRecords other tools wrote (<split>-* files, or a glob with
    # {split}), read with `pipeline`'s schema; `info` stands in for the manifest's metadata.
    format: str = "tftrain"
    info: dict = dataclasses.field(default_factory=dict)  # format=tfrecord: e.g. {num_classes: 10}
    train_split: str = "train"
    eval_split: str = "validation"  # monitored during training
    test_split: str = "test"  # reported in summary.json after training
    batch_size: int = 64  # global batch size, over all replicas and workers
    shuffle_buffer: int = 10_000
    cache: str = "none"  # none | records | decoded: kept in memory after the first pass
    # tf.data's autotuning of parallel calls and buffers; false: one parallel call per core (on
    # a 2-core VM 1.1-1.9x the input speed, bench/input.py; `tftrain doctor` tries it)
    autotune: bool = True
    service_address: str = ""  # host:port of a tf.data service dispatcher: train input runs there
    service_mode: str = "parallel_epochs"  # parallel_epochs | distributed_epoch (tf.data service)


@dataclasses.dataclass
class TaskConfig:
    """What the model learns from the labels: resolved from the dataset when `auto`."""

    type: str = "auto"  # auto | classification | regression | language_model
    # auto | crossentropy (classification, language_model) | mse | mae | huber (regression)
    loss: str = "auto"


@dataclasses.dataclass
class ModelConfig:
    """Which registered model to build, with its keyword arguments."""

    name: str = "cnn"
    params: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class TrainConfig:
    """The optimization loop."""

    epochs: int = 10
    steps_per_epoch: Optional[int] = None  # None: one pass over the training split
    steps: Optional[int] = None  # total optimizer steps; when set, it decides the run's length
    optimizer: str = "adam"  # sgd | adam | adamw | adafactor (factored second moments)
    learning_rate: float = 1e-3  # the peak rate (after warmup)
    momentum: float = 0.9  # sgd only
    weight_decay: float = 0.0  # adamw only
    lr_schedule: str = "constant"  # constant | step | cosine | plateau
    warmup_steps: int = 0  # linear warmup from 0 (constant, step, cosine)
    lr_decay_epochs: int = 30  # step: multiply by lr_decay_rate every this many epochs
    lr_decay_rate: float = 0.1  # step and plateau: the factor
    lr_min: float = 0.0  # cosine: the final rate; plateau: the floor
    plateau_patience: int = 2  # plateau: epochs without improvement of `monitor`
    grad_accum_steps: int = 1  # k > 1: one update per k micro-batches of data.batch_size
    steps_per_execution: int = 1
    monitor: str = "auto"  # best checkpoint, early stopping, plateau; auto: the task's
    early_stopping_patience: int = 0  # 0: off; else epochs without improvement of `monitor`
    backup_every_steps: int = 0  # 0: back up at the end of each epoch only
    # Bounded evaluation on large data: batches per validation (0: the whole split), validate
    # every N steps instead of at epoch ends (0: at epoch ends; the best checkpoint, early
    # stopping, plateau and the epoch backup follow it), batches of the final test (0: whole).
    validation_steps: int = 0
    validation_every_steps: int = 0
    test_steps: int = 0
    # A progress line (step N/TOTAL, loss, examples/s, ETA) and the same scalars in TensorBoard
    # every this many steps; 0: about every 30 seconds of training.
    log_every_steps: int = 0
    # A NaN/Inf loss: stop (one line, exit 1) | rollback (restore the last backup, multiply the
    # learning rate by rollback_lr_factor and go on, at most max_rollbacks times, then stop)
    on_nan: str = "stop"
    rollback_lr_factor: float = 0.5
    max_rollbacks: int = 3
    profile_steps: str = ""  # "start,end": a profiler trace of those steps in logs/plugins/profile
    seed: int = 42
    # Deterministic ops and random layers whose generator state is in the backup: a resumed run
    # ends with the weights of an uninterrupted one (docs/training.md); slower steps.
    deterministic: bool = False


@dataclasses.dataclass
class RuntimeConfig:
    """Where training runs."""

    strategy: str = "auto"
    tpu: str = ""  # local | NAME | grpc://host:port
    cpu_devices: int = 0  # >0: split the CPU into this many virtual devices (tests, mirrored on CPU)
    mixed_precision: str = "float32"
    # strategy=dtensor (model parallelism, docs/dtensor.md): the device mesh ("batch:2,model:2")
    # and rules: regex on weight path -> sharding spec, e.g. {"dense.*kernel": "unsharded,model"}
    mesh: str = ""
    layout_rules: dict = dataclasses.field(default_factory=dict)
    # strategy=dtensor: optimizer slots sharded over the mesh's batch dimension (ZeRO-1): each
    # data-parallel replica keeps and updates 1/batch of them; the weights stay whole per replica
    shard_optimizer_state: bool = False
    # strategy=pipeline (docs/pipeline.md): the model's layers cut into this many stages, one
    # device each; each step's batch split into `microbatches` (GPipe); `stage_rules`: the layers
    # after which to cut, comma-separated ("" cuts where parameter bytes balance)
    pipeline_stages: int = 2
    microbatches: int = 4
    stage_rules: str = ""
    tpu_timeout: int = 60  # seconds to connect to and initialize the TPU before giving up
    jit_compile: str = "auto"  # XLA-compile the steps: true | false | auto (GPUs; TPUs always do)
    # Multi-worker cluster: auto (TF_CONFIG if set, else SLURM inside a multi-task srun step,
    # else one machine) | tf_config | slurm | kubernetes (docs/scale.md). cluster_port: the first
    # port of the workers' servers for slurm (task i of a node gets +i) and kubernetes; 0: TF's
    # defaults (8888 and 8470).
    cluster: str = "auto"
    cluster_port: int = 0


@dataclasses.dataclass
class Config:
    """The whole experiment."""

    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    task: TaskConfig = dataclasses.field(default_factory=TaskConfig)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    runtime: RuntimeConfig = dataclasses.field(default_factory=RuntimeConfig)

def all_keys(config_cls: type = Config, prefix: str = "") -> list[str]:
    """Every dotted key of the config tree, e.g. 'train.epochs'."""
    keys = []
    for field in dataclasses.fields(config_cls):
        field_type = typing.get_type_hints(config_cls)[field.name]
        if dataclasses.is_dataclass(field_type):
            keys += all_keys(field_type, f"{prefix}{field.name}.")
        else:
            keys.append(prefix + field.name)
    return keys


def _unknown_key(key: str) -> ConfigError:
    close = difflib.get_close_matches(key, all_keys(), n=3, cutoff=0.5)
    if not close:  # match the last part alone: 'train.epoch' -> 'train.epochs'
        last = key.rsplit(".", 1)[-1]
        close = [k for k in all_keys() if difflib.get_close_matches(last, [k.rsplit(".", 1)[-1]], cutoff=0.75)]
    if close and difflib.SequenceMatcher(None, key, close[0]).ratio() >= 0.9:
        close = close[:1]  # one near-certain match ('train.epoch' -> 'train.epochs') says it all
    hint = f"; did you mean {' or '.join(close[:3])}?" if close else ""
    return ConfigError(f"unknown config key {key!r}{hint} (valid sections: data, task, model, train, runtime)")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Checks `value` against the annotated type `tp`; returns it, converted where lossless."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        (tp,) = [t for t in options if t is not type(None)]
        origin = typing.get_origin(tp)
    expected = origin or tp
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is float and isinstance(value, str):
        try:  # YAML 1.1 reads '1e-5' (no dot) as a string
            return float(value)
        except ValueError:
            pass
    if expected is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if expected is str and isinstance(value, bool):  # YAML's true/false for a choice of words
        return "true" if value else "false"
    if expected is int and isinstance(value, bool) or not isinstance(value, expected):
        raise ConfigError(f"config key {key!r} must be of type {_type_name(expected)}, "
                          f"got {value!r} ({type(value).__name__})")
    return value


class WholeMapping(dict):
    """A mapping given whole in an override (`model.params={hidden_units: [32]}`): it replaces
    the field's mapping, where a dotted key into it (`model.params.remat=true`) sets that key
    and keeps the others."""


# data.cache was true/false before it named what is kept: the params.yaml of older runs loads.
_LEGACY_VALUES = {("data.cache", False): "none", ("data.cache", True): "records"}


def apply_values(config: Any, updates: dict, prefix: str = "") -> None:
    """Sets the (nested) `updates` on the dataclass tree `config`, strictly."""
    if not isinstance(updates, dict):
        raise ConfigError(f"config section {prefix.rstrip('.') or 'top level'} must be a mapping, "
                          f"got {updates!r}")
    hints = typing.get_type_hints(type(config))
    for name, value in updates.items():
        key = f"{prefix}{name}"
        if name not in hints:
            while isinstance(value, dict) and len(value) == 1:  # 'trian: {epochs: 3}' -> 'trian.epochs'
                (child, value), = value.items()
                key += f".{child}"
            raise _unknown_key(key)
        if dataclasses.is_dataclass(hints[name]):
            apply_values(getattr(config, name), value, key + ".")
        else:
            if isinstance(value, bool):
                value = _LEGACY_VALUES.get((key, value), value)
            current = getattr(config, name)
            if isinstance(value, WholeMapping):  # 'model.params={...}': the mapping as given
                value = dict(value)
            elif isinstance(current, dict) and isinstance(value, dict):
                value = {**current, **value}  # 'model.params.remat=true': one key, others kept
            setattr(config, name, _coerce(key, value, hints[name]))

def profile_steps(text: str) -> tuple[int, int] | None:
    """`train.profile_steps` ("start,end") as a pair, or None: 1-based batches counted from the
    start of the attempt's `fit`, across epochs (a resumed run counts from its own start)."""
    if not text:
        return None
    parts = text.split(",")
    try:
        start, end = (int(p) for p in parts) if len(parts) == 2 else (int(parts[0]),) * 2
    except ValueError:
        start = end = 0
    if not 0 < start <= end:
        raise ConfigError(f"train.profile_steps={text!r}: write 'start,end' with 0 < start <= end, "
                          "e.g. '10,20' (batches counted from the start of fit, across epochs)")
    return start, end


def check_divisible(batch_size: int, num_replicas: int) -> None:
    """The global batch must split evenly over the replicas."""
    if batch_size % num_replicas:
        lower = batch_size - batch_size % num_replicas
        raise ConfigError(
            f"data.batch_size ({batch_size}) must be divisible by the number of replicas "
            f"({num_replicas}); use " + (f"{lower} or {lower + num_replicas}" if lower else
                                         f"{num_replicas} or a multiple of it"))

def to_dict(config: Config) -> dict:
    """The config as plain nested dicts, ready for YAML."""
    return dataclasses.asdict(config)


def to_yaml(config: Config) -> str:
    """The resolved config as YAML text, as written to params.yaml."""
    return yaml.safe_dump(to_dict(config), sort_keys=False)
