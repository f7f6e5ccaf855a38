"""A run resumed after `tftrain convert --append` reads the new shards from its next pass.

End to end through the CLI: a `tftrain train` SIGKILLed after a backup, new examples appended
with `tftrain convert --append`, the same `tftrain train` again. The resumed run finishes the
pass it was in exactly as the uninterrupted run on the old data would have (batch for batch),
reads every old and new example once in each pass after it, and keeps its step plan. Below it,
the parts: the segmented stream (`data.order`) and the record of shards (`data.passes`).
"""
import json
import math

import numpy as np
import pytest

from tests import forked_cli
from tests.conftest import REPO
from tests.test_exact_resume import (BATCH, BOUND, FEATURES, CLASSES, _kill_after_backup, _train,
                                     overrides, read_ids, stream_ids)

OLD, NEW = 300, 150  # training examples before and after the append
EPOCHS = 4  # of the old data: 18 steps each, 72 in all
STEPS = EPOCHS * (OLD // BATCH)


def tftrain(*args):
    done = forked_cli.run(list(args), cwd=REPO, timeout=BOUND)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def write_ids(path, first_id: int, splits: dict) -> None:
    """An .npz with per-split arrays whose feature 0 is a unique id, from `first_id` on."""
    rng = np.random.default_rng(first_id)
    arrays = {}
    for split, count in splits.items():
        x = rng.normal(size=(count, FEATURES)).astype(np.float32)
        x[:, 0] = np.arange(first_id, first_id + count)
        arrays[f"x_{split}"], arrays[f"y_{split}"] = x, rng.integers(0, CLASSES, count)
        first_id += count
    np.savez(path, **arrays)


def test_resumed_after_an_append_reads_the_new_shards_from_its_next_pass(tmp_path):
    write_ids(tmp_path / "ids.npz", 0, {"train": OLD, "validation": 40, "test": 40})
    data = tmp_path / "data"
    tftrain("convert", "--pipeline=numpy", f"--input={tmp_path / 'ids.npz'}", f"--output={data}",
            "--num_shards=3")
    reference = stream_ids(str(data), STEPS, BATCH)  # the run on the old data, uninterrupted
    ids_dir = tmp_path / "ids"
    ids_dir.mkdir()
    command = overrides(str(data), ids_dir, **{"train.epochs": EPOCHS})
    first = _train(tmp_path / "run", command)
    try:
        _kill_after_backup(first, str(tmp_path / "run"), str(ids_dir / "replica-0.txt"), 6)
    finally:
        first.kill_all()
    interrupted = read_ids(ids_dir)[0]

    write_ids(tmp_path / "more.npz", 1000, {"train": NEW})
    tftrain("convert", "--pipeline=numpy", f"--input={tmp_path / 'more.npz'}", f"--output={data}",
            "--append", "--num_shards=2")
    second = _train(tmp_path / "run", command)
    try:
        assert second.wait(BOUND) == 0, second.tail()
    finally:
        second.kill_all()
    assert "grew to 5 shards since this run stopped" in second.output

    summary = json.loads((tmp_path / "run/summary.json").read_text())
    assert summary["steps"] == STEPS  # the plan it started with: 4 passes of the old data
    epoch, step = summary["resumed_from"]
    kept = epoch * (OLD // BATCH) + step
    batches = interrupted[:kept] + read_ids(ids_dir)[0][len(interrupted):]
    assert len(batches) == STEPS
    records = [i for batch in batches for i in batch]
    boundary = math.ceil(kept * BATCH / OLD) * OLD  # the end of the pass the resume was in
    old_records = [i for batch in reference for i in batch][:boundary]
    assert records[:boundary] == old_records  # that pass finished as if nothing was appended
    grown = records[boundary:boundary + OLD + NEW]  # the next pass: every old and new example
    assert sorted(grown) == list(range(OLD)) + list(range(1000, 1000 + NEW))
    rest = records[boundary + OLD + NEW:]
    assert len(set(rest)) == len(rest) and set(rest) <= set(grown)
    assert not (tmp_path / "run/backup").exists()  # the record went with the backup


# ---- the parts ---------------------------------------------------------------------------

def _segments(*specs):
    """order.Segment per (records per pass, first id, from_record): pass p yields ids
    first + 100 * p + 0..records-1."""
    import tensorflow as tf

    from tftrain.data import order

    def one_pass(size, first):
        return lambda p: tf.data.Dataset.range(size).map(lambda i: i + first + 100 * p)
    return [order.Segment(one_pass(size, first), lambda size=size: size, start)
            for size, first, start in specs]


def _ids(segments, start, count):
    from tftrain.data import order

    return [int(i) for i in order.stream(segments, start).take(count).as_numpy_iterator()]


def _pass(p, size, first):
    return [first + 100 * p + i for i in range(size)]


def test_a_later_segment_starts_at_the_pass_after_the_one_holding_its_record():
    segments = _segments((10, 0, 0), (15, 10_000, 25))  # record 25 is in pass 2 of the first
    expected = _pass(0, 10, 0) + _pass(1, 10, 0) + _pass(2, 10, 0) + _pass(3, 15, 10_000)
    assert _ids(segments, 0, 45) == expected
    assert _ids(segments, 27, 18) == expected[27:]  # resumed inside the first segment
    assert _ids(segments, 35, 10) == expected[35:]  # resumed inside the second
    on_boundary = _segments((10, 0, 0), (15, 10_000, 20))  # record 20 starts pass 2
    assert _ids(on_boundary, 18, 7) == _pass(1, 10, 0)[8:] + _pass(2, 15, 10_000)[:5]


def test_a_segment_no_pass_reached_is_skipped():
    segments = _segments((10, 0, 0), (15, 10_000, 25), (20, 50_000, 28))
    assert _ids(segments, 0, 50) == (_pass(0, 10, 0) + _pass(1, 10, 0) + _pass(2, 10, 0)
                                     + _pass(3, 20, 50_000))


def _manifest(*names, examples=10):
    shards = [{"file": name, "num_examples": examples, "bytes": 1} for name in names]
    return {"pipeline": "numpy", "features": {}, "info": {},
            "splits": {"train": {"num_examples": examples * len(names), "shards": shards}}}


def test_the_record_grows_from_the_resume_step_and_refuses_a_lost_shard():
    from tftrain.data import passes
    from tftrain.errors import DataError

    first = passes.resumed(None, _manifest("a", "b"), "train", "/d", 0)
    assert first.sets == ((0, ("a", "b")),) and first.examples == 20
    assert passes.resumed(first, _manifest("a", "b"), "train", "/d", 7) == first
    grown = passes.resumed(first, _manifest("a", "b", "c"), "train", "/d", 7)
    assert grown.sets == ((0, ("a", "b")), (7, ("a", "b", "c"))) and grown.examples == 20
    # resumed again at the same step (the attempt died before its next backup): one set there
    again = passes.resumed(grown, _manifest("a", "b", "c", "d"), "train", "/d", 7)
    assert again.sets == ((0, ("a", "b")), (7, ("a", "b", "c", "d")))
    with pytest.raises(DataError, match="shard b of split 'train', which this run trained on, "
                                        "is no longer in /d"):
        passes.resumed(grown, _manifest("a", "c"), "train", "/d", 9)
    with pytest.raises(DataError, match="trained on split 'train' and now asks for 'other'"):
        passes.resumed(grown, {"splits": {"other": _manifest("a")["splits"]["train"]}},
                       "other", "/d", 9)


def test_a_damaged_record_is_one_clear_error(tmp_path):
    from tftrain.data import passes
    from tftrain.errors import DataError

    (tmp_path / "training_shards.json").write_text('{"split": "train", "sets": []}')
    with pytest.raises(DataError, match="is not a record of the shards this run trained on"):
        passes.recorded(str(tmp_path))
    assert passes.recorded(str(tmp_path / "absent")) is None
