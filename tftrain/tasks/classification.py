"""Classification: class logits, categorical cross-entropy, accuracy (and top-5 accuracy).

Labels are integer class ids in `0..num_classes-1` (the manifest's `info["num_classes"]`, or
`data.info` for TFRecords other tools wrote); a mixed training batch (`data.augment`'s
mixup/cutmix) brings soft targets instead, which the loss and the accuracy take too
(`soft_targets`). `task.label_smoothing` smooths the targets in the loss only. A classifier of
at least `TOP5_MIN_CLASSES` classes also reports `top5_accuracy` (in the Keras logs, summary.json,
`tftrain evaluate`). Prune and quantize gate on the accuracy drop (`--max_accuracy_drop`,
absolute: 0.01 is one point).
"""
from __future__ import annotations

import numpy as np

from tftrain.tasks import soft_targets
from tftrain.tasks.base import Task, as_rows
from tftrain.tasks.class_measures import MAX_CLASSES, ConfusionMatrix

TOP5 = "top5_accuracy"  # the metric's name, as Keras logs it and evaluate reports it
TOP5_MIN_CLASSES = 10  # fewer classes: no top-5 accuracy (it would be 1 or near it)


def predicted_classes(outputs) -> np.ndarray:
    """Class ids from a batch of scores: argmax over classes, or `> 0.5` for one sigmoid unit."""
    outputs = np.asarray(outputs)
    if outputs.ndim == 1 or outputs.shape[-1] == 1:
        return (outputs.reshape(len(outputs)) > 0.5).astype(np.int64)
    return outputs.reshape(len(outputs), -1).argmax(axis=-1)


def count_correct(outputs, labels) -> int:
    """How many rows of `outputs` predict their integer `labels`."""
    labels = np.asarray(labels).reshape(-1).astype(np.int64)
    return int((predicted_classes(outputs) == labels).sum())


def count_top_k(outputs, labels, k: int) -> int:
    """How many rows of `outputs` [examples, classes] have their integer label among their `k`
    highest scores: fewer than `k` scores above the label's (ties count for it, as in
    `tf.math.in_top_k`; a quantized model's scores tie often)."""
    outputs = np.asarray(outputs).reshape(len(outputs), -1)
    labels = np.asarray(labels).reshape(-1).astype(np.int64)
    own = outputs[np.arange(len(labels)), labels]
    above = (outputs > own[:, None]).sum(axis=1)
    return int(((above < k) & np.isfinite(own)).sum())


def cross_entropies(logits, labels, label_smoothing: float = 0.0) -> np.ndarray:
    """Each row's categorical cross-entropy of `logits` [examples, classes] against its integer
    label, with the target smoothed to `y * (1 - eps) + eps / classes` (float64)."""
    logits = np.asarray(logits, np.float64)
    labels = np.asarray(labels).reshape(-1).astype(np.int64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probabilities = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    nats = -log_probabilities[np.arange(len(labels)), labels]
    if not label_smoothing:
        return nats
    return (1 - label_smoothing) * nats - label_smoothing * log_probabilities.mean(axis=1)


def cross_entropy(logits, labels, label_smoothing: float = 0.0) -> float:
    """The mean of `cross_entropies` (the task's loss) over the rows of `logits`."""
    return float(cross_entropies(as_rows(logits, "outputs"), labels, label_smoothing).mean())


class ClassificationTask(Task):
    """`num_classes` logits per example (see the module docstring)."""

    name = "classification"
    losses = ("crossentropy",)
    default_monitor = "val_accuracy"
    directions = {"loss": "min", "accuracy": "max"}
    reported = ("loss", "accuracy", TOP5)
    measure = "accuracy"
    change_name = "accuracy_drop"
    gate_flag = "--max_accuracy_drop"

    def __init__(self, info: dict, loss: str = "auto", num_classes: int = 0,
                 class_weights: tuple[float, ...] | None = None, label_smoothing: float = 0.0):
        super().__init__(info, loss)
        self.num_classes = num_classes
        self.class_weights = class_weights  # train.class_weight per class id (tasks.class_weights)
        self.label_smoothing = label_smoothing

    def outputs(self):
        from tftrain.models.outputs import OutputSpec

        return OutputSpec(size=self.num_classes, kind="logits")

    def loss(self, model=None):
        """Categorical cross-entropy of logits against class ids or soft targets, smoothed by
        `task.label_smoothing` (`soft_targets.keras_classes`); of probabilities when `model`
        (one not trained by tftrain) ends in a softmax or sigmoid."""
        import tf_keras as keras

        activation = ""
        if model is not None:
            last = model.layers[-1]
            activation = getattr(getattr(last, "activation", None), "__name__", "")
            if isinstance(last, keras.layers.Softmax):
                activation = "softmax"
        return soft_targets.keras_classes()["loss"](
            from_logits=activation not in ("softmax", "sigmoid"),
            label_smoothing=self.label_smoothing)

    def metrics(self) -> list:
        accuracy = soft_targets.keras_classes()["accuracy"]
        top5 = [accuracy(k=5, name=TOP5)] if self.num_classes >= TOP5_MIN_CLASSES else []
        return [accuracy(name="accuracy")] + top5

    def confusion(self):
        if self.num_classes > MAX_CLASSES:
            return None
        return ConfusionMatrix(self.num_classes, predicted_classes)

    def evaluate(self, outputs, labels) -> dict[str, float]:
        outputs = np.asarray(outputs)
        classes = outputs.reshape(len(outputs), -1).shape[-1]
        count = len(np.asarray(labels).reshape(-1))
        result = {"loss": cross_entropy(outputs, labels, self.label_smoothing)} if (
            classes > 1) else {}
        result["accuracy"] = count_correct(outputs, labels) / count
        if classes >= TOP5_MIN_CLASSES:
            result[TOP5] = count_top_k(outputs, labels, 5) / count
        return result
