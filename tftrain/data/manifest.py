"""`dataset.json`: what a TFRecord dataset holds. Written last; a directory without it is not a dataset.

Layout:
    {"format": "tftrain.dataset/1", "pipeline": "digits", "source": "...", "tool_version": "...",
     "features": {name: {"dtype": ..., "shape": [...]}}, "info": {...pipeline metadata...},
     "splits": {"train": {"num_examples": N, "shards": [
         {"file": "train-00000-of-00002.tfrecord", "num_examples": n, "bytes": b, "sha256": h}]}},
     "bad_rows": {"count": k, "file": "bad_rows.jsonl"}}
"""
from __future__ import annotations

import json

import tensorflow as tf

from tftrain.errors import DataError
from tftrain.fileio import join, write_json

MANIFEST_NAME = "dataset.json"
BAD_ROWS_NAME = "bad_rows.jsonl"
FORMAT = "tftrain.dataset/1"


def shard_name(split: str, index: int, num_shards: int) -> str:
    """The file name of shard `index` of `num_shards` of `split`."""
    return f"{split}-{index:05d}-of-{num_shards:05d}.tfrecord"


def exists(data_dir: str) -> bool:
    """True when `data_dir` holds a complete dataset (its manifest was written)."""
    return tf.io.gfile.exists(join(data_dir, MANIFEST_NAME))


def read(data_dir: str) -> dict:
    """Reads and checks `data_dir/dataset.json`; raises DataError naming what is wrong."""
    path = join(data_dir, MANIFEST_NAME)
    if not tf.io.gfile.exists(path):
        raise DataError(
            f"{data_dir} is not a tftrain dataset: {MANIFEST_NAME} is missing (a conversion that did "
            "not finish leaves none). Run `tftrain convert --output=" + data_dir + " ...` to create it.")
    try:
        with tf.io.gfile.GFile(path, "r") as f:
            manifest = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{path} is not valid JSON ({e}); convert the dataset again.") from None
    if manifest.get("format") != FORMAT:
        raise DataError(f"{path} has format {manifest.get('format')!r}, expected {FORMAT!r}.")
    return manifest


def write(data_dir: str, manifest: dict) -> None:
    """Writes the manifest last, atomically, which makes `data_dir` a dataset."""
    write_json(join(data_dir, MANIFEST_NAME), {"format": FORMAT, **manifest})


def shard_files(data_dir: str, manifest: dict, split: str) -> list[str]:
    """The full paths of a split's shards; raises DataError for an unknown split."""
    splits = manifest["splits"]
    if split not in splits:
        raise DataError(
            f"dataset {data_dir} has no split {split!r}; it has: {', '.join(sorted(splits))}.")
    return [join(data_dir, shard["file"]) for shard in splits[split]["shards"]]


def shard_sizes(data_dir: str, manifest: dict, split: str) -> dict[str, int]:
    """The full path -> size in bytes of a split's shards, as the manifest records them."""
    shards = manifest["splits"][split]["shards"]
    return {join(data_dir, shard["file"]): shard["bytes"] for shard in shards if "bytes" in shard}
