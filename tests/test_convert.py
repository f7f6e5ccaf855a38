"""The converter: workers, splits, bad rows, --max_bad_fraction, overwrite, errors, the CLI.

This module also defines a small synthetic pipeline (`Pipeline`), loadable as
`--pipeline=tests.test_convert`, whose options inject bad rows, failures and slowness.
"""
from __future__ import annotations

import io
import json
import os
import signal

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from pipelines import load_pipeline
from pipelines.base import BasePipeline, Row
from tftrain.data import manifest as manifest_lib
from tftrain import dir_lock, ownership
from tftrain.data import shard_plan
from tftrain.data.progress import Progress
from tftrain.data.splits import assign_split
from tftrain.data.writer import write_dataset
from tftrain.errors import BadRow, ConfigError, DataError, TftrainError

FEATURES = {"x": {"dtype": "int64", "shape": []}, "label": {"dtype": "int64", "shape": []},
            "key": {"dtype": "string", "shape": []}}


class Pipeline(BasePipeline):
    """Rows `row/00000`.. with value i. Options (strings, as from --pipeline_options):
    n (rows), bad_every (encode raises BadRow when i % bad_every == 1), bad_read_every (read
    yields a BadRow value), fail_at (encode raises RuntimeError), kill_at (the process
    SIGKILLs itself encoding that row)."""

    name = "tests.test_convert"
    default_splits = {"train": 0.8, "test": 0.2}

    def __init__(self, **options):
        super().__init__(**options)
        self.n = int(options.get("n", 200))
        self.bad_every = int(options.get("bad_every", 0))
        self.bad_read_every = int(options.get("bad_read_every", 0))
        self.fail_at = int(options.get("fail_at", -1))
        self.kill_at = int(options.get("kill_at", -1))

    def prepare(self, source):
        return {"num_classes": 3}

    def read(self, source, info, worker=0, num_workers=1):
        for i in range(worker, self.n, num_workers):
            if self.bad_read_every and i % self.bad_read_every == 2:
                yield Row(key=f"row/{i:05d}", value=BadRow("unreadable source record"))
            else:
                yield Row(key=f"row/{i:05d}", value=i)

    def features(self, info):
        return dict(FEATURES)

    def encode(self, row, info):
        i = row.value
        if i == self.kill_at:  # a worker dying without a word (the OOM killer, kill -9)
            os.kill(os.getpid(), signal.SIGKILL)
        if i == self.fail_at:
            raise RuntimeError("the pipeline has a bug")
        if self.bad_every and i % self.bad_every == 1 % self.bad_every:
            raise BadRow(f"value {i} is unlucky")
        return tf.train.Example(features=tf.train.Features(feature={
            "x": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 3])),
            "key": tf.train.Feature(bytes_list=tf.train.BytesList(value=[row.key.encode()]))}))

    def decode(self, features, info):
        return features["x"], features["label"]


def records(data_dir, split):
    """The keys of every record of a split, read straight from its shard files."""
    manifest = manifest_lib.read(str(data_dir))
    keys = []
    for path in manifest_lib.shard_files(str(data_dir), manifest, split):
        for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
            keys.append(tf.train.Example.FromString(record).features.feature["key"].bytes_list.value[0].decode())
    return keys


def output_names(path):
    """The directory's files, without the lock file (which stays, see dir_lock) and the
    conversion marker (which stays after a failure, claiming bad_rows.jsonl for the rerun)."""
    return sorted(n for n in os.listdir(path)
                  if n not in (dir_lock.CONVERT_LOCK, ownership.CONVERT_MARKER))


