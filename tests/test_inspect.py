"""`tftrain inspect`: the description, and --verify catching damage by file and record index."""
from __future__ import annotations

import json
import shutil

import pytest
import tensorflow as tf

from tests.test_convert import Pipeline
from tftrain.data import inspection
from tftrain.data.writer import write_dataset
from tftrain.errors import DataError
from tftrain.fileio import file_sha256


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("inspect") / "data")
    write_dataset(Pipeline(n=400), "", path, num_shards=2, workers=1, splits={"train": 1.0})
    return path


@pytest.fixture
def copy(dataset, tmp_path):
    target = tmp_path / "copy"
    shutil.copytree(dataset, target)
    return target


def shard(copy):
    manifest = json.loads((copy / "dataset.json").read_text())
    entry = manifest["splits"]["train"]["shards"][1]
    return copy / entry["file"], entry["file"]


def record_offset(path, index):
    """The byte offset where record `index` starts (TFRecord: 8+4 header, data, 4 footer)."""
    offset = 0
    for i, record in enumerate(tf.data.TFRecordDataset(str(path)).as_numpy_iterator()):
        if i == index:
            return offset
        offset += 16 + len(record)
    raise IndexError(index)


def test_describe(dataset):
    text = inspection.describe(dataset)
    assert "400 examples" in text and "pipeline tests.test_convert" in text
    assert "x" in text and "int64 []" in text
    assert "train: 400 examples in 2 shard(s)" in text
    assert "labels (label):" in text
    lines = text.splitlines()
    label_rows = lines[lines.index("labels (label):") + 2:]
    assert sum(int(line.split()[-1].replace(",", "")) for line in label_rows) == 400


def test_verify_passes_on_an_intact_dataset(dataset, cli, capsys):
    assert inspection.verify(dataset) == []
    assert cli("inspect", f"--data={dataset}", "--verify") == 0
    assert "all intact" in capsys.readouterr().out


def test_verify_names_the_record_with_a_flipped_byte(copy, cli, capsys):
    path, name = shard(copy)
    offset = record_offset(path, 57) + 14  # inside record 57's data
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))
    problems = inspection.verify(str(copy))
    assert {(p.file, p.record) for p in problems if p.record is not None} == {(name, 57)}
    assert any("sha256" in p.what for p in problems)
    assert cli("inspect", f"--data={copy}", "--verify") == 1
    err = capsys.readouterr().err
    assert f"{name}, record 57: corrupt record" in err


@pytest.mark.parametrize("into, message", [
    (30, r"damaged at byte 8,212: the record claims 53 bytes but only 14 remain"),
    (9, r"damaged at byte 8,212: the file ends inside the record's header \(9 of 12 bytes\)")])
def test_verify_catches_a_truncated_shard(copy, into, message):
    # Cut inside record 120's data (a DataLossError), or inside its header (reads as a clean end).
    path, name = shard(copy)
    cut = record_offset(path, 120) + into
    path.write_bytes(path.read_bytes()[:cut])
    with pytest.raises(DataError, match=rf"{name}, record 120: {message}"):
        inspection.verify_or_raise(str(copy))


def test_verify_catches_missing_files_wrong_counts_and_schema_mismatch(copy):
    manifest = json.loads((copy / "dataset.json").read_text())
    first, second = manifest["splits"]["train"]["shards"]
    # An intact TFRecord whose 3rd record lacks a required feature; sha and size made to match.
    path = copy / second["file"]
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i in range(5):
            features = {"x": tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))}
            if i != 2:
                features["label"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[0]))
                features["key"] = tf.train.Feature(  # large enough for the manifest's count
                    bytes_list=tf.train.BytesList(value=[b"k" * 1000]))
            writer.write(tf.train.Example(features=tf.train.Features(feature=features))
                         .SerializeToString())
    second["sha256"] = file_sha256(str(path))
    second["bytes"] = path.stat().st_size
    (copy / "dataset.json").write_text(json.dumps(manifest))
    (copy / first["file"]).unlink()
    problems = {str(p) for p in inspection.verify(str(copy))}
    assert f"{first['file']}: the file is missing" in problems
    assert any(p.startswith(f"{second['file']}, record 2: does not parse against the schema")
               for p in problems)
    assert any(p.startswith(f"{second['file']}: 5 records, the manifest says") for p in problems)


def train_error_line(cli, capsys, data, tmp_path) -> str:
    """`tftrain train` of a small mlp on `data`: it must fail with exit 1 and one error line,
    no traceback; returns that line."""
    code = cli("train", f"--model_dir={tmp_path / 'run'}",
               f"--params_override=data.dir={data},train.epochs=1,model.name=mlp,"
               "model.params={hidden_units: [16]}")
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err, err[-3000:]
    (line,) = [line for line in err.splitlines() if line.startswith("tftrain train: error:")]
    return line


def test_training_on_a_damaged_record_is_one_line_naming_the_dataset(digits_dir, tmp_path, cli,
                                                                      capsys):
    data = tmp_path / "digits"
    shutil.copytree(digits_dir, data)
    manifest = json.loads((data / "dataset.json").read_text())
    name = manifest["splits"]["train"]["shards"][0]["file"]
    path = data / name
    damaged = bytearray(path.read_bytes())
    damaged[record_offset(path, 300) + 20] ^= 0x01  # inside record 300's data
    path.write_bytes(bytes(damaged))
    line = train_error_line(cli, capsys, data, tmp_path)
    assert f"a damaged record in {data}: TensorFlow found a corrupted record at byte " in line
    assert f"`tftrain inspect --data={data} --verify` names the file and record" in line
    assert cli("inspect", f"--data={data}", "--verify") == 1  # and it does
    assert f"{name}, record 300: corrupt record" in capsys.readouterr().err


def test_training_on_a_raw_image_of_the_wrong_size_is_one_line(digits_dir, tmp_path, cli, capsys):
    """A shard rewritten after the conversion (valid records, one image 2 bytes short)."""
    data = tmp_path / "digits"
    shutil.copytree(digits_dir, data)
    manifest = json.loads((data / "dataset.json").read_text())
    assert manifest["info"]["image_encoding"] == "raw"
    path = data / manifest["splits"]["train"]["shards"][0]["file"]
    records = [bytes(r) for r in tf.data.TFRecordDataset(str(path)).as_numpy_iterator()]
    example = tf.train.Example.FromString(records[100])
    pixels = example.features.feature["image/encoded"].bytes_list
    pixels.value[0] = pixels.value[0][:-2]
    records[100] = example.SerializeToString()
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record)
    manifest["splits"]["train"]["shards"][0]["bytes"] = path.stat().st_size  # consistent sizes
    (data / "dataset.json").write_text(json.dumps(manifest))
    line = train_error_line(cli, capsys, data, tmp_path)
    assert (f"a record in {data} does not match its manifest: an image_encoding=raw image of 62 "
            "bytes where image_size 8x8x1 needs 64" in line), line
    assert cli("inspect", f"--data={data}", "--verify") == 1  # the shard is not the one written
