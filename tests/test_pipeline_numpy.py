"""numpy: .npz (plain and per-split arrays) and directories of .npy files, streamed by rows."""
import numpy as np
import pytest
import tensorflow as tf

from pipelines import Row, load_pipeline
from pipelines import numpy as numpy_pipeline
from tests.pipeline_testutil import bad_row_reason, convert, load_all
from tftrain.errors import ConfigError


def arrays(n, shape=(3, 2), seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, *shape)).astype(np.float64)
    x.reshape(n, -1)[:, 0] = np.arange(n)  # a row id to match rows after shuffling into shards
    return x, rng.integers(0, 4, n).astype(np.int32)


def by_row_id(x, y):
    order = np.argsort(x.reshape(len(x), -1)[:, 0])
    return x[order], y[order]


def test_npz_with_x_and_y(tmp_path):
    x, y = arrays(50)
    np.savez(tmp_path / "data.npz", x=x, y=y)
    manifest = convert("numpy", tmp_path / "data.npz", tmp_path / "out", splits={"train": 1.0})
    assert manifest["features"] == {"x": {"dtype": "float32", "shape": [3, 2]},
                                    "y": {"dtype": "int64", "shape": []}}
    assert manifest["info"]["num_classes"] == int(y.max()) + 1
    got_x, got_y = by_row_id(*load_all(tmp_path / "out", "train"))
    np.testing.assert_allclose(got_x, x.astype(np.float32))
    np.testing.assert_array_equal(got_y, y)


def test_compressed_npz_per_split_arrays_with_custom_names(tmp_path):
    x_train, y_train = arrays(40, shape=(5, 1), seed=1)
    x_test, y_test = arrays(7, shape=(5, 1), seed=2)
    np.savez_compressed(tmp_path / "d.npz", feats_train=x_train, labels_train=y_train.astype(np.float32),
                        feats_test=x_test, labels_test=y_test.astype(np.float32))
    manifest = convert("numpy", tmp_path / "d.npz", tmp_path / "out", x_key="feats", y_key="labels")
    assert {k: v["num_examples"] for k, v in manifest["splits"].items()} == {"train": 40, "test": 7}
    assert manifest["info"]["y_type"] == "float"  # float labels: regression
    got_x, got_y = by_row_id(*load_all(tmp_path / "out", "test"))
    np.testing.assert_allclose(got_x, x_test.astype(np.float32))
    np.testing.assert_allclose(got_y, y_test.astype(np.float32))


def test_npy_directory_and_bad_rows(tmp_path):
    x, y = arrays(30, shape=(4, 1), seed=3)
    x[5, 2, 0] = np.nan
    x[9, 1, 0] = np.inf
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y.astype(np.int64))
    manifest = convert("numpy", tmp_path, tmp_path / "out", splits={"train": 1.0})
    assert manifest["bad_rows"]["count"] == 2
    assert manifest["splits"]["train"]["num_examples"] == 28
    pipeline = load_pipeline("numpy")
    info = pipeline.prepare(str(tmp_path))
    assert "1 NaN or infinite" in bad_row_reason(pipeline, Row("5", (x[5], y[5])), info)
    assert "negative" in bad_row_reason(pipeline, Row("r", (x[0], -1)), info)
    allowed = load_pipeline("numpy", allow_nan=True)
    kept = tf.train.Example.FromString(allowed.encode(Row("5", (x[5], y[5])), info))
    assert np.isnan(kept.features.feature["x"].float_list.value).sum() == 1


def test_streaming_reader_matches_the_array_in_any_worker_split(tmp_path, monkeypatch):
    x, y = arrays(101, shape=(6,), seed=4)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    np.save(tmp_path / "x.npy", x)
    monkeypatch.setattr(numpy_pipeline, "CHUNK_BYTES", 100)  # many small chunks
    member = numpy_pipeline.ArrayFile(str(tmp_path / "d.npz"), "x")
    np.testing.assert_array_equal(np.stack(list(member.rows(17, 64))), x[17:64])
    mapped = numpy_pipeline.ArrayFile(str(tmp_path / "x.npy"))
    np.testing.assert_array_equal(np.stack(list(mapped.rows(0, 101))), x)
    pipeline = load_pipeline("numpy")
    info = pipeline.prepare(str(tmp_path / "d.npz"))
    keys = [[r.key for r in pipeline.read(str(tmp_path / "d.npz"), info, w, 3)] for w in range(3)]
    assert sorted(sum(keys, [])) == [f"{i:010d}" for i in range(101)]