def test_workers_1_and_2_write_the_same_examples_deterministically(tmp_path):
    pipeline = Pipeline(n=300)
    one = write_dataset(pipeline, "", str(tmp_path / "w1"), workers=1, num_shards=4, seed=3)
    two = write_dataset(pipeline, "", str(tmp_path / "w2"), workers=2, num_shards=4, seed=3)
    assert one["workers"] == 1 and two["workers"] == 2
    for split in ("train", "test"):
        assert sorted(records(tmp_path / "w1", split)) == sorted(records(tmp_path / "w2", split))
        assert one["splits"][split]["num_examples"] == two["splits"][split]["num_examples"]
        assert len(two["splits"][split]["shards"]) == 4
    assert one["splits"]["train"]["num_examples"] + one["splits"]["test"]["num_examples"] == 300
    # Each worker owns shards j % 2 == worker, and a row lives in exactly one shard.
    keys = [k for s in ("train", "test") for k in records(tmp_path / "w2", s)]
    assert len(keys) == len(set(keys)) == 300
    # Label counts recorded at conversion time match the records.
    counts = two["splits"]["train"]["label_counts"]
    assert sum(counts.values()) == two["splits"]["train"]["num_examples"]
    assert set(counts) == {"0", "1", "2"}
    # Same worker count and seed: byte-identical shards; another seed: another placement.
    again = write_dataset(pipeline, "", str(tmp_path / "w2"), workers=2, num_shards=4, seed=3,
                          overwrite=True)
    assert again["splits"] == two["splits"]
    other = write_dataset(pipeline, "", str(tmp_path / "w1s"), workers=1, num_shards=4, seed=4)
    assert [s["sha256"] for s in other["splits"]["train"]["shards"]] != \
        [s["sha256"] for s in one["splits"]["train"]["shards"]]
    assert not [n for n in output_names(tmp_path / "w2") if "tmp" in n]


def test_splits_are_deterministic_and_stable_when_rows_are_added(tmp_path):
    fractions = {"train": 0.6, "validation": 0.2, "test": 0.2}
    small = write_dataset(Pipeline(n=150), "", str(tmp_path / "small"), splits=fractions, workers=1)
    big = write_dataset(Pipeline(n=250), "", str(tmp_path / "big"), splits=fractions, workers=1)
    assert set(small["splits"]) == set(big["splits"]) == set(fractions)
    for split in fractions:
        before = set(records(tmp_path / "small", split))
        after = set(records(tmp_path / "big", split))
        assert before <= after  # no old row moved to another split
        assert before == {k for k in after if int(k.split("/")[1]) < 150}
    assert sum(s["num_examples"] for s in big["splits"].values()) == 250
    n = big["splits"]["train"]["num_examples"]
    assert 0.45 * 250 < n < 0.75 * 250
    assert all(assign_split(f"row/{i:05d}", fractions) == assign_split(f"row/{i:05d}", fractions)
               for i in range(50))


