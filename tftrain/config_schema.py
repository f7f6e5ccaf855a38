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

PARAMS = "params.yaml"  # a run directory's resolved config (`tftrain.run_dir`)
STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker_mirrored", "tpu", "dtensor", "pipeline")
# runtime.pipeline_schedule: the order of a stage's micro-batch passes (runtime/pipeline_schedule.py)
PIPELINE_SCHEDULES = ("1f1b", "gpipe", "interleaved")
ASYNC_BACKUP = ("auto", "true", "false")
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
# train.class_weight as a word; else a mapping {class name or id: weight} (tasks/class_weights.py)
CLASS_WEIGHTS = ("none", "balanced")
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
    # Image augmentation of the training input ({}: none; keys in tftrain/data/augment_options.py)
    augment: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class TaskConfig:
    """What the model learns from the labels: resolved from the dataset when `auto`."""

    type: str = "auto"  # auto | classification | regression | language_model
    # auto | crossentropy (classification, language_model) | mse | mae | huber (regression)
    loss: str = "auto"
    label_smoothing: float = 0.0  # in [0, 1): targets y * (1 - eps) + eps / K, in the loss only


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
    # > 0: learning_rate is the rate for a global batch of this many examples, scaled linearly
    # to the run's (data.batch_size x grad_accum_steps): Goyal et al. (2017), timm's lr_base_size
    lr_base_batch_size: int = 0
    momentum: float = 0.9  # sgd only
    # adamw: decoupled decay; sgd: L2 on the weights of rank >= 2 added to their gradients (what
    # Model Garden's l2_weight_decay and PyTorch's SGD weight_decay do); adam, adafactor: none
    weight_decay: float = 0.0
    # > 0: each update's gradients scaled down to this global norm (the whole model's, after
    # the all-reduce and the loss scale); 0: measured (summary.json's `gradients`), not clipped
    clip_global_norm: float = 0.0
    # Exponential moving average of the weights (0: off; else e.g. 0.999), with Model Garden's
    # warm-up min(decay, (1 + t) / (10 + t)) at step t: validation, the best checkpoint, the test
    # split and the export use the average (training/ema.py, callbacks/ema.py)
    ema_decay: float = 0.0
    lr_schedule: str = "constant"  # constant | step | cosine | plateau
    warmup_steps: int = 0  # linear warmup from 0 (constant, step, cosine)
    warmup_epochs: float = 0.0  # the same counted in epochs of the training split (not both)
    lr_decay_epochs: int = 30  # step: multiply by lr_decay_rate every this many epochs
    lr_decay_rate: float = 0.1  # step and plateau: the factor
    lr_min: float = 0.0  # cosine: the final rate; plateau: the floor
    plateau_patience: int = 2  # plateau: epochs without improvement of `monitor`
    grad_accum_steps: int = 1  # k > 1: one update per k micro-batches of data.batch_size
    steps_per_execution: int = 1
    monitor: str = "auto"  # best checkpoint, early stopping, plateau; auto: the task's
    early_stopping_patience: int = 0  # 0: off; else epochs without improvement of `monitor`
    backup_every_steps: int = 0  # 0: back up at the end of each epoch only
    # auto: the backups are written in the background (the step waits only for a copy of the
    # variables in host memory) by a single-process run (one device, Mirrored, pipeline); a
    # multi-worker, TPU or DTensor run writes them synchronously (callbacks/backup.py)
    async_backup: str = "auto"
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
    # Classification: none | balanced (n_samples / (n_classes x count), the training split's
    # label counts in the manifest) | {class name or id: weight} (classes not named: 1.0); a
    # per-example sample weight on the training input only (tftrain/tasks/class_weights.py)
    class_weight: str | dict = "none"
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
    # strategy=pipeline (docs/guides/pipeline-stages.md): the model's layers cut into this many
    # stages, one device each; each step's batch split into `microbatches` (GPipe);
    # `stage_rules`: the layers after which to cut, comma-separated ("" cuts where parameter
    # bytes balance)
    pipeline_stages: int = 2
    microbatches: int = 4
    # The order of each stage's forward and backward passes: 1f1b (warm-up forwards, then one
    # forward one backward: at most `pipeline_stages` micro-batches' activations held per
    # stage) | gpipe (all forwards, then all backwards: all `microbatches` held). Same bubble.
    # 1f1b by default: text_lm on 2 virtual CPU devices at batch 512 peaked at 1047 MiB RSS
    # with 4 micro-batches (gpipe: 1413) and 1126 with 16 (gpipe: 1565), and its steps took
    # as long as gpipe's (docs/guides/pipeline-stages.md#the-schedule). | interleaved
    # (Megatron-LM's virtual stages: the model cut into pipeline_stages x virtual_stages
    # chunks, chunk c on stage c % S, run 1F1B: a bubble V times smaller, V times the sends)
    pipeline_schedule: str = "1f1b"
    # pipeline_schedule=interleaved: the chunks each stage (device) holds, >= 2; the other
    # schedules run 1. `microbatches` must be a multiple of `pipeline_stages` then
    virtual_stages: int = 1
    # Data-parallel copies of the whole pipeline on this host (S x R devices: stage s of replica
    # r on device r*S + s), each stage's gradients averaged over its R copies every step (and
    # over the workers' copies on a multi-worker run: R x workers copies in all)
    pipeline_replicas: int = 1
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
    """Checks `value` against the annotated type `tp`; returns it, converted where lossless.

    A union (`Optional[int]`, `str | dict`) takes None when it lists it, else the value as the
    first of its types that holds it as it is, else as the first that converts it."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        options = [t for t in options if t is not type(None)]
        if len(options) > 1:
            exact = [t for t in options if isinstance(value, typing.get_origin(t) or t)
                     and not (isinstance(value, bool) and t is not bool)]
            for option in exact + [t for t in options if t not in exact]:
                try:
                    return _coerce(key, value, option)
                except ConfigError:
                    pass
            names = " or ".join(_type_name(t) for t in options)
            raise ConfigError(f"config key {key!r} must be of type {names}, "
                              f"got {value!r} ({type(value).__name__})")
        (tp,) = options
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
                value = _plain(value)
            elif isinstance(current, dict) and isinstance(value, dict):
                # 'model.params.remat=true': one key, others kept
                value = {**current, **_plain(value)}
            setattr(config, name, _coerce(key, value, hints[name]))


def _plain(value):
    """`value` with every `WholeMapping` in it a plain dict (what params.yaml can hold)."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value

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


