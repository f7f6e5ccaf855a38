"""NumPy arrays: features `x` of any fixed shape and labels `y`, from `.npz` or `.npy` files.

Sources:
    data.npz            with arrays `x` and `y`, or per split `x_train`, `y_train`, `x_test`, ...
    a directory         with `x.npy` and `y.npy`, or `x_train.npy`, `y_train.npy`, ...
Array names are set with the options `x_key` (default `x`) and `y_key` (default `y`); split
suffixes are `train`, `validation` (or `val`), `test`.

Rows are streamed: a local `.npy` is memory-mapped, and an `.npz` member (or a remote file) is
read a chunk of rows at a time from its header offset, so an array larger than memory converts.
Each worker reads its own contiguous range of rows.

Features: `x` float32 of the array's row shape (with `x_encoding=raw`, an integer or boolean
array is stored instead as the bytes of its own dtype, little-endian: a uint8 array takes a
quarter of the bytes, and `decode` casts it to float32 with one `decode_raw` per batch, the same
values); `y` int64 class ids (integer labels,
`info["num_classes"]` = max + 1) or float32 (regression, any row shape). The labels' statistics
(distinct values, range, mean and standard deviation) go to `info["label_stats"]`: `task.type=auto`
trains float targets, and whole numbers with many distinct values, as regression. A row with NaN or
infinite features is a bad row unless `allow_nan=true`. `decode` returns `(x, y)`.
"""
from __future__ import annotations

import math
import posixpath
import zipfile

import numpy as np

from pipelines import raw_bytes
from pipelines.base import BasePipeline, Row
from pipelines.options import check_known, get_bool, get_str
from pipelines.sources import SPLIT_NAMES
from tftrain.data import example_bytes
from tftrain.errors import BadRow, ConfigError

OPTIONS = ("x_key", "y_key", "allow_nan", "x_encoding")
X_ENCODINGS = ("float32", "raw")
RAW_DTYPES = ("uint8", "int8", "uint16", "int16", "int32", "int64")  # what tf.io.decode_raw reads
CHUNK_BYTES = 8 << 20