def _png(size=8) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((size, size, 3), 128, np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_each_kind_of_bad_row_is_skipped_and_recorded(tmp_path):
    # Images: a truncated PNG, a text file named .png, an empty file; 37 good ones.
    for cls in ("cat", "dog"):
        (tmp_path / "img" / cls).mkdir(parents=True)
    for i in range(37):
        (tmp_path / "img" / ("cat", "dog")[i % 2] / f"{i:03d}.png").write_bytes(_png())
    (tmp_path / "img" / "cat" / "truncated.png").write_bytes(_png()[:40])
    (tmp_path / "img" / "dog" / "notes.png").write_bytes(b"this is not an image\n")
    (tmp_path / "img" / "dog" / "empty.png").write_bytes(b"")
    # CSV: a missing column, a wrong type, a NaN.
    lines = ["a,b,label"] + [f"{i},{i * 0.5},{i % 2}" for i in range(40)]
    lines += ["1,2", "x,1.0,0", "3,nan,1"]
    (tmp_path / "table.csv").write_text("\n".join(lines) + "\n")
    # JSONL: an empty text.
    texts = [json.dumps({"text": f"word{i} other", "label": i % 2}) for i in range(40)]
    texts.append(json.dumps({"text": "", "label": 0}))
    (tmp_path / "text.jsonl").write_text("\n".join(texts) + "\n")

    cases = {"image_folder": ("img", {"truncated.png", "notes.png", "empty.png"}),
             "csv": ("table.csv", 3), "jsonl": ("text.jsonl", 1)}
    for name, (source, expected) in cases.items():
        out = tmp_path / f"out-{name}"
        manifest = write_dataset(load_pipeline(name), str(tmp_path / source), str(out), workers=1,
                                 max_bad_fraction=0.2)
        bad = [json.loads(line) for line in (out / "bad_rows.jsonl").read_text().splitlines()]
        count = len(expected) if isinstance(expected, set) else expected
        assert manifest["bad_rows"]["count"] == len(bad) == count, (name, bad)
        assert manifest["bad_rows"]["file"] == "bad_rows.jsonl"
        assert all(b["key"] and b["reason"] and b["split"] for b in bad)
        if isinstance(expected, set):
            assert {b["key"].rsplit("/", 1)[1] for b in bad} == expected
        total = sum(s["num_examples"] for s in manifest["splits"].values())
        assert total == 37 if name == "image_folder" else total == 40


def test_bad_rows_from_read_and_encode_in_workers(tmp_path):
    manifest = write_dataset(Pipeline(n=400, bad_every=50, bad_read_every=100), "",
                             str(tmp_path / "out"), workers=2, num_shards=2, max_bad_fraction=0.05)
    bad = [json.loads(line) for line in (tmp_path / "out" / "bad_rows.jsonl").read_text().splitlines()]
    assert manifest["bad_rows"]["count"] == len(bad) == 8 + 4
    assert {b["reason"] for b in bad} >= {"unreadable source record", "value 51 is unlucky"}
    assert sum(manifest["bad_rows"]["by_split"].values()) == 12
    assert sum(s["num_examples"] for s in manifest["splits"].values()) == 400 - 12


def test_max_bad_fraction_fails_and_leaves_no_dataset(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(DataError, match=r"40 of 200 rows \(20.00%\) are bad.*max_bad_fraction=0.1"):
        write_dataset(Pipeline(n=200, bad_every=5), "", str(out), workers=1, max_bad_fraction=0.1)
    assert not manifest_lib.exists(str(out))
    assert output_names(out) == ["bad_rows.jsonl"]  # kept to show which rows were bad
    manifest = write_dataset(Pipeline(n=200, bad_every=5), "", str(out), workers=1,
                             max_bad_fraction=0.25)
    assert manifest["bad_rows"]["count"] == 40
    with pytest.raises(ConfigError, match="max_bad_fraction"):
        write_dataset(Pipeline(), "", str(tmp_path / "x"), max_bad_fraction=1.5)


def test_all_bad_rows_fail_fast(tmp_path):
    with pytest.raises(DataError, match="are all bad rows"):
        write_dataset(Pipeline(n=5000, bad_every=1), "", str(tmp_path / "out"), workers=1)


def test_existing_dataset_needs_overwrite(tmp_path):
    out = str(tmp_path / "out")
    write_dataset(Pipeline(n=50), "", out, workers=1, num_shards=3)
    with pytest.raises(TftrainError, match="--overwrite"):
        write_dataset(Pipeline(n=60), "", out, workers=1)
    manifest = write_dataset(Pipeline(n=60), "", out, workers=1, num_shards=1, overwrite=True)
    assert sum(s["num_examples"] for s in manifest["splits"].values()) == 60
    # The old 3-shard files are gone, not mixed in.
    assert output_names(out) == ["dataset.json", "test-00000-of-00001.tfrecord",
                                 "train-00000-of-00001.tfrecord"]


def test_a_failing_worker_is_one_clear_error_and_publishes_nothing(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(DataError, match=r"worker 1 of 2 failed: .*RuntimeError: the pipeline has a "
                       r"bug \(while encoding row 'row/00101'\)"):
        write_dataset(Pipeline(n=400, fail_at=101), "", str(out), workers=2, num_shards=2)
    assert not manifest_lib.exists(str(out))
    assert [n for n in output_names(out) if n.endswith(".tfrecord") or "tmp" in n] == []
    with pytest.raises(DataError, match=r"failed: RuntimeError: the pipeline has a bug"):
        write_dataset(Pipeline(n=50, fail_at=7), "", str(out), workers=1)
    with pytest.raises(DataError, match=r"worker 1 of 2 was killed by signal 9 .*without reporting"):
        write_dataset(Pipeline(n=400, kill_at=301), "", str(out), workers=2, num_shards=2)
    assert [n for n in output_names(out) if n.endswith(".tfrecord") or "tmp" in n] == []


def test_shard_sizing():
    mb = shard_plan.MB
    assert shard_plan.shards_for(10 * mb, 150, 1) == 1
    assert shard_plan.shards_for(10 * mb, 150, 4) == 4  # at least one per worker
    assert shard_plan.shards_for(1500 * mb, 150, 1) == 10
    assert shard_plan.shards_for(1500 * mb, 150, 4) % 4 == 0
    sample = shard_plan.Sample(rows=4096, encoded_rows=64, encoded_bytes=64 * 1000)
    workers, shards, default, rows, _ = shard_plan.choose(
        sample=sample, sizes={None: 600 * mb}, fractions={"train": 0.5, "test": 0.5},
        default_fractions={"train": 1.0}, workers=2, num_shards=None, shard_size_mb=100)
    assert workers == 2 and shards == {"train": 4, "test": 4} and default == 6
    assert rows == 600 * mb // 1000
    # Source splits sized from the input's split folders.
    sample.source_splits = True
    sample.split_rows.update({"train": 10})
    _, shards, _, _, _ = shard_plan.choose(
        sample=sample, sizes={"train": 1000 * mb, "test": 10 * mb}, fractions=None,
        default_fractions={"train": 1.0}, workers=1, num_shards=None, shard_size_mb=None)
    assert shards == {"train": 7, "test": 1}
    # A pipeline that splits its rows itself (text passages) from one unnamed input: the
    # splits share its size in the sample's proportions, not each the whole of it.
    sample = shard_plan.Sample(rows=1000, source_splits=True, encoded_rows=64,
                               encoded_bytes=64 * 1000)
    sample.split_rows.update({"train": 900, "validation": 50, "test": 50})
    _, shards, _, _, _ = shard_plan.choose(
        sample=sample, sizes={None: 4000 * mb}, fractions=None,
        default_fractions={"train": 1.0}, workers=1, num_shards=None, shard_size_mb=100)
    assert shards == {"train": 36, "validation": 2, "test": 2}
    with pytest.raises(ConfigError, match="either --num_shards or --shard_size_mb"):
        shard_plan.choose(sample=sample, sizes=None, fractions=None, default_fractions={},
                          workers=1, num_shards=2, shard_size_mb=10)


def test_shard_size_mb_sets_the_shard_count(tmp_path):
    # ~330 bytes per example x 2000 rows ~ 0.6 MB; 0.1 MB shards -> about 6.
    manifest = write_dataset(load_pipeline("digits"), "", str(tmp_path / "out"), workers=1,
                             shard_size_mb=0.1, splits={"train": 1.0})
    shards = manifest["splits"]["train"]["shards"]
    assert 4 <= len(shards) <= 8
    assert all(abs(s["bytes"] - 0.1 * shard_plan.MB) < 0.05 * shard_plan.MB for s in shards)


def test_an_embedded_dataset_is_converted_without_worker_processes(tmp_path, monkeypatch):
    """digits and diabetes know their size, and a small source of unknown size is read whole by
    its sample: no forkserver (a TensorFlow import) is started for them."""
    from tftrain.data import processes

    started = []
    monkeypatch.setattr(processes, "warm_up", lambda: started.append(True))
    for name in ("digits", "diabetes"):
        pipeline = load_pipeline(name)
        manifest = write_dataset(pipeline, "", str(tmp_path / name), progress=False)
        total = sum(split["num_examples"] for split in manifest["splits"].values())
        assert total == pipeline.known_num_rows("") and manifest["stats"]["workers"] == 1
    assert started == []
    assert processes.needs_workers(load_pipeline("digits"), "", 2)  # asked for
    assert not processes.needs_workers(Pipeline(n=10_000), "", 1)
    # A source of unknown size starts the server only when its plan has several workers.
    assert not processes.needs_workers(Pipeline(n=10), "", None)
    manifest = write_dataset(Pipeline(n=10), "", str(tmp_path / "small"), progress=False)
    assert manifest["stats"]["workers"] == 1 and started == []


def test_progress_bar_on_a_terminal_and_log_lines_otherwise():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = Terminal()
    meter = Progress(1000, stream=stream, redraw_s=0)
    meter.update(100, 5 << 20)
    meter.close()
    text = stream.getvalue()
    assert "\r" in text and "ex/s" in text and "MB/s" in text and "ETA" in text and "10%" in text
    quiet = io.StringIO()
    meter = Progress(None, stream=quiet, log_every_s=0)
    meter.update(5, 10)
    meter.close()
    assert quiet.getvalue() == ""  # not a terminal: absl log lines instead of a bar
    assert "5 examples" in meter.line()


def test_pipeline_options_parsing():
    from tftrain.cli.convert import parse_pipeline_options

    assert parse_pipeline_options("") == {}
    assert parse_pipeline_options("n=3, columns=a:float,b:int,label_column=y") == {
        "n": "3", "columns": "a:float,b:int", "label_column": "y"}
    with pytest.raises(ConfigError, match="key=value"):
        parse_pipeline_options("justtext")
    with pytest.raises(ConfigError, match="twice"):
        parse_pipeline_options("n=1,n=2")


def test_cli_convert_and_inspect(tmp_path, cli, capsys):
    out = str(tmp_path / "out")
    assert cli("convert", "--pipeline=tests.test_convert", f"--output={out}",
               "--pipeline_options=n=120,bad_every=60", "--num_shards=2", "--workers=1",
               "--max_bad_fraction=0.05") == 0
    printed = capsys.readouterr().out
    assert "wrote" in printed and "2 bad row(s) skipped" in printed and "bad_rows.jsonl" in printed
    assert cli("convert", "--pipeline=tests.test_convert", f"--output={out}") == 1
    assert "already holds a complete dataset; pass --overwrite" in capsys.readouterr().err
    assert cli("convert", "--pipeline=tests.test_convert", f"--output={out}", "--overwrite",
               "--num_shards=2", "--shard_size_mb=5") == 2
    assert "either --num_shards or --shard_size_mb" in capsys.readouterr().err
    assert manifest_lib.exists(out)  # a flag error never touches the existing dataset
    assert cli("convert", "--pipeline=tests.test_convert", f"--output={tmp_path / 'y'}",
               "--pipeline_options=n=100,bad_every=2") == 1
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("tftrain convert: error:")]
    assert len(errors) == 1 and "are bad, above --max_bad_fraction=0.01" in errors[0]
    assert cli("convert", "--pipeline=digits", f"--output={tmp_path / 'z'}",
               "--beam_options=--runner=DirectRunner") == 2
    assert cli("inspect", f"--data={out}", "--verify") == 0
    printed = capsys.readouterr().out
    assert "train" in printed and "labels (label)" in printed and "all intact" in printed


def test_the_documented_user_pipeline_converts_and_loads(tmp_path, monkeypatch):
    """docs/pipelines.md's "Your own dataset kind" example, run as written (with 2 workers)."""
    from tftrain.data import load

    docs = open(os.path.join(os.path.dirname(__file__), "..", "docs", "pipelines.md")).read()
    code = docs.split("### Your own dataset kind", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "my_pkg").mkdir()
    (tmp_path / "my_pkg" / "__init__.py").write_text("")
    (tmp_path / "my_pkg" / "sensors.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    rng = np.random.default_rng(0)
    lines = [",".join(f"{v:.3f}" for v in rng.random(8)) + f",{i % 3}" for i in range(300)]
    lines[7] = "1,2,3"  # a bad row
    (tmp_path / "sensors.csv").write_text("\n".join(lines) + "\n")
    manifest = write_dataset(load_pipeline("my_pkg.sensors"), str(tmp_path / "sensors.csv"),
                             str(tmp_path / "out"), workers=2, num_shards=2,
                             max_bad_fraction=0.05, progress=False)
    assert manifest["bad_rows"]["count"] == 1
    assert sum(s["num_examples"] for s in manifest["splits"].values()) == 299
    assert manifest["splits"]["train"]["label_counts"]  # labels counted from the bytes
    with pytest.raises(DataError, match="tftrain does not import code that a dataset names"):
        load(str(tmp_path / "out"), "train", 500, training=False)  # the user named no module
    x, y = next(iter(load(str(tmp_path / "out"), "train", 500, training=False,
                          pipeline="my_pkg.sensors")))
    assert x.shape[1:] == (8,) and x.dtype == tf.float32 and set(y.numpy()) == {0, 1, 2}
