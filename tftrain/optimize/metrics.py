"""The task's measure of a Keras model over a dataset: what every optimized model is compared on.

The numbers themselves come from the task (`Task.evaluate`, pure numpy), so a SavedModel and a
.tflite file of the same model are scored by the same code. `predicted_classes` and
`count_correct` are the classification task's.
"""
from __future__ import annotations

import numpy as np

from tftrain.tasks.classification import count_correct, predicted_classes  # noqa: F401


def predictions(model, dataset) -> tuple[np.ndarray, np.ndarray]:
    """`(outputs, labels)` of a Keras model over a dataset of `(inputs, label)` batches, in
    inference mode, one row per example."""
    outputs, labels = [], []
    for inputs, batch_labels in dataset:
        outputs.append(np.asarray(model(inputs, training=False)))
        labels.append(np.asarray(batch_labels))
    if not outputs:
        raise ValueError("the evaluation dataset is empty")
    return np.concatenate(outputs), np.concatenate(labels)


def keras_metrics(model, dataset, task) -> dict[str, float]:
    """The task's metrics (`Task.evaluate`) of a Keras model over a dataset."""
    return task.evaluate(*predictions(model, dataset))


def keras_accuracy(model, dataset) -> float:
    """Accuracy of a Keras classifier over a dataset of `(inputs, label)` batches."""
    outputs, labels = predictions(model, dataset)
    return count_correct(outputs, labels) / len(labels.reshape(-1))
