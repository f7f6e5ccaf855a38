"""Evaluate an exported model on a dataset split, with the metrics of the model's task.

The task is the one the model was trained for: the `task` section of its run's params.yaml when
the model lies in a run directory (`RUN/export/<version>`, `RUN/pruned`, `RUN/quantized/*.tflite`;
a run without one trained a classifier), else what the dataset's label says (`task.type=auto`).
A SavedModel and a .tflite file are scored by the same function (`Task.evaluate`).
"""
from __future__ import annotations

import dataclasses
import os

import tensorflow as tf
import tf_keras as keras

from tftrain import config as config_lib
from tftrain import data as data_lib
from tftrain import run_dir, tasks
from tftrain.engine import export, model_code, run_config
from tftrain.data import manifest as manifest_lib
from tftrain.errors import ConfigError, DataError, TftrainError
from tftrain.fileio import join, read_bytes, read_json, write_atomic, write_json
from tftrain.optimize import bounds
from tftrain.optimize import metrics as metrics_lib
from tftrain.tasks import class_measures
from tftrain.tasks import r2_metric  # noqa: F401  (registers R2: regression SavedModels load)

WRITTEN_BY = "tftrain evaluate"  # in every metrics file it writes: what it may replace


def load_saved_model(path: str, allow_python: bool = False):
    """Loads the tf_keras SavedModel that `path` stands for: a SavedModel directory, or a run's
    export/ (its highest version, `export.saved_model_dir`); anything else is a clear error, and
    so is a model carrying Python code unless `allow_python` (`model_code.refuse_python`)."""
    found = export.saved_model_dir(path)
    if found is None:
        raise TftrainError(f"{path} is not a SavedModel directory (no saved_model.pb, and no "
                           "version directory holding one); pass a run's export/ directory or a "
                           ".tflite file")
    model_code.refuse_python(found, allow_python)
    export.register_text_ops()
    try:
        return export.load_keras_model(found)
    except Exception as e:  # noqa: BLE001  (a damaged file: tf-keras and protobuf raise many kinds)
        raise TftrainError(f"cannot load the SavedModel at {found}: {type(e).__name__}: "
                           f"{(str(e).splitlines() or [''])[0][:300]}") from None


DEFAULT_BATCH_SIZE = 256  # a model from outside a run
DEFAULT_SPLIT = "test"  # of a dataset given by --data


def evaluate(model_path: str, data_dir: str | None = None, split: str | None = None,
             batch_size: int | None = None, output: str | None = None,
             pipeline: str | None = None, pipeline_options: dict | None = None,
             allow_python: bool = False, steps: int = 0) -> dict:
    """Evaluates a SavedModel (or .tflite file) on `split` with its task's metrics (see the
    module docstring); writes and returns them, with `split`, `num_examples` (the examples
    measured, counted) and `steps` (the bound: at most that many batches of the split; 0, the
    whole split; see `tftrain.optimize.bounds`).

    `data_dir` None: the model's run's data, read as the run read it (its params.yaml's whole
    `data` section, `engine.run_config.RunData`), and `split` None its test split. Else
    `split` None is `test`, and `pipeline`: `data_dir` holds TFRecords another tool wrote, read
    with that pipeline's schema (see `tftrain.data.load`). `allow_python`: load a SavedModel even
    if it carries Python code. `batch_size` None: the run's `data.batch_size`
    (`check_batch_size`).
    """
    steps = bounds.check_steps(steps)
    run = run_config.run_of(model_path)
    params = config_lib.read_yaml(join(run, run_dir.PARAMS)) if run else None
    batch_size = check_batch_size(batch_size, params)
    config = run_data = None
    if data_dir is None:  # the run's own data, as it read it
        if run is None:
            raise ConfigError(f"--data is missing, and {model_path} lies in no run directory "
                              f"(no {run_dir.PARAMS} beside its export/, pruned/ or quantized/) "
                              "whose data it could be evaluated on: pass --data=DIR")
        config = run_config.read(run)
        run_data, data_dir = run_config.RunData(config.data), config.data.dir
    split = run_data.split(split) if run_data else split or DEFAULT_SPLIT
    output = output or join(os.path.dirname(_export_dir(model_path)) or ".", f"eval_{split}.json")
    check_output_replaceable(output)  # before the work: a user's own file there is kept
    if run_data:
        task = run_config.run_task(config)
        dataset = run_data.load(split, batch_size)
    else:
        task = task_of(params, data_dir, pipeline)
        dataset = data_lib.load(data_dir, split, batch_size, training=False, pipeline=pipeline,
                                pipeline_options=pipeline_options)
    dataset = bounds.bounded(dataset, steps)
    confusion = task.confusion()  # a classifier's per-class counts, batch by batch
    if confusion is not None:
        check_picture_replaceable(confusion_png(output))
    if model_path.endswith(".tflite"):
        from tftrain.optimize.tflite_eval import evaluate_tflite

        metrics = evaluate_tflite(model_path, dataset, task=task, confusion=confusion)
        num_examples = metrics["num_examples"]
    else:
        model = load_saved_model(model_path, allow_python)
        check_inputs_fit(model, dataset.element_spec[0], f"{data_dir} (split {split!r})")
        metrics, num_examples = metrics_lib.keras_measure(model, dataset, task, confusion)
    measures = confusion.measures(task.class_names()) if confusion is not None else {}
    metrics = {**metrics, **measures, "split": split, "num_examples": num_examples,
               "steps": steps, "batch_size": batch_size}
    result = {"model": model_path, "data": data_dir, "task": task.name,
              "written_by": WRITTEN_BY, **metrics}
    write_json(output, result)
    if measures:
        write_atomic(confusion_png(output), class_measures.render_png(
            metrics, f"{os.path.basename(model_path.rstrip('/'))}, split {split}"))
    return metrics


