"""Convert a raw dataset into sharded TFRecord files with a dataset.json manifest.

Worker processes (--workers, default all cores) each read their own share of the rows and write
their own shards; rows the pipeline rejects are skipped and listed in bad_rows.jsonl. The output
becomes a dataset only when dataset.json is written, last.

Examples:
  tftrain convert --pipeline=image_folder --input=photos/ --output=data/photos \\
      --splits=train:0.8,validation:0.1,test:0.1
  tftrain convert --pipeline=csv --input=table.csv --output=data/table \\
      --pipeline_options=label_column=species
  tftrain convert --pipeline=digits --output=data/digits --runner=beam \\
      --beam_options='--runner=DirectRunner --direct_num_workers=2'
  tftrain convert --pipeline=jsonl --input=new_reviews.jsonl --output=data/reviews --append
"""
from __future__ import annotations

from absl import flags

from tftrain import quiet_start
from tftrain.cli.common import parse_pipeline_options, require, use_flags

FLAGS = flags.FLAGS
use_flags(__name__, "overwrite", "output", "pipeline", "pipeline_options", "seed", "input",
          "max_bad_fraction")
flags.DEFINE_string("splits", None, "Split fractions, e.g. train:0.8,validation:0.1,test:0.1, "
                    "assigned from a hash of each row's key; default: the source's own splits.")
flags.DEFINE_integer("workers", 0, "Worker processes, each writing its own shards; 0: all cores "
                     "(1 for a small input).")
flags.DEFINE_integer("num_shards", None, "Shards per split (default: from --shard_size_mb).")
flags.DEFINE_float("shard_size_mb", None, "Target shard size in MB (default 150), estimated from "
                   "the input; at least one shard per worker.")
flags.DEFINE_enum("runner", "local", ["local", "beam"], "local: worker processes on this machine; "
                  "beam: an Apache Beam pipeline (pip install 'tftrain[beam]').")
flags.DEFINE_boolean("append", False, "Add the input's rows to the tftrain dataset in --output as "
                     "new shards, encoded with its vocabulary and classes; its files are kept as "
                     "they are and its manifest is replaced atomically.")
flags.DEFINE_string("beam_options", "", "Beam pipeline options for --runner=beam, e.g. "
                    "'--runner=DataflowRunner --project=P --region=R --temp_location=gs://B/tmp'.")

def main(argv):
    require("pipeline", "output")
    from pipelines import load_pipeline

    # Before TensorFlow, to know whether workers will be needed; built-in pipelines do not import
    # TensorFlow at module level (pipelines/base.py), a user's module might.
    with quiet_start.hiding_start_up_chatter():
        pipeline = load_pipeline(FLAGS.pipeline, **parse_pipeline_options(FLAGS.pipeline_options))
    if FLAGS.runner == "local":
        from tftrain.data import processes

        if processes.needs_workers(pipeline, FLAGS.input, FLAGS.workers or None):
            processes.warm_up()  # workers' TensorFlow import overlaps this process's own
    quiet_start.import_tensorflow()
    from tftrain.data.splits import parse_splits

    splits = parse_splits(FLAGS.splits) if FLAGS.splits else None
    kwargs = dict(splits=splits, num_shards=FLAGS.num_shards, shard_size_mb=FLAGS.shard_size_mb,
                  seed=FLAGS.seed, overwrite=FLAGS.overwrite,
                  max_bad_fraction=FLAGS.max_bad_fraction)
    if FLAGS.runner == "beam":
        from tftrain.data.beam_writer import write_dataset_beam

        if FLAGS.append:
            from tftrain.errors import ConfigError

            raise ConfigError("--append runs with --runner=local (Beam appends are not built yet).")
        manifest = write_dataset_beam(pipeline, FLAGS.input, FLAGS.output,
                                      beam_options=FLAGS.beam_options, **kwargs)
    else:
        from tftrain.data.writer import write_dataset

        if FLAGS.beam_options:
            from tftrain.errors import ConfigError

            raise ConfigError("--beam_options is only used with --runner=beam.")
        manifest = write_dataset(pipeline, FLAGS.input, FLAGS.output,
                                 workers=FLAGS.workers or None, append=FLAGS.append, **kwargs)
    from tftrain.data.writer import summary_line

    print(summary_line(FLAGS.output, manifest))
    return 0
