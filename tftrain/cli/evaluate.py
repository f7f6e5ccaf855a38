"""Evaluate a trained model (a SavedModel directory or a .tflite file) on a dataset split.

Prints the metrics of the model's task (accuracy and loss for a classifier; loss, MSE, RMSE, MAE
and R² for regression: the task of its run's params.yaml, else the one the dataset's label
implies) and writes them as JSON (--output, default <model>/../eval_<split>.json), with the
number of examples measured (num_examples) and the bound (steps: --steps=N evaluates at most the
first N batches of the split; 0, the default, the whole split) in batches of --batch_size
(default: the batch size its run trained with, from params.yaml; else 256).
Example: tftrain evaluate --model=runs/demo/export --data=data/digits --split=test
TFRecords written by other tools (no dataset.json): add --pipeline=NAME, the pipeline whose
schema they follow (--data is then a directory of <split>-* files or a glob with {split}).
"""
from absl import flags

from tftrain import quiet_start
from tftrain.cli.common import parse_pipeline_options, require, use_flags
from tftrain.optimize import bounds

FLAGS = flags.FLAGS
use_flags(__name__, "data", "split", "output", "pipeline", "pipeline_options",
          "allow_python_in_model", "steps", "model", "batch_size")


def main(argv):
    require("model", "data")
    quiet_start.import_tensorflow()
    from tftrain.optimize import evaluate

    metrics = evaluate.evaluate(FLAGS.model, FLAGS.data, FLAGS.split, FLAGS.batch_size,
                                output=FLAGS.output, pipeline=FLAGS.pipeline,
                                pipeline_options=parse_pipeline_options(FLAGS.pipeline_options),
                                allow_python=FLAGS.allow_python_in_model,
                                steps=FLAGS.steps or 0)
    print(" ".join(f"{k}={v:.4f}" for k, v in metrics.items() if isinstance(v, float)))
    print(bounds.describe(metrics["num_examples"], metrics["steps"]))
    return 0
