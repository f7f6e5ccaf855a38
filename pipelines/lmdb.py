"""An LMDB environment whose values are encoded images or serialized `tf.train.Example`s.

`--input` is the environment's directory (the one holding `data.mdb`) or its data file. LMDB
memory-maps its file, so the input must be a local path. Every value is one row, keyed by its
LMDB key (decoded as text when it is UTF-8, else written in hex).

Values (found from the first records, or forced with `values=image|example`):
    image: JPEG/PNG bytes, stored as they are with the standard image keys (checked from the
        header and file structure like `image_folder`, see `images.probe_image`), and decoded
        like `image_folder`. Labels come from the key, `<class>/<name>` (or
        `<split>/<class>/<name>` when every key starts with a split name), class names sorted ->
        ids; or from `labels=FILE.csv`, rows `key,label` (optional header `key,label`): class
        names sorted -> ids, or the ids themselves when every label is a whole number.
    example: serialized `tf.train.Example`s, stored as they are. The schema is taken from the
        first records: each feature's type, and a fixed length when all of them agree (length 1
        is a scalar), else variable length. A later record that breaks it is a bad row. `decode`
        is the `tfds` pipeline's generic one: `(inputs, label)` with the label from `label_key`
        (default `label`, else `image/class/label`) and `inputs` the one other feature or a dict.

Never unpickled: many LMDB image datasets store Python pickles, and unpickling runs whatever code
the data names. A pickled value (protocol header 0x80) stops the conversion (among the first
records) or is a bad row, with a message that says how to rewrite the database. Caffe `Datum`
protobufs are not read either, and are named as such.

Workers each open the environment read-only without the lock file (`lock=False`), so the
environment must not be written to while it converts. Each worker walks the keys in order with one
read transaction and a cursor and reads the values of every `num_workers`-th key only.

Options:
    values: auto (default), image or example.
    labels: image values: a CSV file of `key,label` rows, instead of labels in the keys.
    image_size, channels: image values, as for `image_folder` (default: the first image's size, 3).
    image_encoding, jpeg_quality: image values, as for `image_folder` (default keep).
    label_key: Example values: the label feature.
    num_classes: Example values with an int64 label: the number of classes (default: the
        largest label among the first records + 1; a larger label later is a bad row).
"""
from __future__ import annotations

import collections
import itertools
import math
import os

from absl import logging

from pipelines.base import BasePipeline, Row
from pipelines.images import (ENCODING_OPTIONS, IMAGE_FEATURES, decode_image_batch,
                              encoded_image_example, encoding_info, encoding_options, probe_image)
from pipelines.options import check_known, get_int, get_size, get_str
from pipelines.sources import SPLIT_NAMES
from tftrain.errors import BadRow, ConfigError, DataError

OPTIONS = ("values", "labels", "image_size", "channels", *ENCODING_OPTIONS, "label_key", "num_classes")
MODE_OPTIONS = {"image": ("labels", "image_size", "channels", *ENCODING_OPTIONS),
                "example": ("label_key", "num_classes")}
SAMPLE_RECORDS = 100  # values looked at to detect their kind and take the Example schema
_DTYPES = {"bytes_list": "string", "float_list": "float32", "int64_list": "int64"}
# Caffe's caffe.proto Datum: field number -> wire type (float_data may also be packed).
_DATUM_FIELDS = {1: 0, 2: 0, 3: 0, 4: 2, 5: 0, 6: 5, 7: 0}

PICKLE_REFUSAL = (
    "is a Python pickle (protocol {protocol}), and tftrain never unpickles: unpickling runs "
    "whatever code the data names, so a downloaded database could run anything on this machine. "
    "With code you trust, write each value into a new LMDB as the image's JPEG/PNG bytes (labels "
    "in the key, `<class>/<name>`, or in a labels=FILE.csv) or as a serialized tf.train.Example "
    "(`example.SerializeToString()`), and convert that.")
DATUM_REFUSAL = (
    "is a Caffe Datum protobuf, which tftrain does not read: write each image into a new LMDB as "
    "JPEG/PNG bytes (an encoded Datum's `data` field already is one) or as a serialized "
    "tf.train.Example, and convert that.")


