"""The experiment config: YAML files, strict overrides, and validation against what exists.

Applied in one fixed order: defaults -> YAML file -> command-line flags -> `--params_override`.
Everything is checked here, before TensorFlow starts: an unknown key names the closest valid
keys, a value of the wrong type names the expected type, and an impossible combination names
the numbers involved. The resolved config is written to `model_dir/params.yaml`.
"""
from __future__ import annotations

import difflib
import math
import os
import posixpath
from typing import Any

import yaml

import tftrain
from tftrain import models, tasks
from tftrain.tasks import class_weights, soft_targets
from tftrain.config_schema import (  # noqa: F401  (the schema is part of this module's API)
    ASYNC_BACKUP, CACHE_MODES, CHOICES, CLASS_WEIGHTS, CLUSTERS, DATA_FORMATS, JIT_COMPILE,
    LR_SCHEDULES, MONITORS, ON_NAN, OPTIMIZERS, PARAMS, PIPELINE_SCHEDULES, PRECISIONS,
    SERVICE_MODES, STRATEGIES, TASK_LOSSES, TASK_TYPES, Config, DataConfig, ModelConfig,
    RuntimeConfig, TaskConfig, TrainConfig, WholeMapping, all_keys, apply_values,
    check_divisible, profile_steps, to_dict, to_yaml)
from tftrain.data import augment_options
from tftrain.errors import ConfigError
from tftrain.runtime import dtensor_layouts, pipeline_schedule
from tftrain.yaml_file import MAX_YAML_BYTES, MAX_YAML_NODES, load_yaml, read_yaml  # noqa: F401


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


def resolve_config_path(name_or_path: str) -> str:
    """A config file path from a path, the name of a shipped config (`digits`), or a run
    directory (its params.yaml: the config it trained with, whole)."""
    candidates = [name_or_path]
    if not name_or_path.endswith((".yaml", ".yml")):
        candidates.append(os.path.join(CONFIG_DIR, name_or_path + ".yaml"))
        candidates.append(posixpath.join(name_or_path, PARAMS))
    for path in candidates:
        if os.path.isfile(path) or (path.startswith(("gs://", "ram://")) and _gfile_exists(path)):
            return path
    shipped = sorted(f[:-5] for f in os.listdir(CONFIG_DIR) if f.endswith(".yaml"))
    raise ConfigError(f"config {name_or_path!r} not found: give a YAML file path, a run "
                      f"directory (its {PARAMS}) or one of the shipped configs: "
                      f"{', '.join(shipped)}")


def _gfile_exists(path: str) -> bool:
    import tensorflow as tf  # only for remote paths

    return tf.io.gfile.exists(path)


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
        if isinstance(value, dict):
            value = WholeMapping(value)
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
            apply_values(result, read_yaml(path))
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None
    for key, value in (flag_values or {}).items():
        apply_values(result, _nested(key, value))
    apply_values(result, parse_overrides(overrides))
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

    for key, options in CHOICES.items():  # task.type and task.loss: check_task
        if not key.startswith("task."):
            section, name = key.split(".")
            choice(key, getattr(getattr(config, section), name), options)
    if not 0 <= config.runtime.cluster_port <= 65535:
        raise ConfigError("runtime.cluster_port must be 0 (TF's default) or a port number, got "
                          f"{config.runtime.cluster_port}")
    if config.data.format == "tfrecord" and config.data.source:
        raise ConfigError(f"data.format=tfrecord reads existing TFRecords in data.dir; "
                          f"data.source ({config.data.source!r}) is only for converting raw data: "
                          "drop one of them")
    check_task(config)
    for key in ("data.batch_size", "data.shuffle_buffer", "train.epochs", "train.steps_per_epoch",
                "train.steps", "train.learning_rate", "train.steps_per_execution",
                "train.grad_accum_steps", "train.lr_decay_epochs", "train.lr_decay_rate"):
        section, name = key.split(".")
        positive(key, getattr(getattr(config, section), name))
    for key in ("warmup_steps", "lr_min", "plateau_patience", "early_stopping_patience",
                "backup_every_steps", "weight_decay", "validation_steps",
                "validation_every_steps", "test_steps", "log_every_steps"):
        if getattr(config.train, key) < 0:
            raise ConfigError(f"train.{key} must be >= 0, got {getattr(config.train, key)}")
    if config.train.lr_schedule == "plateau" and config.train.warmup_steps:
        raise ConfigError("train.lr_schedule=plateau cannot be combined with train.warmup_steps "
                          f"({config.train.warmup_steps}): reduce-on-plateau needs a plain rate; "
                          "use lr_schedule=cosine or constant for warmup")
    if config.train.lr_min >= config.train.learning_rate and config.train.lr_schedule in ("cosine", "plateau"):
        raise ConfigError(f"train.lr_min ({config.train.lr_min}) must be below train.learning_rate "
                          f"({config.train.learning_rate}) for lr_schedule={config.train.lr_schedule}")
    clip = config.train.clip_global_norm
    if not (clip >= 0 and math.isfinite(clip)):
        raise ConfigError(f"train.clip_global_norm must be a finite number >= 0 (0: off), got "
                          f"{clip}; 1.0 is the usual value for language models")
    if not 0 < config.train.rollback_lr_factor < 1:
        raise ConfigError("train.rollback_lr_factor must be between 0 and 1 (the learning rate is "
                          f"multiplied by it at each rollback), got {config.train.rollback_lr_factor}")
    if not 0 <= config.train.ema_decay < 1:
        raise ConfigError(f"train.ema_decay={config.train.ema_decay} must be in [0, 1) (0: no "
                          "moving average of the weights; typical: 0.99 to 0.9999)")
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
    positive("runtime.tpu_timeout", config.runtime.tpu_timeout)
    if config.runtime.strategy == "tpu" and not config.runtime.tpu:
        raise ConfigError("runtime.strategy=tpu needs runtime.tpu (or --tpu): local, a TPU name, "
                          "or grpc://host:port")
    if config.runtime.strategy == "mirrored" and config.runtime.cpu_devices > 1:
        check_divisible(config.data.batch_size, config.runtime.cpu_devices)
    if config.runtime.shard_optimizer_state and config.runtime.strategy != "dtensor":
        raise ConfigError("runtime.shard_optimizer_state=true shards optimizer slots over a "
                          "DTensor mesh's batch dimension: it needs runtime.strategy=dtensor "
                          "(and runtime.mesh with batch:N, N > 1)")
    if config.runtime.strategy == "dtensor":
        dtensor_layouts.check_config(config)
    check_pipeline(config.runtime, config.data.batch_size)
    if not config.data.dir:
        raise ConfigError("data.dir is empty: name the dataset directory")
    models.check_model(config.model.name, config.model.params)


