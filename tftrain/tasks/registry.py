"""The tasks by name, and which one a run trains: `task.type`, or the dataset's label.

`task.type=auto` is inferred from the manifest's `info` (what the converter recorded):
- a float label (`label_stats.kind == "float"`: a CSV column `:float`, float NumPy targets)
  -> regression;
- class names or a categorical label -> classification;
- whole-number labels -> classification, unless they take more than `MAX_INFERRED_CLASSES`
  distinct values (a count, a price, an age...): then regression, with a warning that says how
  to choose (`task.type=regression` or `task.type=classification`);
- next tokens (`label_stats.kind == "tokens"`: windows of token ids, the `text` pipeline)
  -> language_model;
- no label statistics (digits, image folders, TFDS, TFRecords of other tools) -> classification.
A task the labels cannot support (regression on class names, classification of a float label,
a language model of anything but token windows, ...) is a `DataError` naming the label and the
setting to change.
"""
from __future__ import annotations

import dataclasses

from absl import logging

from tftrain import models
from tftrain.data import augment_options
from tftrain.errors import ConfigError, DataError
from tftrain.tasks import class_weights, soft_targets
from tftrain.tasks.classification import ClassificationTask
from tftrain.tasks.language_model import LanguageModelTask
from tftrain.tasks.regression import RegressionTask

TASKS = {"classification": ClassificationTask, "regression": RegressionTask,
         "language_model": LanguageModelTask}
# More distinct whole-number labels than this look like a quantity, not class ids.
MAX_INFERRED_CLASSES = 100


def label_kind(info: dict) -> str | None:
    """"float", "int", "categorical" or "tokens": what the label is, from the manifest's
    `info`; None when the pipeline recorded nothing about it (then `num_classes` says classes)."""
    stats = info.get("label_stats") or {}
    if stats.get("kind"):
        return stats["kind"]
    if isinstance(info.get("label"), dict) and info["label"].get("type"):  # CSV before stats
        return info["label"]["type"]
    if info.get("y_type"):  # NumPy before stats
        return info["y_type"]
    return "categorical" if info.get("class_names") else None


def _where(manifest: dict, data=None) -> str:
    directory = f" {data.dir}" if data is not None else ""
    return f"dataset{directory} (pipeline {manifest.get('pipeline')!r})"


def infer_type(manifest: dict, data=None) -> str:
    """The task `task.type=auto` trains on this dataset (see the module docstring)."""
    info = manifest.get("info") or {}
    kind = label_kind(info)
    if kind == "float":
        return "regression"
    if kind == "tokens":
        return "language_model"
    stats = info.get("label_stats") or {}
    if kind == "int" and "distinct" in stats and (
            stats["distinct"] is None or stats["distinct"] > MAX_INFERRED_CLASSES):
        distinct = ("more than 1000" if stats["distinct"] is None else str(stats["distinct"]))
        logging.warning(
            "%s: the label holds whole numbers with %s distinct values (%s..%s), more than %d: "
            "training it as regression (task.type=auto). Set task.type=regression to say so, or "
            "task.type=classification to train a %s-class classifier.", _where(manifest, data),
            distinct, _number(stats.get("min")), _number(stats.get("max")),
            MAX_INFERRED_CLASSES, info.get("num_classes", "?"))
        return "regression"
    return "classification"


def _number(value) -> str:
    return "?" if value is None else f"{value:g}"


