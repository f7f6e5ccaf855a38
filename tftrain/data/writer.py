"""Writes a pipeline's rows as sharded TFRecord files with a manifest.

Output is atomic: every shard is written under a temporary name and renamed when complete, and
`dataset.json` is written last, so an interrupted conversion never leaves a directory that a
reader would accept.
"""
from __future__ import annotations

import time

import tensorflow as tf
from absl import logging

import tftrain
from pipelines import BasePipeline
from tftrain.data import manifest as manifest_lib
from tftrain.data.splits import assign_shard, assign_split
from tftrain.errors import BadRow, DataError, TftrainError
from tftrain.fileio import file_sha256, join


def prepare_output_dir(output_dir: str, overwrite: bool) -> None:
    """Refuses to replace a complete dataset unless `overwrite`; clears leftovers of a killed run."""
    if manifest_lib.exists(output_dir):
        if not overwrite:
            raise TftrainError(
                f"{output_dir} already holds a complete dataset; pass --overwrite to replace it.")
        # The manifest goes first: from here on the directory is not a dataset until rewritten.
        tf.io.gfile.remove(join(output_dir, manifest_lib.MANIFEST_NAME))
    tf.io.gfile.makedirs(output_dir)
    for name in tf.io.gfile.listdir(output_dir):
        if name.endswith(".tfrecord") or ".tmp" in name or name == "bad_rows.jsonl":
            tf.io.gfile.remove(join(output_dir, name))


def write_dataset(pipeline: BasePipeline, source: str, output_dir: str, *,
                  splits: dict[str, float] | None = None, num_shards: int = 1, seed: int = 0,
                  overwrite: bool = False) -> dict:
    """Converts `source` with `pipeline` into `output_dir`; returns the manifest.

    Rows keep their source split unless `splits` (name -> fraction) is given; rows without one
    use `pipeline.default_splits`. Each split gets `num_shards` shards.
    """
    prepare_output_dir(output_dir, overwrite)
    info = pipeline.prepare(source)
    writers: dict[tuple[str, int], tf.io.TFRecordWriter] = {}
    counts: dict[tuple[str, int], int] = {}
    started = time.monotonic()

    def tmp_path(split, index):
        return join(output_dir, "." + manifest_lib.shard_name(split, index, num_shards) + ".tmp")

    num_bad = 0
    for row in pipeline.read(source, info):
        split = row.split if (row.split and not splits) else assign_split(row.key, splits or pipeline.default_splits)
        try:
            example = pipeline.encode(row, info)
        except BadRow as e:
            num_bad += 1
            logging.warning("skipping row %s: %s", row.key, e)
            continue
        shard = (split, assign_shard(row.key, num_shards, seed))
        if shard not in writers:
            writers[shard] = tf.io.TFRecordWriter(tmp_path(*shard))
            counts[shard] = 0
        writers[shard].write(example.SerializeToString())
        counts[shard] += 1
    for writer in writers.values():
        writer.close()
    if not writers:
        raise DataError(f"no examples were read from {source!r} by pipeline {pipeline.name!r}.")

    split_entries: dict[str, dict] = {}
    for split in sorted({s for s, _ in writers}):
        shards = []
        for index in range(num_shards):
            final = join(output_dir, manifest_lib.shard_name(split, index, num_shards))
            if (split, index) not in writers:  # an empty shard is still a valid TFRecord file
                tf.io.TFRecordWriter(tmp_path(split, index)).close()
                counts[(split, index)] = 0
            tf.io.gfile.rename(tmp_path(split, index), final, overwrite=True)
            shards.append({"file": manifest_lib.shard_name(split, index, num_shards),
                           "num_examples": counts[(split, index)],
                           "bytes": tf.io.gfile.stat(final).length,
                           "sha256": file_sha256(final)})
        split_entries[split] = {"num_examples": sum(s["num_examples"] for s in shards), "shards": shards}

    manifest = {"pipeline": pipeline.name, "source": str(source), "tool_version": tftrain.__version__,
                "features": pipeline.features(info), "info": info, "splits": split_entries,
                "bad_rows": {"count": num_bad}}
    manifest_lib.write(output_dir, manifest)
    total = sum(s["num_examples"] for s in split_entries.values())
    logging.info("wrote %d examples (%s) to %s in %.1fs, %d bad rows skipped", total,
                 ", ".join(f"{k}={v['num_examples']}" for k, v in split_entries.items()),
                 output_dir, time.monotonic() - started, num_bad)
    return manifest
