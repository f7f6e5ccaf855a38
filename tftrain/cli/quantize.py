"""Quantize a trained (or pruned) model to TFLite and measure it against the float model.

Modes: dynamic (int8 weights), int8 (int8 weights and activations, calibrated on the training
split), float16 (float16 weights), qat (quantization-aware fine-tuning, then int8; on a pruned
model it keeps the sparsity). Several modes: --mode=int8,float16. Each model is written to
RUN/quantized/model_<mode>.tflite (model_pruned_<mode> with --source=pruned) and evaluated with
the LiteRT interpreter on the evaluation split (--steps=N: its first N batches, the same for
every model) next to the float .tflite, or, when that would exceed LiteRT's 2 GiB flatbuffer
limit (over ~537M weights), next to the float32 Keras model on the same batches; the report
goes to RUN/quantized/report_<mode>.json and report.json. A mode whose .tflite would exceed the
limit, or a conversion this machine's memory cannot hold (estimated), is refused before any
conversion (exit 2). Exits non-zero (keeping the reports) when a
classifier's accuracy drop exceeds --max_accuracy_drop, or a regression model's RMSE grew by more
than --max_metric_change. Prints the float / pruned / quantized table.
Example: tftrain quantize --model_dir=runs/demo --mode=int8,float16
"""
from absl import flags

from tftrain import quiet_start
from tftrain.cli.common import require, use_flags
from tftrain.optimize import bounds

FLAGS = flags.FLAGS
use_flags(__name__, "model_dir", "strategy", "split", "max_metric_change",
          "allow_python_in_model", "steps")
flags.DEFINE_list("mode", None, "dynamic, int8, float16 or qat; a comma-separated list runs each.")
flags.DEFINE_enum("source", "export", ["export", "pruned"],
                  "Which model of the run: export/ (trained) or pruned/ (from tftrain prune).")
flags.DEFINE_float("max_accuracy_drop", 0.01, "Classifiers: largest accepted accuracy drop "
                   "versus the float model (its .tflite, or the Keras model over the flatbuffer "
                   "limit; 0.01 = one point).")
flags.DEFINE_bool("int8_io", False, "int8/qat: int8 model inputs and outputs instead of float.")
flags.DEFINE_integer("num_calibration_examples", 100, "int8: training examples used to "
                     "calibrate activation ranges.")
flags.DEFINE_integer("qat_epochs", 1, "qat: quantization-aware fine-tuning epochs.")
flags.DEFINE_float("qat_learning_rate", None, "qat: learning rate at the start, decaying to 0 "
                   "(cosine); default: a quarter of the run's train.learning_rate.")
flags.DEFINE_integer("tflite_threads", 1, "Interpreter threads for evaluation and latency.")


def main(argv):
    from tftrain.errors import ConfigError, TftrainError

    require("model_dir", "mode")
    quiet_start.import_tensorflow()
    from tftrain.optimize import quantize, report, runs

    modes = [quantize.check_mode(mode.strip()) for mode in FLAGS.mode]
    try:
        reports = runs.quantize_run(
            FLAGS.model_dir, modes, source=FLAGS.source, max_accuracy_drop=FLAGS.max_accuracy_drop,
            max_metric_change=(0.05 if FLAGS.max_metric_change is None
                               else FLAGS.max_metric_change),
            int8_io=FLAGS.int8_io, qat_epochs=FLAGS.qat_epochs,
            qat_learning_rate=FLAGS.qat_learning_rate,
            num_calibration_examples=FLAGS.num_calibration_examples, split=FLAGS.split,
            strategy_name=FLAGS.strategy, num_threads=FLAGS.tflite_threads,
            allow_python=FLAGS.allow_python_in_model, eval_steps=FLAGS.steps or 0)
    except TftrainError as e:
        # The gate failed: show what was measured (not after a refusal: nothing was).
        if not isinstance(e, ConfigError) and report.comparison_rows(FLAGS.model_dir):
            print(report.demo_table(FLAGS.model_dir), flush=True)
        raise
    print(report.demo_table(FLAGS.model_dir))
    for r in reports:
        print(model_line(r))
    return 0


def model_line(r: dict) -> str:
    """One quantized model against its float reference: the .tflite, or the Keras model when
    the float .tflite would exceed the flatbuffer limit (then no float size or time)."""
    measure = r["measure"]
    if r.get("reference") == "keras":
        against = (f"float32 Keras model {r['float_' + measure]:.4f}), {r['tflite_bytes']} "
                   f"bytes ({r['size_ratio_to_float32_weights']:.2f}x the float32 weights), "
                   f"{r['latency_ms']:.4f} ms/example at batch 1")
    else:
        against = (f"float {r['float_' + measure]:.4f}), {r['tflite_bytes']} bytes "
                   f"({r['size_ratio']:.2f}x), {r['latency_ms']:.4f} ms/example at batch 1 "
                   f"({r['latency_ratio']:.2f}x)")
    return (f"{r['mode']}: {r['tflite_path']} {measure} {r[measure]:.4f} ({against}; "
            f"{bounds.describe(r['num_examples'], r['eval_steps'])}")
