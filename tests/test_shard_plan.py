"""The shard plan of a conversion (`tftrain.data.shard_plan`): which worker owns which shard,
where a row goes, the first look at the source, its size on disk, and the shard counts chosen
from them. Pure (or local files under tmp_path, and TensorFlow's in-memory ram:// file system
for the remote paths); fast; `make mutation` runs them."""
import collections
import hashlib
import os
from types import SimpleNamespace

import pytest
import tensorflow as tf

from tftrain.data import shard_plan
from tftrain.data.shard_plan import MB, Sample, ShardPlan, choose, shards_for
from tftrain.errors import BadRow, ConfigError, DataError


def spec_hash(key: str, salt: str) -> float:
    digest = hashlib.sha256(salt.encode() + b"\x00" + key.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def plan(**changes) -> ShardPlan:
    fields = dict(output_dir="/out", run_id="r1", num_workers=3, seed=5,
                  shards={"train": 7, "test": 3}, default_shards=2, fractions=None,
                  default_fractions={"train": 1.0})
    return ShardPlan(**{**fields, **changes})


def row(key, split=None, split_key=None, value=b"v"):
    return SimpleNamespace(key=key, split=split, split_key=split_key, value=value)


# ---- ShardPlan ---------------------------------------------------------------------------

def test_each_worker_owns_every_num_workers_th_shard():
    p = plan()
    assert [list(p.owned("train", w)) for w in range(3)] == [[0, 3, 6], [1, 4], [2, 5]]
    assert [list(p.owned("test", w)) for w in range(3)] == [[0], [1], [2]]
    assert list(p.owned("new", 1)) == [1]  # a split not foreseen: default_shards
    assert (p.num_shards("train"), p.num_shards("test"), p.num_shards("new")) == (7, 3, 2)


def test_a_row_goes_to_one_of_its_workers_shards_by_key_and_seed():
    p = plan()
    keys = [f"k{i}" for i in range(300)]
    for worker, owned in ((0, [0, 3, 6]), (1, [1, 4])):
        got = [p.shard_of(key, "train", worker) for key in keys]
        assert got == [owned[int(spec_hash(key, "shard5") * len(owned))] for key in keys]
        assert sorted(set(got)) == owned


def test_the_split_of_a_row():
    p = plan(default_fractions={"a": 0.5, "b": 0.5})
    assert p.split_of(row("k", split="test")) == "test"
    keys = [f"k{i}" for i in range(50)]
    by_key = [p.split_of(row(key)) for key in keys]
    assert by_key == ["a" if spec_hash(key, "split") < 0.5 else "b" for key in keys]
    # A row with a split key (a window of a passage) takes the split of that key.
    assert [p.split_of(row(f"w{i}", split_key=key)) for i, key in enumerate(keys)] == by_key
    resplit = plan(fractions={"x": 0.5, "y": 0.5})
    assert resplit.split_of(row("k", split="test")) in ("x", "y")
    assert [resplit.split_of(row("w", split="test", split_key=key)) for key in keys] == [
        {"a": "x", "b": "y"}[s] for s in by_key]


def test_file_names_temporary_paths_and_claims():
    p = plan()
    assert p.file_name("train", 4) == "train-00004-of-00007.tfrecord"
    assert plan(generation=2).file_name("test", 1) == "test-g002-00001-of-00003.tfrecord"
    assert p.file_name("new", 1) == "new-00001-of-00002.tfrecord"
    assert p.tmp_path("train-00004-of-00007.tfrecord") == \
        "/out/.train-00004-of-00007.tfrecord.tmp-r1"
    assert p.claim_path("new-00000-of-00002.tfrecord") == \
        "/out/.new-00000-of-00002.tfrecord.claim.tmp-r1"
    assert p.foresees("train") and not p.foresees("new")
    assert p.file_names() == ["test-00000-of-00003.tfrecord", "test-00001-of-00003.tfrecord",
                              "test-00002-of-00003.tfrecord"] + [
        f"train-{i:05d}-of-00007.tfrecord" for i in range(7)]


# ---- take_sample --------------------------------------------------------------------------

class Pipeline:
    """Rows r0, r1, ...: `bad` ones carry a BadRow, `broken` ones fail to encode; encoded row i
    is i + 1 bytes. Records how it was read and whether the reader was closed."""

    name = "fake"

    def __init__(self, n, splits=(), bad=(), broken=()):
        self.n, self.splits, self.bad, self.broken = n, splits, set(bad), set(broken)
        self.closed = False
        self.read_args = None

    def read(self, source, info, worker, num_workers):
        self.read_args = (source, info, worker, num_workers)
        try:
            for i in range(self.n):
                value = BadRow(f"bad {i}") if i in self.bad else i
                yield row(f"r{i}", self.splits[i] if i < len(self.splits) else None, value=value)
        finally:
            self.closed = True

    def encode(self, r, info):
        if r.value in self.broken:
            raise ValueError("boom")
        return b"x" * (r.value + 1)


def by_split(r):
    return r.split or "none"


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setattr(shard_plan, "SAMPLE_ROWS", 10)
    monkeypatch.setattr(shard_plan, "SAMPLE_ENCODE", 4)


def test_a_source_read_whole_is_counted_exactly(small):
    pipeline = Pipeline(10, splits=["test"])
    sample = shard_plan.take_sample(pipeline, "src", {"i": 1}, by_split)
    assert pipeline.read_args == ("src", {"i": 1}, 0, 1)
    assert (sample.rows, sample.exhausted, sample.source_splits) == (10, True, True)
    assert sample.split_rows == collections.Counter({"none": 9, "test": 1})
    assert (sample.encoded_rows, sample.encoded_bytes, sample.bad_reasons) == (4, 1 + 2 + 3 + 4, [])
    assert sample.example_bytes == 2.5
    assert pipeline.closed


def test_a_larger_source_is_sampled_and_its_reader_closed(small):
    pipeline = Pipeline(11)
    sample = shard_plan.take_sample(pipeline, "src", {}, by_split)
    assert (sample.rows, sample.exhausted, sample.source_splits) == (10, False, False)
    assert pipeline.closed  # the reader is closed although it has rows left
    pipeline = Pipeline(9)
    sample = shard_plan.take_sample(pipeline, "src", {}, by_split)
    assert (sample.rows, sample.exhausted) == (9, True)
    assert Sample().example_bytes == 0.0


def test_bad_rows_count_towards_the_encoded_sample(small):
    sample = shard_plan.take_sample(Pipeline(10, bad=[0, 2]), "src", {}, by_split)
    assert sample.bad_reasons == ["r0: bad 0", "r2: bad 2"]
    assert (sample.encoded_rows, sample.encoded_bytes) == (2, 2 + 4)  # rows 1 and 3


def test_an_encode_that_raises_is_a_data_error(small):
    pipeline = Pipeline(10, broken=[2])
    with pytest.raises(DataError) as raised:
        shard_plan.take_sample(pipeline, "src", {}, by_split)
    assert str(raised.value) == "pipeline 'fake' failed: ValueError: boom (while encoding row 'r2')"
    assert isinstance(raised.value.__cause__, ValueError)
    assert pipeline.closed


def test_a_reader_without_close_is_left_as_it_is(small):
    class Listed(Pipeline):
        def read(self, source, info, worker, num_workers):
            return iter([row("r0", value=0), row("r1", "test", value=1)])  # nothing to close

    sample = shard_plan.take_sample(Listed(0), "src", {}, by_split)
    assert (sample.rows, sample.exhausted, sample.source_splits) == (2, True, True)


def test_a_split_counted_from_a_later_row_too(small):
    sample = shard_plan.take_sample(Pipeline(3, splits=["train"]), "src", {}, by_split)
    assert sample.source_splits  # a split on the first row only still counts


# ---- source_bytes and _tree_bytes -----------------------------------------------------------

def write(path, size):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(b"x" * size)


def test_the_size_of_a_file_a_pattern_and_a_folder(tmp_path):
    write(f"{tmp_path}/a/one.csv", 100)
    write(f"{tmp_path}/a/two.csv", 30)
    write(f"{tmp_path}/a/.hidden", 1000)
    assert shard_plan.source_bytes(f"{tmp_path}/a/one.csv") == {None: 100}
    assert shard_plan.source_bytes(f"{tmp_path}/a/*.csv") == {None: 130}
    assert shard_plan.source_bytes(f"{tmp_path}/a/?ne.csv") == {None: 100}
    assert shard_plan.source_bytes(f"{tmp_path}/a/[o]ne.csv") == {None: 100}
    assert shard_plan.source_bytes(f"{tmp_path}/a/*.json") is None
    assert shard_plan.source_bytes(f"{tmp_path}/a") == {None: 130}  # hidden files left out
    assert shard_plan.source_bytes(f"{tmp_path}/missing") is None
    assert shard_plan.source_bytes("") is None
    os.makedirs(f"{tmp_path}/empty")
    assert shard_plan.source_bytes(f"{tmp_path}/empty") == {None: 0}


def test_a_folder_of_split_names_is_measured_per_split(tmp_path):
    root = f"{tmp_path}/dX"  # an X: nothing but * ? [ makes a path a pattern
    write(f"{root}/train/x.jsonl", 50)
    write(f"{root}/train/deeper/y.jsonl", 20)
    write(f"{root}/train-extra.jsonl", 5)
    write(f"{root}/test.jsonl", 7)
    write(f"{root}/.DS_Store", 1000)
    assert shard_plan.source_bytes(root) == {"train": 75, "test": 7}
    write(f"{root}/notes.txt", 3)  # not a split's name: the whole folder, one input
    assert shard_plan.source_bytes(root) == {None: 85}


def test_entries_are_measured_under_their_own_names(tmp_path):
    # A name is only cut at its first dot to find its split; the file is the name as listed
    # (an X or a space at its end included).
    root = f"{tmp_path}/named"
    write(f"{root}/train/a.bin", 10)
    write(f"{root}/validation.X", 4)
    write(f"{root}/test.csv ", 3)
    assert shard_plan.source_bytes(root) == {"train": 10, "validation": 4, "test": 3}


def test_a_remote_folder_is_measured_through_gfile():
    root = "ram://shard_plan_test/src"
    for name, size in (("train/a.bin", 10), ("train/b.bin", 4), ("test.csv", 3)):
        tf.io.gfile.makedirs(os.path.dirname(f"{root}/{name}"))
        with tf.io.gfile.GFile(f"{root}/{name}", "wb") as f:
            f.write(b"x" * size)
    assert shard_plan.source_bytes(root) == {"train": 14, "test": 3}
    assert shard_plan._tree_bytes(f"{root}/test.csv") == 3
    assert shard_plan._tree_bytes(f"{root}/train") == 14


def test_a_large_folder_is_measured_from_a_spread_of_its_files(tmp_path, monkeypatch):
    monkeypatch.setattr(shard_plan, "STAT_FILES", 3)
    for i in range(10):
        write(f"{tmp_path}/f/{i:02d}.bin", 10 * (i + 1))
    names = [n for _, _, names in os.walk(f"{tmp_path}/f") for n in names]
    measured = names[::4]  # every ceil(10 / 3)-th file of the listing
    expected = round(sum(10 * (int(n[:2]) + 1) for n in measured) / len(measured) * 10)
    assert shard_plan._tree_bytes(f"{tmp_path}/f") == expected != 550
    monkeypatch.setattr(shard_plan, "STAT_FILES", 10)
    assert shard_plan._tree_bytes(f"{tmp_path}/f") == 550  # few enough: all of them
    write(f"{tmp_path}/one/only.bin", 7)
    assert shard_plan._tree_bytes(f"{tmp_path}/one") == 7


def test_a_linked_folder_is_not_followed(tmp_path):
    write(f"{tmp_path}/l/a.bin", 10)
    os.symlink(f"{tmp_path}/l", f"{tmp_path}/l/loop")  # a cycle: walked once
    assert shard_plan._tree_bytes(f"{tmp_path}/l") == 10


# ---- shard counts ----------------------------------------------------------------------------

@pytest.mark.parametrize("nbytes, target, workers, expected", [
    (0, 150, 1, 1), (0, 150, 3, 3), (74 * MB, 150, 1, 1), (76 * MB, 150, 1, 1),
    (225 * MB, 150, 1, 2), (1500 * MB, 150, 1, 10), (1500 * MB, 150, 4, 8),
    (1500 * MB, 100, 4, 16), (10 * MB, 150, 4, 4), (2 * MB, 0.5, 1, 4), (700 * MB, 100, 2, 8),
])
def test_shards_for(nbytes, target, workers, expected):
    assert shards_for(nbytes, target, workers) == expected


@pytest.mark.parametrize("args, message", [
    (dict(num_shards=2, shard_size_mb=10),
     "pass either --num_shards or --shard_size_mb, not both."),
    (dict(num_shards=0), "--num_shards=0 must be at least 1."),
    (dict(shard_size_mb=0), "--shard_size_mb=0 must be positive."),
    (dict(workers=0), "--workers=0 must be at least 1 (or 0 for all cores)."),
    (dict(max_bad_fraction=-0.1), "--max_bad_fraction=-0.1 must be between 0 and 1."),
    (dict(max_bad_fraction=1.1), "--max_bad_fraction=1.1 must be between 0 and 1."),
])
def test_bad_writer_arguments(args, message):
    with pytest.raises(ConfigError) as raised:
        shard_plan.check_args(**args)
    assert str(raised.value) == message


def test_good_writer_arguments():
    for args in (dict(num_shards=1), dict(shard_size_mb=0.01), dict(workers=1),
                 dict(max_bad_fraction=0), dict(max_bad_fraction=1), dict(num_shards=3, workers=2),
                 dict(shard_size_mb=5, workers=4), {}):
        shard_plan.check_args(**args)


def sample_of(rows, split_rows=None, exhausted=False, source_splits=False, example_bytes=1000):
    sample = Sample(rows=rows, exhausted=exhausted, source_splits=source_splits,
                    encoded_rows=64 if example_bytes else 0,
                    encoded_bytes=64 * example_bytes)
    sample.split_rows.update(split_rows or {})
    return sample


def choice(sample, sizes=None, fractions=None, default_fractions=None, workers=1, num_shards=None,
           shard_size_mb=None):
    return choose(sample=sample, sizes=sizes, fractions=fractions,
                  default_fractions=default_fractions or {"train": 1.0}, workers=workers,
                  num_shards=num_shards, shard_size_mb=shard_size_mb)


@pytest.mark.parametrize("args", [dict(num_shards=0), dict(shard_size_mb=0), dict(workers=0)])
def test_choose_checks_its_arguments(args):
    with pytest.raises(ConfigError):
        choice(sample_of(10), **args)


def test_workers_default_to_the_cores_or_one_for_a_small_source(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    assert choice(sample_of(10, exhausted=True), workers=None)[0] == 1
    assert choice(sample_of(10), workers=None)[0] == 3
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert choice(sample_of(10), workers=None)[0] == 1


def test_num_shards_and_workers():
    workers, shards, default, _, notes = choice(sample_of(10), workers=4, num_shards=2)
    assert (workers, shards, default) == (2, {"train": 2}, 2)
    assert notes == ["using 2 worker(s): each worker writes its own shards and "
                     "--num_shards=2 < --workers=4"]
    workers, _, _, _, notes = choice(sample_of(10), workers=3, num_shards=4)
    assert workers == 3 and notes == [
        "--num_shards=4 is not a multiple of 3 workers: shards of different workers will differ "
        "in size"]
    for num_shards in (2, 4):  # as many shards as workers, or a multiple: nothing to say
        workers, shards, _, _, notes = choice(sample_of(10), workers=2, num_shards=num_shards)
        assert (workers, shards, notes) == (2, {"train": num_shards}, [])


def test_an_input_of_unknown_size():
    workers, shards, default, rows, notes = choice(
        sample_of(10), fractions={"a": 0.5, "b": 0.5}, workers=2)
    assert (workers, shards, default, rows) == (2, {"a": 2, "b": 2}, 2, None)
    assert notes == ["the input's size is unknown: writing one shard per worker and split (pass "
                     "--num_shards or --shard_size_mb to choose)"]
    assert choice(sample_of(10), num_shards=3)[4] == []  # the count is given: nothing to say
    # one shard per worker and split whatever the target size
    assert choice(sample_of(10), workers=1, shard_size_mb=1e-7)[1:3] == ({"train": 1}, 1)


def test_a_source_read_whole_is_sized_from_the_sample():
    sample = sample_of(300_000, {"train": 250_000, "test": 50_000}, exhausted=True,
                       source_splits=True, example_bytes=1000)  # 250 MB and 50 MB
    workers, shards, default, rows, notes = choice(sample, sizes={None: 1}, shard_size_mb=100)
    assert (workers, shards, default, rows, notes) == (1, {"train": 2, "test": 1}, 3, 300_000, [])
    # --splits on a source read whole: the splits are the fractions' and sized by the rows
    # the sample put in each (split_rows counts them as re-split).
    sample = sample_of(300_000, {"a": 100_000, "b": 200_000}, exhausted=True)
    _, shards, default, _, _ = choice(sample, fractions={"a": 0.5, "b": 0.5}, shard_size_mb=50)
    assert (shards, default) == ({"a": 2, "b": 4}, 6)


def test_fractions_share_the_input_size():
    sample = sample_of(4096, example_bytes=1000)
    workers, shards, default, rows, _ = choice(
        sample, sizes={None: 600 * MB}, fractions={"train": 0.5, "test": 0.5}, workers=2,
        shard_size_mb=100)
    assert (workers, shards, default, rows) == (2, {"train": 4, "test": 4}, 6, 600 * MB // 1000)
    # without --splits and without source splits: the default fractions
    _, shards, default, _, _ = choice(sample, sizes={None: 600 * MB}, shard_size_mb=100,
                                      default_fractions={"train": 0.75, "test": 0.25})
    assert (shards, default) == ({"train": 4, "test": 2}, 6)
    # --splits wins over the rows' own splits
    sample.source_splits = True
    sample.split_rows.update({"x": 10})
    _, shards, _, _, _ = choice(sample, sizes={None: 600 * MB}, fractions={"a": 1.0},
                                shard_size_mb=100)
    assert shards == {"a": 6}


def test_source_splits_sized_from_their_files_or_the_sample():
    sample = sample_of(4096, {"train": 3000, "validation": 96}, source_splits=True)
    _, shards, default, rows, _ = choice(
        sample, sizes={"train": 1000 * MB, "test": 10 * MB}, shard_size_mb=None)
    # validation is in the rows but has no file of its own: sized as the whole input
    assert shards == {"train": 7, "test": 1, "validation": 7} and default == 7
    assert rows == 1010 * MB // 1000
    # one unnamed input split by the pipeline: in the sample's proportions
    sample = sample_of(1000, {"train": 900, "validation": 50, "test": 50}, source_splits=True)
    _, shards, default, _, _ = choice(sample, sizes={None: 4000 * MB}, shard_size_mb=100)
    assert (shards, default) == ({"train": 36, "validation": 2, "test": 2}, 40)


def test_a_sample_of_one_row_shares_the_input_by_its_rows():
    sample = sample_of(1, {"test": 1}, source_splits=True)
    _, shards, default, _, _ = choice(sample, sizes={None: 300 * MB}, shard_size_mb=100)
    assert (shards, default) == ({"test": 3}, 3)


def test_rows_are_not_estimated_without_an_example_size():
    sample = sample_of(4096, example_bytes=0)
    assert choice(sample, sizes={None: 600 * MB})[3] is None
    assert choice(sample_of(4096), sizes={None: 0})[3] is None
