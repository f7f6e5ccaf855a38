"""Every file tftrain reads from a dataset is checked before anything opens it.

A dataset directory may come from elsewhere, and TensorFlow's TFRecord reader trusts what it
is given: a shard linked to /dev/zero never ends, a FIFO blocks forever, and a record header
claiming 2^40 bytes (with a valid checksum) makes it allocate that much and crash the process.
So a local dataset file must be a regular file whose real path lies inside the dataset
directory (a link to another file inside it is fine), its size must be the manifest's, and its
record headers are walked (`record_file.check_frames`) before TensorFlow reads it: once per
unchanged file per process, when the input pipeline is built (in Python, so that the pipeline's
graph stays free of Python calls: a TPU host or a tf.data service worker runs it without one).
The walk reads 12 bytes per record: ~1.5 million records/s on one core (bench/frame_check.py).

Remote files (gs://) have no links, devices or FIFOs; walking their headers would cost one
request per record, so they are not walked (TensorFlow's reader is then trusted with them).
"""
from __future__ import annotations

import os
import stat

from tftrain.data import record_file
from tftrain.data.record_file import DamagedFile
from tftrain.fileio import is_local, resolves_inside

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
          (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))
_checked: dict[tuple, int] = {}  # (real path, inode, size, mtime) -> records, walked once


def check(path: str, directory: str | None, expected_bytes: int | None = None) -> int | None:
    """Checks the dataset file `path` (see the module doc); returns its number of records, or
    None for a remote file. `directory`: the dataset directory it must lie in (None for
    foreign TFRecords found by a glob, which may lie anywhere the user pointed); `expected_bytes`:
    its size in the manifest. Raises DamagedFile (a DataError) naming the file and what is wrong."""
    if not is_local(path):
        return None
    real = os.path.realpath(path)
    if directory is not None:
        if not resolves_inside(path, directory):
            raise DamagedFile(path, f"leads out of the dataset directory {directory} (to {real}): "
                                    "tftrain reads only files inside it")
    try:
        info = os.stat(real)
    except OSError as e:
        raise DamagedFile(path, f"cannot be read ({e.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        kind = next((name for test, name in _KINDS if test(info.st_mode)), "not a regular file")
        raise DamagedFile(path, f"is {kind}, not a TFRecord file: tftrain reads only regular files")
    if expected_bytes is not None and info.st_size != expected_bytes:
        raise DamagedFile(path, f"has {info.st_size:,} bytes where the manifest says "
                                f"{expected_bytes:,}: it was changed after the conversion")
    key = (real, info.st_ino, info.st_size, info.st_mtime_ns)
    if key not in _checked:
        _checked[key] = record_file.check_frames(path)
    return _checked[key]
