"""Serialized `tf.train.Example`s built directly as bytes, without protobuf objects.

Building an Example through the protobuf classes costs ~30 us per image (one Python object per
Feature and list), as much as reading and checking the image file; the converter's pipelines
therefore write the wire format themselves (~8 us). The output parses to the same message as the protobuf-built Example (checked against protobuf in
`tests/test_example_bytes.py`): features sorted by name, packed int64/float lists, so the same
features always give the same bytes.

    example({"image/encoded": bytes_feature(data), "image/height": int64_feature(64)})

A pipeline's `encode()` may return such bytes or a `tf.train.Example`; `serialize` and
`int64_scalar` accept both.
"""
from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

_TAG_1 = b"\x0a"  # field 1, length-delimited: Example.features, Features.feature entries,
                  # map-entry key, Feature.bytes_list, BytesList.value, packed list values
_TAG_2 = b"\x12"  # field 2, length-delimited: map-entry value, Feature.float_list
_TAG_3 = b"\x1a"  # field 3, length-delimited: Feature.int64_list
# The varints of 0 .. 2**14 - 1 (one or two bytes), looked up: lengths of features up to 16 KiB
# and most labels and sizes, the values written for every row.
_SMALL_VARINTS = [bytes([n]) if n < 128 else bytes([(n & 0x7F) | 0x80, n >> 7])
                  for n in range(1 << 14)]
_SMALL_VARINT_LIMIT = len(_SMALL_VARINTS)


def _varint(value: int) -> bytes:
    if 0 <= value < _SMALL_VARINT_LIMIT:
        return _SMALL_VARINTS[value]
    value &= (1 << 64) - 1  # negative int64s are 10-byte two's complement varints
    out = bytearray()
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _delimited(tag: bytes, payload: bytes) -> bytes:
    return tag + _varint(len(payload)) + payload


def bytes_feature(values: bytes | str | Iterable[bytes | str]) -> bytes:
    """A serialized `tf.train.Feature` holding a BytesList (a str is UTF-8 encoded)."""
    if isinstance(values, str):
        values = values.encode()
    elif isinstance(values, (bytearray, memoryview)):
        values = bytes(values)
    if isinstance(values, bytes):  # the common case: small parts first, so `values` is copied once
        size = _varint(len(values))
        return _TAG_1 + _varint(1 + len(size) + len(values)) + _TAG_1 + size + values
    items = b"".join(_delimited(_TAG_1, v.encode() if isinstance(v, str) else bytes(v))
                     for v in values)
    return _TAG_1 + _varint(len(items)) + items


def int64_feature(values: int | Iterable[int]) -> bytes:
    """A serialized `tf.train.Feature` holding an Int64List."""
    if isinstance(values, (int, np.integer)):
        value = int(values)
        feature = _INT64_SCALARS.get(value)
        if feature is None:
            packed = _varint(value)
            feature = _TAG_3 + _varint(len(packed) + 2) + _TAG_1 + _varint(len(packed)) + packed
            if len(_INT64_SCALARS) < _MAX_CACHED:
                _INT64_SCALARS[value] = feature
        return feature
    packed = b"".join(_varint(v) for v in np.asarray(values, np.int64).ravel().tolist())
    return _delimited(_TAG_3, _delimited(_TAG_1, packed) if packed else b"")


def float_feature(values: float | Iterable[float]) -> bytes:
    """A serialized `tf.train.Feature` holding a FloatList (values are stored as float32)."""
    packed = np.asarray(values, dtype="<f4").tobytes()  # a scalar or any shape, flattened
    return _delimited(_TAG_2, _delimited(_TAG_1, packed) if packed else b"")


def example(features: Mapping[str, bytes]) -> bytes:
    """A serialized `tf.train.Example` from feature name -> serialized Feature (see above)."""
    parts, body_size = [_TAG_1, b""], 0  # parts[1]: the size of the body, known at the end
    for name in sorted(features):
        feature = features[name]
        key = _KEYS.get(name) or _key(name)
        size = _varint(len(feature))
        entry_size = len(key) + 1 + len(size) + len(feature)
        entry_size_bytes = _varint(entry_size)
        parts += (_TAG_1, entry_size_bytes, key, _TAG_2, size, feature)
        body_size += 1 + len(entry_size_bytes) + entry_size
    parts[1] = _varint(body_size)
    return b"".join(parts)  # one copy of each (possibly large) feature


