"""`tftrain convert --runner=beam`: the same read -> encode -> shard steps as an Apache Beam pipeline.

    Create(read partitions) -> Reshuffle -> FlatMap(pipeline.read share) -> ParDo(encode)
        good: ((split, shard), serialized) -> GroupByKey -> write each shard (temp name, rename)
        bad:  bad-row records ----------------------------------------.
    shard entries -> ToList -> write a summary file (with bad_rows) <-'

The launcher (this process) sizes the shards first, like the local writer, and writes
`bad_rows.jsonl` and `dataset.json` (the same manifest) after the Beam job has finished, so the
output is a dataset only once every shard is in place. Each row's split is the same as with
the local runner (a hash of its key); its shard is `assign_shard(key, shards, seed)` over all of
the split's shards, and the order within a shard is whatever the runner's grouping gives.
The output directory is checked, claimed and cleared like the local writer's
(`writer.claim_output_dir`): only tftrain's own files are ever deleted, a shard is never
renamed over a file that exists, and the conversion marker goes once dataset.json is written.
Runs on any Beam runner (DirectRunner, Dataflow, Flink, Spark) through `--beam_options`.
"""
from __future__ import annotations

import json
import shlex
import time

from absl import logging

from tftrain.data import example_bytes, shard_plan, shard_worker, writer
from tftrain.data.record_file import RecordFile
from tftrain.errors import BadRow, ConfigError, DataError
from tftrain.fileio import read_json, remove, write_json

SUMMARY_NAME = "beam-summary.json"
MIN_READ_PARTITIONS = 8


def _read_partition(partition: int, pipeline, source: str, info: dict, partitions: int):
    yield from pipeline.read(source, info, partition, partitions)


class _EncodeFn:  # wrapped in a beam.DoFn subclass at run time (apache_beam is optional)
    def __init__(self, pipeline, info, plan, key):
        self.pipeline, self.info, self.plan, self.key = pipeline, info, plan, key

    def process(self, row):
        import apache_beam as beam

        split = self.plan.split_of(row)
        try:
            if isinstance(row.value, BadRow):
                raise row.value
            example = self.pipeline.encode(row, self.info)
        except BadRow as e:
            yield beam.pvalue.TaggedOutput("bad", {"key": row.key, "split": split, "reason": str(e)})
            return
        except Exception as e:
            raise shard_worker.RowFailed(row.key, e) from e
        label = example_bytes.int64_scalar(example, self.key) if self.key else None
        yield ((split, self.plan.shard_of(row.key, split, 0)),
               (example_bytes.serialize(example), label))


def _write_shard(item, plan) -> dict:
    """Writes one shard's records under a temporary name, hashing them, and renames it."""
    (split, index), records = item
    labels: dict[str, int] = {}
    with RecordFile(plan.tmp_path(plan.file_name(split, index))) as out:
        for data, label in records:
            out.write(data)
            if label is not None:
                labels[str(label)] = labels.get(str(label), 0) + 1
    (entry,) = shard_worker.publish(plan, {(split, index): out}, lambda: True)
    entry["labels"] = labels
    return entry


def _write_summary(entries: list, bad_rows: list, plan) -> None:
    """Writes the bad rows (the launcher merges them) and the job's summary for the launcher."""
    import tensorflow as tf

    by_split: dict[str, int] = {}
    with tf.io.gfile.GFile(shard_worker.bad_rows_tmp(plan, 0), "w") as f:
        for bad in bad_rows:
            f.write(json.dumps(bad) + "\n")
            by_split[bad["split"]] = by_split.get(bad["split"], 0) + 1
    labels: dict[str, dict] = {}
    for entry in entries:
        split_labels = labels.setdefault(entry["split"], {})
        for label, n in entry.pop("labels").items():
            split_labels[label] = split_labels.get(label, 0) + n
    write_json(plan.tmp_path(SUMMARY_NAME), {"worker": 0, "shards": entries, "bad_rows": by_split,
                                              "labels": labels})


def write_dataset_beam(pipeline, source: str, output_dir: str, *, beam_options: str = "",
                       splits: dict | None = None, num_shards: int | None = None,
                       shard_size_mb: float | None = None, seed: int = 0, overwrite: bool = False,
                       max_bad_fraction: float = 0.01) -> dict:
    """Converts like `writer.write_dataset`, as a Beam job; returns the manifest."""
    try:
        import apache_beam as beam
        from apache_beam.options.pipeline_options import PipelineOptions
    except ImportError:
        raise ConfigError("--runner=beam needs Apache Beam: pip install 'tftrain[beam]'.") from None
    shard_plan.check_args(num_shards=num_shards, shard_size_mb=shard_size_mb,
                          max_bad_fraction=max_bad_fraction)
    writer.check_output_dir(output_dir, overwrite)
    try:
        options = PipelineOptions(shlex.split(beam_options or "--runner=DirectRunner"))
    except (ValueError, SystemExit) as e:
        raise ConfigError(f"bad --beam_options={beam_options!r}: {e}") from None

    started = time.monotonic()
    pipeline.requested_splits = dict(splits) if splits else None
    info = pipeline.prepare(source)
    plan, _ = writer.make_plan(pipeline, source, info, output_dir, splits=splits,
                               num_shards=num_shards, shard_size_mb=shard_size_mb, workers=1,
                               seed=seed)
    with writer.claim_output_dir(plan, overwrite, assets=pipeline.assets):
        partitions = max(MIN_READ_PARTITIONS, min(64, sum(plan.shards.values())))
        key = shard_worker.label_key(pipeline.features(info), info)
        encode = type("EncodeFn", (_EncodeFn, beam.DoFn), {})(pipeline, info, plan, key)
        try:
            with beam.Pipeline(options=options) as root:
                rows = (root
                        | "Partitions" >> beam.Create(range(partitions))
                        | "Spread" >> beam.Reshuffle()
                        | "Read" >> beam.FlatMap(_read_partition, pipeline, source, info,
                                                 partitions))
                encoded = rows | "Encode" >> beam.ParDo(encode).with_outputs("bad", main="good")
                entries = (encoded.good
                           | "GroupShards" >> beam.GroupByKey()
                           | "WriteShards" >> beam.Map(_write_shard, plan)
                           | "AllShards" >> beam.combiners.ToList())
                bad = beam.pvalue.AsList(encoded.bad)
                _ = entries | "Summary" >> beam.Map(_write_summary, bad, plan)
            summary = read_json(plan.tmp_path(SUMMARY_NAME))
            remove(plan.tmp_path(SUMMARY_NAME), within=plan.output_dir)
            manifest = writer.finish(pipeline, source, info, plan, [summary], splits,
                                     max_bad_fraction)
        except BaseException as e:
            writer.remove_shards(plan)
            if isinstance(e, (DataError, ConfigError, KeyboardInterrupt)):
                raise
            logging.exception("the Beam job failed")
            raise DataError(f"the Beam conversion job failed: {type(e).__name__}: "
                            f"{str(e).splitlines()[0] if str(e) else ''}") from e
    writer.add_stats(manifest, started, 0)
    logging.info("%s", writer.summary_line(output_dir, manifest))
    return manifest
