"""The training order and resume positions (`tftrain.data.order`): pass seeds, where a resumed
stream starts (`_pieces`), the stream itself, and the records one pass of an input pipeline
yields. Small tf.data pipelines, no model; fast; `make mutation` runs them."""
from types import SimpleNamespace

import pytest
import tensorflow as tf
from tensorflow.python.eager import context

from tftrain.data import order
from tftrain.data.order import _MAX_PASSES as FOREVER
from tftrain.data.record_file import DamagedFile, RecordFile


def test_pass_seeds_are_fixed_by_the_seed_and_the_pass():
    # Pinned (for this TensorFlow): a run resumed by a later tftrain reads the passes it
    # would have read.
    assert [int(order.pass_seed(7, p)) for p in range(3)] == [867682380, 1754976562, 114081158]
    assert int(order.pass_seed(0, 0)) == 1795456191
    assert int(order.pass_seed(7, tf.constant(2))) == 114081158  # a tensor index: the same
    seeds = [int(order.pass_seed(seed, p)) for seed in range(20) for p in range(20)]
    assert len(set(seeds)) == 400 and all(1 <= s < 2**31 - 1 for s in seeds)
    assert order.pass_seed(7, 0).dtype == tf.int64


def shuffled(size, seed=7):
    """A segment whose pass p is range(size) shuffled with pass p's seed."""
    return order.Segment(
        lambda p: tf.data.Dataset.range(size).shuffle(size, seed=order.pass_seed(seed, p)),
        lambda: size)


ORDER = [2, 9, 5, 6, 1, 8, 0, 3, 7, 4, 1, 5, 2, 6, 7, 4, 0, 3, 9, 8, 3, 0, 9, 2, 1, 5, 4, 6, 8, 7]


def ids(segments, start, count):
    return [int(i) for i in order.stream(segments, start).take(count)]


def test_the_stream_is_a_function_of_the_seed_alone():
    assert ids([shuffled(10)], 0, 30) == ORDER  # pinned, as the pass seeds
    assert [int(i) for i in order.stream([shuffled(10)]).take(30)] == ORDER  # from record 0
    before = context.global_seed()  # TensorFlow's global seed plays no part
    try:
        tf.random.set_seed(123)
        assert ids([shuffled(10)], 0, 30) == ORDER
        tf.random.set_seed(0)
        assert ids([shuffled(10)], 0, 30) == ORDER
    finally:
        tf.random.set_seed(before)
    assert ids([shuffled(10, seed=8)], 0, 30) != ORDER


@pytest.mark.parametrize("start", [0, 1, 9, 10, 11, 20, 27])
def test_a_resumed_stream_goes_on_where_it_stopped(start):
    assert ids([shuffled(10)], start, 30 - start) == ORDER[start:]


def test_a_resumed_stream_across_segments():
    def numbered(size, first, from_record=0):  # pass p: first + 100 * p + 0..size-1
        return order.Segment(
            lambda p: tf.data.Dataset.range(size).map(lambda i: i + first + 100 * p),
            lambda: size, from_record)

    def run(p, size, first):
        return [first + 100 * p + i for i in range(size)]

    segments = [numbered(3, 0), numbered(4, 1000, 5), numbered(2, 5000, 14)]
    # passes 0, 1 of the first (records 0-5), then 2 and 3 of the second (records 6-13),
    # then the third from pass 4 (record 14) on
    stream = (run(0, 3, 0) + run(1, 3, 0) + run(2, 4, 1000) + run(3, 4, 1000) + run(4, 2, 5000)
              + run(5, 2, 5000))
    for start in (0, 2, 5, 6, 7, 13, 14, 15):
        assert ids(segments, start, len(stream) - start) == stream[start:]


# ---- _pieces: where each segment's passes start and how much of the first is skipped ----------

def seg(size, from_record=0, name=""):
    return SimpleNamespace(records_per_pass=lambda: size, from_record=from_record, name=name)


def pieces(segments, start):
    return [(s.name, first, end, skip) for s, first, end, skip in order._pieces(segments, start)]


@pytest.mark.parametrize("start, expected", [
    (0, (0, 0)), (9, (0, 9)), (10, (1, 0)), (25, (2, 5)), (20, (2, 0)), (99, (9, 9))])
def test_one_segment(start, expected):
    first, skip = expected
    assert pieces([seg(10, name="a")], start) == [("a", first, FOREVER, skip)]


