"""The experiment config: typed dataclasses, YAML files, strict overrides, validation.

Applied in one fixed order: defaults -> YAML file -> command-line flags -> `--params_override`.
Everything is checked here, before TensorFlow starts: an unknown key names the closest valid
keys, a value of the wrong type names the expected type, and an impossible combination names
the numbers involved. The resolved config is written to `model_dir/params.yaml`.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import stat
import types
import typing
from typing import Any, Optional

import yaml

import tftrain
from tftrain.errors import ConfigError


def _shipped_config_dir() -> str:
    """The folder of the shipped YAML configs (`digits`, ...), installed or in a checkout.

    The repository keeps them in its top-level `configs/`; a wheel installs that folder as the
    package data `tftrain/configs/` (pyproject.toml maps it). An editable install or a plain
    checkout has no `tftrain/configs/`, and reads the repository's folder directly.
    """
    package_dir = os.path.dirname(os.path.abspath(tftrain.__file__))
    installed = os.path.join(package_dir, "configs")
    if os.path.isdir(installed):
        return installed
    return os.path.join(os.path.dirname(package_dir), "configs")


CONFIG_DIR = _shipped_config_dir()

STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker_mirrored", "tpu", "dtensor")
# runtime.cluster: where the multi-worker cluster is described (tftrain/runtime/cluster.py)
CLUSTERS = ("auto", "tf_config", "slurm", "kubernetes")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16", "auto")
JIT_COMPILE = ("auto", "true", "false")  # XLA for the train/eval steps; auto: on GPUs only
OPTIMIZERS = ("sgd", "adam", "adamw")
SERVICE_MODES = ("parallel_epochs", "distributed_epoch")
CACHE_MODES = ("none", "records", "decoded")  # what tftrain.data.load keeps in memory
DATA_FORMATS = ("tftrain", "tfrecord")  # a tftrain dataset, or TFRecords other tools wrote
LR_SCHEDULES = ("constant", "step", "cosine", "plateau")
ON_NAN = ("stop", "rollback")  # train.on_nan: what a NaN/Inf loss does (callbacks/divergence.py)
# train.monitor: auto is the task's own (val_accuracy for classifiers, val_rmse for regression,
# val_loss for language models)
MONITORS = ("auto", "val_accuracy", "val_loss", "accuracy", "loss", "val_rmse", "val_mae",
            "val_r2", "rmse", "mae", "r2", "val_perplexity", "perplexity")
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
    optimizer: str = "adam"
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


# data.cache was true/false before it named what is kept: the params.yaml of older runs loads.
_LEGACY_VALUES = {("data.cache", False): "none", ("data.cache", True): "records"}


def _apply(config: Any, updates: dict, prefix: str = "") -> None:
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
            _apply(getattr(config, name), value, key + ".")
        else:
            if isinstance(value, bool):
                value = _LEGACY_VALUES.get((key, value), value)
            setattr(config, name, _coerce(key, value, hints[name]))


def resolve_config_path(name_or_path: str) -> str:
    """A config file path from a path or the name of a shipped config (`digits`)."""
    candidates = [name_or_path]
    if not name_or_path.endswith((".yaml", ".yml")):
        candidates.append(os.path.join(CONFIG_DIR, name_or_path + ".yaml"))
    for path in candidates:
        if os.path.isfile(path) or (path.startswith(("gs://", "ram://")) and _gfile_exists(path)):
            return path
    shipped = sorted(f[:-5] for f in os.listdir(CONFIG_DIR) if f.endswith(".yaml"))
    raise ConfigError(f"config {name_or_path!r} not found: give a YAML file path or one of the "
                      f"shipped configs: {', '.join(shipped)}")


def _gfile_exists(path: str) -> bool:
    import tensorflow as tf  # only for remote paths

    return tf.io.gfile.exists(path)


MAX_YAML_BYTES = 1 << 20  # a config, or a run's params.yaml: kilobytes
MAX_YAML_NODES = 100_000  # counted through aliases: a few hundred bytes can expand to billions


def read_yaml(path: str) -> dict:
    """Reads a YAML mapping safely and within bounds (`load_yaml`); errors name the file."""
    if path.startswith(("gs://", "ram://")):
        import tensorflow as tf

        with tf.io.gfile.GFile(path, "rb") as f:
            raw = f.read(MAX_YAML_BYTES + 1)
    else:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block, a device never end
            raise ConfigError(f"{path} is not a regular file, so it is not a config file.")
        with open(path, "rb") as f:
            raw = f.read(MAX_YAML_BYTES + 1)
    if len(raw) > MAX_YAML_BYTES:
        raise ConfigError(f"{path} is over {MAX_YAML_BYTES >> 20} MiB: not a config file.")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path} is not UTF-8 text (byte {e.start}); save it as UTF-8.") from None
    data = load_yaml(text, path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of sections (data, model, train, runtime).")
    return data


def load_yaml(text: str, where: str):
    """Parses YAML with the safe loader, refusing a document that expands (through aliases)
    to more than MAX_YAML_NODES nodes, refers to itself, or nests too deeply; errors are one
    ConfigError naming `where`."""
    loader = None
    try:
        loader = yaml.SafeLoader(text)
        node = loader.get_single_node()
        if node is not None:
            _expanded_size(node, {}, set(), where)
        return None if node is None else loader.construct_document(node)
    except yaml.YAMLError as e:
        raise ConfigError(f"{where} is not valid YAML: {e}".replace("\n", " ")) from None
    except RecursionError:
        raise ConfigError(f"{where} nests too deeply to be a config.") from None
    finally:
        if loader is not None:
            loader.dispose()


def _expanded_size(node, sizes: dict, open_nodes: set, where: str) -> int:
    """The number of nodes `node` stands for once every alias is expanded (memoized by node,
    so this costs the size of the document, not of its expansion)."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_nodes:
        raise ConfigError(f"{where}: an alias refers to the node that contains it (a YAML "
                          "structure that never ends).")
    open_nodes.add(key)
    children = node.value if isinstance(node.value, list) else []
    size = 1
    for child in children:
        for item in (child if isinstance(child, tuple) else (child,)):
            size += _expanded_size(item, sizes, open_nodes, where)
            if size > MAX_YAML_NODES:
                raise ConfigError(
                    f"{where} expands to over {MAX_YAML_NODES:,} values through its aliases "
                    "(&anchor / *alias): that is not a config. Write the values out.")
    open_nodes.discard(key)
    sizes[key] = size
    return size


