"""The task's measure of a Keras model over a dataset: what every optimized model is compared on.

The numbers themselves come from the task (`Task.evaluate`, pure numpy), so a SavedModel and a
.tflite file of the same model are scored by the same code. `predicted_classes` and
`count_correct` are the classification task's.
"""
from __future__ import annotations

import numpy as np

from tftrain.tasks.classification import count_correct, predicted_classes  # noqa: F401


def predictions(model, dataset, confusion=None) -> tuple[np.ndarray, np.ndarray]:
    """`(outputs, labels)` of a Keras model over a dataset of `(inputs, label)` batches, in
    inference mode, one row per example; each batch is also added to `confusion` (a
    `tasks.class_measures.ConfusionMatrix`) when given."""
    outputs, labels = [], []
    for inputs, batch_labels in dataset:
        outputs.append(np.asarray(model(inputs, training=False)))
        labels.append(np.asarray(batch_labels))
        if confusion is not None:
            confusion.add(outputs[-1], labels[-1])
    if not outputs:
        raise ValueError("the evaluation dataset is empty")
    return np.concatenate(outputs), np.concatenate(labels)


def keras_measure(model, dataset, task, confusion=None) -> tuple[dict[str, float], int]:
    """The task's metrics (`Task.evaluate`) of a Keras model over a dataset, and the number of
    examples they were measured on: the rows of the batches consumed (a short last batch
    counts what it holds). `confusion`: see `predictions`."""
    outputs, labels = predictions(model, dataset, confusion)
    return task.evaluate(outputs, labels), int(len(labels))


def keras_accuracy(model, dataset) -> float:
    """Accuracy of a Keras classifier over a dataset of `(inputs, label)` batches."""
    outputs, labels = predictions(model, dataset)
    return count_correct(outputs, labels) / len(labels.reshape(-1))
