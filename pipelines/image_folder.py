"""A folder of images, one subdirectory per class: `<source>/<class>/<image>.jpg|.jpeg|.png`.

The encoded JPEG/PNG bytes are stored as they are (no re-encoding); only the header is read for
height and width, plus enough structure to reject damaged files (see `images.probe_image`).
Label ids follow the sorted class names, which are stored in the manifest's `info`.

Source splits: when every subdirectory of `source` is a split name (`train/`, `validation/` or
`val/`, `test/`), each holds class folders and its images keep that split.

Options:
    image_size: decoded size at training time, `64` or `64x48` (height x width); default: the
        size of the first image, which suits folders of same-sized images.
    channels: 3 (RGB, default) or 1 (grayscale); decoding converts every image to it.
    image_encoding: keep (default: the JPEG/PNG bytes as they are), raw (uint8 pixels at
        image_size: no decode at read time), png or jpeg (re-encoded at image_size), auto (raw
        up to 64x64x3, else keep); jpeg_quality: 1..100 (default 95), with jpeg only. See
        `images.encoded_image_example`.
"""
from __future__ import annotations

import posixpath

from absl import logging

from pipelines.base import BasePipeline, Row
from pipelines.images import (ENCODING_OPTIONS, IMAGE_FEATURES, decode_image_batch,
                              encoded_image_example, encoding_info, encoding_options, probe_image)
from pipelines.options import check_known, get_int, get_size
from pipelines.sources import SPLIT_NAMES, predict_files
from tftrain.errors import BadRow, ConfigError

EXTENSIONS = (".jpg", ".jpeg", ".png")
OPTIONS = ("image_size", "channels", *ENCODING_OPTIONS)


def _subdirs(path: str) -> list[str]:
    import tensorflow as tf

    return sorted(name.rstrip("/") for name in tf.io.gfile.listdir(path)
                  if not name.startswith(".") and tf.io.gfile.isdir(posixpath.join(path, name)))


class Pipeline(BasePipeline):
    """Reads `<source>/[<split>/]<class>/<file>`; see the module docstring for options."""

    name = "image_folder"
    default_splits = {"train": 0.8, "validation": 0.1, "test": 0.1}

    def __init__(self, **options):
        check_known(options, OPTIONS, self.name)
        super().__init__(**options)
        self.image_size = get_size(options, "image_size")
        self.channels = get_int(options, "channels", 3)
        if self.channels not in (1, 3):
            raise ConfigError(f"pipeline option channels={self.channels} must be 1 or 3.")
        self.encoding = encoding_options(options)

    def _layout(self, source: str) -> dict[str | None, str]:
        """Source split (or None) -> the directory that holds its class folders."""
        import tensorflow as tf

        if not tf.io.gfile.isdir(source):
            raise ConfigError(f"image_folder input {source!r} is not a directory; pass a folder with "
                              "one subdirectory per class.")
        top = _subdirs(source)
        if top and all(name.lower() in SPLIT_NAMES for name in top):
            return {SPLIT_NAMES[name.lower()]: posixpath.join(source, name) for name in top}
        return {None: source}

    def _files(self, folder: str) -> list[str]:
        import tensorflow as tf

        return sorted(name for name in tf.io.gfile.listdir(folder)
                      if name.lower().endswith(EXTENSIONS) and not name.startswith("."))

    def prepare(self, source):
        layout = self._layout(source)
        class_names = sorted({c for folder in layout.values() for c in _subdirs(folder)})
        if not class_names:
            raise ConfigError(f"image_folder input {source!r} has no class subdirectories; expected "
                              "<input>/<class>/<image>.jpg (optionally under train/, validation/, test/).")
        size = self.image_size or self._first_image_size(layout, class_names)
        image_size = [size[0], size[1], self.channels]
        return {"class_names": class_names, "num_classes": len(class_names),
                "image_size": image_size, "source_splits": sorted(s for s in layout if s) or None,
                **encoding_info(self.encoding, image_size)}

    def _first_image_size(self, layout, class_names) -> tuple[int, int]:
        """The height and width of the first readable image, for folders of same-sized images."""
        for row in self.read(None, {"class_names": class_names, "_layout": layout}):
            try:
                _, height, width = probe_image(_read_bytes(row.value[0]))
            except BadRow:
                continue
            logging.info("image_folder: decoding to %dx%d, the size of %s; pass "
                         "--pipeline_options=image_size=HxW to choose another.", height, width, row.key)
            return height, width
        raise ConfigError("image_folder found no readable .jpg, .jpeg or .png image in the class folders.")

    def read(self, source, info, worker=0, num_workers=1):
        layout = info.get("_layout") or self._layout(source)
        index = 0
        for split in sorted(layout, key=str):
            for label, class_name in enumerate(info["class_names"]):
                folder = posixpath.join(layout[split], class_name)
                if not _isdir(folder):
                    continue
                key_prefix = posixpath.join(split or "", class_name, "")  # "[split/]class/"
                path_prefix = posixpath.join(folder, "")
                for name in self._files(folder):
                    if index % num_workers == worker:
                        yield Row(key=key_prefix + name, value=(path_prefix + name, label), split=split)
                    index += 1

    def features(self, info):
        return dict(IMAGE_FEATURES)

    def encode(self, row, info):
        return encode_file(row, info)

    def predict_rows(self, source, info):
        return image_file_rows(source, self.name)

    def image_shape(self, info):
        height, width = self.image_size or info.get("image_size", [224, 224])[:2]
        channels = self.channels if "channels" in self.options else info.get("image_size", [0, 0, 3])[2]
        return height, width, channels

    def decode(self, features, info):
        return decode_image_batch(features, *self.image_shape(info), info)


def _read_bytes(path: str) -> bytes:
    import tensorflow as tf

    from tftrain.fileio import read_bytes

    try:
        return read_bytes(path)
    except (OSError, tf.errors.OpError) as e:
        raise BadRow(f"cannot read {path}: {e}") from None


def encode_file(row: Row, info: dict):
    """The Example of an image file: `row.value` is `(path, label)`; the bytes are stored as
    `info` says (`images.encoded_image_example`); an unreadable or damaged file is a BadRow."""
    path, label = row.value
    return encoded_image_example(info, data=_read_bytes(path), label=label,
                                 text=info["class_names"][label], filename=row.key)


def image_file_rows(source: str, pipeline: str):
    """`predict_rows` of the image pipelines: each image file of `source` (a file, a folder,
    recursively, or a glob), keyed by its path, with the stand-in label 0."""
    for path in predict_files(source, EXTENSIONS, "images", pipeline):
        yield Row(key=path, value=(path, 0)), {}


def _isdir(path: str) -> bool:
    import tensorflow as tf

    return tf.io.gfile.isdir(path)
