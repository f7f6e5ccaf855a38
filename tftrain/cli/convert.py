"""Convert a raw dataset into sharded TFRecord files with a dataset.json manifest.

Example: tftrain convert --pipeline=image_folder --input=photos/ --output=data/photos
         --splits=train:0.8,validation:0.1,test:0.1
"""
from absl import flags

from tftrain.cli.common import require, use_flags

FLAGS = flags.FLAGS
use_flags(__name__, "overwrite")
flags.DEFINE_string("pipeline", None, "Dataset kind: digits, image_folder, csv, numpy, tfds, jsonl, "
                    "or an importable module of your own (my_pkg.my_data).")
flags.DEFINE_string("input", "", "Raw input: a directory, file or TFDS name, as the pipeline expects.")
flags.DEFINE_string("output", None, "Output dataset directory (gs:// works).")
flags.DEFINE_string("splits", None, "Split fractions, e.g. train:0.8,validation:0.1,test:0.1; "
                    "default: the source's own splits.")
flags.DEFINE_integer("num_shards", 1, "Shards per split.")
flags.DEFINE_integer("seed", 0, "Seed for spreading examples over shards.")


def main(argv):
    require("pipeline", "output")
    from pipelines import load_pipeline
    from tftrain.data.splits import parse_splits
    from tftrain.data.writer import write_dataset

    splits = parse_splits(FLAGS.splits) if FLAGS.splits else None
    manifest = write_dataset(load_pipeline(FLAGS.pipeline), FLAGS.input, FLAGS.output,
                             splits=splits, num_shards=FLAGS.num_shards, seed=FLAGS.seed,
                             overwrite=FLAGS.overwrite)
    counts = ", ".join(f"{k}={v['num_examples']}" for k, v in manifest["splits"].items())
    print(f"wrote {FLAGS.output}: {counts}; {manifest['bad_rows']['count']} bad rows skipped")
    return 0