def test_user_errors(tmp_path):
    np.savez(tmp_path / "a.npz", x=np.zeros((3, 2)))
    with pytest.raises(ConfigError, match="no labels 'y'"):
        load_pipeline("numpy").prepare(str(tmp_path / "a.npz"))
    np.savez(tmp_path / "b.npz", x=np.zeros((3, 2)), y=np.zeros(4, np.int64))
    with pytest.raises(ConfigError, match="has 3 rows but"):
        load_pipeline("numpy").prepare(str(tmp_path / "b.npz"))
    np.savez(tmp_path / "c.npz", features=np.zeros((3, 2)))
    with pytest.raises(ConfigError, match="it has: features"):
        load_pipeline("numpy").prepare(str(tmp_path / "c.npz"))


def test_x_encoding_raw_keeps_integer_arrays_in_their_own_bytes(tmp_path, cli, capsys):
    rng = np.random.default_rng(5)
    x = rng.integers(0, 256, (60, 16, 16, 3)).astype(np.uint8)
    y = np.arange(60) % 3
    np.savez(tmp_path / "images.npz", x=x, y=y)
    as_float = convert("numpy", tmp_path / "images.npz", tmp_path / "float", splits={"train": 1.0},
                       num_shards=1)
    as_raw = convert("numpy", tmp_path / "images.npz", tmp_path / "raw", splits={"train": 1.0},
                     num_shards=1, x_encoding="raw")
    assert as_raw["info"]["x_encoding"] == "raw" and as_raw["info"]["x_dtype"] == "uint8"
    assert as_raw["features"]["x"] == {"dtype": "string", "shape": []}
    bytes_of = {m["info"].get("x_encoding", "float32"): m["splits"]["train"]["shards"][0]["bytes"]
                for m in (as_float, as_raw)}
    assert bytes_of["raw"] < 0.3 * bytes_of["float32"]  # 768 bytes of pixels instead of 3,072
    got_float, labels_float = load_all(tmp_path / "float", "train")
    got_raw, labels_raw = load_all(tmp_path / "raw", "train")
    assert got_raw.dtype == np.float32 and got_raw.shape == (60, 16, 16, 3)
    np.testing.assert_array_equal(got_raw, got_float)  # the same values, in the same order
    np.testing.assert_array_equal(labels_raw, labels_float)
    # a record of the wrong size (a shard changed after its conversion): the CLI's one line
    from tftrain.data import reader

    decode = tf.function(lambda x: load_pipeline("numpy").decode(
        {"x": x, "y": tf.constant([0], tf.int64)}, as_raw["info"]))
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        decode(tf.constant([b"\0" * 10]))
    assert ("an x_encoding=raw array of 10 bytes where x_shape 16x16x3 needs 768"
            in reader.damaged_record_message(error.value))
    # int16 keeps its sign and byte order
    np.savez(tmp_path / "signed.npz", x=np.array([[-300, 7], [2, -1]], np.int16), y=np.array([0, 1]))
    convert("numpy", tmp_path / "signed.npz", tmp_path / "signed", splits={"train": 1.0},
            num_shards=1, x_encoding="raw")
    np.testing.assert_array_equal(sorted(load_all(tmp_path / "signed", "train")[0].tolist()),
                                  [[-300.0, 7.0], [2.0, -1.0]])
    # float arrays and unknown encodings: one error line
    np.savez(tmp_path / "floats.npz", x=np.zeros((4, 2)), y=np.arange(4))
    assert cli("convert", "--pipeline=numpy", f"--input={tmp_path / 'floats.npz'}",
               f"--output={tmp_path / 'out1'}", "--pipeline_options=x_encoding=raw") != 0
    assert "x_encoding=raw keeps integer and boolean arrays in their own dtype" in capsys.readouterr().err
    np.savez(tmp_path / "unsigned.npz", x=np.zeros((4, 2), np.uint32), y=np.arange(4))
    with pytest.raises(ConfigError, match="has x of dtype uint32"):  # decode_raw has no uint32
        load_pipeline("numpy", x_encoding="raw").prepare(str(tmp_path / "unsigned.npz"))
    with pytest.raises(ConfigError, match="x_encoding='bytes' must be one of float32, raw"):
        load_pipeline("numpy", x_encoding="bytes")