# Bounded caches of what repeats from row to row: feature names, scalar int64 features (labels,
# image sizes).
_MAX_CACHED = 10_000
_KEYS: dict[str, bytes] = {}  # feature name -> its serialized map-entry key field
_INT64_SCALARS: dict[int, bytes] = {}  # value -> its serialized Int64List feature


def _key(name: str) -> bytes:
    if len(_KEYS) < _MAX_CACHED:
        _KEYS[name] = _delimited(_TAG_1, name.encode())
        return _KEYS[name]
    return _delimited(_TAG_1, name.encode())


def serialize(encoded) -> bytes:
    """The bytes of what a pipeline's `encode()` returned (serialized bytes or a tf.train.Example)."""
    if isinstance(encoded, bytes):
        return encoded
    if not hasattr(encoded, "SerializeToString"):
        raise TypeError(f"encode() returned a {type(encoded).__name__}; return a tf.train.Example "
                        "or its serialized bytes (see tftrain.data.example_bytes)")
    return encoded.SerializeToString(deterministic=True)


def int64_scalar(encoded, name: str) -> int | None:
    """The value of feature `name` when it is an Int64List of exactly one value, else None.

    `encoded` is what a pipeline's `encode()` returned: a tf.train.Example or its bytes. Bytes
    laid out as `example` writes them are read directly (a few entries skipped by their lengths);
    any other layout is parsed by protobuf.
    """
    if isinstance(encoded, bytes):
        found = _int64_scalar_of_our_layout(encoded, name)
        if found is not _OTHER_LAYOUT:
            return found
        from tensorflow.core.example import example_pb2

        encoded = example_pb2.Example.FromString(encoded)
    feature = encoded.features.feature
    values = feature[name].int64_list.value if name in feature else ()
    return int(values[0]) if len(values) == 1 else None


_OTHER_LAYOUT = object()


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 128:
            return value, pos
        shift += 7


def _int64_scalar_of_our_layout(data: bytes, name: str):
    """`int64_scalar` of bytes in `example`'s layout (one features field, each map entry its key
    then its value, each name once); `_OTHER_LAYOUT` when the bytes are laid out otherwise."""
    try:
        if data[:1] != _TAG_1:
            return _OTHER_LAYOUT if data else None
        size, pos = _read_varint(data, 1)
        if pos + size != len(data):
            return _OTHER_LAYOUT
        key = _KEYS.get(name) or _key(name)
        while pos < len(data):
            if data[pos] != 0x0A:
                return _OTHER_LAYOUT
            entry_size, pos = _read_varint(data, pos + 1)
            entry_end = pos + entry_size
            if data[pos] != 0x0A:  # a map entry that does not start with its key
                return _OTHER_LAYOUT
            if data.startswith(key, pos):
                value = pos + len(key)
                if data[value] != 0x12:
                    return _OTHER_LAYOUT
                feature_size, value = _read_varint(data, value + 1)
                if value + feature_size != entry_end:
                    return _OTHER_LAYOUT
                if data[value] != 0x1A:  # not an Int64List
                    return None
                list_size, value = _read_varint(data, value + 1)
                if not list_size:  # an empty list
                    return None
                list_end = value + list_size
                if data[value] != 0x0A:  # not a packed list
                    return _OTHER_LAYOUT
                packed_size, value = _read_varint(data, value + 1)
                if value + packed_size != list_end:  # the values in more than one run
                    return _OTHER_LAYOUT
                number, end = _read_varint(data, value)
                if end != list_end:  # none or more than one value
                    return None
                return number - (1 << 64) if number >= 1 << 63 else number
            pos = entry_end
        return None
    except IndexError:  # truncated: let protobuf say what is wrong
        return _OTHER_LAYOUT
