"""RecordFile writes the same bytes as tf.io.TFRecordWriter and hashes them on the way out."""
import hashlib
import os

import tensorflow as tf

from tftrain.data.record_file import BUFFER_BYTES, RecordFile


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
