"""The per-class measures of a trained classifier on the test split, and `confusion.png`.

`train` calls `measure` after its test evaluation: one more pass over the test split (its
first `train.test_steps` batches when bounded), prediction only, with the model that is
exported, read in the split's fixed order as `tftrain evaluate` reads it. Each worker of a
multi-worker run makes it (they report the same test metrics; only the chief draws). Keras's
`evaluate` gives scalars per metric, so the confusion matrix is counted in this second pass,
not in the first; its cost is one inference of the split.
"""
from __future__ import annotations

import posixpath

import tensorflow as tf
import tf_keras as keras

from tftrain import config as config_lib
from tftrain import run_dir
from tftrain.data import foreign, reader
from tftrain.fileio import join, write_atomic
from tftrain.tasks import class_measures


def measure(model: keras.Model, task, config: config_lib.Config, model_dir: str,
            chief: bool = True) -> dict:
    """`per_class`, `macro_f1` and `confusion_matrix` of `model` on `data.test_split` (see
    `tftrain.tasks.class_measures`), with `confusion.png` written into `model_dir` by the
    `chief`; {} for a task without classes."""
    matrix = task.confusion()
    if matrix is None:
        return {}
    data = config.data
    dataset = reader.load(data.dir, data.test_split, data.batch_size, training=False,
                          **foreign.load_kwargs(data))
    if config.train.test_steps:
        dataset = dataset.take(config.train.test_steps)
    predict = tf.function(lambda inputs: model(inputs, training=False))
    for inputs, labels in dataset:
        matrix.add(predict(inputs).numpy(), labels.numpy())
    measures = matrix.measures(task.class_names())
    if measures and chief:
        title = f"{posixpath.basename(model_dir.rstrip('/'))}, split {data.test_split}"
        write_atomic(join(model_dir, run_dir.CONFUSION_PNG),
                     class_measures.render_png(measures, title))
    return measures