def confusion_png(output: str) -> str:
    """Where the confusion matrix of the metrics file `output` goes: beside it, named after it
    (`eval_test.json` -> `eval_test_confusion.png`)."""
    return (output[:-len(".json")] if output.endswith(".json") else output) + "_confusion.png"


def check_picture_replaceable(path: str) -> None:
    """Raises unless `path` is absent or a confusion matrix that tftrain drew."""
    if tf.io.gfile.exists(path) and not class_measures.written_here(read_bytes(path)):
        raise TftrainError(f"{path} exists and was not drawn by tftrain, which does not "
                           "replace what it did not write; pass --output=PATH (the picture "
                           "goes beside it), or move that file away.")


def check_output_replaceable(output: str) -> None:
    """Raises unless `output` is absent or a metrics file that `evaluate` wrote (it carries
    `written_by`; an earlier version's has its model, data, split and task keys)."""
    if not tf.io.gfile.exists(output):
        return
    try:
        earlier = read_json(output)
    except (ValueError, UnicodeDecodeError, tf.errors.OpError):
        earlier = None
    ours = isinstance(earlier, dict) and (earlier.get("written_by") == WRITTEN_BY
                                          or {"model", "data", "split", "task"} <= set(earlier))
    if not ours:
        raise TftrainError(f"{output} exists and was not written by tftrain evaluate, which "
                           "does not replace what it did not write; pass --output=PATH, or move "
                           "that file away.")


def task_of(params: dict | None, data_dir: str, pipeline: str | None = None):
    """The task that scores a model on `data_dir` (see the module docstring): `params`, its
    run's params.yaml, else the one the dataset's label implies."""
    config = config_lib.Config()
    config.data.dir = data_dir
    if params is not None:
        values = params.get("task") or {"type": "classification"}
        config.task = dataclasses.replace(
            config.task, **{key: str(values[key]) for key in ("type", "loss") if key in values})
        config_lib.check_task(config)
    if manifest_lib.exists(data_dir):
        manifest = manifest_lib.read(data_dir)
    else:  # TFRecords of another tool: its pipeline's schema, no recorded label statistics
        config.data.format = "tfrecord"
        manifest = {"pipeline": pipeline, "info": {}}
    return tasks.from_config(config, manifest, training=False)


def check_batch_size(batch_size: int | None, params: dict | None) -> int:
    """`batch_size`, or when None the batch size the run trained with (its params.yaml's
    data.batch_size: what its devices held, so a bounded evaluation of a large model fits as
    its steps did), or DEFAULT_BATCH_SIZE for a model from outside a run; raises ConfigError
    when it is not positive."""
    if batch_size is None:
        batch_size = ((params or {}).get("data") or {}).get("batch_size") or DEFAULT_BATCH_SIZE
    if int(batch_size) < 1:
        raise ConfigError(f"--batch_size={batch_size} must be >= 1: the examples per "
                          "evaluation step (leave it out for the run's data.batch_size)")
    return int(batch_size)


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
