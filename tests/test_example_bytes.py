"""example_bytes writes the tf.train.Example wire format itself: it must parse to what protobuf builds."""
import numpy as np
import pytest
import tensorflow as tf

from tftrain.data import example_bytes as eb

F = tf.train.Feature


def proto(features: dict) -> tf.train.Example:
    return tf.train.Example(features=tf.train.Features(feature=features))


CASES = {
    "scalars": (
        {"a": eb.bytes_feature(b"xyz"), "b": eb.int64_feature(5), "c": eb.float_feature(1.5),
         "s": eb.bytes_feature("héllo")},
        {"a": F(bytes_list=tf.train.BytesList(value=[b"xyz"])),
         "b": F(int64_list=tf.train.Int64List(value=[5])),
         "c": F(float_list=tf.train.FloatList(value=[1.5])),
         "s": F(bytes_list=tf.train.BytesList(value=["héllo".encode()]))}),
    "edge values and empty lists": (
        {"": eb.bytes_feature([]), "neg": eb.int64_feature([-1, 2**63 - 1, -2**63, 0, 300]),
         "f": eb.float_feature(np.array([np.inf, -0.0, 1e30, 3.25], np.float32)),
         "e": eb.float_feature([]), "i": eb.int64_feature(np.array([], np.int64)),
         "npint": eb.int64_feature(np.int64(-5)), "npfloat": eb.float_feature(np.float32(0.1))},
        {"": F(bytes_list=tf.train.BytesList(value=[])),
         "neg": F(int64_list=tf.train.Int64List(value=[-1, 2**63 - 1, -2**63, 0, 300])),
         "f": F(float_list=tf.train.FloatList(value=[np.inf, -0.0, 1e30, 3.25])),
         "e": F(float_list=tf.train.FloatList(value=[])),
         "i": F(int64_list=tf.train.Int64List(value=[])),
         "npint": F(int64_list=tf.train.Int64List(value=[-5])),
         "npfloat": F(float_list=tf.train.FloatList(value=[np.float32(0.1)]))}),
    "long values": (
        {"é/key": eb.bytes_feature(["ü", b"", b"x" * 300, bytearray(b"ab")]),
         "Z": eb.int64_feature(np.arange(-100, 200).reshape(3, 100)),
         "big": eb.bytes_feature(bytes(range(256)) * 1000),
         "buffer": eb.bytes_feature(bytearray(b"raw")), "view": eb.bytes_feature(memoryview(b"mv")),
         "matrix": eb.float_feature(np.ones((2, 3), np.float64))},
        {"é/key": F(bytes_list=tf.train.BytesList(value=["ü".encode(), b"", b"x" * 300, b"ab"])),
         "Z": F(int64_list=tf.train.Int64List(value=list(range(-100, 200)))),
         "big": F(bytes_list=tf.train.BytesList(value=[bytes(range(256)) * 1000])),
         "buffer": F(bytes_list=tf.train.BytesList(value=[b"raw"])),
         "view": F(bytes_list=tf.train.BytesList(value=[b"mv"])),
         "matrix": F(float_list=tf.train.FloatList(value=[1.0] * 6))}),
    "no features": ({}, {}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_parses_to_the_protobuf_built_example(name):
    ours, reference = CASES[name]
    data = eb.example(ours)
    assert tf.train.Example.FromString(data) == proto(reference)
    assert eb.example(dict(reversed(list(ours.items())))) == data  # order-independent bytes


def test_a_float_beyond_float32_becomes_inf_as_in_protobuf_with_a_warning():
    with pytest.warns(RuntimeWarning, match="overflow"):
        data = eb.example({"huge": eb.float_feature(1e39)})
    reference = proto({"huge": F(float_list=tf.train.FloatList(value=[1e39]))})
    assert tf.train.Example.FromString(data) == reference
    assert reference.features.feature["huge"].float_list.value[0] == np.inf


def test_tensorflow_parses_it():
    data = eb.example({"x": eb.float_feature(np.arange(4, dtype=np.float32)), "y": eb.int64_feature(7),
                       "t": eb.bytes_feature("tag")})
    parsed = tf.io.parse_single_example(data, {
        "x": tf.io.FixedLenFeature([4], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64),
        "t": tf.io.FixedLenFeature([], tf.string)})
    np.testing.assert_array_equal(parsed["x"].numpy(), [0, 1, 2, 3])
    assert parsed["y"].numpy() == 7 and parsed["t"].numpy() == b"tag"


def test_serialize_and_int64_scalar_accept_bytes_and_protos():
    data = eb.example({"label": eb.int64_feature(-3), "many": eb.int64_feature([1, 2]),
                       "f": eb.float_feature(1.0)})
    message = tf.train.Example.FromString(data)
    assert eb.serialize(data) is data
    assert tf.train.Example.FromString(eb.serialize(message)) == message
    with pytest.raises(TypeError, match="encode\\(\\) returned a dict; return a tf.train.Example"):
        eb.serialize({"label": 3})
    for encoded in (data, message):
        assert eb.int64_scalar(encoded, "label") == -3
        assert eb.int64_scalar(encoded, "many") is None
        assert eb.int64_scalar(encoded, "f") is None
        assert eb.int64_scalar(encoded, "missing") is None


@pytest.mark.parametrize("value", [0, 1, 127, 128, 129, 300, 16383, 16384, 2**21, 2**63 - 1, -1,
                                   -2**63])
def test_varint_boundaries_and_cached_scalars_are_protobufs_bytes(value):
    expected = F(int64_list=tf.train.Int64List(value=[value])).SerializeToString()
    assert eb.int64_feature(value) == expected
    assert eb.int64_feature(np.int64(value)) == expected  # the second time from the cache
    size = abs(value) % 20_000  # byte strings whose lengths need one, two or three varint bytes
    data = bytes(size)
    assert eb.bytes_feature(data) == F(bytes_list=tf.train.BytesList(value=[data])).SerializeToString()


def _protobuf_int64_scalar(message, name):
    feature = message.features.feature
    values = feature[name].int64_list.value if name in feature else ()
    return int(values[0]) if len(values) == 1 else None


@pytest.mark.parametrize("name", sorted(CASES))
def test_int64_scalar_reads_our_bytes_and_protobufs_bytes_as_protobuf_does(name):
    ours, reference = CASES[name]
    extra = {"one": eb.int64_feature(-7), "big": eb.int64_feature(2**40), "empty": eb.int64_feature([])}
    message = proto({**reference, "one": F(int64_list=tf.train.Int64List(value=[-7])),
                     "big": F(int64_list=tf.train.Int64List(value=[2**40])),
                     "empty": F(int64_list=tf.train.Int64List(value=[]))})
    for data in (eb.example({**ours, **extra}), message.SerializeToString(deterministic=True)):
        for key in [*message.features.feature, "missing", "o"]:
            assert eb.int64_scalar(data, key) == _protobuf_int64_scalar(message, key), key


def test_int64_scalar_of_a_list_packed_in_two_runs_is_what_protobuf_reads():
    two_runs = b"\x1a\x06" + b"\x0a\x01\x05" + b"\x0a\x01\x06"  # Int64List [5] + [6] = [5, 6]
    data = eb.example({"label": two_runs, "one": eb.int64_feature(3)})
    message = tf.train.Example.FromString(data)
    assert list(message.features.feature["label"].int64_list.value) == [5, 6]
    assert eb.int64_scalar(data, "label") is None
    assert eb.int64_scalar(data, "one") == 3
