"""The data of bench/recipes.py, made offline from scikit-learn's two sample photos.

`write_photo_folder`: a small-data image task. Each photo (china.jpg, flower.jpg, 427x640) is
cut into a 2x3 grid of 213x213 cells, and each cell is a class (12 classes: the temple's roof,
the sky, the trees, the lake, the flower's centre, the blurred leaves, ...). Each cell is
split into 2x2 quadrants (106x106); an example is a 64x64 crop inside one quadrant: training
crops come from the top-left and bottom-right quadrants, validation and test crops from the
other two, so no test pixel was ever seen in training (a model must generalise from two parts
of a texture to the other two). Written as PNGs in `<root>/<split>/<class>/`, the folder
layout `tftrain convert --pipeline=image_folder` takes with its splits as they are.

`write_imagenet_records`: TFRecords in the ImageNet layout of the TPU reference
`imagenet_to_gcs.py` (`train-0000i-of-0000n`, JPEG `image/encoded`, 1-based
`image/class/label` of 1000 classes, height/width/filename/text and variable-length
`image/object/bbox/*` features), with photo-like JPEGs of ImageNet-like sizes: random
crops of the two photos, 300..500 pixels a side (rescaled where the photo is too small).
"""
from __future__ import annotations

import io
import os

import numpy as np

CROP = 64
GRID = (2, 3)  # rows, columns of cells per photo: 12 classes over the two photos
CELL = 213  # 427 // 2 and 640 // 3
QUADRANT = CELL // 2
QUADRANTS = {"train": ((0, 0), (1, 1)), "validation": ((0, 1), (1, 0)), "test": ((0, 1), (1, 0))}
PER_CLASS = {"train": 20, "validation": 10, "test": 100}
SEEDS = {"train": 1, "validation": 2, "test": 3}  # disjoint draws (and disjoint rows for train)


def _photos() -> dict[str, np.ndarray]:
    from sklearn.datasets import load_sample_images

    sample = load_sample_images()
    return {os.path.splitext(os.path.basename(name))[0]: image
            for name, image in zip(sample.filenames, sample.images)}


def write_photo_folder(root: str) -> dict[str, int]:
    """Writes the 64x64 crops under `root` (an image folder with train/validation/test);
    returns the number of images per split. Made once: an existing complete folder is kept."""
    from PIL import Image

    done = os.path.join(root, ".complete")
    counts = {split: n * len(_photos()) * GRID[0] * GRID[1] for split, n in PER_CLASS.items()}
    if os.path.exists(done):
        return counts
    for photo, pixels in _photos().items():
        for row in range(GRID[0]):
            for column in range(GRID[1]):
                name = f"{photo}_r{row}c{column}"
                top, left = row * CELL, column * CELL
                for split, count in PER_CLASS.items():
                    rng = np.random.default_rng([SEEDS[split], row, column, len(photo)])
                    folder = os.path.join(root, split, name)
                    os.makedirs(folder, exist_ok=True)
                    for index in range(count):
                        qy, qx = QUADRANTS[split][index % 2]
                        y = top + qy * QUADRANT + int(rng.integers(0, QUADRANT - CROP + 1))
                        x = left + qx * QUADRANT + int(rng.integers(0, QUADRANT - CROP + 1))
                        Image.fromarray(pixels[y:y + CROP, x:x + CROP]).save(
                            os.path.join(folder, f"{index:03d}.png"))
    open(done, "w").close()
    return counts


def _imagenet_example(encoded: bytes, height: int, width: int, label: int, filename: str,
                      boxes: np.ndarray) -> bytes:
    """One record with the features `imagenet_to_gcs.py` writes; `boxes` [n, 4] (xmin, ymin,
    xmax, ymax)."""
    from tftrain.data.example_bytes import bytes_feature, example, float_feature, int64_feature

    return example({
        "image/encoded": bytes_feature(encoded), "image/format": bytes_feature(b"JPEG"),
        "image/class/label": int64_feature(label),
        "image/class/text": bytes_feature(f"class {label}"),
        "image/height": int64_feature(height), "image/width": int64_feature(width),
        "image/filename": bytes_feature(filename), "image/colorspace": bytes_feature(b"RGB"),
        "image/channels": int64_feature(3),
        **{f"image/object/bbox/{name}": float_feature(boxes[:, index])
           for index, name in enumerate(("xmin", "ymin", "xmax", "ymax"))},
        "image/object/bbox/label": int64_feature([label] * len(boxes)),
    })


def write_imagenet_records(directory: str, images: int, files: int = 4, seed: int = 0) -> list[str]:
    """Writes `images` records into `files` train files under `directory` (once: existing
    complete files are kept); returns the file paths. JPEG quality 90, as ImageNet's are ~."""
    import tensorflow as tf
    from PIL import Image

    names = [os.path.join(directory, f"train-{i:05d}-of-{files:05d}") for i in range(files)]
    done = os.path.join(directory, f".complete-{images}")
    if os.path.exists(done):
        return names
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    photos = list(_photos().values())
    writers = [tf.io.TFRecordWriter(name) for name in names]
    for index in range(images):
        pixels = photos[int(rng.integers(len(photos)))]
        height, width = (int(n) for n in rng.integers(300, 501, size=2))
        # A window of the photo with the target's aspect, as large as fits, then resized.
        scale = min(1.0, pixels.shape[0] / height, pixels.shape[1] / width) * rng.uniform(0.6, 1.0)
        window = (max(1, int(height * scale)), max(1, int(width * scale)))
        y = int(rng.integers(0, pixels.shape[0] - window[0] + 1))
        x = int(rng.integers(0, pixels.shape[1] - window[1] + 1))
        crop = Image.fromarray(pixels[y:y + window[0], x:x + window[1]]).resize((width, height))
        buffer = io.BytesIO()
        crop.save(buffer, format="JPEG", quality=90)
        label = int(rng.integers(1, 1001))
        # 0..2 boxes, [xmin, ymin, xmax, ymax] each: the bbox features vary in length.
        boxes = np.sort(rng.random((int(rng.integers(0, 3)), 2, 2)), axis=1).reshape(-1, 4)
        writers[index % files].write(_imagenet_example(
            buffer.getvalue(), height, width, label, f"n{label:08d}_{index}.JPEG", boxes))
    for writer in writers:
        writer.close()
    open(done, "w").close()
    return names
