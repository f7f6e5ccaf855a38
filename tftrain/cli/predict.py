"""Predict with a trained model on new raw files, preprocessed exactly as its training data.

--model: a run directory (its export), its export/ or a .tflite in it (quantized/, pruned/).
--input: what the run's dataset pipeline converts: an image, a folder of images (recursive) or
a glob; CSV files (the label column may be absent; other columns, such as an id, are passed
through); JSON Lines or text lines for a text classifier; - for lines on standard input. Or
--data=DIR --split=NAME: the records of a converted split.
--output: FILE.csv or FILE.jsonl, one row per input row in input order: input (the path, or
file:line), the passed-through columns, class and probability (--top_k=K adds class_2,
probability_2, ... to K), or value (regression, in the label's units), and error (why a row
could not be predicted; empty for good rows). Written under a temporary name and renamed when
complete; exits 1 when more than --max_bad_fraction of the rows are bad.
Example: tftrain predict --model=runs/photos --input=new_photos/ --output=predictions.csv
"""
from absl import flags

from tftrain import quiet_start
from tftrain.cli.common import parse_pipeline_options, require, use_flags

FLAGS = flags.FLAGS
use_flags(__name__, "model", "input", "output", "data", "split", "top_k", "batch_size",
          "overwrite", "max_bad_fraction", "pipeline_options")
flags.DEFINE_integer("num_threads", None, "A .tflite model's interpreter threads (default: "
                     "the cores this process may use).", lower_bound=1)


def main(argv):
    require("model", "output")
    quiet_start.import_tensorflow()
    from tftrain.optimize import predict

    summary = predict.predict(
        FLAGS.model, FLAGS.output, input_path=FLAGS.input or None, data=FLAGS.data,
        split=FLAGS.split, top_k=1 if FLAGS.top_k is None else FLAGS.top_k,
        batch_size=FLAGS.batch_size or predict.DEFAULT_BATCH_SIZE, overwrite=FLAGS.overwrite,
        max_bad_fraction=FLAGS.max_bad_fraction,
        pipeline_options=parse_pipeline_options(FLAGS.pipeline_options),
        num_threads=FLAGS.num_threads)
    print(summary.line())
    return 0
