"""Evaluate an exported model on a dataset split."""
from __future__ import annotations

import os

import tensorflow as tf
import tf_keras as keras

from tftrain import data as data_lib
from tftrain.errors import TftrainError
from tftrain.fileio import join, write_json


def load_saved_model(path: str):
    """Loads a tf_keras SavedModel; a missing or foreign directory is a clear error."""
    if not tf.io.gfile.exists(join(path, "saved_model.pb")):
        raise TftrainError(f"{path} is not a SavedModel directory (no saved_model.pb); pass a run's "
                           "export/ directory or a .tflite file")
    return keras.models.load_model(path, compile=False)


def evaluate(model_path: str, data_dir: str, split: str, batch_size: int = 256,
             output: str | None = None) -> dict:
    """Evaluates a SavedModel (or .tflite file) on `split`; writes and returns the metrics."""
    dataset = data_lib.load(data_dir, split, batch_size, training=False)
    if model_path.endswith(".tflite"):
        from tftrain.optimize.tflite_eval import evaluate_tflite

        metrics = evaluate_tflite(model_path, dataset)
    else:
        model = load_saved_model(model_path)
        model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        metrics = {k: float(v) for k, v in model.evaluate(dataset, return_dict=True, verbose=0).items()}
    result = {"model": model_path, "data": data_dir, "split": split, **metrics}
    output = output or join(os.path.dirname(model_path.rstrip("/")) or ".", f"eval_{split}.json")
    write_json(output, result)
    return metrics
