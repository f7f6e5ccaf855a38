"""RecordFile writes the same bytes as tf.io.TFRecordWriter and hashes them on the way out;
check_frames walks a file's record headers and names the first damaged one. Fast; `make
mutation` runs them."""
import hashlib
import io
import os
import struct

import pytest
import tensorflow as tf

from tftrain.data.record_file import (BUFFER_BYTES, DamagedFile, RecordFile, check_frames,
                                      masked_crc32c)


def test_same_bytes_as_tfrecordwriter_and_the_right_hash(tmp_path):
    records = [b"", b"x", os.urandom(300), os.urandom(BUFFER_BYTES + 5)] + [os.urandom(n) for n in range(0, 5000, 37)]
    ours, theirs = str(tmp_path / "ours.tfrecord"), str(tmp_path / "theirs.tfrecord")
    with RecordFile(ours) as out:
        for record in records:
            out.write(record)
    nbytes, sha256 = out.close()  # a second close is harmless and returns the same
    with tf.io.TFRecordWriter(theirs) as writer:
        for record in records:
            writer.write(record)
    data = open(ours, "rb").read()
    assert data == open(theirs, "rb").read()
    assert (nbytes, sha256, out.records) == (len(data), hashlib.sha256(data).hexdigest(), len(records))
    assert [r.numpy() for r in tf.data.TFRecordDataset(ours)] == records


def test_empty_file_and_gfile_paths():
    path = "ram://record_file_test/empty.tfrecord"
    tf.io.gfile.makedirs("ram://record_file_test")
    assert RecordFile(path).close() == (0, hashlib.sha256(b"").hexdigest())
    with RecordFile("ram://record_file_test/one.tfrecord") as out:
        out.write(b"abc")
    assert [r.numpy() for r in tf.data.TFRecordDataset("ram://record_file_test/one.tfrecord")] == [b"abc"]


# ---- framing, byte by byte ---------------------------------------------------------------

def tf_file(path, records) -> bytes:
    """`records` written by TensorFlow's own writer; returns the file's bytes."""
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record)
    return open(path, "rb").read()


def test_record_framing_against_tensorflows_writer(tmp_path):
    # masked_crc32c and the layout, record by record, against TensorFlow's writer (CRCs above
    # and below 2^31 among them).
    records = [b"", b"abc", bytes(range(256)) * 3] + [os.urandom(n) for n in range(1, 200, 3)]
    data = tf_file(tmp_path / "tf.tfrecord", records)
    offset = 0
    for record in records:
        length = struct.pack("<Q", len(record))
        assert data[offset:offset + 12] == length + masked_crc32c(length)
        assert data[offset + 12:offset + 12 + len(record)] == record
        assert data[offset + 12 + len(record):offset + 16 + len(record)] == masked_crc32c(record)
        offset += 16 + len(record)
    assert offset == len(data)


def test_a_full_buffer_is_written_at_once_and_counted(tmp_path):
    path = str(tmp_path / "x.tfrecord")
    out = RecordFile(path)
    assert (out.bytes, out.records) == (0, 0)
    out.write(b"a" * (BUFFER_BYTES - 17))  # one byte short of a full buffer: kept
    assert (os.path.getsize(path), out.bytes, out.records) == (0, 0, 1)
    out.write(b"")  # 16 bytes more: BUFFER_BYTES + 15 pending, written
    assert os.path.getsize(path) == out.bytes == BUFFER_BYTES + 15
    exact = RecordFile(str(tmp_path / "exact.tfrecord"))
    exact.write(b"b" * (BUFFER_BYTES - 16))  # exactly a full buffer
    assert os.path.getsize(str(tmp_path / "exact.tfrecord")) == exact.bytes == BUFFER_BYTES
    for n in range(3):  # after a flush, the buffer starts again and the counts go on
        out.write(b"c" * BUFFER_BYTES)
    out.write(b"d")
    nbytes, sha256 = out.close()
    data = open(path, "rb").read()
    assert data == tf_file(tmp_path / "tf.tfrecord", [b"a" * (BUFFER_BYTES - 17), b""]
                           + [b"c" * BUFFER_BYTES] * 3 + [b"d"])
    assert (nbytes, sha256, out.records) == (len(data), hashlib.sha256(data).hexdigest(), 6)
    assert out.close() == (nbytes, sha256)
    exact.close()


def test_a_local_shard_is_written_unbuffered_through_short_writes(tmp_path):
    path = str(tmp_path / "x.tfrecord")
    out = RecordFile(path)
    # No buffer but the record file's own (a converter keeps one open per shard it owns).
    assert type(out._file) is io.FileIO

    class Short(io.FileIO):
        """A raw file that takes at most 1000 bytes per call, as a raw write may."""

        def write(self, data):
            return super().write(bytes(data[:1000]))

    out._file.close()
    out._file = Short(path, "wb")
    records = [os.urandom(5000), os.urandom(BUFFER_BYTES)]
    for record in records:
        out.write(record)
    out.close()
    assert open(path, "rb").read() == tf_file(tmp_path / "tf.tfrecord", records)