class ArrayFile:
    """One array in a `.npy` file or an `.npz` member, read by rows without loading it whole."""

    def __init__(self, path: str, member: str | None = None):
        self.path, self.member = path, member
        with self._open() as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                self.shape, self.fortran, self.dtype = np.lib.format.read_array_header_1_0(f)
            else:
                self.shape, self.fortran, self.dtype = np.lib.format.read_array_header_2_0(f)
            self.offset = f.tell()
        if self.dtype.hasobject:
            raise ConfigError(f"{self} holds Python objects (dtype {self.dtype}); save a numeric array.")
        if not self.shape:
            raise ConfigError(f"{self} is a scalar; expected an array with one row per example.")

    def __str__(self):
        return f"{self.path}:{self.member}" if self.member else self.path

    def _open(self):
        import tensorflow as tf

        if self.member is None:
            return tf.io.gfile.GFile(self.path, "rb")
        archive = zipfile.ZipFile(tf.io.gfile.GFile(self.path, "rb"))
        return archive.open(self.member + ".npy")

    def __len__(self):
        return self.shape[0]

    def rows(self, start: int, stop: int):
        """Yields rows `start..stop-1` as arrays."""
        for chunk in self.chunks(start, stop):
            yield from chunk

    def chunks(self, start: int, stop: int):
        """Yields rows `start..stop-1` in arrays of consecutive rows (a few MB each)."""
        row_shape = self.shape[1:]
        per_chunk = max(1, CHUNK_BYTES // max(1, self.dtype.itemsize * math.prod(row_shape)))
        if self.member is None and "://" not in self.path:
            array = np.load(self.path, mmap_mode="r")
            for begin in range(start, stop, per_chunk):
                yield np.array(array[begin:min(stop, begin + per_chunk)])
            return
        if self.fortran and len(self.shape) > 1:  # column-major rows are not contiguous
            with self._open() as f:
                array = np.lib.format.read_array(f)
            yield array[start:stop]
            return
        row_bytes = self.dtype.itemsize * math.prod(row_shape)
        with self._open() as f:
            f.seek(self.offset + start * row_bytes)
            for begin in range(start, stop, per_chunk):
                count = min(stop, begin + per_chunk) - begin
                data = f.read(count * row_bytes)
                if len(data) != count * row_bytes:
                    raise ConfigError(f"{self} is truncated: it ends before row {begin + len(data) // row_bytes}.")
                yield np.frombuffer(data, self.dtype).reshape((count, *row_shape))


def _raw_storable(dtype: np.dtype) -> bool:
    """Whether `x_encoding=raw` can store arrays of `dtype` (bool is stored as uint8)."""
    return dtype.kind == "b" or dtype.name in RAW_DTYPES


MAX_COUNTED_VALUES = 1000  # distinct label values counted beyond this are "many" (None)


def label_stats(arrays: list[ArrayFile], integer: bool) -> dict:
    """The labels' statistics for the manifest (see `tftrain.tasks.registry`), in one streaming
    pass: kind, row shape, distinct values (None: more than `MAX_COUNTED_VALUES`), range, and
    per-entry mean and standard deviation (the regression head's scale)."""
    count, total, squares, distinct = 0, 0.0, 0.0, set()
    low, high = np.inf, -np.inf
    for y in arrays:
        for chunk in y.chunks(0, len(y)):
            if not chunk.size:
                continue
            values = chunk.reshape(len(chunk), -1).astype(np.float64)
            finite = values[np.isfinite(values).all(axis=1)]
            count += len(finite)
            total = total + finite.sum(axis=0)
            squares = squares + (finite ** 2).sum(axis=0)
            if finite.size:
                low, high = min(low, float(finite.min())), max(high, float(finite.max()))
            if distinct is not None:
                distinct.update(np.unique(finite).tolist())
                if len(distinct) > MAX_COUNTED_VALUES:
                    distinct = None
    mean = np.atleast_1d(total / max(count, 1))
    std = np.sqrt(np.maximum(np.atleast_1d(squares / max(count, 1)) - mean ** 2, 0.0))
    std = np.where(std > 1e-12, std, 1.0)
    scalar = len(arrays[0].shape) == 1 or integer
    return {"kind": "int" if integer else "float",
            "shape": [] if scalar else list(arrays[0].shape[1:]),
            "distinct": len(distinct) if distinct is not None else None, "count": count,
            "min": low if count else None, "max": high if count else None,
            "mean": float(mean[0]) if scalar else mean.tolist(),
            "std": float(std[0]) if scalar else std.tolist()}


class Pipeline(BasePipeline):
    """`(x, y)` arrays -> examples; see the module docstring."""

    name = "numpy"
    default_splits = {"train": 0.8, "validation": 0.1, "test": 0.1}

    def __init__(self, **options):
        check_known(options, OPTIONS, self.name)
        super().__init__(**options)
        self.x_key = get_str(options, "x_key", "x")
        self.y_key = get_str(options, "y_key", "y")
        self.allow_nan = get_bool(options, "allow_nan")
        self.x_encoding = (get_str(options, "x_encoding", "float32") or "float32").lower()
        if self.x_encoding not in X_ENCODINGS:
            raise ConfigError(f"pipeline option x_encoding={options['x_encoding']!r} must be one of "
                              f"{', '.join(X_ENCODINGS)}.")

    def _pairs(self, source: str) -> dict[str | None, tuple[ArrayFile, ArrayFile]]:
        """Source split (or None) -> its (x, y) arrays."""
        import tensorflow as tf

        if source.lower().endswith(".npz"):
            if not tf.io.gfile.exists(source):
                raise ConfigError(f"numpy input {source!r} does not exist.")
            with zipfile.ZipFile(tf.io.gfile.GFile(source, "rb")) as archive:
                names = {n[:-4] for n in archive.namelist() if n.endswith(".npy")}
            make = lambda name: ArrayFile(source, name)  # noqa: E731
        elif tf.io.gfile.isdir(source):
            names = {n[:-4] for n in tf.io.gfile.listdir(source) if n.endswith(".npy")}
            make = lambda name: ArrayFile(posixpath.join(source, name + ".npy"))  # noqa: E731
        else:
            raise ConfigError(f"numpy input {source!r} must be an .npz file or a directory of .npy "
                              f"files ({self.x_key}.npy and {self.y_key}.npy).")
        if self.x_key in names:
            found = {None: (self.x_key, self.y_key)}
        else:
            found = {}
            for name in sorted(names):
                prefix = self.x_key + "_"
                split = SPLIT_NAMES.get(name[len(prefix):].lower()) if name.startswith(prefix) else None
                if split:
                    found[split] = (name, self.y_key + name[len(self.x_key):])
        if not found:
            raise ConfigError(f"numpy input {source!r} has no array {self.x_key!r} (nor "
                              f"{self.x_key}_train, ...); it has: {', '.join(sorted(names)) or 'none'}. "
                              "Name them with --pipeline_options=x_key=...,y_key=....")
        pairs = {}
        for split, (x_name, y_name) in found.items():
            if y_name not in names:
                raise ConfigError(f"numpy input {source!r} has {x_name!r} but no labels {y_name!r}.")
            pairs[split] = (make(x_name), make(y_name))
        return pairs

    def prepare(self, source):
        pairs = self._pairs(source)
        x_shapes = {tuple(x.shape[1:]) for x, _ in pairs.values()}
        y_shapes = {tuple(y.shape[1:]) for _, y in pairs.values()}
        if len(x_shapes) > 1 or len(y_shapes) > 1:
            raise ConfigError(f"numpy input {source!r}: splits differ in row shape (x {x_shapes}, y {y_shapes}).")
        for x, y in pairs.values():
            if x.dtype.kind not in "biuf":
                raise ConfigError(f"{x} has dtype {x.dtype}; features must be numeric.")
            if len(x) != len(y):
                raise ConfigError(f"{x} has {len(x)} rows but {y} has {len(y)}; they must match.")
        x_dtypes = {x.dtype for x, _ in pairs.values()}
        if self.x_encoding == "raw" and (len(x_dtypes) > 1 or not _raw_storable(next(iter(x_dtypes)))):
            raise ConfigError(f"x_encoding=raw keeps integer and boolean arrays in their own dtype "
                              f"({', '.join(RAW_DTYPES)} or bool); numpy input {source!r} has x of "
                              f"dtype {', '.join(sorted(map(str, x_dtypes)))}. Leave x_encoding at "
                              "float32.")
        y_shape = list(y_shapes.pop())
        integer = all(y.dtype.kind in "biu" for _, y in pairs.values()) and y_shape in ([], [1])
        info = {"x_shape": list(x_shapes.pop()), "y_type": "int" if integer else "float",
                "y_shape": [] if integer else y_shape,
                "source_splits": sorted(s for s in pairs if s) or None,
                "num_examples": {str(s): len(x) for s, (x, _) in pairs.items()}}
        if self.x_encoding == "raw":
            dtype = next(iter(x_dtypes))
            info["x_encoding"] = "raw"
            info["x_dtype"] = "uint8" if dtype.kind == "b" else dtype.name
        info["label_stats"] = label_stats([y for _, y in pairs.values()], integer)
        if integer:
            info["num_classes"] = 1 + max(0, int(info["label_stats"]["max"] or 0))
        return info

    def read(self, source, info, worker=0, num_workers=1):
        for split, (x, y) in sorted(self._pairs(source).items(), key=lambda kv: str(kv[0])):
            start, stop = len(x) * worker // num_workers, len(x) * (worker + 1) // num_workers
            prefix = f"{split}/" if split else ""
            for index, x_row, y_row in zip(range(start, stop), x.rows(start, stop), y.rows(start, stop)):
                yield Row(key=f"{prefix}{index:010d}", value=(x_row, y_row), split=split)

    def features(self, info):
        label = ({"dtype": "int64", "shape": []} if info["y_type"] == "int"
                 else {"dtype": "float32", "shape": info["y_shape"]})
        x = ({"dtype": "string", "shape": []} if info.get("x_encoding") == "raw"
             else {"dtype": "float32", "shape": info["x_shape"]})
        return {"x": x, "y": label}

    def encode(self, row, info):
        x_row, y_row = row.value
        if info.get("x_encoding") == "raw":
            stored = np.ascontiguousarray(x_row, np.dtype(info["x_dtype"]).newbyteorder("<"))
            x_feature = example_bytes.bytes_feature(stored.tobytes())
        else:
            x = np.asarray(x_row, np.float32).ravel()
            if not self.allow_nan and not np.isfinite(x).all():
                raise BadRow(f"x has {int((~np.isfinite(x)).sum())} NaN or infinite value(s) "
                             "(pass allow_nan=true to keep them)")
            x_feature = example_bytes.float_feature(x)
        if info["y_type"] == "int":
            label = int(np.asarray(y_row).ravel()[0])
            if label < 0:
                raise BadRow(f"label {label} is negative")
            y = example_bytes.int64_feature(label)
        else:
            values = np.asarray(y_row, np.float32).ravel()
            if not np.isfinite(values).all():
                raise BadRow("y has NaN or infinite values")
            y = example_bytes.float_feature(values)
        return example_bytes.example({"x": x_feature, "y": y})

    def decode(self, features, info):
        import tensorflow as tf

        x = features["x"]
        if info.get("x_encoding") == "raw":
            shape = info["x_shape"]
            x = tf.cast(raw_bytes.decode_batch(x, info["x_dtype"], shape, "x_encoding=raw array",
                                               "x_shape " + "x".join(map(str, shape))), tf.float32)
        label = features["y"]
        return x, tf.cast(label, tf.int32 if info["y_type"] == "int" else tf.float32)

