"""lmdb: environments of PNG images or serialized Examples, built here with the lmdb package."""
import io
import json
import pickle

import lmdb
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from pipelines import Row, load_pipeline
from tests import documented
from tests.pipeline_testutil import bad_row_reason, convert, load_all
from tftrain.data import example_bytes
from tftrain.errors import ConfigError, DataError

CLASSES = {"bird": (255, 0, 0), "cat": (0, 255, 0), "dog": (0, 0, 255)}


def make_db(path, items):
    """Writes `items` (key -> value, bytes or str keys) into a new LMDB environment at `path`."""
    env = lmdb.open(str(path), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for key, value in items.items():
            txn.put(key.encode() if isinstance(key, str) else key, value)
    env.close()
    return str(path)


def png(pixels):
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def class_images(per_class, size=8, seed=0):
    """`<class>/<i>.png` -> (pixels, class index): the class color plus noise, so classes are
    learnable and every image is distinct."""
    rng = np.random.default_rng(seed)
    images = {}
    for label, (name, color) in enumerate(sorted(CLASSES.items())):
        for i in range(per_class):
            noise = rng.integers(-40, 40, (size, size, 3))
            images[f"{name}/{i:03d}.png"] = (np.clip(np.array(color) + noise, 0, 255).astype(np.uint8), label)
    return images


def records(data_dir, split):
    """filename -> parsed standard image features, from the shards of a split."""
    manifest = json.loads((data_dir / "dataset.json").read_text())
    found = {}
    for shard in manifest["splits"][split]["shards"]:
        for raw in tf.data.TFRecordDataset(str(data_dir / shard["file"])):
            feature = tf.train.Example.FromString(raw.numpy()).features.feature
            found[feature["image/filename"].bytes_list.value[0].decode()] = feature
    return found


def test_image_values_with_class_keys_convert_over_two_workers(tmp_path, cli, capsys):
    images = class_images(per_class=6)
    db = make_db(tmp_path / "db", {key: png(pixels) for key, (pixels, _) in images.items()})
    out = tmp_path / "out"
    assert cli("convert", "--pipeline=lmdb", f"--input={db}", f"--output={out}", "--workers=2",
               "--num_shards=2", "--splits=train:1.0") == 0
    manifest = json.loads((out / "dataset.json").read_text())
    assert manifest["workers"] == 2 and manifest["pipeline"] == "lmdb"
    assert manifest["info"]["mode"] == "image" and manifest["info"]["class_names"] == ["bird", "cat", "dog"]
    assert manifest["info"]["image_size"] == [8, 8, 3]
    assert manifest["splits"]["train"]["num_examples"] == 18
    assert cli("inspect", f"--data={out}", "--verify") == 0
    assert "all intact" in capsys.readouterr().out

    stored = records(out, "train")
    assert sorted(stored) == sorted(images)  # the row key is the LMDB key
    for key, feature in stored.items():
        assert feature["image/encoded"].bytes_list.value[0] == png(images[key][0])
        assert feature["image/class/label"].int64_list.value[0] == images[key][1]
    loaded, labels = load_all(out, "train")
    by_pixels = {pixels.tobytes(): label for pixels, label in images.values()}
    assert len(loaded) == 18
    for image, label in zip(loaded, labels):
        assert by_pixels[np.round(image * 255).astype(np.uint8).tobytes()] == label  # PNG: exact


def test_labels_from_a_csv_file_and_keys_that_are_not_text(tmp_path):
    items = {key: png(np.full((4, 6, 3), value, np.uint8))
             for key, value in {"img-0": 0, "img-1": 9, b"\xff\x01": 200, "img-unlabeled": 0}.items()}
    db = make_db(tmp_path / "db", items)
    labels = tmp_path / "labels.csv"
    labels.write_text("key,label\nimg-0,zebra\nimg-1,ant\nff01,zebra\n")  # binary keys in hex
    manifest = convert("lmdb", db, tmp_path / "out", splits={"train": 1.0}, labels=str(labels))
    assert manifest["info"]["class_names"] == ["ant", "zebra"] and manifest["info"]["labels"] == "file"
    assert manifest["bad_rows"]["count"] == 1  # img-unlabeled
    stored = records(tmp_path / "out", "train")
    assert {k: f["image/class/text"].bytes_list.value[0].decode() for k, f in stored.items()} == {
        "img-0": "zebra", "img-1": "ant", "ff01": "zebra"}
    assert stored["img-1"]["image/class/label"].int64_list.value[0] == 0
    assert stored["img-0"]["image/height"].int64_list.value[0] == 4
    assert "no label for this key" in (tmp_path / "out" / "bad_rows.jsonl").read_text()
    _, loaded_labels = load_all(tmp_path / "out", "train")
    assert sorted(loaded_labels.tolist()) == [0, 1, 1]


def test_example_values_take_their_schema_from_the_records(tmp_path):
    rng = np.random.default_rng(0)
    items = {}
    for i in range(110):  # the schema comes from the first 100; the last two break it
        items[f"{i:04d}"] = example_bytes.example({
            "x": example_bytes.float_feature(rng.random(2 if i == 109 else 3).astype(np.float32)),
            "tokens": example_bytes.int64_feature(list(range(i % 4 + 1))),  # varies: variable length
            "name": example_bytes.bytes_feature(f"row {i}"),
            "label": example_bytes.int64_feature(7 if i == 108 else i % 5),
        })
    db = make_db(tmp_path / "db", items)
    manifest = convert("lmdb", db, tmp_path / "out", splits={"train": 1.0})
    assert manifest["info"]["mode"] == "example" and manifest["info"]["num_classes"] == 5
    assert manifest["features"] == {
        "label": {"dtype": "int64", "shape": []}, "name": {"dtype": "string", "shape": []},
        "tokens": {"dtype": "int64", "shape": [], "varlen": True}, "x": {"dtype": "float32", "shape": [3]}}
    assert manifest["splits"]["train"]["num_examples"] == 108
    reasons = (tmp_path / "out" / "bad_rows.jsonl").read_text()
    assert "feature 'x' has 2 value(s), the schema from the first 100 records says 3" in reasons
    assert "label 7 is not a class id below num_classes=5" in reasons
    from tftrain.data import load

    seen = 0
    for inputs, labels in load(str(tmp_path / "out"), "train", 8, training=False):
        for j, name in enumerate(inputs["name"].numpy()):
            source = tf.train.Example.FromString(items[f"{int(name.split()[1]):04d}"]).features.feature
            np.testing.assert_array_equal(inputs["x"][j].numpy(), source["x"].float_list.value)
            assert inputs["tokens"][j].numpy().tolist() == list(source["tokens"].int64_list.value)
            assert labels[j].numpy() == source["label"].int64_list.value[0]
            seen += 1
    assert seen == 108 and labels.dtype == tf.int32

    standard = make_db(tmp_path / "standard", {"a": example_bytes.example({
        "image/encoded": example_bytes.bytes_feature(b"..."),
        "image/class/label": example_bytes.int64_feature(2)})})
    info = load_pipeline("lmdb").prepare(standard)
    assert info["label_key"] == "image/class/label" and info["num_classes"] == 3


def test_bad_values_are_bad_rows_and_pickles_are_refused(tmp_path):
    images = class_images(per_class=3)
    items = {key: png(pixels) for key, (pixels, _) in images.items()}
    good = items["cat/000.png"]
    items.update({"cat/truncated.png": good[:40], "dog/random.bin": np.random.default_rng(1).bytes(64),
                  "no-class-key": good,
                  "dog/datum": b"\x08\x03\x10\x02\x18\x02\x22\x0c" + bytes(12) + b"\x28\x01"})
    db = make_db(tmp_path / "db", items)
    manifest = convert("lmdb", db, tmp_path / "out", splits={"train": 1.0})
    assert manifest["splits"]["train"]["num_examples"] == 9 and manifest["bad_rows"]["count"] == 4
    reasons = {row["key"]: row["reason"] for row in map(json.loads,
               (tmp_path / "out" / "bad_rows.jsonl").read_text().splitlines())}
    assert "truncated or corrupt PNG" in reasons["cat/truncated.png"]
    assert "not an image" in reasons["dog/random.bin"]
    assert "Caffe Datum" in reasons["dog/datum"]
    assert "carries no known class" in reasons["no-class-key"]

    # A pickle among the first records refuses the whole environment; one found later is a bad row.
    pipeline = load_pipeline("lmdb")
    info = pipeline.prepare(db)
    pickled_value = pickle.dumps({"image": good, "label": 2})
    assert "never unpickles" in bad_row_reason(pipeline, Row("dog/pickled", pickled_value), info)

    pickled = make_db(tmp_path / "pickled", {f"{i}": pickle.dumps(i) for i in range(3)})
    with pytest.raises(DataError, match="is a Python pickle .*never unpickles: unpickling runs"):
        load_pipeline("lmdb").prepare(pickled)
    datums = make_db(tmp_path / "datums", {"a": items["dog/datum"]})
    with pytest.raises(DataError, match="Caffe Datum protobuf, which tftrain does not read"):
        load_pipeline("lmdb").prepare(datums)
    examples = load_pipeline("lmdb", values="example")
    with pytest.raises(DataError, match="none of the first 13 values is a serialized tf.train.Example"):
        examples.prepare(db)
    with pytest.raises(ConfigError, match="option.*label_key are for example values"):
        load_pipeline("lmdb", label_key="y").prepare(db)
    with pytest.raises(ConfigError, match="not a readable LMDB environment"):
        (tmp_path / "empty").mkdir()
        load_pipeline("lmdb").prepare(str(tmp_path / "empty"))


def test_workers_read_disjoint_shares_in_key_order(tmp_path):
    db = make_db(tmp_path / "db", {f"train/a/{i}": png(np.zeros((2, 2, 3), np.uint8)) for i in range(7)}
                 | {f"test/b/{i}": png(np.zeros((2, 2, 3), np.uint8)) for i in range(3)})
    pipeline = load_pipeline("lmdb")
    info = pipeline.prepare(db)
    assert info["class_names"] == ["a", "b"] and info["source_splits"] == ["test", "train"]
    shares = [[row.key for row in pipeline.read(db, info, w, 3)] for w in range(3)]
    everything = [row.key for row in pipeline.read(db, info)]
    assert sorted(sum(shares, [])) == sorted(everything) and len(everything) == 10
    assert shares[1] == everything[1::3]
    assert {row.split for row in pipeline.read(db, info)} == {"train", "test"}
    assert bad_row_reason(pipeline, Row("train/a/x", b""), info) == "empty file"


def test_trains_on_a_converted_image_lmdb(tmp_path, cli, monkeypatch):
    """The pipelines page's lmdb command as written (in a fresh directory), on an environment
    and a labels file generated here in place of the user's /data/faces_lmdb and
    /data/faces_labels.csv; then a run trains on what it wrote."""
    images = class_images(per_class=40, seed=2)
    db = make_db(tmp_path / "db", {f"face-{i:03d}": png(pixels)
                                   for i, (pixels, _) in enumerate(images.values())})
    labels = tmp_path / "labels.csv"
    labels.write_text("key,label\n" + "".join(f"face-{i:03d},{name.split('/')[0]}\n"
                                              for i, name in enumerate(images)))
    monkeypatch.chdir(tmp_path)
    args = documented.args(
        "tftrain convert --pipeline=lmdb --input=/data/faces_lmdb --output=data/faces "
        "--pipeline_options=labels=/data/faces_labels.csv,image_size=112")
    assert cli(*[a.replace("/data/faces_lmdb", db).replace("/data/faces_labels.csv", str(labels))
                 for a in args]) == 0
    data = tmp_path / "data" / "faces"
    info = json.loads((data / "dataset.json").read_text())["info"]
    assert (info["image_size"], info["labels"]) == ([112, 112, 3], "file"), info
    assert info["class_names"] == sorted(CLASSES), info
    assert cli("train", f"--model_dir={tmp_path / 'run'}",
               f"--params_override=data.dir={data},model.name=mlp,model.params={{hidden_units: [32]}},"
               "train.epochs=2,train.learning_rate=0.01") == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["epochs"] == 2 and summary["eval"]["accuracy"] > 0.6