def check_pipeline(runtime, batch_size: int) -> None:
    """The pipeline keys: at least two stages, a batch that splits into the replicas'
    micro-batches, chunks per stage that the schedule runs (`interleaved`: >= 2, and
    micro-batches in groups of the stages), no whole-step XLA (it would put every stage on one
    device)."""
    if runtime.strategy != "pipeline":
        if runtime.stage_rules:
            raise ConfigError(f"runtime.stage_rules={runtime.stage_rules!r} cuts a model into "
                              "pipeline stages: it needs runtime.strategy=pipeline")
        if runtime.pipeline_replicas != 1:
            raise ConfigError(f"runtime.pipeline_replicas={runtime.pipeline_replicas} copies "
                              "pipeline stages: it needs runtime.strategy=pipeline")
        if runtime.virtual_stages != 1:
            raise ConfigError(f"runtime.virtual_stages={runtime.virtual_stages} cuts pipeline "
                              "stages into chunks: it needs runtime.strategy=pipeline and "
                              "runtime.pipeline_schedule=interleaved")
        return
    if runtime.pipeline_stages < 2:
        raise ConfigError("runtime.pipeline_stages must be >= 2 for runtime.strategy=pipeline, got "
                          f"{runtime.pipeline_stages} (one stage is runtime.strategy=one_device)")
    if runtime.microbatches < 1:
        raise ConfigError(f"runtime.microbatches must be >= 1, got {runtime.microbatches}")
    if runtime.pipeline_replicas < 1:
        raise ConfigError("runtime.pipeline_replicas must be >= 1, got "
                          f"{runtime.pipeline_replicas}")
    pipeline_schedule.check(runtime.pipeline_schedule, runtime.pipeline_stages,
                            runtime.microbatches, runtime.virtual_stages)
    parts = runtime.pipeline_replicas * runtime.microbatches
    if batch_size % parts:
        split = f"runtime.microbatches={runtime.microbatches}"
        if runtime.pipeline_replicas > 1:
            split = f"runtime.pipeline_replicas={runtime.pipeline_replicas} x {split} = {parts}"
        raise ConfigError(f"data.batch_size={batch_size} must split into {split} equal "
                          f"micro-batches: make it a multiple of {parts}")
    if runtime.jit_compile == "true":
        raise ConfigError("runtime.jit_compile=true compiles a whole step for one device, and "
                          "runtime.strategy=pipeline places each stage on its own: use "
                          "jit_compile=auto or false")


def check_task(config: Config) -> None:
    """`task.type`, `task.loss`, `train.monitor` and `data.augment` fit together (as far as
    known before the dataset is read: `task.type=auto` is resolved by `tftrain.tasks.resolve`)."""
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
    soft_targets.check_setting(task.label_smoothing, task.type)
    if task.type != "auto":
        tasks.TASKS[task.type].check_monitor(config.train.monitor)
    class_weights.check_setting(config.train.class_weight, task.type)
    augment_options.check_task(augment_options.parse(config.data.augment), task.type)


def from_yaml_file(path: str) -> Config:
    """Reads a resolved config (e.g. a run's params.yaml) strictly, and validates it."""
    result = Config()
    values = read_yaml(path)
    if "task" not in values:  # a run of a tftrain without tasks: it trained a classifier
        result.task.type = "classification"
    apply_values(result, values)
    validate(result)
    return result
