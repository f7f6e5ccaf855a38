"""A TensorFlow Datasets (TFDS) dataset that is already prepared on disk; nothing is downloaded.

`--input` is either a prepared TFDS directory (the one holding `dataset_info.json`, e.g.
`~/tensorflow_datasets/mnist/3.0.1`) or a dataset name (`mnist`, `mnist:3.0.1`,
`glue/sst2`) looked up in the `data_dir` option (default: TFDS's own default data dir). Prepare
a dataset first with `tfds build NAME --data_dir=DIR`; tftrain never downloads at convert time.

The source splits are kept. Image classification datasets (an `Image` feature and a
`ClassLabel`, taken from `supervised_keys` or options `image_key`/`label_key`) are mapped to
the standard image keys, with the encoded PNG/JPEG bytes kept as they are (or stored as
options `image_encoding`/`jpeg_quality` say, as for `image_folder`), and decode like
`image_folder` (option `image_size`, default the dataset's fixed image size, or the first
image's). Any other dataset keeps TFDS's own serialized features (nested names joined by `/`);
its `decode` returns `(inputs, label)` with the label from `label_key` (default the supervised
label), and `inputs` the single remaining feature or a dict of them.

Records are read with TensorFlow's record iterator (no tf.data, no TFDS import in the workers);
only `prepare` imports TFDS. TFDS datasets stored as array_record are not supported: rebuild
them with `tfds build --file_format=tfrecord`.
"""
from __future__ import annotations

import posixpath

import numpy as np
from absl import logging

from pipelines.base import BasePipeline, Row
from pipelines.images import (ENCODING_OPTIONS, IMAGE_FEATURES, decode_image_batch,
                              encoded_image_example, encoding_info, encoding_options, probe_image)
from pipelines.options import check_known, get_int, get_size, get_str
from tftrain.errors import BadRow, ConfigError

OPTIONS = ("data_dir", "image_key", "label_key", "image_size", "channels", *ENCODING_OPTIONS)


def _schema_of(serialized_info: dict, prefix: str = "") -> dict[str, dict]:
    """TFDS's serialized feature info (nested TensorInfo) -> a tftrain feature schema."""
    schema = {}
    for name, info in serialized_info.items():
        key = prefix + name
        if isinstance(info, dict):
            schema.update(_schema_of(info, key + "/"))
            continue
        kind = np.dtype(info.np_dtype).kind
        dtype = "int64" if kind in "biu" else "float32" if kind == "f" else "string"
        shape = list(info.shape)
        schema[key] = ({"dtype": dtype, "shape": [], "varlen": True} if None in shape
                       else {"dtype": dtype, "shape": shape})
    return schema


def _records(path: str):
    """The serialized records of one TFRecord file (CRC-checked), without tf.data."""
    from tensorflow.python.lib.io import tf_record

    return tf_record.tf_record_iterator(path)


