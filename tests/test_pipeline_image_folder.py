"""image_folder: real PNG/JPEG files in class folders, converted and read back."""
import io

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from pipelines import Row, load_pipeline
from tests.pipeline_testutil import bad_row_reason, convert, load_all
from tftrain.errors import ConfigError

COLORS = {"bird": (255, 0, 0), "cat": (0, 255, 0), "dog": (0, 0, 255)}


def save_image(path, color, size=(16, 16), fmt="PNG"):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path, format=fmt)


def make_folder(root, per_class=4):
    for name, color in COLORS.items():
        for i in range(per_class):
            fmt = "JPEG" if i % 2 else "PNG"
            save_image(root / name / f"{i}.{'jpg' if i % 2 else 'png'}", color, fmt=fmt)
    return root


def test_converts_class_folders_keeping_bytes_and_standard_keys(tmp_path):
    src = make_folder(tmp_path / "src")
    save_image(src / "cat" / "wide.png", COLORS["cat"], size=(24, 10))  # width 24, height 10
    (src / "cat" / "notes.txt").write_text("not an image and not an image extension: ignored")
    manifest = convert("image_folder", src, tmp_path / "out", splits={"train": 1.0}, image_size=8)

    assert manifest["info"]["class_names"] == ["bird", "cat", "dog"]
    assert manifest["info"]["num_classes"] == 3
    assert manifest["info"]["image_size"] == [8, 8, 3]
    assert manifest["splits"]["train"]["num_examples"] == 13
    assert manifest["bad_rows"]["count"] == 0

    records = {}
    for shard in manifest["splits"]["train"]["shards"]:
        for raw in tf.data.TFRecordDataset(str(tmp_path / "out" / shard["file"])):
            example = tf.train.Example.FromString(raw.numpy()).features.feature
            records[example["image/filename"].bytes_list.value[0].decode()] = example
    assert len(records) == 13
    wide = records["cat/wide.png"]
    assert wide["image/encoded"].bytes_list.value[0] == (src / "cat" / "wide.png").read_bytes()
    assert wide["image/height"].int64_list.value[0] == 10
    assert wide["image/width"].int64_list.value[0] == 24
    assert wide["image/format"].bytes_list.value[0] == b"png"
    assert wide["image/class/label"].int64_list.value[0] == 1
    assert wide["image/class/text"].bytes_list.value[0] == b"cat"
    assert records["dog/1.jpg"]["image/format"].bytes_list.value[0] == b"jpeg"

    images, labels = load_all(tmp_path / "out", "train")
    assert images.shape == (13, 8, 8, 3) and images.dtype == np.float32
    assert sorted(labels.tolist()) == [0] * 4 + [1] * 5 + [2] * 4
    for image, label in zip(images, labels):
        color = np.array(COLORS[manifest["info"]["class_names"][label]]) / 255.0
        # The center pixel is the class color (JPEG within a small error; the wide image is padded).
        np.testing.assert_allclose(image[4, 4], color, atol=0.05)


def test_source_split_folders_are_kept(tmp_path):
    src = tmp_path / "src"
    make_folder(src / "train", per_class=3)
    make_folder(src / "test", per_class=1)
    save_image(src / "validation" / "cat" / "v.png", COLORS["cat"])
    manifest = convert("image_folder", src, tmp_path / "out")
    counts = {name: split["num_examples"] for name, split in manifest["splits"].items()}
    assert counts == {"train": 9, "test": 3, "validation": 1}
    assert manifest["info"]["class_names"] == ["bird", "cat", "dog"]
    # Without image_size the first image's size is used.
    assert manifest["info"]["image_size"] == [16, 16, 3]
    images, labels = load_all(tmp_path / "out", "validation")
    assert images.shape == (1, 16, 16, 3) and labels.tolist() == [1]


def test_bad_files_are_skipped_with_a_reason(tmp_path):
    src = make_folder(tmp_path / "src", per_class=2)
    good = io.BytesIO()
    Image.new("RGB", (32, 32), (1, 2, 3)).save(good, format="PNG")
    (src / "cat" / "truncated.png").write_bytes(good.getvalue()[:40])
    jpeg = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), np.uint8)).save(jpeg, "JPEG")
    (src / "cat" / "truncated.jpg").write_bytes(jpeg.getvalue()[:-200])
    (src / "dog" / "text.jpg").write_bytes(b"this is a text file with an image extension")
    (src / "dog" / "empty.png").write_bytes(b"")
    manifest = convert("image_folder", src, tmp_path / "out", splits={"train": 1.0}, image_size=8)
    assert manifest["bad_rows"]["count"] == 4
    assert manifest["splits"]["train"]["num_examples"] == 6

    pipeline = load_pipeline("image_folder", image_size=8)
    info = pipeline.prepare(str(src))
    rows = {row.key: row for row in pipeline.read(str(src), info)}
    assert "truncated" in bad_row_reason(pipeline, rows["cat/truncated.png"], info).lower()
    assert "truncated jpeg" in bad_row_reason(pipeline, rows["cat/truncated.jpg"], info).lower()
    assert "not an image" in bad_row_reason(pipeline, rows["dog/text.jpg"], info)
    assert bad_row_reason(pipeline, rows["dog/empty.png"], info) == "empty file"
    assert "cannot read" in bad_row_reason(pipeline, Row("x", (str(src / "missing.png"), 0)), info)


def test_workers_read_disjoint_shares_of_every_file(tmp_path):
    src = make_folder(tmp_path / "src", per_class=5)
    pipeline = load_pipeline("image_folder")
    info = pipeline.prepare(str(src))
    shares = [[row.key for row in pipeline.read(str(src), info, w, 3)] for w in range(3)]
    everything = [row.key for row in pipeline.read(str(src), info)]
    assert sorted(sum(shares, [])) == sorted(everything) and len(everything) == 15
    assert all(shares)


def test_user_errors_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="image_size"):
        load_pipeline("image_folder", image_size="big")
    with pytest.raises(ConfigError, match="Did you mean 'image_size'"):
        load_pipeline("image_folder", image_sise=8)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no class subdirectories"):
        load_pipeline("image_folder").prepare(str(tmp_path / "empty"))