def parse_overrides(text: str) -> dict:
    """Parses 'train.epochs=3,data.batch_size=64' into a nested dict; values are YAML scalars.

    A value may hold commas inside brackets or quotes: 'model.params={filters: [8, 16]}'.
    """
    updates: dict = {}
    for item in _split_top_level(text):
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"bad override {item!r}: write key=value, e.g. train.epochs=3")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            raise ConfigError(f"bad value in override {item!r}: not a YAML scalar, list or mapping") from None
        node = updates
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {key!r} conflicts with another override of {part!r}")
        node[leaf] = value
    return updates


def _split_top_level(text: str) -> list[str]:
    items, depth, quote, current = [], 0, "", ""
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == "," and depth == 0:
            items.append(current)
            current = ""
            continue
        current += char
    items.append(current)
    return [item.strip() for item in items if item.strip()]


def build_config(config: str = "digits", flag_values: dict | None = None,
                 overrides: str = "") -> Config:
    """Defaults -> YAML file -> flag values (dotted keys) -> overrides; then validated."""
    result = Config()
    if config:
        path = resolve_config_path(config)
        try:
            _apply(result, read_yaml(path))
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None
    for key, value in (flag_values or {}).items():
        _apply(result, _nested(key, value))
    _apply(result, parse_overrides(overrides))
    validate(result)
    return result


def conversion_allowed(config: Config, overrides: str) -> bool:
    """Whether `train` may convert a missing dataset into `data.dir`: not when `overrides` (the
    command line) moved `data.dir` without naming `data.pipeline` or `data.source` while the
    config converts embedded data (no `data.source`, e.g. digits), which would otherwise be
    trained on in place of the data the user pointed at."""
    data_overrides = parse_overrides(overrides).get("data", {})
    return bool(config.data.source) or "dir" not in data_overrides or bool(
        {"pipeline", "source"} & set(data_overrides))


def _nested(key: str, value: Any) -> dict:
    node: dict = {}
    root = node
    *parents, leaf = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return root


