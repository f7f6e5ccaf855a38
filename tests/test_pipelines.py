"""Shared pipeline pieces: foreign TFRecords, image probing, options, source splits, pickling."""
import io
import pickle

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from pipelines import BUILTIN, load_pipeline
from pipelines.images import probe_image
from pipelines.options import get_bool, get_int, get_size
from pipelines.sources import split_from_name
from tftrain.data import load
from tftrain.errors import BadRow, ConfigError, DataError


def encode(array, fmt, **kwargs):
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format=fmt, **kwargs)
    return buffer.getvalue()


def write_foreign(path, values):
    """TFRecords as other TF tooling writes them: a subset of the standard image keys."""
    with tf.io.TFRecordWriter(str(path)) as writer:
        for value in values:
            image = np.full((6, 10, 3), value, np.uint8)
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[encode(image, "PNG")])),
                "image/format": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"png"])),
                "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[value % 3])),
            })).SerializeToString())


def test_load_reads_foreign_tfrecords_by_pipeline_and_pattern(tmp_path):
    write_foreign(tmp_path / "train-00000-of-00002", [0, 10, 20])
    write_foreign(tmp_path / "train-00001-of-00002", [30, 40])
    write_foreign(tmp_path / "validation-00000-of-00001", [50])
    options = {"image_size": "6x10"}

    data = load(str(tmp_path), "train", 4, training=False, pipeline="image_folder",
                pipeline_options=options)
    images, labels = zip(*data.as_numpy_iterator())
    images, labels = np.concatenate(images), np.concatenate(labels)
    assert images.shape == (5, 6, 10, 3)
    values = np.round(images[:, 3, 5, 0] * 255).astype(int)  # files are interleaved
    assert sorted(values.tolist()) == [0, 10, 20, 30, 40]
    np.testing.assert_array_equal(labels, values % 3)
    np.testing.assert_allclose(images, np.broadcast_to(images[:, :1, :1, :1], images.shape))

    pattern = str(tmp_path / "{split}-*-of-*")
    batch = next(iter(load(pattern, "validation", 4, training=False, pipeline="image_folder",
                           pipeline_options=options)))
    assert batch[0].shape == (1, 6, 10, 3) and batch[1].numpy().tolist() == [50 % 3]

    with pytest.raises(DataError, match="no TFRecord files match"):
        load(str(tmp_path), "test", 4, training=False, pipeline="image_folder")
    with pytest.raises(DataError, match="dataset.json is missing"):
        load(str(tmp_path), "train", 4, training=False)


def test_probe_image_reads_headers_and_rejects_damage():
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 255, (20, 30, 3), np.uint8)
    png, jpeg = encode(pixels, "PNG"), encode(pixels, "JPEG")
    progressive = encode(pixels, "JPEG", progressive=True)
    assert probe_image(png) == ("png", 20, 30)
    assert probe_image(jpeg) == ("jpeg", 20, 30)
    assert probe_image(progressive) == ("jpeg", 20, 30)
    assert probe_image(jpeg + b"camera trailer") == ("jpeg", 20, 30)
    damaged = {
        "empty file": b"",
        "not an image": b"plain text",
        "unsupported image format GIF": encode(pixels, "GIF"),
        "truncated JPEG": progressive[:len(progressive) * 3 // 4],
        "corrupt PNG": png[:50] + bytes([png[50] ^ 0xFF]) + png[51:],
        "truncated or corrupt PNG": png[:-20],
    }
    for reason, data in damaged.items():
        with pytest.raises(BadRow, match=reason):
            probe_image(data)


def test_option_helpers_and_split_names():
    assert get_size({"s": "64"}, "s") == (64, 64)
    assert get_size({"s": "64x48"}, "s") == (64, 48)
    assert get_size({}, "s", (1, 2)) == (1, 2)
    assert get_bool({"b": "Yes"}, "b") is True and get_bool({"b": "0"}, "b", True) is False
    assert get_int({"n": "7"}, "n", minimum=1) == 7
    for bad in ({"s": "0"}, {"s": "axb"}):
        with pytest.raises(ConfigError, match="must be a size"):
            get_size(bad, "s")
    with pytest.raises(ConfigError, match="must be at least 3"):
        get_int({"n": 2}, "n", minimum=3)
    with pytest.raises(ConfigError, match="true or false"):
        get_bool({"b": "maybe"}, "b")
    names = {"train.csv": "train", "validation-00001.jsonl": "validation", "val": "validation",
             "test_part2.jsonl": "test", "Train": "train", "training.csv": None, "data.csv": None,
             "gs://bucket/dir/dev.jsonl": "validation"}
    assert {name: split_from_name(name) for name in names} == names


@pytest.mark.parametrize("name", [n for n in BUILTIN if n != "digits"])
def test_every_pipeline_rejects_unknown_options_and_pickles(name):
    with pytest.raises(ConfigError, match=f"pipeline {name!r} has no option 'no_such_option'"):
        load_pipeline(name, no_such_option=1)
    pipeline = load_pipeline(name)
    clone = pickle.loads(pickle.dumps(pipeline))  # spawned conversion workers receive a copy
    assert type(clone) is type(pipeline) and clone.options == pipeline.options
