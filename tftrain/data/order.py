"""The training order: which records a training input pipeline yields, as a function of the seed.

Training reads the data in *passes* (one pass: every record of this input pipeline once). Pass
`p` is shuffled with the seed `pass_seed(seed, p)` (shard files, then records in a buffer), so
the whole infinite stream of a repeated training input is a pure function of the seed, the
files and the input pipeline, and the same every time it is built. A run resumed at step `s`
therefore builds the stream from the pass that holds record `s * records_per_step` and skips the
records of that pass that were already consumed: serialized records (or decoded ones, when
they come from the decoded cache), before any parsing, so resuming costs reading at most one
pass, never the passes before it.

A dataset that grows (`tftrain convert --append`) while a run is stopped joins the run at the
pass after the one it resumes in: the stream is made of `Segment`s, each a set of files read
from a pass boundary on, and the passes keep their numbers (and seeds) across segments.
"""
from __future__ import annotations

import dataclasses
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


@dataclasses.dataclass(frozen=True)
class Segment:
    """Passes that read one set of files: `one_pass(p)` is pass p, of `records_per_pass()`
    records (asked only when needed). A segment after the first begins at the first pass
    boundary at or after record `from_record` of the stream: a dataset that grew while a run
    was stopped joins it at the pass after the one it was in."""

    one_pass: Callable[[tf.Tensor], tf.data.Dataset]
    records_per_pass: Callable[[], int]
    from_record: int = 0


def stream(segments: list[Segment], start_record: int = 0) -> tf.data.Dataset:
    """The endless training stream: passes 0, 1, 2, ... one after the other, each read from
    the files of its segment, starting `start_record` records in."""
    pieces = _pieces(segments, start_record)
    dataset = None
    for segment, first_pass, end_pass, skip in pieces:
        piece = tf.data.Dataset.range(first_pass, end_pass).flat_map(_traced(segment.one_pass))
        piece = piece.skip(skip) if skip else piece
        dataset = piece if dataset is None else dataset.concatenate(piece)
    return dataset


def _traced(one_pass):
    @tf.autograph.experimental.do_not_convert  # plain TF and tf.data calls: nothing to convert
    def traced_pass(index):
        # flat_map traces this in a graph of its own: this sets that graph's seed, not TF's
        # global one, so the order does not depend on it (and a global seed of 0, which TF's
        # seed logic cannot combine with a tensor seed, does no harm).
        tf.random.set_seed(_GRAPH_SEED)
        return one_pass(index)
    return traced_pass


def _pieces(segments: list[Segment], start_record: int) -> list[tuple[Segment, int, int, int]]:
    """(segment, first pass, end pass, records to skip) for each segment the stream reads from
    `start_record` on: the passes are numbered on across segments (a pass's shuffle seed
    follows its number), and a segment that no pass reached is left out."""
    first_pass, begin, bounds = 0, 0, []  # bounds: (segment, first pass, first record)
    for k, segment in enumerate(segments):
        if k:
            size = _size(segments[k - 1])
            passes = max(0, math.ceil((segment.from_record - begin) / size))
            first_pass, begin = first_pass + passes, begin + passes * size
        bounds.append((segment, first_pass, begin))
    pieces = []
    for k, (segment, first, begin) in enumerate(bounds):
        end = bounds[k + 1][1] if k + 1 < len(bounds) else _MAX_PASSES
        if end == first:
            continue
        end_record = bounds[k + 1][2] if k + 1 < len(bounds) else None
        if end_record is not None and start_record >= end_record:
            continue  # a resumed run is past this segment
        skip = max(0, start_record - begin)
        if skip:
            passes, skip = divmod(skip, _size(segment))
            first += passes
        pieces.append((segment, first, end, skip))
    return pieces


def _size(segment: Segment) -> int:
    size = segment.records_per_pass()
    if size <= 0:
        raise ValueError("an input pipeline without records cannot resume")
    return size


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
