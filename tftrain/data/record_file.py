"""TFRecord files from Python: written and hashed on the way out (`RecordFile`), and their
framing checked before TensorFlow reads them (`check_frames`).

The bytes are exactly those of `tf.io.TFRecordWriter` (uncompressed): per record, the length as
a little-endian uint64, the masked CRC-32C of those 8 bytes, the data, the masked CRC-32C of
the data. Writing the framing here lets the converter compute each shard's sha256 on the way
out instead of reading the whole shard back, and gathers small records into writes of
`BUFFER_BYTES` (`tf.io.TFRecordWriter` makes one write call per record). The buffer is one
bytearray, not a list of small bytes objects: a converter keeps a writer open per shard it
owns, and shards grow in number with the data, so each must cost its buffer and no more (a list
of 100-byte records cost ~2.7 MB per MB buffered). Paths go through `tf.io.gfile`
unless local.
"""
from __future__ import annotations

import hashlib
import io
import os
import struct

import google_crc32c
from absl import logging

from tftrain.errors import DataError

BUFFER_BYTES = 256 << 10
_MASK_DELTA = 0xA282EAD8

if google_crc32c.implementation != "c":
    logging.warning("google-crc32c runs without its C extension on this platform: writing "
                    "TFRecord shards will be slow (reinstall google-crc32c from a binary wheel).")


def masked_crc32c(data: bytes) -> bytes:
    """TFRecord's masked CRC-32C of `data`, as the 4 little-endian bytes stored in the file."""
    crc = google_crc32c.value(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF)


class RecordFile:
    """Writes records to a new TFRecord file at `path`; `close()` returns (bytes, sha256 hex)."""

    def __init__(self, path: str):
        if "://" in path:
            import tensorflow as tf

            self._file = tf.io.gfile.GFile(path, "wb")
        else:
            self._file = open(path, "wb", buffering=0)  # noqa: SIM115 - closed in close()
        self._sha256 = hashlib.sha256()
        self._pending = bytearray()
        self.bytes = 0
        self.records = 0

    def write(self, data: bytes) -> None:
        """Appends one record."""
        length = struct.pack("<Q", len(data))
        pending = self._pending
        pending += length
        pending += masked_crc32c(length)
        pending += data
        pending += masked_crc32c(data)
        self.records += 1
        if len(pending) >= BUFFER_BYTES:
            self._flush()

    def _flush(self) -> None:
        chunk = bytes(self._pending)
        self._sha256.update(chunk)
        if isinstance(self._file, io.FileIO):
            view = memoryview(chunk)
            while view:  # a raw file may take less than asked
                view = view[self._file.write(view):]
        else:
            self._file.write(chunk)
        self.bytes += len(chunk)
        self._pending = bytearray()

    def close(self) -> tuple[int, str]:
        """Flushes and closes the file; returns its size in bytes and its sha256 (hex)."""
        if self._file is not None:
            try:
                self._flush()
            finally:
                self._file.close()
                self._file = None
        return self.bytes, self._sha256.hexdigest()

    def __enter__(self) -> "RecordFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


FRAME_BYTES = 16  # the framing of one record: its length, the length's CRC, the data's CRC
_WINDOW = 1 << 16


def check_frames(path: str) -> int:
    """Walks the record headers of the local TFRecord file `path` without reading the records;
    returns how many records it holds.

    TensorFlow's reader trusts a record's length header: a header claiming 2^40 bytes (with a
    valid CRC) makes it allocate that much and crash the process. Here every length is checked
    against the bytes left in the file (and its CRC against the length) before anything reads
    the record. Raises DamagedFile (a DataError) naming the file, the record and its offset.
    """
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        window, window_start = b"", 0
        offset = records = 0
        while offset < size:
            at = offset - window_start
            if at < 0 or at + 12 > len(window):
                window, window_start, at = os.pread(fd, _WINDOW, offset), offset, 0
            header = window[at:at + 12]
            if len(header) < 12:
                raise _damaged(path, records, offset, f"the file ends inside the record's header "
                               f"({size - offset} of 12 bytes)")
            if masked_crc32c(header[:8]) != header[8:]:
                raise _damaged(path, records, offset, "the length's checksum does not match")
            (length,) = struct.unpack("<Q", header[:8])
            if length > size - offset - FRAME_BYTES:
                raise _damaged(path, records, offset, f"the record claims {length:,} bytes but "
                               f"only {max(0, size - offset - FRAME_BYTES):,} remain in the file")
            offset += length + FRAME_BYTES
            records += 1
    return records


class DamagedFile(DataError):
    """A dataset file that must not be read: `what` is wrong with the file at `path`."""

    def __init__(self, path: str, what: str, record: int | None = None):
        where = f"{path}, record {record}" if record is not None else path
        super().__init__(f"{where}: {what}. Convert the dataset again or restore the file.")
        self.path, self.what, self.record = path, what, record


def _damaged(path: str, index: int, offset: int, what: str) -> DamagedFile:
    return DamagedFile(path, f"damaged at byte {offset:,}: {what}", index)
