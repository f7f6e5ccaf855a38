"""Prune a trained model: fine-tune a clone with magnitude pruning, measured against the float.

Runs under the run's own strategy, data and optimizer (its params.yaml); writes RUN/pruned/ (a
SavedModel, float.tflite and model.tflite) and RUN/pruned/report.json (per-layer and overall
sparsity, parameter counts, gzip sizes and the task's measure before/after on the evaluation
split: accuracy, or RMSE for regression; --steps=N: on its first N batches only, the same for
every model, with the examples counted), then prints the comparison table. Exits non-zero if a
pruned layer misses the target sparsity, or a regression model's RMSE grew by more than
--max_metric_change.
Example: tftrain prune --model_dir=runs/demo --target_sparsity=0.8
"""
from absl import flags

from tftrain import quiet_start
from tftrain.cli.common import require, use_flags
from tftrain.optimize import bounds

FLAGS = flags.FLAGS
use_flags(__name__, "model_dir", "strategy", "split", "max_metric_change",
          "allow_python_in_model", "steps")
flags.DEFINE_float("target_sparsity", 0.8, "Fraction of each pruned kernel set to zero, in (0, 1).")
flags.DEFINE_string("sparsity_m_by_n", "", "Structured sparsity instead of a fraction: M:N keeps "
                    "at most N-M non-zeros in every N consecutive input-channel weights, e.g. 2:4.")
flags.DEFINE_integer("epochs", None, "Fine-tuning epochs (mask updates are spread over them); "
                     "default: enough for the data, at least 2 epochs and 1200 steps.",
                     lower_bound=1)
flags.DEFINE_enum("pruning_schedule", "polynomial", ["polynomial", "constant"],
                  "Sparsity ramp: polynomial (0 -> target over 2/3 of the steps) or constant.")
flags.DEFINE_integer("min_weights_to_prune", 2048, "Layers whose kernels hold fewer weights stay "
                     "dense (typically the first convolution and the classifier: little of the "
                     "size, much of the accuracy); 0 prunes every layer.", lower_bound=0)
flags.DEFINE_float("learning_rate", None, "Fine-tuning learning rate at the start, decaying to "
                   "0 (cosine); default: a quarter of the run's train.learning_rate. The run's "
                   "optimizer.")
flags.DEFINE_float("distill_weight", 0.5, "Share of the fine-tuning loss that asks a classifier "
                   "to match the float model's class scores (self-distillation: the pruned model "
                   "keeps the float model's decisions); 0 fine-tunes on the labels alone.",
                   lower_bound=0.0, upper_bound=1.0)
flags.DEFINE_float("distill_temperature", 2.0, "Temperature of the distilled class scores (above "
                   "1 softens them).", lower_bound=1e-3)


def main(argv):
    require("model_dir")
    quiet_start.import_tensorflow()  # only after the flags are valid
    from tftrain.optimize import prune, runs

    prune.check_target_sparsity(FLAGS.target_sparsity)
    prune.parse_m_by_n(FLAGS.sparsity_m_by_n)
    summary = runs.prune_run(
        FLAGS.model_dir, target_sparsity=FLAGS.target_sparsity, m_by_n=FLAGS.sparsity_m_by_n,
        epochs=FLAGS.epochs, schedule=FLAGS.pruning_schedule, learning_rate=FLAGS.learning_rate,
        min_weights=FLAGS.min_weights_to_prune, distill_weight=FLAGS.distill_weight,
        temperature=FLAGS.distill_temperature, split=FLAGS.split, strategy_name=FLAGS.strategy,
        max_metric_change=FLAGS.max_metric_change,
        allow_python=FLAGS.allow_python_in_model, eval_steps=FLAGS.steps or 0)
    from tftrain.optimize import report

    measure = summary["measure"]
    print(f"sparsity {summary['sparsity']:.1%}, {measure} {summary[measure + '_before']:.4f} -> "
          f"{summary[measure + '_after']:.4f}, gzip {summary['gzip_bytes_before']} -> "
          f"{summary['gzip_bytes_after']} bytes ({summary['gzip_ratio']:.2f}x); "
          f"{bounds.describe(summary['num_examples_after'], summary['eval_steps'])}")
    print(report.demo_table(FLAGS.model_dir))
    print(f"pruned model and report in {FLAGS.model_dir}/pruned")
    return 0
