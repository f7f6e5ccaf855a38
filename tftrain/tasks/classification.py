"""Classification: class logits, sparse categorical cross-entropy, accuracy.

Labels are integer class ids in `0..num_classes-1` (the manifest's `info["num_classes"]`, or
`data.info` for TFRecords other tools wrote). Prune and quantize gate on the accuracy drop
(`--max_accuracy_drop`, absolute: 0.01 is one point).
"""
from __future__ import annotations

import numpy as np

from tftrain.tasks.base import Task, as_rows
from tftrain.tasks.class_measures import MAX_CLASSES, ConfusionMatrix


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


def cross_entropy(logits, labels) -> float:
    """The mean sparse categorical cross-entropy of `logits` [examples, classes] (float64)."""
    logits = as_rows(logits, "outputs")
    labels = np.asarray(labels).reshape(-1).astype(np.int64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probabilities = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return float(-log_probabilities[np.arange(len(labels)), labels].mean())


class ClassificationTask(Task):
    """`num_classes` logits per example (see the module docstring)."""

    name = "classification"
    losses = ("crossentropy",)
    default_monitor = "val_accuracy"
    directions = {"loss": "min", "accuracy": "max"}
    reported = ("loss", "accuracy")
    measure = "accuracy"
    change_name = "accuracy_drop"
    gate_flag = "--max_accuracy_drop"

    def __init__(self, info: dict, loss: str = "auto", num_classes: int = 0,
                 class_weights: tuple[float, ...] | None = None):
        super().__init__(info, loss)
        self.num_classes = num_classes
        self.class_weights = class_weights  # train.class_weight per class id (tasks.class_weights)

    def outputs(self):
        from tftrain.models.outputs import OutputSpec

        return OutputSpec(size=self.num_classes, kind="logits")

    def loss(self, model=None):
        """Sparse categorical cross-entropy of logits; of probabilities when `model` (one not
        trained by tftrain) ends in a softmax or sigmoid."""
        import tf_keras as keras

        activation = ""
        if model is not None:
            last = model.layers[-1]
            activation = getattr(getattr(last, "activation", None), "__name__", "")
            if isinstance(last, keras.layers.Softmax):
                activation = "softmax"
        return keras.losses.SparseCategoricalCrossentropy(
            from_logits=activation not in ("softmax", "sigmoid"))

    def metrics(self) -> list:
        return ["accuracy"]

    def confusion(self):
        if self.num_classes > MAX_CLASSES:
            return None
        return ConfusionMatrix(self.num_classes, predicted_classes)

    def evaluate(self, outputs, labels) -> dict[str, float]:
        outputs = np.asarray(outputs)
        result = {"loss": cross_entropy(outputs, labels)} if outputs.reshape(
            len(outputs), -1).shape[-1] > 1 else {}
        result["accuracy"] = count_correct(outputs, labels) / len(np.asarray(labels).reshape(-1))
        return result
