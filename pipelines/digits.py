"""The embedded default: scikit-learn's bundled handwritten digits (1,797 8x8 images, no network).

Each 8x8 grayscale image is stored with the standard image keys, so the digits dataset is read
by exactly the same code as any image dataset: as raw pixels by default (`image_encoding=auto`:
64 bytes, no decode at read time), or as a PNG with `image_encoding=keep` (or `png`; `jpeg`
with `jpeg_quality`), see `pipelines.images`. The source has no splits of its own; the
converter assigns train/validation/test from each row's key.
"""
from __future__ import annotations

import numpy as np

from pipelines import image_folder
from pipelines.base import BasePipeline, Row
from pipelines.images import (ENCODING_OPTIONS, IMAGE_FEATURES, decode_image_batch,
                              encoded_image_example, encoding_info, encoding_options)
from pipelines.options import check_known

SIZE = 8
NUM_ROWS = 1797  # len(sklearn.datasets.load_digits().target)


class Pipeline(BasePipeline):
    """`source` is ignored: the data ships inside scikit-learn."""

    name = "digits"
    default_splits = {"train": 0.8, "validation": 0.1, "test": 0.1}

    def __init__(self, **options):
        check_known(options, ENCODING_OPTIONS, self.name)
        super().__init__(**options)
        self.encoding = encoding_options(options, default="auto")

    def known_num_rows(self, source):
        return NUM_ROWS

    def prepare(self, source):
        return {"num_classes": 10, "class_names": [str(d) for d in range(10)],
                "image_size": [SIZE, SIZE, 1],
                **encoding_info(self.encoding, [SIZE, SIZE, 1])}

    def read(self, source, info, worker=0, num_workers=1):
        from sklearn.datasets import load_digits

        digits = load_digits()
        for index in range(worker, len(digits.target), num_workers):
            yield Row(key=f"digits/{index:04d}",
                      value=(digits.images[index], int(digits.target[index])))

    def features(self, info):
        return dict(IMAGE_FEATURES)

    def encode(self, row, info):
        if isinstance(row.value[0], str):  # an image file (`predict_rows`)
            return image_folder.encode_file(row, info)
        pixels, label = row.value
        # sklearn's pixels are 0..16; stretch them to the full 8-bit range.
        image = np.clip(np.rint(pixels * (255.0 / 16.0)), 0, 255).astype(np.uint8)
        return encoded_image_example(info, pixels=image, label=label, text=str(label),
                                     filename=row.key)

    def predict_rows(self, source, info):
        """Image files (8x8 grayscale PNGs or JPEGs of a digit, white on black; another size is
        fitted into 8x8), stored as the conversion stores the embedded digits."""
        return image_folder.image_file_rows(source, self.name)

    def image_shape(self, info):
        return SIZE, SIZE, 1

    def decode(self, features, info):
        return decode_image_batch(features, *self.image_shape(info), info)
