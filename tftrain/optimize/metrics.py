"""Classification accuracy: the one measure every optimized model is compared on."""
from __future__ import annotations

import numpy as np


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


def keras_accuracy(model, dataset) -> float:
    """Accuracy of a Keras classifier over a dataset of `(inputs, label)` batches."""
    correct = total = 0
    for inputs, labels in dataset:
        outputs = model(inputs, training=False)
        correct += count_correct(outputs, labels)
        total += int(np.asarray(labels).reshape(-1).shape[0])
    if not total:
        raise ValueError("the evaluation dataset is empty")
    return correct / total
