"""A damaged or hostile dataset never crashes or hangs a reader (issue #23, defect 2): every file
is checked before TensorFlow opens it (`tftrain.data.dataset_files`)."""
from __future__ import annotations

import json
import os
import shutil
import struct

import pytest

from tests import forked_cli
from tests.test_inspect import train_error_line
from tftrain.data import dataset_files, record_file
from tftrain.data.record_file import DamagedFile, RecordFile, masked_crc32c

HUGE = 1 << 40


def huge_header_record(path):
    """Rewrites the first record's length header of `path` to claim 2^40 bytes, with a valid
    checksum of that length, which TensorFlow's reader trusts."""
    data = path.read_bytes()
    length = struct.pack("<Q", HUGE)
    path.write_bytes(length + masked_crc32c(length) + data[12:])


@pytest.fixture
def digits_copy(digits_dir, tmp_path):
    target = tmp_path / "digits"
    shutil.copytree(digits_dir, target)
    return target


def test_check_frames_counts_and_refuses_lengths_past_the_end(tmp_path):
    path = tmp_path / "x.tfrecord"
    with RecordFile(str(path)) as f:
        for size in (0, 5, 70_000, 3):
            f.write(b"r" * size)
    assert record_file.check_frames(str(path)) == 4
    huge_header_record(path)
    with pytest.raises(DamagedFile, match=r"record 0: damaged at byte 0: the record claims "
                                          "1,099,511,627,776 bytes"):
        record_file.check_frames(str(path))
    with RecordFile(str(path)) as f:
        f.write(b"abc")
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(DamagedFile, match="claims 3 bytes but only 2 remain"):
        record_file.check_frames(str(path))
    path.write_bytes(path.read_bytes()[:7])
    with pytest.raises(DamagedFile, match="ends inside the record's header"):
        record_file.check_frames(str(path))


def shard_of(data, split="test"):
    manifest = json.loads((data / "dataset.json").read_text())
    return data / manifest["splits"][split]["shards"][0]["file"]


def test_a_huge_length_header_is_one_line_not_a_segfault(digits_copy):
    """In a process of its own: before the fix, `inspect --verify` died with SIGSEGV (exit 139)."""
    huge_header_record(shard_of(digits_copy))
    done = forked_cli.run(["inspect", f"--data={digits_copy}", "--verify"], timeout=120)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert "record 0: damaged at byte 0: the record claims 1,099,511,627,776 bytes" in done.stderr


@pytest.mark.parametrize("kind", ["huge header", "link to /dev/zero", "fifo", "directory",
                                  "link out"])
def test_inspect_and_train_on_a_hostile_shard_end_in_one_line(kind, digits_copy, tmp_path, cli,
                                                               capsys):
    outside = tmp_path / "outside.tfrecord"
    for split in ("train", "validation", "test"):
        shard = shard_of(digits_copy, split)
        if kind == "huge header":
            huge_header_record(shard)
            continue
        shutil.copy(shard, outside)
        shard.unlink()
        if kind == "link to /dev/zero":
            os.symlink("/dev/zero", shard)
        elif kind == "fifo":
            os.mkfifo(shard)
        elif kind == "directory":
            shard.mkdir()
        else:
            os.symlink(outside, shard)
    expected = {"huge header": "the record claims 1,099,511,627,776 bytes",
                "link to /dev/zero": "leads out of the dataset directory",
                "fifo": "is a FIFO, not a TFRecord file", "directory": "is a directory",
                "link out": "leads out of the dataset directory"}[kind]
    assert cli("inspect", f"--data={digits_copy}", "--verify") == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and expected in err
    assert expected in train_error_line(cli, capsys, digits_copy, tmp_path)


def test_a_shard_changed_after_conversion_is_refused_before_reading(digits_copy, tmp_path, cli,
                                                                    capsys):
    shard = shard_of(digits_copy, "train")
    shard.write_bytes(shard.read_bytes() + b"extra")
    assert "bytes where the manifest says" in train_error_line(cli, capsys, digits_copy, tmp_path)


def test_a_link_inside_the_dataset_is_read(digits_copy, tmp_path):
    shard = shard_of(digits_copy, "test")
    shard.rename(digits_copy / "elsewhere.bin")
    os.symlink("elsewhere.bin", shard)
    assert dataset_files.check(str(shard), str(digits_copy)) == 189


def test_foreign_tfrecords_are_walked_too(digits_copy, tmp_path, cli, capsys):
    """`data.format: tfrecord` counts records of files tftrain did not write: by their headers."""
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    for split in ("train", "validation", "test"):
        shutil.copy(shard_of(digits_copy, split), foreign / f"{split}-0.tfrecord")
    huge_header_record(foreign / "train-0.tfrecord")
    code = cli("train", f"--model_dir={tmp_path / 'run'}",
               f"--params_override=data.dir={foreign},data.format=tfrecord,data.pipeline=digits,"
               "data.info={num_classes: 10},train.epochs=1,model.name=mlp,"
               "model.params={hidden_units: [16]}")
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err, err[-2000:]
    assert "the record claims 1,099,511,627,776 bytes" in err