def from_config(config, manifest: dict, *, training: bool = True):
    """The task of a run (its `Config`) on the dataset `manifest` describes; raises DataError
    (or ConfigError) when the labels cannot support it. `training=False` (scoring a trained
    model's outputs) does not need the dataset to name its number of classes."""
    task_type = config.task.type
    if task_type == "auto":
        task_type = infer_type(manifest, config.data)
    if task_type not in TASKS:
        raise ConfigError(f"task.type={task_type!r} is not available: choose auto, "
                          f"{', '.join(TASKS)}")
    info = manifest.get("info") or {}
    kind = label_kind(info)
    weighted = config.train.class_weight
    if weighted != "none" and (task_type != "classification" or kind == "tokens"):
        class_weights.refuse("language_model" if kind == "tokens" else task_type,
                             " (from the dataset's label)" if config.task.type == "auto" else "")
    augment_options.check_task(
        augment_options.parse(config.data.augment),
        "language_model" if kind == "tokens" else task_type,
        " (from the dataset's label)" if config.task.type == "auto" else "")
    if task_type == "language_model" or kind == "tokens":
        return language_model_task(task_type, config, manifest)
    if task_type == "regression":
        soft_targets.check_setting(config.task.label_smoothing, task_type,
                                   " (from the dataset's label)" if config.task.type == "auto"
                                   else "")
        if kind in ("categorical", None) or info.get("class_names"):
            raise DataError(
                f"task.type=regression needs a numeric label, but {_where(manifest, config.data)} "
                "has class labels (names or categories): use task.type=classification (or auto), "
                "or convert the target as a number (a CSV column declared `:float`).")
        stats = info.get("label_stats") or {}
        return RegressionTask(info, config.task.loss, shape=stats.get("shape") or info.get(
            "y_shape") or (), mean=stats.get("mean"), std=stats.get("std"))
    if kind == "float":
        raise DataError(
            f"task.type=classification needs integer class labels, but "
            f"{_where(manifest, config.data)} has a float label: use task.type=regression (or "
            "auto), or convert the label as classes (a CSV column declared `:int` or "
            "`:categorical`).")
    count = num_classes(manifest, config.data) if training else info.get("num_classes", 0)
    weights = class_weights.weights(weighted, manifest, config.data) if training else None
    return ClassificationTask(info, config.task.loss, count, class_weights=weights,
                              label_smoothing=config.task.label_smoothing)


def language_model_task(task_type: str, config, manifest: dict) -> LanguageModelTask:
    """The language-model task; a DataError unless task and dataset are both about next tokens."""
    info = manifest.get("info") or {}
    where = _where(manifest, config.data)
    if task_type != "language_model":
        raise DataError(
            f"task.type={task_type} needs a label per example, but {where} holds windows of "
            "token ids whose labels are the next tokens: use task.type=language_model (or auto).")
    if label_kind(info) != "tokens" or not info.get("vocab_size"):
        raise DataError(
            f"task.type=language_model needs windows of token ids with a vocabulary (convert "
            f"text with `tftrain convert --pipeline=text`), but {where} has "
            f"{_label_description(info)}: use task.type=auto, or train on a text dataset.")
    if config.train.monitor.removeprefix("val_") == "bits_per_byte" and not info.get("token_bytes"):
        raise ConfigError(f"train.monitor={config.train.monitor} needs the bytes of each token, "
                          f"which {where} does not record (converted before bits per byte "
                          "existed): convert it again, or monitor val_loss.")
    return LanguageModelTask(info, config.task.loss, int(info["vocab_size"]),
                             label_smoothing=config.task.label_smoothing)


def _label_description(info: dict) -> str:
    kind = label_kind(info)
    if kind is None:
        return "class labels" if info.get("num_classes") else "no token windows"
    return {"float": "a float label", "int": "an integer label"}.get(kind, "class labels")


def num_classes(manifest: dict, data) -> int:
    """The number of classes the dataset's labels have; DataError when it names none."""
    count = (manifest.get("info") or {}).get("num_classes")
    if isinstance(count, int) and count > 0:
        return count
    if data.format == "tfrecord":
        raise DataError("data.format=tfrecord: say how many classes the labels have with "
                        "data.info={num_classes: K} (or task.type=regression for real-valued "
                        "labels).")
    raise DataError(f"{_where(manifest, data)} names no number of classes (num_classes in its "
                    "manifest's info): convert the label as a class column, or train it with "
                    "task.type=regression.")


def resolve(config, manifest: dict):
    """`(config, task)`: a copy of `config` with `task.type`, `task.loss`, `train.monitor` and
    `model.name: auto` resolved (what params.yaml and summary.json record), and the task."""
    task = from_config(config, manifest)
    resolved = dataclasses.replace(
        config, task=dataclasses.replace(config.task, **task.resolved()),
        train=dataclasses.replace(config.train, monitor=task.monitor(config.train.monitor)),
        model=_resolved_model(config.model, manifest, task.resolved()["type"]))
    return resolved, task


def _resolved_model(model, manifest: dict, task_type: str):
    """`model` with `auto` replaced by the model that fits the dataset; the config's
    model.params that this model does not take (another model's) are left out, in the log."""
    if model.name != models.AUTO:
        return model
    name, kind = models.choose(manifest, task_type)
    params, dropped = models.taken_params(name, model.params)
    logging.info("model.name=auto: %s, for %s%s", name, kind,
                 f"; left out model.params {', '.join(dropped)} (another model's)"
                 if dropped else "")
    return dataclasses.replace(model, name=name, params=params)
