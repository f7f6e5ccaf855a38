"""tfds: tiny TFDS datasets built locally (no network), converted by name and by directory."""
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from pipelines import Row, load_pipeline
from tests.pipeline_testutil import bad_row_reason, convert, load_all
from tftrain.errors import ConfigError


class TftrainTinyImages(tfds.core.GeneratorBasedBuilder):
    """8x8 RGB images filled with 10 * index; label = index % 2."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self, supervised_keys=("image", "label"),
            features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(8, 8, 3)),
                "label": tfds.features.ClassLabel(names=["cat", "dog"])}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(0, 12), "test": self._generate_examples(12, 16)}

    def _generate_examples(self, start, stop):
        for i in range(start, stop):
            yield i, {"image": np.full((8, 8, 3), 10 * i, np.uint8), "label": i % 2}


class TftrainTinyTable(tfds.core.GeneratorBasedBuilder):
    """A non-image dataset: a float vector, a nested dict, a class label."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
            "x": tfds.features.Tensor(shape=(3,), dtype=np.float32),
            "meta": {"n": np.int32, "name": tfds.features.Text()},
            "label": tfds.features.ClassLabel(num_classes=3)}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(9)}

    def _generate_examples(self, n):
        for i in range(n):
            yield i, {"x": np.arange(3, dtype=np.float32) + i, "meta": {"n": i, "name": f"r{i}"},
                      "label": i % 3}


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("tfds")
    for builder_class in (TftrainTinyImages, TftrainTinyTable):
        builder_class(data_dir=str(data_dir)).download_and_prepare()
    return data_dir


def test_image_dataset_by_name_keeps_splits_and_standard_keys(tfds_dir, tmp_path):
    manifest = convert("tfds", "tftrain_tiny_images", tmp_path / "out", data_dir=str(tfds_dir))
    assert {k: v["num_examples"] for k, v in manifest["splits"].items()} == {"train": 12, "test": 4}
    info = manifest["info"]
    assert info["mode"] == "image" and info["class_names"] == ["cat", "dog"]
    assert info["image_size"] == [8, 8, 3] and info["num_classes"] == 2
    assert set(manifest["features"]) >= {"image/encoded", "image/format", "image/class/label"}

    shard = tmp_path / "out" / manifest["splits"]["test"]["shards"][0]["file"]
    for raw in tf.data.TFRecordDataset(str(shard)).take(1):
        feature = tf.train.Example.FromString(raw.numpy()).features.feature
        assert feature["image/format"].bytes_list.value[0] == b"png"
        assert feature["image/height"].int64_list.value[0] == 8
        label = feature["image/class/label"].int64_list.value[0]
        assert feature["image/class/text"].bytes_list.value[0].decode() == ["cat", "dog"][label]

    images, labels = load_all(tmp_path / "out", "train")
    assert images.shape == (12, 8, 8, 3)
    values = np.round(images[:, 0, 0, 0] * 255 / 10).astype(int)  # the example index
    assert sorted(values.tolist()) == list(range(12))
    np.testing.assert_array_equal(labels, values % 2)
    np.testing.assert_allclose(images, np.broadcast_to(images[:, :1, :1, :1], images.shape))


def test_prepared_directory_and_decode_size_option(tfds_dir, tmp_path):
    directory = tfds_dir / "tftrain_tiny_images" / "1.0.0"
    manifest = convert("tfds", directory, tmp_path / "out", image_size="4")
    assert manifest["info"]["image_size"] == [4, 4, 3]
    images, _ = load_all(tmp_path / "out", "test")
    assert images.shape == (4, 4, 4, 3)


def test_other_datasets_keep_their_features(tfds_dir, tmp_path):
    manifest = convert("tfds", "tftrain_tiny_table", tmp_path / "out", data_dir=str(tfds_dir))
    assert manifest["info"]["mode"] == "features"
    assert manifest["features"] == {"x": {"dtype": "float32", "shape": [3]},
                                    "meta/n": {"dtype": "int64", "shape": []},
                                    "meta/name": {"dtype": "string", "shape": []},
                                    "label": {"dtype": "int64", "shape": []}}
    inputs, labels = load_all(tmp_path / "out", "train")
    assert sorted(inputs) == ["meta/n", "meta/name", "x"]
    order = np.argsort(inputs["meta/n"])
    np.testing.assert_allclose(inputs["x"][order], np.arange(3)[None, :] + np.arange(9)[:, None])
    assert [n.decode() for n in inputs["meta/name"][order]] == [f"r{i}" for i in range(9)]
    np.testing.assert_array_equal(labels[order], np.arange(9) % 3)


def test_bad_records_and_missing_datasets(tfds_dir, tmp_path):
    pipeline = load_pipeline("tfds", data_dir=str(tfds_dir))
    info = pipeline.prepare("tftrain_tiny_images")
    rows = list(pipeline.read("tftrain_tiny_images", info))
    assert len(rows) == 16 and {r.split for r in rows} == {"train", "test"}
    example = tf.train.Example.FromString(rows[0].value)
    encoded = example.features.feature["image"].bytes_list.value[0]
    example.features.feature["image"].bytes_list.value[0] = encoded[:30]
    assert "PNG" in bad_row_reason(pipeline, Row("r", example.SerializeToString()), info)
    del example.features.feature["image"]
    assert "no image" in bad_row_reason(pipeline, Row("r", example.SerializeToString()), info)
    assert "not a tf.train.Example" in bad_row_reason(pipeline, Row("r", b"\x0a\xff"), info)
    with pytest.raises(ConfigError, match="tfds build mnist"):
        load_pipeline("tfds", data_dir=str(tmp_path)).prepare("mnist")
