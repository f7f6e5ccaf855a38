"""The run directory (`--model_dir`): its layout, creation, and small atomic writes.

    params.yaml    the resolved config          summary.json   results of the finished run
    checkpoints/   best weights by a metric     backup/        state for automatic resume
    logs/train, logs/validation  TensorBoard    export/        the SavedModel
    pruned/, quantized/  written by `tftrain prune` and `tftrain quantize`
"""
from __future__ import annotations

import datetime
import os

import tensorflow as tf
from absl import logging

from tftrain.errors import TftrainError
from tftrain.fileio import join, remove, write_json

PARAMS = "params.yaml"
SUMMARY = "summary.json"
CHECKPOINTS = "checkpoints"
BACKUP = "backup"
LOGS = "logs"
EXPORT = "export"
PRUNED = "pruned"
QUANTIZED = "quantized"


def new_run_dir(config_name: str, root: str = "runs") -> str:
    """A fresh run directory name under `root`, e.g. runs/digits-20261130-101500."""
    stem = os.path.splitext(os.path.basename(config_name))[0] or "run"
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path, n = join(root, f"{stem}-{stamp}"), 1
    while os.path.exists(path):
        n += 1
        path = join(root, f"{stem}-{stamp}-{n}")
    return path


def prepare(model_dir: str, overwrite: bool, params_yaml: str | None = None) -> None:
    """Creates `model_dir`; refuses to retrain a finished run unless `overwrite`.

    An unfinished run (no summary.json) is left as it is, so training resumes from its backup;
    when `params_yaml` differs from the params.yaml it was started with, a warning says so.
    """
    if tf.io.gfile.exists(join(model_dir, SUMMARY)):
        if not overwrite:
            raise TftrainError(
                f"{model_dir} holds a finished run ({SUMMARY} exists); nothing to do. Pass "
                "--overwrite to train it again from scratch, or choose another --model_dir")
        for name in (SUMMARY, CHECKPOINTS, BACKUP, LOGS, EXPORT, PRUNED, QUANTIZED, PARAMS):
            remove(join(model_dir, name))
    elif params_yaml is not None and all(tf.io.gfile.exists(join(model_dir, name)) for name in (BACKUP, PARAMS)):
        with tf.io.gfile.GFile(join(model_dir, PARAMS)) as f:
            if f.read() != params_yaml:
                logging.warning("%s holds an unfinished run started with another config (%s); "
                                "resuming it with the new one", model_dir, PARAMS)
    tf.io.gfile.makedirs(model_dir)


def finish(model_dir: str, summary: dict) -> None:
    """Writes summary.json, which marks the run finished, then deletes its backup."""
    write_json(join(model_dir, SUMMARY), summary)
    remove(join(model_dir, BACKUP))
