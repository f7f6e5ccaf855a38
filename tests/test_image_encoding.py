"""`image_encoding`: real PNG folders converted with keep / raw / png / jpeg and read back.

raw and png must decode to exactly the pixels that keep decodes from the source PNGs; jpeg
within a small error. The manifest and `tftrain inspect` say which encoding a dataset has, and
a dataset whose manifest predates the option reads as it always did.
"""
import json
import shutil

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from pipelines import load_pipeline
from tests.pipeline_testutil import convert, load_all
from tftrain.errors import ConfigError

SIZE = 16
CLASSES = ("bird", "cat", "dog")


def photo_like(index, size=(SIZE, SIZE)):
    """A smooth colour gradient plus a little noise (compresses like a photo, unlike noise)."""
    rng = np.random.default_rng(index)
    yy, xx = np.mgrid[0:size[0], 0:size[1]]
    base = 40 + index * 3 + (xx * 6 + yy * 4)[..., None] * rng.uniform(0.5, 1.0, 3)
    return np.clip(base + rng.normal(0, 3, (*size, 3)), 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """24 16x16 RGB PNGs in three class folders."""
    root = tmp_path_factory.mktemp("images") / "src"
    for index in range(24):
        folder = root / CLASSES[index % 3]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(photo_like(index)).save(folder / f"{index:02d}.png")
    return root


@pytest.fixture(scope="module")
def converted(source, tmp_path_factory):
    """encoding -> dataset dir, each converted by `tftrain convert` as a user runs it."""
    from tests.conftest import run_cli

    root = tmp_path_factory.mktemp("converted")
    dirs = {}
    for encoding in ("keep", "raw", "png", "jpeg"):
        dirs[encoding] = root / encoding
        assert run_cli("convert", "--pipeline=image_folder", f"--input={source}",
                       f"--output={dirs[encoding]}", f"--pipeline_options=image_encoding={encoding}",
                       "--splits=train:0.75,test:0.25", "--num_shards=2", "--workers=1") == 0
    return dirs


def stored(data_dir):
    """The parsed features of every record of a dataset, by file name."""
    manifest = json.loads((data_dir / "dataset.json").read_text())
    found = {}
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            for record in tf.data.TFRecordDataset(str(data_dir / shard["file"])):
                feature = tf.train.Example.FromString(record.numpy()).features.feature
                found[feature["image/filename"].bytes_list.value[0].decode()] = feature
    return found


def test_each_encoding_is_recorded_stored_and_shown(converted, cli, capsys):
    for encoding, data_dir in converted.items():
        info = json.loads((data_dir / "dataset.json").read_text())["info"]
        assert info["image_encoding"] == encoding
        assert info.get("jpeg_quality") == (95 if encoding == "jpeg" else None)
        records = stored(data_dir)
        assert len(records) == 24
        formats = {f["image/format"].bytes_list.value[0].decode() for f in records.values()}
        assert formats == {"png" if encoding == "keep" else encoding}
        sizes = {(f["image/height"].int64_list.value[0], f["image/width"].int64_list.value[0])
                 for f in records.values()}
        assert sizes == {(SIZE, SIZE)}
        assert cli("inspect", f"--data={data_dir}") == 0
        shown = [line for line in capsys.readouterr().out.splitlines() if line.startswith("images: ")]
        assert len(shown) == 1 and shown[0].split()[1].strip(":,") == encoding, shown
    raw = next(iter(stored(converted["raw"]).values()))
    assert len(raw["image/encoded"].bytes_list.value[0]) == SIZE * SIZE * 3  # uint8 pixels
    from tftrain.data import load

    spec = load(str(converted["raw"]), "train", 4, training=True).element_spec
    assert spec[0].shape.as_list() == [4, SIZE, SIZE, 3]  # a static batch size, as for keep


def test_raw_and_png_decode_exactly_like_keep_and_jpeg_closely(converted):
    for split in ("train", "test"):
        keep, keep_labels = load_all(converted["keep"], split)
        assert keep.shape[1:] == (SIZE, SIZE, 3) and keep.dtype == np.float32
        assert 0.0 <= keep.min() and keep.max() <= 1.0
        for encoding in ("raw", "png"):
            images, labels = load_all(converted[encoding], split)
            assert images.dtype == np.float32
            np.testing.assert_array_equal(images, keep)  # bit-identical: lossless
            np.testing.assert_array_equal(labels, keep_labels)
        images, labels = load_all(converted["jpeg"], split)
        np.testing.assert_array_equal(labels, keep_labels)
        assert images.shape == keep.shape and np.abs(images - keep).mean() < 0.02


def test_jpeg_quality_changes_the_size_and_the_error(source, converted, tmp_path):
    low = tmp_path / "q10"
    manifest = convert("image_folder", source, low, splits={"train": 0.75, "test": 0.25},
                       workers=1, image_encoding="jpeg", jpeg_quality="10")  # as `converted`
    assert manifest["info"]["jpeg_quality"] == 10

    def encoded_bytes(data_dir):
        return sum(len(f["image/encoded"].bytes_list.value[0]) for f in stored(data_dir).values())

    def error(data_dir):  # mean absolute error against the lossless read
        return np.abs(load_all(data_dir, "train")[0] - load_all(converted["keep"], "train")[0]).mean()

    assert encoded_bytes(low) < encoded_bytes(converted["jpeg"])
    assert error(converted["jpeg"]) < 0.02 and error(low) > 2 * error(converted["jpeg"])


def test_a_manifest_without_the_encoding_reads_as_before(converted, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(converted["keep"], old)
    manifest = json.loads((old / "dataset.json").read_text())
    del manifest["info"]["image_encoding"]  # as written before the option existed
    (old / "dataset.json").write_text(json.dumps(manifest))
    np.testing.assert_array_equal(load_all(old, "test")[0], load_all(converted["keep"], "test")[0])
    from tftrain.data.inspection import describe

    assert "image_encoding not recorded" in describe(str(old))


def test_raw_resizes_at_convert_time_and_reads_at_another_size(source, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(source, src)
    wide = photo_like(99, size=(8, 32))
    Image.fromarray(wide).save(src / "cat" / "wide.png")  # 8 high, 32 wide: fitted and padded
    for encoding in ("keep", "raw"):
        convert("image_folder", src, tmp_path / encoding, splits={"train": 1.0},
                image_encoding=encoding, image_size=SIZE)
    keep, _ = load_all(tmp_path / "keep", "train")
    raw, _ = load_all(tmp_path / "raw", "train")
    assert raw.shape == keep.shape == (25, SIZE, SIZE, 3)
    record = stored(tmp_path / "raw")["cat/wide.png"]
    pixels = np.frombuffer(record["image/encoded"].bytes_list.value[0], np.uint8)
    pixels = pixels.reshape(SIZE, SIZE, 3)
    assert not pixels[:6].any() and not pixels[10:].any() and pixels[6:10].any()  # rows 6..9
    # Against keep's read-time resize of the same image: the same placement, close values.
    close = np.abs(raw - keep).max(axis=(1, 2, 3))
    assert sorted(close)[-1] < 0.35 and sorted(close)[-2] == 0.0  # only the wide image differs

    # Read at another size or channel count than converted: resized and converted in the batch.
    options = {"image_size": "8x4", "channels": "1"}
    smaller, _ = load_all(tmp_path / "raw", "train", pipeline_options=options)
    reference, _ = load_all(tmp_path / "keep", "train", pipeline_options=options)
    assert smaller.shape == reference.shape == (25, 8, 4, 1)
    assert np.abs(smaller - reference).mean() < 0.05


def test_digits_store_raw_pixels_by_default_decoded_like_png(digits_dir, tmp_path):
    manifest = json.loads(open(f"{digits_dir}/dataset.json").read())
    assert manifest["info"]["image_encoding"] == "raw"
    convert("digits", "", tmp_path / "png", num_shards=None, image_encoding="keep")  # same shards
    for split in ("train", "test"):
        png, png_labels = load_all(tmp_path / "png", split)
        raw, raw_labels = load_all(digits_dir, split)
        np.testing.assert_array_equal(raw, png)
        np.testing.assert_array_equal(raw_labels, png_labels)
    assert {f["image/format"].bytes_list.value[0] for f in stored(tmp_path / "png").values()} == {b"png"}


def test_lmdb_and_tfds_pass_the_option_on(tmp_path):
    from tests.test_pipeline_lmdb import class_images, make_db, png
    from tests.test_pipeline_tfds import TftrainTinyImages, TftrainTinyTable

    images = class_images(per_class=3)
    lmdb_source = make_db(tmp_path / "db", {key: png(pixels) for key, (pixels, _) in images.items()})
    tfds_source = tmp_path / "tfds"
    TftrainTinyImages(data_dir=str(tfds_source)).download_and_prepare()
    for pipeline, source, split in (("lmdb", lmdb_source, "train"),
                                    ("tfds", TftrainTinyImages.name, "test")):
        decoded = {}
        for encoding in ("keep", "raw"):
            out = tmp_path / f"{pipeline}-{encoding}"
            manifest = convert(pipeline, source, out, image_encoding=encoding,
                               **({"data_dir": str(tfds_source)} if pipeline == "tfds" else {}))
            assert manifest["info"]["image_encoding"] == encoding
            decoded[encoding] = load_all(out, split)[0]
        np.testing.assert_array_equal(decoded["raw"], decoded["keep"])

    examples = make_db(tmp_path / "examples", {"a": tf.train.Example().SerializeToString()})
    with pytest.raises(ConfigError, match="are for image values"):
        load_pipeline("lmdb", values="example", image_encoding="raw").prepare(examples)
    TftrainTinyTable(data_dir=str(tfds_source)).download_and_prepare()
    with pytest.raises(ConfigError, match="are for image datasets"):
        load_pipeline("tfds", data_dir=str(tfds_source), image_encoding="raw").prepare(
            TftrainTinyTable.name)


@pytest.mark.parametrize("options,message", [
    ({"image_encoding": "webp"}, "image_encoding='webp' must be one of keep, raw, png, jpeg"),
    ({"image_encoding": "jpeg", "jpeg_quality": "0"}, "jpeg_quality=0 must be between 1 and 100"),
    ({"image_encoding": "jpeg", "jpeg_quality": "101"}, "jpeg_quality=101 must be between 1 and 100"),
    ({"image_encoding": "jpeg", "jpeg_quality": "high"}, "jpeg_quality='high' must be an integer"),
    ({"jpeg_quality": "80"}, "jpeg_quality is only used with image_encoding=jpeg"),
    ({"image_encoding": "raw", "jpeg_quality": "80"}, "only used with image_encoding=jpeg"),
])
@pytest.mark.parametrize("pipeline", ["image_folder", "digits", "tfds", "lmdb"])
def test_bad_option_values_are_config_errors(pipeline, options, message):
    with pytest.raises(ConfigError, match=message):
        load_pipeline(pipeline, **options)


def test_a_bad_option_is_one_error_line(source, tmp_path, cli, capsys):
    assert cli("convert", "--pipeline=image_folder", f"--input={source}", f"--output={tmp_path / 'x'}",
               "--pipeline_options=image_encoding=jpeg,jpeg_quality=200") != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tftrain convert: error:"), err
    assert "jpeg_quality=200 must be between 1 and 100" in err[0] and "Traceback" not in err[0]
    assert not (tmp_path / "x").exists()
