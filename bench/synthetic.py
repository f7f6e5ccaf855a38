"""A synthetic image dataset for the benchmarks: N 32x32x3 PNG images in 10 classes.

Each image is a smooth colour gradient (its class sets the direction) plus noise, stored with the
standard image keys, so it is read by exactly the code path of a real image dataset (CIFAR-like
sizes). Pipeline name: `bench.synthetic`; `source` is the number of images.
"""
from __future__ import annotations

import numpy as np

from pipelines.base import BasePipeline, Row
from pipelines.images import IMAGE_FEATURES, decode_image_batch, png_example

SIZE = 32


def make_dataset(path: str, count: int = 56_000, num_shards: int = 16) -> dict:
    """Writes the dataset to `path` unless it is already there; returns its manifest."""
    from tftrain.data import manifest as manifest_lib
    from tftrain.data.writer import write_dataset

    if manifest_lib.exists(path):
        manifest = manifest_lib.read(path)
        if sum(s["num_examples"] for s in manifest["splits"].values()) == count:
            return manifest
    from pipelines import load_pipeline

    return write_dataset(load_pipeline("bench.synthetic"), str(count), path, num_shards=num_shards,
                         overwrite=True, progress=False)


def pixels(index: int) -> tuple[np.ndarray, int]:
    """Image `index` (uint8 SIZExSIZEx3) and its label: its class sets the gradient's direction."""
    rng = np.random.default_rng(index)
    label = index % 10
    angle = label * np.pi / 5
    yy, xx = np.mgrid[0:SIZE, 0:SIZE] / SIZE
    ramp = np.cos(angle) * xx + np.sin(angle) * yy
    colour = rng.uniform(0.3, 1.0, size=3)
    values = ramp[..., None] * colour * 200 + rng.normal(0, 12, (SIZE, SIZE, 3))
    return np.clip(values, 0, 255).astype(np.uint8), label


class Pipeline(BasePipeline):
    """`source`: the number of images to generate."""

    name = "bench.synthetic"
    default_splits = {"train": 0.9, "validation": 0.05, "test": 0.05}

    def prepare(self, source):
        return {"num_classes": 10, "image_size": [SIZE, SIZE, 3], "count": int(source)}

    def read(self, source, info, worker=0, num_workers=1):
        for index in range(worker, info["count"], num_workers):
            yield Row(key=f"synthetic/{index:07d}", value=index)

    def features(self, info):
        return dict(IMAGE_FEATURES)

    def encode(self, row, info):
        image, label = pixels(row.value)
        return png_example(image, label=label, text=str(label), filename=row.key)

    def decode(self, features, info):
        return decode_image_batch(features, SIZE, SIZE, channels=3)
