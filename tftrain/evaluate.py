"""Evaluate an exported model on a dataset split."""
from __future__ import annotations

import os

import tensorflow as tf
import tf_keras as keras

from tftrain import data as data_lib
from tftrain import export
from tftrain.errors import DataError, TftrainError
from tftrain.fileio import join, write_json


def load_saved_model(path: str):
    """Loads the tf_keras SavedModel that `path` stands for: a SavedModel directory, or a run's
    export/ (its highest version, `export.saved_model_dir`); anything else is a clear error."""
    found = export.saved_model_dir(path)
    if found is None:
        raise TftrainError(f"{path} is not a SavedModel directory (no saved_model.pb, and no "
                           "version directory holding one); pass a run's export/ directory or a "
                           ".tflite file")
    return keras.models.load_model(found, compile=False)


def evaluate(model_path: str, data_dir: str, split: str, batch_size: int = 256,
             output: str | None = None, pipeline: str | None = None,
             pipeline_options: dict | None = None) -> dict:
    """Evaluates a SavedModel (or .tflite file) on `split`; writes and returns the metrics.

    `pipeline`: `data_dir` holds TFRecords another tool wrote, read with that pipeline's schema
    (see `tftrain.data.load`).
    """
    dataset = data_lib.load(data_dir, split, batch_size, training=False, pipeline=pipeline,
                            pipeline_options=pipeline_options)
    if model_path.endswith(".tflite"):
        from tftrain.optimize.tflite_eval import evaluate_tflite

        metrics = evaluate_tflite(model_path, dataset)
    else:
        model = load_saved_model(model_path)
        check_inputs_fit(model, dataset.element_spec[0], f"{data_dir} (split {split!r})")
        model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        metrics = {k: float(v) for k, v in model.evaluate(dataset, return_dict=True, verbose=0).items()}
    result = {"model": model_path, "data": data_dir, "split": split, **metrics}
    output = output or join(os.path.dirname(_export_dir(model_path)) or ".", f"eval_{split}.json")
    write_json(output, result)
    return metrics


def _export_dir(model_path: str) -> str:
    """`model_path` without a trailing version directory (RUN/export/1712345678 -> RUN/export):
    the default output goes next to export/, never into it."""
    head, name = os.path.split(model_path.rstrip("/"))
    return head if name.isdigit() and head else model_path.rstrip("/")


def check_inputs_fit(model: keras.Model, input_spec, where: str) -> None:
    """Raises DataError unless the dataset's inputs (`input_spec`) fit the model's inputs."""
    shapes = model.input_shape if isinstance(model.input_shape, list) else [model.input_shape]
    wanted = [tf.TensorShape(shape) for shape in shapes]
    given = [spec.shape for spec in tf.nest.flatten(input_spec)]
    if len(wanted) != len(given) or not all(w.is_compatible_with(g) for w, g in zip(wanted, given)):
        raise DataError(
            f"the model takes inputs of shape {_shapes(wanted)}, but {where} yields "
            f"{_shapes(given)}: evaluate it on data of the kind it was trained on (its run's "
            "params.yaml names data.dir).")


def _shapes(shapes) -> str:
    return ", ".join(str(tuple(shape.as_list())) for shape in shapes)
