"""Evaluate a trained model (a SavedModel directory or a .tflite file) on a dataset split.

Prints the metrics of the model's task (accuracy, loss and macro-F1 for a classifier, with a
table of each class's precision, recall, F1 and support; loss, MSE, RMSE, MAE and R² for
regression: the task of its run's params.yaml, else the one the dataset's label implies) and
writes them as JSON (--output, default <model>/../eval_<split>.json; a classifier's confusion
matrix also as a PNG beside it, <output without .json>_confusion.png), with the
number of examples measured (num_examples) and the bound (steps: --steps=N evaluates at most the
first N batches of the split; 0, the default, the whole split) in batches of --batch_size
(default: the batch size its run trained with, from params.yaml; else 256).
Example: tftrain evaluate --model=runs/demo/export --data=data/digits --split=test
Without --data, a run's model (RUN/export, RUN/pruned, RUN/quantized/*.tflite) is evaluated on
its run's data, read as training read it (the whole data section of its params.yaml: other
tools' TFRecords included), on the run's test split unless --split says otherwise.
TFRecords written by other tools (no dataset.json): add --pipeline=NAME, the pipeline whose
schema they follow (--data is then a directory of <split>-* files or a glob with {split}).
"""
import os

from absl import flags

from tftrain import quiet_start
from tftrain.cli.common import parse_pipeline_options, require, use_flags
from tftrain.errors import ConfigError
from tftrain.optimize import bounds

FLAGS = flags.FLAGS
use_flags(__name__, "data", "split", "output", "pipeline", "pipeline_options",
          "allow_python_in_model", "steps", "model", "batch_size")


def main(argv):
    require("model")
    if "://" not in FLAGS.model and not os.path.exists(FLAGS.model):  # before TensorFlow starts
        raise ConfigError(f"--model={FLAGS.model}: no such file or directory; pass a "
                          "SavedModel directory (e.g. RUN/export) or a .tflite file")
    quiet_start.import_tensorflow()
    from tftrain.optimize import evaluate

    metrics = evaluate.evaluate(FLAGS.model, FLAGS.data, FLAGS.split, FLAGS.batch_size,
                                output=FLAGS.output, pipeline=FLAGS.pipeline,
                                pipeline_options=parse_pipeline_options(FLAGS.pipeline_options),
                                allow_python=FLAGS.allow_python_in_model,
                                steps=FLAGS.steps or 0)
    print(f"{metrics['split']} split: "
          + " ".join(f"{k}={v:.4f}" for k, v in metrics.items() if isinstance(v, float)))
    print(bounds.describe(metrics["num_examples"], metrics["steps"]))
    if "per_class" in metrics:  # a classifier: precision, recall, F1 and support per class
        from tftrain.tasks import class_measures

        print(class_measures.table(metrics))
    return 0
