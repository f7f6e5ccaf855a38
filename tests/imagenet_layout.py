"""TFRecords in the layout most people hold ImageNet in, written the way other tools write them.

The TPU reference `imagenet_to_gcs.py` / TF-slim layout: files `train-00000-of-00002`,
`train-00001-of-00002` and `validation-00000-of-00001` (no `.tfrecord` suffix, no
dataset.json), JPEGs of varied sizes, 1-based `image/class/label` (0 is "background", unused),
`image/class/text`, `image/height`, `image/width`, `image/filename`, `image/format`, and the
variable-length `image/object/bbox/{xmin,ymin,xmax,ymax,label}` that tftrain does not read.

Each class has its own colour (red, green, blue) under seeded noise, so a small model learns
it in a few dozen steps. `write(directory)` writes it; `CONFIG_OVERRIDES` is what a user sets to
train on it (`data.format=tfrecord` with the image_folder schema, 4 classes for labels 1..3).
"""
from __future__ import annotations

import io
import os

import numpy as np

CLASSES = ("red", "green", "blue")  # labels 1, 2, 3
NUM_CLASSES = 4  # label 0 unused, as in the 1001-class ImageNet records
IMAGE_SIZE = 24  # what the pipeline decodes to (the JPEGs themselves are 20..40 pixels a side)
FILES = {"train": 2, "validation": 1}
PER_CLASS = {"train": 24, "validation": 8}

CONFIG_OVERRIDES = {
    "data.format": "tfrecord",
    "data.pipeline": "image_folder",
    "data.pipeline_options": f"{{image_size: {IMAGE_SIZE}}}",
    "data.info": f"{{num_classes: {NUM_CLASSES}}}",
    "data.eval_split": "validation",
    "data.test_split": "validation",
}


def overrides(data_dir: str, **more) -> str:
    """`--params_override` text that trains on `data_dir` written by `write`, plus `more`."""
    values = {"data.dir": data_dir, **CONFIG_OVERRIDES, **more}
    return ",".join(f"{key}={value}" for key, value in values.items())


def _jpeg(rng: np.random.Generator, label: int) -> tuple[bytes, int, int]:
    from PIL import Image

    height, width = (int(n) for n in rng.integers(20, 41, size=2))
    pixels = rng.integers(0, 90, size=(height, width, 3))
    pixels[..., label - 1] += 150  # the class's colour channel
    buffer = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8)).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue(), height, width


def _example(rng: np.random.Generator, label: int, filename: str) -> bytes:
    import tensorflow as tf

    encoded, height, width = _jpeg(rng, label)
    boxes = int(rng.integers(0, 3))  # 0..2 boxes: the bbox features are of variable length
    corners = np.sort(rng.random((boxes, 2, 2)), axis=1)

    def floats(values):
        return tf.train.Feature(float_list=tf.train.FloatList(value=list(values)))

    def ints(values):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=list(values)))

    def strings(value: bytes):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    feature = {
        "image/encoded": strings(encoded),
        "image/format": strings(b"JPEG"),
        "image/class/label": ints([label]),
        "image/class/text": strings(CLASSES[label - 1].encode()),
        "image/height": ints([height]),
        "image/width": ints([width]),
        "image/filename": strings(filename.encode()),
        "image/colorspace": strings(b"RGB"),
        "image/channels": ints([3]),
        "image/object/bbox/xmin": floats(corners[:, 0, 0]),
        "image/object/bbox/ymin": floats(corners[:, 0, 1]),
        "image/object/bbox/xmax": floats(corners[:, 1, 0]),
        "image/object/bbox/ymax": floats(corners[:, 1, 1]),
        "image/object/bbox/label": ints([label] * boxes),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write(directory: str, seed: int = 0) -> str:
    """Writes the dataset into `directory` (created); returns it."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    os.makedirs(directory, exist_ok=True)
    for split, num_files in FILES.items():
        examples = [_example(rng, label, f"n0000000{label}_{i}.JPEG")
                    for i in range(PER_CLASS[split]) for label in (1, 2, 3)]
        for index in range(num_files):
            name = os.path.join(directory, f"{split}-{index:05d}-of-{num_files:05d}")
            with tf.io.TFRecordWriter(name) as writer:
                for example in examples[index::num_files]:
                    writer.write(example)
    return directory
