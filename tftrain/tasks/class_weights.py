"""`train.class_weight`: a weight per class, given to each training example as its sample weight.

`none` (every example weighs 1), `balanced` or a mapping `{class name or id: weight}` (classes
not named weigh 1). `balanced` is scikit-learn's: class c weighs n_samples / (n_classes x
count_c), from the training split's label counts that the conversion recorded in `dataset.json`
(`splits.<train>.label_counts`), n_classes being the classes that occur there. TFRecords of other
tools (`data.format=tfrecord`) record no counts: `balanced` is refused there, a mapping works.

The weights reach the model as a per-example sample weight added to the training input
(`tftrain.data.load`'s `label_weights`), so every backend (tf.distribute strategies, DTensor,
pipeline stages) trains on them as on Keras's `fit(class_weight=...)`: the loss of a batch is
sum(w_i x loss_i) / batch size. Validation and test inputs carry no weights: their loss, accuracy
and per-class measures are those of the plain labels.
"""
from __future__ import annotations

import difflib
import math

from tftrain.config_schema import CLASS_WEIGHTS
from tftrain.errors import ConfigError

SHOWN_CLASSES = 20  # class names listed in an error, at most


def check_setting(setting, task_type: str = "auto") -> None:
    """Checks `train.class_weight` before any dataset is read: a word of CLASS_WEIGHTS or a
    mapping of class names or ids to positive numbers, on a task that has classes (`task_type`
    regression or language_model has none; auto is checked once the dataset says)."""
    if isinstance(setting, dict):
        if not setting:
            raise ConfigError("train.class_weight={} names no class: give {class name or id: "
                              "weight, ...}, or none or balanced")
        for key, weight in setting.items():
            if isinstance(key, bool) or not isinstance(key, (int, str)):
                raise ConfigError(f"train.class_weight: {key!r} is not a class name or id")
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not (
                    math.isfinite(weight) and weight > 0):
                raise ConfigError(
                    f"train.class_weight: the weight of class {key!r} is {weight!r}, not a "
                    f"positive number: give every class named a weight > 0, e.g. {{{key}: 2.0}}")
    elif setting not in CLASS_WEIGHTS:
        close = difflib.get_close_matches(str(setting), CLASS_WEIGHTS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"train.class_weight={setting!r} is not one of "
                          f"{', '.join(CLASS_WEIGHTS)} or a mapping {{class name or id: "
                          f"weight}}{hint}")
    if setting != "none" and task_type in ("regression", "language_model"):
        refuse(task_type)


def refuse(task_type: str, why: str = "") -> None:
    """The ConfigError of a class weight on a task without classes."""
    raise ConfigError(f"train.class_weight weights the classes of a classifier, and "
                      f"task.type={task_type}{why} has none: set train.class_weight=none (or "
                      "leave it out)")


def weights(setting, manifest: dict, data) -> tuple[float, ...] | None:
    """The weight of each class id 0..K-1 that `setting` gives on the dataset of `manifest`
    (its info's `num_classes` and `class_names`, its training split's `label_counts`; `data`
    is the run's DataConfig); None for `none`. ConfigError for a class the dataset does not
    have, or `balanced` without label counts."""
    if not isinstance(setting, dict) and setting == "none":
        return None
    info = manifest.get("info") or {}
    count = int(info.get("num_classes") or 0)
    where = f"dataset {data.dir}"
    if setting == "balanced":
        return balanced(_label_counts(manifest, data, where), count)
    names = [str(name) for name in info.get("class_names") or []]
    result = [1.0] * count
    named: dict[int, object] = {}
    for key, weight in setting.items():
        index = _class_id(key, names, count)
        if index is None:
            raise ConfigError(f"train.class_weight names class {key!r}, which {where} does not "
                              f"have: its classes are {_listing(names, count)}")
        if index in named:
            raise ConfigError(f"train.class_weight names class {index} twice ({named[index]!r} "
                              f"and {key!r}): give one weight per class")
        named[index] = key
        result[index] = float(weight)
    return tuple(result)


def balanced(label_counts: dict, num_classes: int) -> tuple[float, ...]:
    """scikit-learn's `balanced` weights of class ids 0..`num_classes`-1 from `label_counts`
    (class id, as a string or int -> examples): n_samples / (n_classes x count) over the classes
    that occur; 1.0 for a class that does not (no training example carries its weight)."""
    counts = [0] * num_classes
    for label, n in label_counts.items():
        if 0 <= int(label) < num_classes:
            counts[int(label)] += int(n)
    present = sum(1 for n in counts if n)
    total = sum(counts)
    return tuple(total / (present * n) if n else 1.0 for n in counts)


def for_config(config) -> tuple[float, ...] | None:
    """The class weights of a run's `config` (see `weights`), from its dataset's manifest;
    None for `train.class_weight=none` (then no manifest is read)."""
    setting = config.train.class_weight
    if not isinstance(setting, dict) and setting == "none":
        return None
    if config.data.format == "tfrecord":  # other tools' TFRecords: data.info stands in
        manifest = {"pipeline": config.data.pipeline, "info": dict(config.data.info)}
    else:
        from tftrain.data import manifest as manifest_lib  # imports TensorFlow: not at the top,
        # since config validation (which imports this module) runs before TensorFlow starts

        manifest = manifest_lib.read(config.data.dir)
    return weights(setting, manifest, config.data)


def named(class_weights, class_names) -> dict[str, float]:
    """`{class name (else id): weight}` of a weight vector, as summary.json records it."""
    names = list(class_names or [])
    return {str(names[i]) if i < len(names) else str(i): float(w)
            for i, w in enumerate(class_weights)}


def _label_counts(manifest: dict, data, where: str) -> dict:
    split = (manifest.get("splits") or {}).get(data.train_split) or {}
    counts = split.get("label_counts")
    if counts:
        return counts
    if data.format == "tfrecord":
        why = "TFRecords of other tools (data.format=tfrecord) have no manifest to count them in"
    else:
        why = (f"dataset.json records none for split {data.train_split!r} (its "
               "pipeline stores no integer class label, or more than 10,000 distinct ones)")
    raise ConfigError(f"train.class_weight=balanced needs the training split's label counts, "
                      f"and {where} has none: {why}; give the weights as a mapping instead, "
                      "train.class_weight={class name or id: weight}")


def _class_id(key, names: list[str], count: int) -> int | None:
    """The class id that `key` (a class name or id) stands for, or None."""
    if isinstance(key, str) and key in names:
        return names.index(key)
    if isinstance(key, str) and key.isdigit():
        key = int(key)
    if isinstance(key, int) and 0 <= key < count:
        return key
    return None


def _listing(names: list[str], count: int) -> str:
    if not names:
        return f"the ids 0..{count - 1}"
    shown = ", ".join(names[:SHOWN_CLASSES])
    more = f", ... ({len(names)} in all)" if len(names) > SHOWN_CLASSES else ""
    return f"{shown}{more} (or their ids 0..{count - 1})"