# The choices of each key that has a fixed set of words (tftrain.config validates them), and one
# sentence per key for its reference page: docs/reference/config.md is generated from these and
# the dataclasses above (`python tools/gen_reference.py`; tests/test_docs_site.py checks that
# every key has an entry and that the committed page is current). Nothing reads them at run time.
CHOICES = {
    "data.format": DATA_FORMATS, "data.cache": CACHE_MODES, "data.service_mode": SERVICE_MODES,
    "task.type": TASK_TYPES,
    "task.loss": ("auto",) + tuple(dict.fromkeys(sum(TASK_LOSSES.values(), ()))),
    "train.optimizer": OPTIMIZERS, "train.lr_schedule": LR_SCHEDULES, "train.monitor": MONITORS,
    "train.on_nan": ON_NAN, "runtime.strategy": STRATEGIES, "runtime.cluster": CLUSTERS,
    "runtime.mixed_precision": PRECISIONS, "runtime.jit_compile": JIT_COMPILE,
    "runtime.pipeline_schedule": PIPELINE_SCHEDULES, "train.async_backup": ASYNC_BACKUP,
}

KEY_DOCS = {
    "data.dir": "Dataset directory (TFRecord shards + `dataset.json`); `gs://` works.",
    "data.pipeline": "Dataset kind that converts `data.source` into `data.dir` the first time "
                     "it is needed (only into an absent or empty directory): a built-in kind or "
                     "your own `my_pkg.my_data` module.",
    "data.source": "Raw input of that conversion (unused by the embedded kinds: `digits`, "
                   "`diabetes`, `text`, `jsonl` without one).",
    "data.pipeline_options": "The pipeline's options, as `--pipeline_options` of `tftrain "
                             "convert` takes them (e.g. `{image_size: 64}`).",
    "data.format": "`tftrain`: `data.dir` holds `dataset.json`; `tfrecord`: TFRecords other "
                   "tools wrote (`<split>-*` files, or a glob with `{split}`), read in place with "
                   "`data.pipeline`'s schema.",
    "data.info": "With `data.format=tfrecord`: what a manifest would say, e.g. "
                 "`{num_classes: 10}`.",
    "data.train_split": "The split trained on.",
    "data.eval_split": "The split validated on during training (best checkpoint, early "
                       "stopping, plateau schedule).",
    "data.test_split": "The split evaluated after training, reported in `summary.json`.",
    "data.batch_size": "Global batch size over all replicas and workers; must divide by the "
                       "replica count.",
    "data.shuffle_buffer": "Examples in the shuffle buffer (lower it for large records).",
    "data.cache": "Kept in memory after the first pass: `none`, `records` (serialized "
                  "examples), `decoded` (decoded examples: no reading or decoding after the "
                  "first epoch).",
    "data.autotune": "tf.data's autotuning of parallel calls and buffers; `false`: one parallel "
                     "call per core from the start (faster on small hosts; `tftrain doctor` "
                     "measures it on yours).",
    "data.service_address": "`host:port` of a tf.data service dispatcher: the training input "
                            "runs on its workers (`tftrain data_service`).",
    "data.service_mode": "tf.data service sharding: `parallel_epochs` (every service worker "
                         "runs the whole pipeline) or `distributed_epoch` (each example once "
                         "per pass).",
    "data.augment": "Image augmentation of the training input, on the host, resumable exactly "
                    "(`{}`: none): `random_resized_crop` (`true` or `{scale: [0.08, 1.0], "
                    "ratio: [0.75, 1.3333], eval_crop: 0.875}`; evaluation, export and predict "
                    "then center-crop `eval_crop` of the shorter side), `flip` (horizontal), "
                    "`randaugment` (`{num_layers: 2, magnitude: 10}`, magnitude 0..30), "
                    "`random_erasing` (a probability), `mixup_alpha` and `cutmix_alpha` "
                    "(>= 0; soft targets), `switch_prob` (0.5: the chance a mixed batch uses "
                    "cutmix when both are on), `mix_prob` (1.0: the chance a batch is mixed). "
                    "Image pipelines only; see the training guide.",
    "task.type": "What is learned from the labels; `auto` follows the dataset's label "
                 "(`dataset.json`'s `info.label_stats`): class ids or names are "
                 "classification, floats regression, token windows language_model.",
    "task.loss": "`auto` is the task's default: `crossentropy` (classification, "
                 "language_model), `mse` (regression; also `mae`, `huber`).",
    "task.label_smoothing": "In [0, 1) (0: off): classification and language models train on "
                            "the targets `y * (1 - eps) + eps / K` over their K classes (tokens); "
                            "the loss only (Keras's logged loss too), never the accuracy.",
    "model.name": "`auto` (the model that fits the dataset: images `cnn`, tabular features "
                  "`mlp`, token windows for language modeling `transformer_lm`, other token "
                  "sequences `transformer`; model.params it does not take are left out, in the "
                  "log), a registered model (`mlp`, `cnn`, `resnet`, `transformer`, "
                  "`transformer_lm`, `application`) or your own "
                  "`package.module:function(input_shape, outputs, **params)`.",
    "model.params": "The builder's keyword arguments, checked against its signature; "
                    "`model.params.remat=true` sets one and keeps the others, "
                    "`model.params={...}` replaces them all.",
    "train.epochs": "Epochs; each is one pass over the training split unless "
                    "`train.steps_per_epoch` says otherwise.",
    "train.steps_per_epoch": "Steps per epoch; null: one pass over the training split.",
    "train.steps": "Total optimizer steps; when set, it decides the run's length (the input "
                   "repeats: no epoch has to be a pass).",
    "train.optimizer": "`sgd`, `adam`, `adamw` or `adafactor` (factored second moments: a "
                       "small state for big models).",
    "train.learning_rate": "The peak learning rate (after warmup).",
    "train.momentum": "SGD's momentum.",
    "train.weight_decay": "`adamw`: decoupled weight decay; `sgd`: L2 regularization of the "
                          "weights of rank >= 2 (kernels, not biases or normalization), added "
                          "to their gradients as Model Garden's `l2_weight_decay` and "
                          "PyTorch's SGD do; refused for adam and adafactor.",
    "train.lr_base_batch_size": "> 0: `learning_rate` is given for a global batch of this many "
                                "examples and scaled linearly to the run's update batch "
                                "(`data.batch_size` x `grad_accum_steps`): the rule of Goyal et "
                                "al. (2017); 0: used as given.",
    "train.warmup_epochs": "Linear warmup from 0 over this many epochs of the training split "
                           "(rounded to steps); set this or `warmup_steps`, not both.",
    "train.clip_global_norm": "> 0: each update's gradients are scaled down to at most this "
                              "global norm (the whole model's: after the all-reduce over "
                              "replicas and workers, without the loss scale, over every "
                              "pipeline stage and DTensor shard, once per accumulated update); "
                              "0: off. The norm is measured either way: `grad_norm` in the "
                              "step logs and TensorBoard, `gradients` in `summary.json`.",
    "train.ema_decay": "Keep an exponential moving average of the weights with this decay "
                       "(0: off; 0 <= decay < 1, e.g. 0.999), warmed up as "
                       "min(decay, (1 + t) / (10 + t)) at step t: validation, the best "
                       "checkpoint, the test metrics and the export use the average.",
    "train.lr_schedule": "`constant`, `step`, `cosine` (each with linear warmup) or `plateau`.",
    "train.warmup_steps": "Linear warmup from 0 over this many steps (constant, step, cosine).",
    "train.lr_decay_epochs": "`step`: multiply the rate by `train.lr_decay_rate` every this "
                             "many epochs (passes over the data).",
    "train.lr_decay_rate": "`step` and `plateau`: the factor.",
    "train.lr_min": "`cosine`: the final rate; `plateau`: the floor.",
    "train.plateau_patience": "`plateau`: epochs without improvement of `train.monitor` before "
                              "the rate drops.",
    "train.grad_accum_steps": "k > 1: one update per k micro-batches of `data.batch_size` (the "
                              "batch of k x B in B's memory).",
    "train.steps_per_execution": "Steps run per `tf.function` call (use more than 1 on TPU).",
    "train.monitor": "The metric for the best checkpoint, early stopping and the plateau "
                     "schedule; `auto` is the task's (`val_accuracy`, `val_rmse`, `val_loss`), "
                     "its direction from the task.",
    "train.early_stopping_patience": "Epochs without improvement of `train.monitor` before "
                                     "stopping; 0: off.",
    "train.backup_every_steps": "Back up for resume every N steps; 0: at each epoch end only.",
    "train.async_backup": "Write each backup in the background: the step waits only while the "
                          "variables are copied to host memory, and for the previous write (at "
                          "most one in flight); a backup becomes the one to resume from only once "
                          "it is whole. `auto`: on for one-process runs (one device, Mirrored, "
                          "pipeline), off for multi-worker, TPU and DTensor runs (`true` there "
                          "is refused). `summary.json[\"backup\"]` has the seconds the steps "
                          "were blocked and the seconds of writing.",
    "train.validation_steps": "Batches per validation; 0: the whole split.",
    "train.validation_every_steps": "Validate every N steps instead of at epoch ends (the best "
                                    "checkpoint, early stopping, plateau and the epoch backup "
                                    "follow it); 0: at epoch ends.",
    "train.test_steps": "Batches of the final test; 0: the whole split.",
    "train.log_every_steps": "Without a terminal, a progress line (`step N/TOTAL loss=... "
                             "examples/s ETA ...`) and the same scalars in TensorBoard every N "
                             "steps; 0: about every 30 s.",
    "train.on_nan": "A NaN/Inf loss: `stop` (one line, exit 1) or `rollback` (restore the last "
                    "backup, lower the learning rate, go on).",
    "train.rollback_lr_factor": "`rollback`: the learning rate is multiplied by this.",
    "train.max_rollbacks": "`rollback`: at most this many, then the run stops as with `stop`.",
    "train.profile_steps": "`'start,end'`: a profiler trace of those training-batch calls in "
                           "`logs/plugins/profile`.",
    "train.class_weight": "Classification only: `none`, `balanced` (each class weighted "
                          "n_samples / (n_classes x its count), from the training split's label "
                          "counts in `dataset.json`, as scikit-learn's `balanced`) or a mapping "
                          "`{class name or id: weight}` (positive numbers; classes not named "
                          "weigh 1). Applied as a per-example sample weight on the training "
                          "input only: validation and test metrics are unweighted.",
    "train.seed": "Seed of the initial weights, the data order and the random layers.",
    "train.deterministic": "Deterministic ops and random layers whose state is backed up: a "
                           "killed and resumed run ends with the uninterrupted run's weights; "
                           "slower steps.",
    "runtime.strategy": "`auto` (TPU if `runtime.tpu`, else multi-worker when the cluster has "
                        "more than one worker, else all GPUs mirrored, else one device), "
                        "`one_device`, `mirrored`, `multi_worker_mirrored`, `tpu`, `dtensor` "
                        "(experimental), `pipeline` (the model's layers in stages).",
    "runtime.tpu": "`local` (on a TPU VM), a TPU name, or `grpc://host:port`.",
    "runtime.cpu_devices": "> 0: split the CPU into this many virtual devices (Mirrored, "
                           "DTensor or pipeline stages on a CPU-only machine).",
    "runtime.mixed_precision": "`float32`, `mixed_float16`, `mixed_bfloat16`, or `auto` "
                               "(bfloat16 on TPU, float16 on GPU, float32 on CPU).",
    "runtime.mesh": "`runtime.strategy=dtensor`: the device mesh, e.g. `batch:2,model:2` "
                    "(`batch` splits the data, `model` the weights).",
    "runtime.layout_rules": "`runtime.strategy=dtensor`: weight-path regex -> sharding spec, "
                            "e.g. `{\"dense.*kernel\": \"unsharded,model\"}`, before the "
                            "model's own rules.",
    "runtime.shard_optimizer_state": "`runtime.strategy=dtensor`: optimizer slots split over "
                                     "the mesh's `batch` dimension too (ZeRO-1).",
    "runtime.pipeline_stages": "`runtime.strategy=pipeline`: stages, one device each (GPUs, "
                               "else virtual CPU devices).",
    "runtime.microbatches": "`runtime.strategy=pipeline`: micro-batches per step (GPipe); "
                            "`data.batch_size` must divide by it.",
    "runtime.pipeline_schedule": "`runtime.strategy=pipeline`: the order of each stage's "
                                 "micro-batch passes: `1f1b` (one forward, one backward: at "
                                 "most `pipeline_stages` micro-batches' activations held per "
                                 "stage) or `gpipe` (all forwards, then all backwards: all "
                                 "`microbatches` held), the same idle share; or `interleaved` "
                                 "(1F1B over `virtual_stages` chunks per stage: a bubble "
                                 "`virtual_stages` times smaller, as many times the sends "
                                 "between stages; `microbatches` a multiple of "
                                 "`pipeline_stages`).",
    "runtime.virtual_stages": "`runtime.pipeline_schedule=interleaved`: the model's chunks "
                              "each stage (device) holds, >= 2 (the model is cut into "
                              "`pipeline_stages` x `virtual_stages` chunks, chunk c on stage "
                              "c % `pipeline_stages`); 1 under the other schedules.",
    "runtime.pipeline_replicas": "`runtime.strategy=pipeline`: data-parallel copies of the "
                                 "whole pipeline on this host (`pipeline_stages` x "
                                 "`pipeline_replicas` devices), each on its share of the "
                                 "batch, every stage's gradients averaged over its copies (on "
                                 "W workers, each runs R: R x W copies in all).",
    "runtime.stage_rules": "`runtime.strategy=pipeline`: the layers after which to cut, "
                           "comma-separated; empty: balanced by parameter bytes.",
    "runtime.tpu_timeout": "Seconds to connect to and initialize the TPU before giving up.",
    "runtime.jit_compile": "XLA-compile the train and eval steps: `true`, `false`, `auto` (on "
                           "GPUs; TPUs always compile).",
    "runtime.cluster": "Where the workers are described: `auto` (TF_CONFIG if set, else SLURM "
                       "inside a multi-task `srun` step, else one machine), `tf_config`, "
                       "`slurm`, `kubernetes`.",
    "runtime.cluster_port": "First port of the workers' servers for `slurm` (task i of a node: "
                            "+i) and `kubernetes`; 0: TensorFlow's defaults (8888, 8470).",
}
