"""A synthetic image dataset for the benchmarks: N 32x32x3 PNG images in 10 classes.

Each image is a smooth colour gradient (its class sets the direction) plus noise, stored with the
standard image keys, so it is read by exactly the code path of a real image dataset (CIFAR-like
sizes). Pipeline name: `bench.synthetic`; `source` is the number of images. The pipeline option
`image_encoding` (see `pipelines.images`) stores them otherwise (`raw`: uint8 pixels); the
default stores PNGs. `make_numpy_dataset` writes the same images through the `numpy` pipeline.
"""
from __future__ import annotations

import numpy as np

from pipelines.base import BasePipeline, Row
from pipelines.images import (ENCODING_OPTIONS, IMAGE_FEATURES, decode_image_batch,
                              encoded_image_example, encoding_info, encoding_options, png_example)
from pipelines.options import check_known

SIZE = 32


def make_dataset(path: str, count: int = 56_000, num_shards: int = 16,
                 image_encoding: str = "keep") -> dict:
    """Writes the dataset to `path` unless it is already there; returns its manifest.

    `image_encoding`: the pipeline option (`keep` stores PNGs, `raw` uint8 pixels)."""
    from tftrain.data import manifest as manifest_lib
    from tftrain.data.writer import write_dataset

    if manifest_lib.exists(path):
        manifest = manifest_lib.read(path)
        stored = manifest.get("info", {}).get("image_encoding", "keep")
        if sum(s["num_examples"] for s in manifest["splits"].values()) == count and stored == image_encoding:
            return manifest
    from pipelines import load_pipeline

    pipeline = load_pipeline("bench.synthetic", **({} if image_encoding == "keep"
                                                   else {"image_encoding": image_encoding}))
    return write_dataset(pipeline, str(count), path, num_shards=num_shards,
                         overwrite=True, progress=False)


def make_numpy_dataset(path: str, count: int = 56_000, num_shards: int = 16,
                       x_encoding: str = "float32") -> dict:
    """The same `count` images as `make_dataset`, converted by the `numpy` pipeline into `path`
    (unless already there; returns its manifest): `x` float32 [32, 32, 3] (0..255), `y` the label;
    with `x_encoding="raw"` (the pipeline option), `x` is stored as its uint8 bytes.

    Arrays `x_<split>`/`y_<split>` (uint8, in `<path>-arrays/`) hold each split's images, in the
    split `make_dataset` puts them, so the train splits of both hold the same images.
    """
    import os

    from pipelines import load_pipeline
    from tftrain.data import manifest as manifest_lib
    from tftrain.data.splits import assign_split
    from tftrain.data.writer import write_dataset

    if manifest_lib.exists(path):
        manifest = manifest_lib.read(path)
        stored = manifest.get("info", {}).get("x_encoding", "float32")
        if sum(s["num_examples"] for s in manifest["splits"].values()) == count and stored == x_encoding:
            return manifest
    arrays = path.rstrip("/") + "-arrays"
    os.makedirs(arrays, exist_ok=True)
    by_split: dict[str, list[int]] = {}
    for index in range(count):
        by_split.setdefault(assign_split(_key(index), Pipeline.default_splits), []).append(index)
    for split, indices in by_split.items():
        images = np.empty((len(indices), SIZE, SIZE, 3), np.uint8)
        labels = np.empty(len(indices), np.int64)
        for row, index in enumerate(indices):
            images[row], labels[row] = pixels(index)
        np.save(os.path.join(arrays, f"x_{split}.npy"), images)
        np.save(os.path.join(arrays, f"y_{split}.npy"), labels)
    return write_dataset(load_pipeline("numpy", x_encoding=x_encoding), arrays, path,
                         num_shards=num_shards, overwrite=True, progress=False)


def _key(index: int) -> str:
    return f"synthetic/{index:07d}"


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
    """`source`: the number of images to generate. Option `image_encoding` (default: PNG)."""

    name = "bench.synthetic"
    default_splits = {"train": 0.9, "validation": 0.05, "test": 0.05}

    def __init__(self, **options):
        check_known(options, ENCODING_OPTIONS, self.name)
        super().__init__(**options)
        self.encoding = encoding_options(options) if options else None

    def prepare(self, source):
        info = {"num_classes": 10, "image_size": [SIZE, SIZE, 3], "count": int(source)}
        return {**info, **encoding_info(self.encoding, info["image_size"])} if self.encoding else info

    def read(self, source, info, worker=0, num_workers=1):
        for index in range(worker, info["count"], num_workers):
            yield Row(key=_key(index), value=index)

    def features(self, info):
        return dict(IMAGE_FEATURES)

    def encode(self, row, info):
        image, label = pixels(row.value)
        if self.encoding:
            return encoded_image_example(info, pixels=image, label=label, text=str(label),
                                         filename=row.key)
        return png_example(image, label=label, text=str(label), filename=row.key)

    def image_shape(self, info):
        return SIZE, SIZE, 3

    def decode(self, features, info):
        return decode_image_batch(features, *self.image_shape(info), info)