def _environment(source: str):
    """The LMDB environment at `source`, opened read-only without its lock file."""
    import lmdb

    if "://" in source:
        raise ConfigError(f"LMDB input {source!r} must be a local path (LMDB memory-maps its file); "
                          "copy the environment to local disk first.")
    if not os.path.exists(source):
        raise ConfigError(f"LMDB input {source!r} does not exist; pass the environment's directory "
                          "(the one holding data.mdb) or its data file.")
    try:
        # One read transaction per process, and lock=False keeps no reader table anyway.
        return lmdb.open(source, subdir=os.path.isdir(source), readonly=True, lock=False,
                         readahead=False, max_readers=1)
    except lmdb.Error as e:
        raise ConfigError(f"{source!r} is not a readable LMDB environment: {e}") from None


def _key_text(key: bytes) -> str:
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return key.hex()


def _pickle_protocol(value: bytes) -> int | None:
    """The protocol of a pickle written with protocol 2 or later (PROTO opcode 0x80), else None."""
    return value[1] if len(value) > 1 and value[0] == 0x80 and 2 <= value[1] <= 5 else None


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]  # IndexError past the end: not a well-formed message
        result |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise IndexError


def _is_datum(value: bytes) -> bool:
    """Whether `value` is a well-formed protobuf with only Caffe Datum fields and some data."""
    pos, fields = 0, set()
    try:
        while pos < len(value):
            tag, pos = _varint(value, pos)
            field, wire = tag >> 3, tag & 7
            if _DATUM_FIELDS.get(field) != wire and (field, wire) != (6, 2):
                return False
            if wire == 0:
                _, pos = _varint(value, pos)
            elif wire == 2:
                length, pos = _varint(value, pos)
                pos += length
            else:
                pos += 4
            fields.add(field)
    except IndexError:
        return False
    return pos == len(value) and bool(fields & {4, 6})


def _parse_example(value: bytes):
    """The `tf.train.Example` in `value`, or None when it is not one with at least one feature.

    Protobuf parsing is lenient (unknown fields are kept aside), so an empty Example is what
    most non-Example bytes parse to.
    """
    from google.protobuf.message import DecodeError
    from tensorflow.core.example import example_pb2

    try:
        example = example_pb2.Example.FromString(value)
    except DecodeError:
        return None
    return example if example.features.feature else None


def _refusal(value: bytes) -> str | None:
    """Why tftrain will not read `value` at all (a pickle, a Caffe Datum), or None."""
    protocol = _pickle_protocol(value)
    if protocol:
        return PICKLE_REFUSAL.format(protocol=protocol)
    return DATUM_REFUSAL if _is_datum(value) else None


def _kind(value: bytes) -> str:
    """'pickle', 'image', 'example', 'datum' or 'unknown'."""
    if _pickle_protocol(value):
        return "pickle"
    if value.startswith((b"\x89PNG", b"\xff\xd8")):
        return "image"
    if _parse_example(value) is not None:
        return "example"
    return "datum" if _is_datum(value) else "unknown"


def _schema_from(examples: list) -> dict[str, dict]:
    """The feature schema that the sampled `tf.train.Example`s agree on (see the module docstring)."""
    kinds, lengths = collections.defaultdict(set), collections.defaultdict(set)
    present = collections.Counter()
    for example in examples:
        for name, feature in example.features.feature.items():
            kind = feature.WhichOneof("kind")
            if kind:
                kinds[name].add(kind)
            lengths[name].add(len(getattr(feature, kind).value) if kind else 0)
            present[name] += 1
    schema = {}
    for name in sorted(present):
        if len(kinds[name]) > 1:
            raise DataError(f"LMDB Example feature {name!r} holds {' and '.join(sorted(kinds[name]))} "
                            "values in different records; one feature must keep one type.")
        dtype = _DTYPES[min(kinds[name], default="bytes_list")]
        length = min(lengths[name]) if len(lengths[name]) == 1 else 0
        if present[name] == len(examples) and length:
            schema[name] = {"dtype": dtype, "shape": [] if length == 1 else [length]}
        else:
            schema[name] = {"dtype": dtype, "shape": [], "varlen": True}
    return schema