# ---- check_frames ---------------------------------------------------------------------------

def message(path, record, offset, what):
    return (f"{path}, record {record}: damaged at byte {offset:,}: {what}. "
            "Convert the dataset again or restore the file.")


def test_check_frames_counts_records(tmp_path):
    path = tmp_path / "x.tfrecord"
    for records in ([], [b""], [b"a"], [b"", b"", b"xyz"],
                    [os.urandom(n) for n in range(0, 3000, 7)],
                    [os.urandom(70_000), b"q", os.urandom(200_000), b""]):
        tf_file(path, records)
        assert check_frames(str(path)) == len(records)


def header(length):
    raw = struct.pack("<Q", length)
    return raw + masked_crc32c(raw)


def test_check_frames_names_the_damaged_record(tmp_path):
    path = tmp_path / "x.tfrecord"
    good = tf_file(path, [b"abc", b"de"])  # 19 + 18 bytes
    cases = [
        (good[:-1], 1, 19, "the record claims 2 bytes but only 1 remain in the file"),
        (good + header(0)[:5], 2, 37, "the file ends inside the record's header (5 of 12 bytes)"),
        (good + header(1)[:11], 2, 37, "the file ends inside the record's header (11 of 12 bytes)"),
        (good + header(0)[:12], 2, 37, "the record claims 0 bytes but only 0 remain in the file"),
        (good + header(0)[:12] + b"xy", 2, 37,
         "the record claims 0 bytes but only 0 remain in the file"),
        (good + header(1 << 40) + b"x" * 20, 2, 37,
         "the record claims 1,099,511,627,776 bytes but only 16 remain in the file"),
        (good + header((1 << 63) + 5) + b"x" * 20, 2, 37,
         "the record claims 9,223,372,036,854,775,813 bytes but only 16 remain in the file"),
        (good[:19] + bytes([good[19] ^ 1]) + good[20:], 1, 19,
         "the length's checksum does not match"),  # a bit of the length
        (good[:27] + bytes([good[27] ^ 1]) + good[28:], 1, 19,
         "the length's checksum does not match"),  # a bit of the length's CRC
    ]
    for data, record, offset, what in cases:
        path.write_bytes(data)
        with pytest.raises(DamagedFile) as raised:
            check_frames(str(path))
        assert str(raised.value) == message(path, record, offset, what)
        assert (raised.value.path, raised.value.record) == (str(path), record)
        assert raised.value.what == f"damaged at byte {offset:,}: {what}"
    # the data's own checksum is not read: a damaged record body still walks
    path.write_bytes(good[:13] + b"X" + good[14:])
    assert check_frames(str(path)) == 2


def test_check_frames_reads_a_window_of_headers_at_a_time(tmp_path, monkeypatch):
    reads = []

    def pread(fd, n, offset):
        reads.append((n, offset))
        return real_pread(fd, n, offset)

    real_pread = os.pread
    monkeypatch.setattr(os, "pread", pread)
    path = tmp_path / "x.tfrecord"
    tf_file(path, [b"r" * 100] * 1000)  # 116,000 bytes: two windows of 64 KiB
    assert check_frames(str(path)) == 1000
    assert reads == [(1 << 16, 0), (1 << 16, 116 * 565)]  # record 565 starts past the first
    # A header across the end of the window: read again from that header.
    reads.clear()
    tf_file(path, [b"a" * (65530 - 16), b"b"])
    assert check_frames(str(path)) == 2 and reads == [(1 << 16, 0), (1 << 16, 65530)]
    # The second record's header ends exactly at the end of the first window: no second read.
    reads.clear()
    tf_file(path, [b"a" * (65536 - 16 - 12), b"b" * 10])
    assert check_frames(str(path)) == 2 and reads == [(1 << 16, 0)]
    # Large records: one read per header, at the header.
    reads.clear()
    tf_file(path, [b"a" * 100_000, b"b" * 100_000])
    assert check_frames(str(path)) == 2 and reads == [(1 << 16, 0), (1 << 16, 100_016)]


def test_a_damaged_file_error():
    error = DamagedFile("/d/x.tfrecord", "a problem")
    assert str(error) == "/d/x.tfrecord: a problem. Convert the dataset again or restore the file."
    assert (error.path, error.what, error.record) == ("/d/x.tfrecord", "a problem", None)
    error = DamagedFile("/d/x.tfrecord", "a problem", 0)
    assert str(error) == ("/d/x.tfrecord, record 0: a problem. Convert the dataset again or "
                          "restore the file.")
    assert error.record == 0