def validate(config: Config) -> None:
    """Checks values and combinations that no type can express; raises ConfigError."""
    def choice(key, value, options):
        if value not in options:
            close = difflib.get_close_matches(str(value), options, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{key}={value!r} is not one of {', '.join(options)}{hint}")

    def positive(key, value):
        if value is not None and value <= 0:
            raise ConfigError(f"{key} must be > 0, got {value}")

    choice("runtime.strategy", config.runtime.strategy, STRATEGIES)
    choice("runtime.cluster", config.runtime.cluster, CLUSTERS)
    if not 0 <= config.runtime.cluster_port <= 65535:
        raise ConfigError("runtime.cluster_port must be 0 (TF's default) or a port number, got "
                          f"{config.runtime.cluster_port}")
    choice("runtime.mixed_precision", config.runtime.mixed_precision, PRECISIONS)
    choice("runtime.jit_compile", config.runtime.jit_compile, JIT_COMPILE)
    choice("train.optimizer", config.train.optimizer, OPTIMIZERS)
    choice("train.lr_schedule", config.train.lr_schedule, LR_SCHEDULES)
    choice("data.cache", config.data.cache, CACHE_MODES)
    choice("data.format", config.data.format, DATA_FORMATS)
    if config.data.format == "tfrecord" and config.data.source:
        raise ConfigError(f"data.format=tfrecord reads existing TFRecords in data.dir; "
                          f"data.source ({config.data.source!r}) is only for converting raw data: "
                          "drop one of them")
    choice("train.monitor", config.train.monitor, MONITORS)
    check_task(config)
    for key in ("data.batch_size", "data.shuffle_buffer", "train.epochs", "train.steps_per_epoch",
                "train.steps", "train.learning_rate", "train.steps_per_execution",
                "train.grad_accum_steps", "train.lr_decay_epochs", "train.lr_decay_rate"):
        section, name = key.split(".")
        positive(key, getattr(getattr(config, section), name))
    for key in ("warmup_steps", "lr_min", "plateau_patience", "early_stopping_patience",
                "backup_every_steps", "weight_decay"):
        if getattr(config.train, key) < 0:
            raise ConfigError(f"train.{key} must be >= 0, got {getattr(config.train, key)}")
    if config.train.lr_schedule == "plateau" and config.train.warmup_steps:
        raise ConfigError("train.lr_schedule=plateau cannot be combined with train.warmup_steps "
                          f"({config.train.warmup_steps}): reduce-on-plateau needs a plain rate; "
                          "use lr_schedule=cosine or constant for warmup")
    if config.train.lr_min >= config.train.learning_rate and config.train.lr_schedule in ("cosine", "plateau"):
        raise ConfigError(f"train.lr_min ({config.train.lr_min}) must be below train.learning_rate "
                          f"({config.train.learning_rate}) for lr_schedule={config.train.lr_schedule}")
    choice("train.on_nan", config.train.on_nan, ON_NAN)
    if not 0 < config.train.rollback_lr_factor < 1:
        raise ConfigError("train.rollback_lr_factor must be between 0 and 1 (the learning rate is "
                          f"multiplied by it at each rollback), got {config.train.rollback_lr_factor}")
    if config.train.max_rollbacks < 0:
        raise ConfigError(f"train.max_rollbacks must be >= 0, got {config.train.max_rollbacks}")
    if config.train.on_nan == "rollback" and config.runtime.strategy == "dtensor":
        raise ConfigError("train.on_nan=rollback is not supported with runtime.strategy=dtensor "
                          "(restoring a DTensor backup inside fit is untested): use train.on_nan=stop")
    profile_steps(config.train.profile_steps)
    if config.train.deterministic and config.data.service_address:
        raise ConfigError("train.deterministic=true needs the input read in this process: the "
                          "tf.data service (data.service_address="
                          f"{config.data.service_address!r}) hands out batches in no fixed "
                          "order; drop one of them")
    if config.runtime.cpu_devices < 0:
        raise ConfigError(f"runtime.cpu_devices must be >= 0, got {config.runtime.cpu_devices}")
    choice("data.service_mode", config.data.service_mode, SERVICE_MODES)
    positive("runtime.tpu_timeout", config.runtime.tpu_timeout)
    if config.runtime.strategy == "tpu" and not config.runtime.tpu:
        raise ConfigError("runtime.strategy=tpu needs runtime.tpu (or --tpu): local, a TPU name, "
                          "or grpc://host:port")
    if config.runtime.strategy == "mirrored" and config.runtime.cpu_devices > 1:
        check_divisible(config.data.batch_size, config.runtime.cpu_devices)
    if config.runtime.strategy == "dtensor":
        from tftrain.runtime import dtensor_layouts  # no TensorFlow at import

        dtensor_layouts.check_config(config)
    if not config.data.dir:
        raise ConfigError("data.dir is empty: name the dataset directory")
    from tftrain import models  # no TensorFlow at import

    models.check_model(config.model.name, config.model.params)


def check_task(config: Config) -> None:
    """`task.type`, `task.loss` and `train.monitor` fit together (as far as known before the
    dataset is read: `task.type=auto` is resolved by `tftrain.tasks.resolve`)."""
    task = config.task
    if task.type not in TASK_TYPES:
        close = difflib.get_close_matches(str(task.type), TASK_TYPES, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"task.type={task.type!r} is not one of {', '.join(TASK_TYPES)}{hint}")
    losses = TASK_LOSSES.get(task.type) or tuple(dict.fromkeys(sum(TASK_LOSSES.values(), ())))
    if task.loss != "auto" and task.loss not in losses:
        owner = next((t for t, names in TASK_LOSSES.items() if task.loss in names), None)
        why = f" (a {owner} loss)" if owner else ""
        raise ConfigError(f"task.loss={task.loss!r}{why} is not a loss of task.type={task.type}: "
                          f"choose auto or one of {', '.join(losses)}")
    from tftrain.tasks import registry  # no TensorFlow at import

    if task.type != "auto":
        registry.TASKS[task.type].check_monitor(config.train.monitor)


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
            f"({num_replicas}); use {lower or num_replicas} or {lower + num_replicas}")


def to_dict(config: Config) -> dict:
    """The config as plain nested dicts, ready for YAML."""
    return dataclasses.asdict(config)


def to_yaml(config: Config) -> str:
    """The resolved config as YAML text, as written to params.yaml."""
    return yaml.safe_dump(to_dict(config), sort_keys=False)


def from_yaml_file(path: str) -> Config:
    """Reads a resolved config (e.g. a run's params.yaml) strictly, and validates it."""
    result = Config()
    values = read_yaml(path)
    if "task" not in values:  # a run of a tftrain without tasks: it trained a classifier
        result.task.type = "classification"
    _apply(result, values)
    validate(result)
    return result
