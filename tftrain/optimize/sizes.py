"""Model sizes: raw and gzip-compressed bytes of weights and files.

Pruned weights are stored dense (zeros included), so pruning shows up only after compression:
`gzip_weights_bytes` is the size of all weights as float32, concatenated and gzipped.
"""
from __future__ import annotations

import gzip

import numpy as np
import tensorflow as tf


def gzip_bytes(data: bytes) -> int:
    """Size of `data` after gzip at the highest compression level."""
    return len(gzip.compress(data, compresslevel=9, mtime=0))


def gzip_weights_bytes(model) -> int:
    """Gzip size of every weight of `model` as little-endian float32, in layer order."""
    parts = [np.asarray(w, dtype="<f4").tobytes() for w in model.get_weights()]
    return gzip_bytes(b"".join(parts))


def file_bytes(path: str) -> int:
    """Size of the file at `path` (any filesystem `tf.io.gfile` knows)."""
    return int(tf.io.gfile.stat(path).length)