def damaged_manifest(data, change):
    """Applies `change` to the manifest of `data`; a change that returns text writes that."""
    manifest = json.loads((data / "dataset.json").read_text())
    text = change(manifest)
    (data / "dataset.json").write_text(text if isinstance(text, str) else json.dumps(manifest))


def set_path(path, value):
    def change(manifest):
        *parents, last = path
        node = manifest
        for key in parents:
            node = node[key]
        node[last] = value
    return change


TRAIN_SHARD = ["splits", "train", "shards", 0]


@pytest.mark.parametrize("change, expected", [
    (set_path(["splits", "train", "num_examples"], -5),
     "splits.train.num_examples: -5 is not a non-negative integer"),
    (set_path(["splits", "train", "num_examples"], 1e18),
     "splits.train.num_examples: 1e+18 is not a non-negative integer"),
    (set_path(["splits", "train", "num_examples"], 10**18),
     "splits.train.num_examples: 1,000,000,000,000,000,000, but its shards hold 1,426"),
    (set_path(TRAIN_SHARD + ["num_examples"], 10**9),
     "records cannot fit in"),
    (set_path(TRAIN_SHARD + ["num_examples"], True),
     "splits.train.shards[0].num_examples: True is not a non-negative integer"),
    (set_path(["splits", "train", "shards"], []), "splits.train.shards: missing or empty"),
    (set_path(TRAIN_SHARD + ["file"], "../outside.tfrecord"), "is not a file name inside"),
    (set_path(TRAIN_SHARD + ["file"], "/etc/passwd"), "is not a file name inside"),
    (set_path(["features", "image/encoded", "dtype"], "complex128"), "is not one of string"),
    (set_path(["features", "image/encoded", "shape"], [-1]), "is not a list of non-negative"),
    (set_path(["splits"], "train"), "splits: a str, not an object"),
    (set_path(["pipeline"], 7), "pipeline: 7 is not a pipeline name"),
    (set_path(["info", "num_classes"], "ten"), "info.num_classes: 'ten' is not a positive"),
    (set_path(["info", "num_classes"], 100_000_001), "is not a positive integer up to 10,000,000"),
    (lambda m: m.pop("features"), "features: missing"),
    (lambda m: json.dumps(m)[:-1] + ', "deep": ' + "[" * 100_000 + "]" * 100_000 + "}",
     "nested too deeply"),
], ids=lambda value: value if isinstance(value, str) else "")
def test_a_bad_manifest_is_refused_with_a_line_per_problem(change, expected, digits_copy, tmp_path,
                                                           cli, capsys):
    damaged_manifest(digits_copy, change)
    assert cli("inspect", f"--data={digits_copy}") == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and expected in err, err[-2000:]
    assert "tftrain inspect: error:" in err


def test_non_utf8_and_non_object_manifests(digits_copy, cli, capsys):
    for content in (b"\xff\xfe{}", b"[1, 2]", b"null"):
        (digits_copy / "dataset.json").write_bytes(content)
        assert cli("inspect", f"--data={digits_copy}") == 1
        err = capsys.readouterr().err
        assert "Traceback" not in err and "dataset.json" in err, err[-2000:]


def test_a_num_examples_that_lies_does_not_train(digits_copy, tmp_path, cli, capsys):
    """Before, -5 trained 1 step and exported a model (exit 0); 1e18 trained forever."""
    damaged_manifest(digits_copy, set_path(["splits", "train", "num_examples"], -5))
    assert "not a non-negative integer" in train_error_line(cli, capsys, digits_copy, tmp_path)
    assert not (tmp_path / "run" / "export").exists()


@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_special_files_in_place_of_json_and_yaml_never_block(kind, digits_copy, tmp_path, cli,
                                                             capsys):
    """dataset.json, a run's marker and params.yaml from elsewhere: a FIFO would block the read
    forever, /dev/zero would never end."""
    def plant(path):
        path.unlink(missing_ok=True)
        os.mkfifo(path) if kind == "fifo" else os.symlink("/dev/zero", path)

    plant(digits_copy / "dataset.json")
    assert cli("inspect", f"--data={digits_copy}") == 1
    err = capsys.readouterr().err
    assert "is not a valid manifest" in err or "leads out of" in err
    run = tmp_path / "run"
    run.mkdir()
    plant(run / ".tftrain.json")
    plant(run / "params.yaml")
    assert cli("train", f"--model_dir={run}", f"--params_override=data.dir={digits_copy}") == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and ": error: " in err


def test_a_manifest_that_links_out_of_the_dataset_is_refused(digits_copy, tmp_path, cli, capsys):
    outside = tmp_path / "elsewhere.json"
    (digits_copy / "dataset.json").rename(outside)
    os.symlink(outside, digits_copy / "dataset.json")
    assert cli("inspect", f"--data={digits_copy}") == 1
    assert "leads out of" in capsys.readouterr().err