class Pipeline(BasePipeline):
    """A prepared TFDS dataset -> tftrain shards; see the module docstring."""

    name = "tfds"

    def __init__(self, **options):
        check_known(options, OPTIONS, self.name)
        super().__init__(**options)
        self.data_dir = get_str(options, "data_dir")
        self.image_key = get_str(options, "image_key")
        self.label_key = get_str(options, "label_key")
        self.image_size = get_size(options, "image_size")
        self.channels = get_int(options, "channels")
        self.encoding = encoding_options(options)

    def _builder(self, source: str):
        import tensorflow as tf
        import tensorflow_datasets as tfds
        from tensorflow_datasets.core import read_only_builder

        if tf.io.gfile.exists(posixpath.join(source, "dataset_info.json")):
            return tfds.builder_from_directory(source)
        try:
            return read_only_builder.builder_from_files(source, data_dir=self.data_dir)
        except Exception as e:  # TFDS raises DatasetNotFoundError and friends
            where = self.data_dir or "the default TFDS data dir"
            raise ConfigError(
                f"TFDS dataset {source!r} is not prepared in {where} and tftrain does not download at "
                f"convert time: run `tfds build {source} --data_dir=DIR` first, then pass "
                f"--pipeline_options=data_dir=DIR (or --input=<the prepared dataset directory>). "
                f"TFDS said: {str(e).splitlines()[0]}") from None

    def prepare(self, source):
        import tensorflow_datasets as tfds

        builder = self._builder(source)
        if str(builder.info.file_format).lower().split(".")[-1] != "tfrecord":
            raise ConfigError(f"TFDS dataset {source!r} is stored as {builder.info.file_format}; "
                              "rebuild it with `tfds build --file_format=tfrecord`.")
        splits = {name: {"files": [str(p) for p in split.filepaths], "num_examples": split.num_examples}
                  for name, split in builder.info.splits.items()}
        if not splits:
            raise ConfigError(f"TFDS dataset {source!r} has no prepared splits in {builder.data_dir}.")
        features = builder.info.features
        supervised = builder.info.supervised_keys
        supervised = supervised if supervised and all(isinstance(k, str) for k in supervised[:2]) else None

        def only(kind):
            found = [k for k, f in features.items() if isinstance(f, kind)]
            return found[0] if len(found) == 1 else None

        image_key = self.image_key or (supervised[0] if supervised else only(tfds.features.Image))
        label_key = self.label_key or (supervised[1] if supervised else only(tfds.features.ClassLabel))
        for key in (self.image_key, self.label_key):
            if key and key not in features:
                raise ConfigError(f"TFDS dataset {source!r} has no feature {key!r}; it has: "
                                  f"{', '.join(features.keys())}.")
        info = {"tfds_name": builder.info.full_name, "tfds_dir": str(builder.data_dir),
                "splits": splits, "source_splits": sorted(splits), "label_key": label_key}
        label_feature = features[label_key] if label_key in features else None
        if isinstance(label_feature, tfds.features.ClassLabel):
            info.update(class_names=list(label_feature.names), num_classes=label_feature.num_classes)
        image_feature = features[image_key] if image_key in features else None
        if (isinstance(image_feature, tfds.features.Image) and image_feature.np_dtype == np.uint8
                and "class_names" in info):
            shape = list(image_feature.shape)
            channels = self.channels or shape[-1] or 3
            size = self.image_size or (tuple(shape[:2]) if None not in shape[:2] else None)
            info.update(mode="image", image_key=image_key, image_size=[*(size or (0, 0)), channels])
            if size is None:
                info["image_size"][:2] = self._first_image_size(info)
            info.update(encoding_info(self.encoding, info["image_size"]))
        else:
            given = [option for option in ENCODING_OPTIONS if option in self.options]
            if given:
                raise ConfigError(f"pipeline option(s) {', '.join(given)} are for image datasets; "
                                  f"TFDS dataset {source!r} is not an image classification dataset.")
            info.update(mode="features", schema=_schema_of(features.get_serialized_info()))
        return info

    def _first_image_size(self, info) -> list[int]:
        for row in self.read(None, info):
            _, height, width = probe_image(self._image_bytes(self._example(row), info))
            logging.info("tfds: decoding to %dx%d, the size of the first image; pass "
                         "--pipeline_options=image_size=HxW to choose another.", height, width)
            return [height, width]
        raise ConfigError(f"TFDS dataset {info['tfds_name']} has no examples.")

    def read(self, source, info, worker=0, num_workers=1):
        files = [(split, path) for split in sorted(info["splits"]) for path in info["splits"][split]["files"]]
        by_file = len(files) >= num_workers  # enough files: each worker reads whole files
        index = 0
        for number, (split, path) in enumerate(files):
            if by_file and number % num_workers != worker:
                continue
            for record_index, record in enumerate(_records(path)):
                if by_file or index % num_workers == worker:
                    yield Row(key=f"{split}/{posixpath.basename(path)}:{record_index}", value=record,
                              split=split)
                index += 1

    def features(self, info):
        return dict(IMAGE_FEATURES) if info["mode"] == "image" else dict(info["schema"])

    @staticmethod
    def _example(row):
        import tensorflow as tf
        from google.protobuf.message import DecodeError

        try:
            return tf.train.Example.FromString(row.value)
        except DecodeError as e:
            raise BadRow(f"not a tf.train.Example: {e}") from None

    @staticmethod
    def _image_bytes(example, info) -> bytes:
        values = example.features.feature[info["image_key"]].bytes_list.value
        if not values:
            raise BadRow(f"no image in feature {info['image_key']!r}")
        return values[0]

    def encode(self, row, info):
        example = self._example(row)
        if info["mode"] != "image":
            missing = sorted(set(info["schema"]) - set(example.features.feature))
            if missing:
                raise BadRow(f"missing feature(s) {', '.join(missing)}")
            return example
        encoded = self._image_bytes(example, info)
        probed = probe_image(encoded)
        labels = example.features.feature[info["label_key"]].int64_list.value
        if not labels or not 0 <= labels[0] < info["num_classes"]:
            raise BadRow(f"label {list(labels)} in {info['label_key']!r} is not a class id")
        filenames = example.features.feature.get("image/filename")
        filename = filenames.bytes_list.value[0].decode() if filenames and filenames.bytes_list.value else row.key
        return encoded_image_example(info, data=encoded, probed=probed, label=labels[0],
                                     text=info["class_names"][labels[0]], filename=filename)

    def image_shape(self, info):
        if info["mode"] != "image":
            return None
        height, width, channels = info["image_size"]
        height, width = self.image_size or (height, width)
        return height, width, self.channels or channels

    def decode(self, features, info):
        import tensorflow as tf

        if info["mode"] == "image":
            return decode_image_batch(features, *self.image_shape(info), info)
        inputs = dict(features)
        label = inputs.pop(info["label_key"], None) if info.get("label_key") else None
        if label is not None and label.dtype == tf.int64:
            label = tf.cast(label, tf.int32)
        if len(inputs) == 1:
            (inputs,) = inputs.values()
        return inputs, label