def test_a_later_segment_joins_at_the_next_pass_boundary():
    a, b = seg(10, name="a"), seg(15, 25, "b")  # record 25 is in pass 2 of a: b from pass 3
    assert pieces([a, b], 0) == [("a", 0, 3, 0), ("b", 3, FOREVER, 0)]
    assert pieces([a, b], 27) == [("a", 2, 3, 7), ("b", 3, FOREVER, 0)]
    assert pieces([a, b], 29) == [("a", 2, 3, 9), ("b", 3, FOREVER, 0)]
    assert pieces([a, b], 30) == [("b", 3, FOREVER, 0)]  # past a
    assert pieces([a, b], 35) == [("b", 3, FOREVER, 5)]
    assert pieces([a, b], 50) == [("b", 4, FOREVER, 5)]
    on_boundary = seg(15, 20, "b")  # record 20 begins pass 2: b from pass 2
    assert pieces([a, on_boundary], 0) == [("a", 0, 2, 0), ("b", 2, FOREVER, 0)]
    at_start = seg(15, 0, "b")  # no pass of a before b joins
    assert pieces([a, at_start], 0) == [("b", 0, FOREVER, 0)]


def test_a_third_segment_counts_from_where_the_second_began():
    a, b, c = seg(10, name="a"), seg(15, 25, "b"), seg(4, 50, "c")
    # b begins at record 30 (pass 3); record 50 is in b's second pass: c from pass 5, record 60
    assert pieces([a, b, c], 0) == [("a", 0, 3, 0), ("b", 3, 5, 0), ("c", 5, FOREVER, 0)]
    assert pieces([a, b, c], 59) == [("b", 4, 5, 14), ("c", 5, FOREVER, 0)]
    assert pieces([a, b, c], 61) == [("c", 5, FOREVER, 1)]
    assert pieces([a, b, c], 66) == [("c", 6, FOREVER, 2)]
    skipped = seg(4, 28, "c")  # joins before b began: b has no pass
    assert pieces([a, b, skipped], 0) == [("a", 0, 3, 0), ("c", 3, FOREVER, 0)]


def test_a_pass_without_records_cannot_resume():
    for bad in (0, -1):
        with pytest.raises(ValueError) as raised:
            order._pieces([seg(bad)], 5)
        assert str(raised.value) == "an input pipeline without records cannot resume"
    assert order._pieces([seg(0, name="a")], 0)[0][1:] == (0, FOREVER, 0)  # not asked at 0
    assert pieces([seg(1, name="a")], 5) == [("a", 5, FOREVER, 0)]


# ---- records_per_pipeline ----------------------------------------------------------------------

def test_records_of_one_pipeline_by_file_and_by_record():
    counts, files = [10, 20, 30, 40, 50], [f"f{i}" for i in range(5)]
    assert [order.records_per_pipeline(counts, files, 2, i, True) for i in range(2)] == [90, 60]
    assert [order.records_per_pipeline(counts, files, 3, i, True) for i in range(3)] == [
        50, 70, 30]
    # every n-th record: pipeline i reads records i, i + n, ...
    assert [order.records_per_pipeline(counts, files, 4, i, False) for i in range(4)] == [
        38, 38, 37, 37]
    assert order.records_per_pipeline(counts, files, 1, 0, False) == 150
    assert [order.records_per_pipeline([2], ["f"], 4, i, False) for i in range(4)] == [1, 1, 0, 0]


def test_unknown_counts_are_read_from_the_files(tmp_path):
    path = str(tmp_path / "x.tfrecord")
    with RecordFile(path) as out:
        for i in range(7):
            out.write(b"r" * i)
    remote = "ram://order_test/x.tfrecord"
    tf.io.gfile.makedirs("ram://order_test")
    tf.io.gfile.copy(path, remote, overwrite=True)
    assert order.records_per_pipeline([None, 5], [path, "f"], 1, 0, False) == 12
    assert order.records_per_pipeline([None, 5, None], [path, "f", remote], 2, 0, True) == 14
    assert order._count_records(remote) == 7


def test_a_local_file_is_checked_before_it_is_counted(tmp_path):
    path = tmp_path / "x.tfrecord"
    with RecordFile(str(path)) as out:
        out.write(b"abc")
    path.write_bytes(path.read_bytes()[:-1])  # the last record cut short
    with pytest.raises(DamagedFile) as raised:
        order.records_per_pipeline([None], [str(path)], 1, 0, False)
    assert raised.value.what == "damaged at byte 0: the record claims 3 bytes but only 2 remain " \
        "in the file"