def _read_labels_file(path: str) -> dict[str, str]:
    """`key -> label` from a CSV file of `key,label` rows (an optional `key,label` header)."""
    import csv

    import tensorflow as tf

    labels: dict[str, str] = {}
    try:
        with tf.io.gfile.GFile(path) as f:
            for line, row in enumerate(csv.reader(f), 1):
                if not row or (line == 1 and [c.strip().lower() for c in row] == ["key", "label"]):
                    continue
                if len(row) != 2 or not row[1].strip():
                    raise ConfigError(f"labels file {path}, line {line}: expected `key,label`, got {row}.")
                key, label = row[0], row[1].strip()
                if labels.setdefault(key, label) != label:
                    raise ConfigError(f"labels file {path}, line {line}: key {key!r} has two labels, "
                                      f"{labels[key]!r} and {label!r}.")
    except tf.errors.NotFoundError:
        raise ConfigError(f"pipeline option labels={path!r}: no such file.") from None
    if not labels:
        raise ConfigError(f"labels file {path} has no `key,label` rows.")
    return labels


def _label_ids(labels: dict[str, str]) -> tuple[list[str], dict[str, int]]:
    """Class names and `key -> id`: whole-number labels are ids, other labels sorted names."""
    if all(label.isdigit() for label in labels.values()):
        ids = {key: int(label) for key, label in labels.items()}
        return [str(i) for i in range(max(ids.values()) + 1)], ids
    class_names = sorted(set(labels.values()))
    index = {name: i for i, name in enumerate(class_names)}
    return class_names, {key: index[label] for key, label in labels.items()}


