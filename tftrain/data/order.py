"""The training order: which records a training input pipeline yields, as a function of the seed.

Training reads the data in *passes* (one pass: every record of this input pipeline once). Pass
`p` is shuffled with the seed `pass_seed(seed, p)` (shard files, then records in a buffer), so
the whole infinite stream of a repeated training input is a pure function of the seed, the
files and the input pipeline, and the same every time it is built. A run resumed at step `s`
therefore builds the stream from the pass that holds record `s * records_per_step` and skips the
records of that pass that were already consumed: serialized records (or decoded ones, when
they come from the decoded cache), before any parsing, so resuming costs reading at most one
pass, never the passes before it.
"""
from __future__ import annotations

import math
from typing import Callable

import tensorflow as tf

from tftrain.data import dataset_files

_MAX_PASSES = 2**62  # "forever": a repeated training input never runs out of passes
_GRAPH_SEED = 0x5EED  # the graph-level seed of the passes; their op-level seeds vary


def pass_seed(seed: int, index) -> tf.Tensor:
    """The shuffle seed of pass `index` (a Python int or a scalar tensor), mixed statelessly
    from (seed, index): distinct passes, and distinct runs, get unrelated orders."""
    pair = tf.stack([tf.constant(seed, tf.int64), tf.cast(index, tf.int64)])
    return tf.random.stateless_uniform([], seed=pair, minval=1, maxval=2**31 - 1, dtype=tf.int64)


def stream(one_pass: Callable[[tf.Tensor], tf.data.Dataset], start_record: int = 0,
           records_per_pass: Callable[[], int] | None = None) -> tf.data.Dataset:
    """The endless training stream: `one_pass(p)` for p = 0, 1, 2, ..., one after the other,
    starting `start_record` records in (`records_per_pass()` is asked only then)."""
    first_pass = skip = 0
    if start_record:
        size = records_per_pass()
        if size <= 0:
            raise ValueError("an input pipeline without records cannot resume")
        first_pass, skip = divmod(start_record, size)
    def traced_pass(index):
        # flat_map traces this in a graph of its own: this sets that graph's seed, not TF's
        # global one, so the order does not depend on it (and a global seed of 0, which TF's
        # seed logic cannot combine with a tensor seed, does no harm).
        tf.random.set_seed(_GRAPH_SEED)
        return one_pass(index)

    dataset = tf.data.Dataset.range(first_pass, _MAX_PASSES).flat_map(traced_pass)
    return dataset.skip(skip) if skip else dataset


def records_per_pipeline(shard_counts: list[int | None], files: list[str], num_pipelines: int,
                         pipeline_id: int, by_file: bool) -> int:
    """How many records one pass of input pipeline `pipeline_id` yields: the records of its
    files (`by_file`), or its share of every n-th record. `shard_counts` are the manifest's
    counts per file of the split (None where unknown: those files are counted by reading them)."""
    def count(i: int) -> int:
        return shard_counts[i] if shard_counts[i] is not None else _count_records(files[i])

    if by_file:
        return sum(count(i) for i in range(pipeline_id, len(files), num_pipelines))
    total = sum(count(i) for i in range(len(files)))
    return math.ceil(max(0, total - pipeline_id) / num_pipelines)


def _count_records(path: str) -> int:
    """The records in one TFRecord file: its headers walked when local, else read once."""
    records = dataset_files.check(path, None)
    if records is not None:
        return records
    return int(tf.data.TFRecordDataset(path).reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))