class Pipeline(BasePipeline):
    """An LMDB environment of images or Examples -> tftrain shards; see the module docstring."""

    name = "lmdb"
    default_splits = {"train": 0.8, "validation": 0.1, "test": 0.1}

    def __init__(self, **options):
        check_known(options, OPTIONS, self.name)
        super().__init__(**options)
        self.values = get_str(options, "values", "auto")
        if self.values not in ("auto", "image", "example"):
            raise ConfigError(f"pipeline option values={self.values!r} must be auto, image or example.")
        self.labels_file = get_str(options, "labels")
        self.image_size = get_size(options, "image_size")
        self.channels = get_int(options, "channels", 3)
        if self.channels not in (1, 3):
            raise ConfigError(f"pipeline option channels={self.channels} must be 1 or 3.")
        self.encoding = encoding_options(options)
        self.label_key = get_str(options, "label_key")
        self.num_classes = get_int(options, "num_classes", minimum=1)
        self._ids = None  # label lookup, built once per process (see _label)

    def __getstate__(self):  # workers rebuild the label lookup rather than receive it
        return {**self.__dict__, "_ids": None}

    # -- prepare -------------------------------------------------------------------------------

    def prepare(self, source):
        with _environment(source) as env, env.begin() as txn:
            num_records = txn.stat()["entries"]
            sample = list(itertools.islice(txn.cursor(), SAMPLE_RECORDS))
        if not sample:
            raise DataError(f"LMDB environment {source!r} has no records.")
        for key, value in sample:
            if _pickle_protocol(value):
                raise DataError(f"LMDB {source!r}: the value of key {_key_text(key)!r} {_refusal(value)}")
        mode = self.values if self.values != "auto" else self._detect(source, sample)
        other = "example" if mode == "image" else "image"
        wrong = [option for option in MODE_OPTIONS[other] if option in self.options]
        if wrong:
            raise ConfigError(f"pipeline option(s) {', '.join(wrong)} are for {other} values; the "
                              f"values of LMDB {source!r} are read as {mode}s.")
        info = {"mode": mode, "num_records": num_records}
        if mode == "image":
            info.update(self._prepare_images(source, [value for _, value in sample]))
        else:
            info.update(self._prepare_examples(source, [value for _, value in sample]))
        return info

    @staticmethod
    def _detect(source: str, sample: list) -> str:
        kinds = collections.Counter(_kind(value) for _, value in sample)
        if kinds["image"] or kinds["example"]:
            mode = "image" if kinds["image"] >= kinds["example"] else "example"
            logging.info("lmdb: reading the values as %ss (of the first %d: %s); pass "
                         "--pipeline_options=values=image|example to choose.", mode, len(sample),
                         ", ".join(f"{n} {k}" for k, n in kinds.most_common()))
            return mode
        if kinds["datum"]:
            key, value = next((k, v) for k, v in sample if _kind(v) == "datum")
            reason = DATUM_REFUSAL
        else:
            key, value = sample[0]
            try:
                probe_image(value)
            except BadRow as e:  # it says what the bytes look like (another image format, ...)
                reason = (f"is neither JPEG/PNG bytes nor a serialized tf.train.Example ({e}), and "
                          f"no other of the first {len(sample)} values is either.")
        raise DataError(f"LMDB {source!r}: the value of key {_key_text(key)!r} {reason}")

    def _prepare_images(self, source: str, values: list[bytes]) -> dict:
        if self.labels_file:
            class_names, _ = _label_ids(_read_labels_file(self.labels_file))
            info = {"labels": "file", "labels_file": self.labels_file, "key_splits": False}
        else:
            class_names, splits = self._key_classes(source)
            info = {"labels": "key", "key_splits": bool(splits), "source_splits": splits}
        size = self.image_size or self._first_image_size(source, values)
        info.update(class_names=class_names, num_classes=len(class_names),
                    image_size=[size[0], size[1], self.channels])
        info.update(encoding_info(self.encoding, info["image_size"]))
        return info

    @staticmethod
    def _key_classes(source: str) -> tuple[list[str], list[str] | None]:
        """Class names from keys `<class>/<name>`, or `<split>/<class>/<name>` when every key
        starts with a split name, and then the splits (else None). Reads the keys only."""
        classes, split_classes, splits, keys = set(), set(), collections.Counter(), 0
        with _environment(source) as env, env.begin() as txn:
            for key in txn.cursor().iternext(keys=True, values=False):
                parts = _key_text(key).split("/")
                keys += 1
                if len(parts) >= 2:
                    classes.add(parts[0])
                if len(parts) >= 3 and parts[0].lower() in SPLIT_NAMES:
                    split_classes.add(parts[1])
                    splits[SPLIT_NAMES[parts[0].lower()]] += 1
        key_splits = sum(splits.values()) == keys
        class_names = sorted(split_classes if key_splits else classes)
        if not class_names:
            raise ConfigError(f"the keys of LMDB {source!r} carry no class (expected "
                              "`<class>/<name>`); pass --pipeline_options=labels=FILE.csv with "
                              "`key,label` rows.")
        return class_names, sorted(splits) if key_splits else None

    @staticmethod
    def _first_image_size(source: str, values: list[bytes]) -> tuple[int, int]:
        for value in values:
            try:
                _, height, width = probe_image(value)
            except BadRow:
                continue
            logging.info("lmdb: decoding to %dx%d, the size of the first image; pass "
                         "--pipeline_options=image_size=HxW to choose another.", height, width)
            return height, width
        raise DataError(f"LMDB {source!r}: none of the first {len(values)} values is a readable "
                        "JPEG or PNG image.")

    def _prepare_examples(self, source: str, values: list[bytes]) -> dict:
        examples = [e for e in map(_parse_example, values) if e is not None]
        if not examples:
            raise DataError(f"LMDB {source!r}: none of the first {len(values)} values is a "
                            "serialized tf.train.Example.")
        schema = _schema_from(examples)
        if self.label_key and self.label_key not in schema:
            raise ConfigError(f"pipeline option label_key={self.label_key!r}: the Examples of LMDB "
                              f"{source!r} have no such feature; they have {', '.join(schema)}.")
        label_key = self.label_key or next((k for k in ("label", "image/class/label") if k in schema), None)
        info = {"schema": schema, "label_key": label_key, "schema_records": len(examples)}
        if label_key and schema[label_key] == {"dtype": "int64", "shape": []}:
            largest = max(e.features.feature[label_key].int64_list.value[0] for e in examples)
            info["num_classes"] = self.num_classes or max(int(largest), 0) + 1
            if not self.num_classes:
                logging.info("lmdb: %d classes, from the largest label among the first %d records; "
                             "pass --pipeline_options=num_classes=K if there are more.",
                             info["num_classes"], len(examples))
        return info

    # -- read and encode -----------------------------------------------------------------------

    def read(self, source, info, worker=0, num_workers=1):
        with _environment(source) as env, env.begin() as txn:
            cursor = txn.cursor()
            # Keys only, in key order: a worker reads the values (pages) of its own keys only.
            for index, key in enumerate(cursor.iternext(keys=True, values=False)):
                if index % num_workers != worker:
                    continue
                text = _key_text(key)
                split = SPLIT_NAMES.get(text.split("/", 1)[0].lower()) if info.get("key_splits") else None
                yield Row(key=text, value=cursor.value(), split=split)

    def features(self, info):
        return dict(IMAGE_FEATURES) if info["mode"] == "image" else dict(info["schema"])

    def encode(self, row, info):
        value = row.value
        if info["mode"] == "image":
            try:
                probed = probe_image(value)
            except BadRow:
                refusal = _refusal(value)
                if refusal:
                    raise BadRow(f"the value {refusal}") from None
                raise
            label = self._label(row, info)
            return encoded_image_example(info, data=value, probed=probed, label=label,
                                         text=info["class_names"][label], filename=row.key)
        example = _parse_example(value)
        if example is None:
            raise BadRow(f"the value {_refusal(value) or 'is not a serialized tf.train.Example'}")
        self._check_example(example, info)
        return value  # valid as it is: no need to serialize it again

    def _label(self, row, info) -> int:
        """The class id of an image row, from its key or from the labels file."""
        if self._ids is None:
            if info["labels"] == "file":
                self._ids = _label_ids(_read_labels_file(info["labels_file"]))[1]
            else:
                self._ids = {name: i for i, name in enumerate(info["class_names"])}
        if info["labels"] == "file":
            label = self._ids.get(row.key)
            if label is None:
                raise BadRow(f"no label for this key in {info['labels_file']}")
            return label
        parts = row.key.split("/")
        class_at = 1 if info["key_splits"] else 0  # `[split/]class/name`
        name = parts[class_at] if len(parts) >= class_at + 2 else None
        if name not in self._ids:
            raise BadRow("the key carries no known class (expected `<class>/<name>`)" if name is None
                         else f"class {name!r} was not in the environment when it was prepared")
        return self._ids[name]

    @staticmethod
    def _check_example(example, info) -> None:
        """Raises BadRow when the Example does not follow the schema taken from the first records."""
        where = f"the schema from the first {info['schema_records']} records"
        features = example.features.feature
        for name, spec in info["schema"].items():
            feature = features.get(name)
            kind = feature.WhichOneof("kind") if feature is not None else None
            values = getattr(feature, kind).value if kind else ()
            if kind and _DTYPES[kind] != spec["dtype"]:
                raise BadRow(f"feature {name!r} holds {_DTYPES[kind]}, {where} says {spec['dtype']}")
            expected = math.prod(spec["shape"])
            if not spec.get("varlen") and len(values) != expected:
                raise BadRow(f"feature {name!r} has {len(values)} value(s), {where} says {expected}")
        if "num_classes" in info:
            (label,) = features[info["label_key"]].int64_list.value
            if not 0 <= label < info["num_classes"]:
                raise BadRow(f"label {label} is not a class id below num_classes={info['num_classes']}"
                             " (pass --pipeline_options=num_classes=K)")

    # -- decode --------------------------------------------------------------------------------

    def image_shape(self, info):
        if info["mode"] != "image":
            return None
        height, width = self.image_size or info["image_size"][:2]
        channels = self.channels if "channels" in self.options else info["image_size"][2]
        return height, width, channels

    def decode(self, features, info):
        if info["mode"] == "image":
            return decode_image_batch(features, *self.image_shape(info), info)
        from pipelines.tfds import Pipeline as TfdsPipeline

        return TfdsPipeline().decode(features, {"mode": "features", "label_key": info["label_key"]})
