"""`tftrain.data.load`: ordering, shuffling, sharding over input pipelines, batching, caching."""
import logging

import numpy as np
import pytest
import tensorflow as tf

from pipelines import load_pipeline
from pipelines.digits import Pipeline as DigitsPipeline
from tftrain.data import load, manifest as manifest_lib
from tftrain.data.reader import load_distributed
from tftrain.data.writer import write_dataset


def _keys(dataset):
    """One hashable key per example: its pixels and label."""
    return [images[i].tobytes() + bytes([labels[i]])
            for images, labels in dataset.as_numpy_iterator() for i in range(len(labels))]


def _context(index, count=2):
    return tf.distribute.InputContext(num_input_pipelines=count, input_pipeline_id=index,
                                      num_replicas_in_sync=count)


@pytest.fixture(scope="module")
def two_shard_dir(tmp_path_factory):
    """digits in two shards per split (`digits_dir` has one, as the default path converts it)."""
    path = str(tmp_path_factory.mktemp("two") / "digits")
    write_dataset(load_pipeline("digits"), "", path, num_shards=2)
    return path


def test_evaluation_reads_every_example_once_in_file_order(digits_dir):
    first = _keys(load(digits_dir, "validation", 16, training=False))
    assert first == _keys(load(digits_dir, "validation", 16, training=False))
    num_examples = manifest_lib.read(digits_dir)["splits"]["validation"]["num_examples"]
    assert len(first) == num_examples
    dataset = load(digits_dir, "validation", 16, training=False)
    assert dataset.cardinality().numpy() == -(-num_examples // 16)  # known size, last batch kept


def test_training_shuffles_each_epoch_and_drops_the_remainder(digits_dir):
    dataset = load(digits_dir, "train", 32, training=True, seed=1)
    assert dataset.element_spec[0].shape.as_list() == [32, 8, 8, 1]  # static batch dimension
    assert dataset.element_spec[1].dtype == tf.int32
    epochs = [_keys(dataset) for _ in range(2)]
    everything = set(_keys(load(digits_dir, "train", 50, training=False)))
    num_examples = manifest_lib.read(digits_dir)["splits"]["train"]["num_examples"]
    assert epochs[0] != epochs[1]  # a new order each epoch
    for epoch in epochs:  # full batches only; the remainder changes with the order
        assert len(epoch) == num_examples // 32 * 32 and set(epoch) <= everything


@pytest.mark.parametrize("files", ["two", "one"])
def test_two_input_pipelines_cover_every_example_once(digits_dir, two_shard_dir, files, caplog):
    data_dir = two_shard_dir if files == "two" else digits_dir
    everything = _keys(load(data_dir, "train", 50, training=False))
    with caplog.at_level(logging.WARNING):
        shards = [_keys(load(data_dir, "train", 50, training=False, input_context=_context(i)))
                  for i in range(2)]
    assert sorted(shards[0] + shards[1]) == sorted(everything)
    assert shards[0] and shards[1]
    assert ("sharding by example" in caplog.text) == (files == "one")  # DATA fallback is announced


def test_training_pipelines_shard_by_file(two_shard_dir):
    shards = [_keys(load(two_shard_dir, "train", 10, training=True, drop_remainder=False,
                         input_context=_context(i), seed=3)) for i in range(2)]
    assert not set(shards[0]) & set(shards[1])
    assert len(shards[0]) + len(shards[1]) == len(_keys(load(two_shard_dir, "train", 50,
                                                             training=False)))


def test_deterministic_training_order_is_the_same_for_every_iterator(two_shard_dir):
    """What sharding by example after the fact (DTensor's local replicas) relies on."""
    dataset = load(two_shard_dir, "train", 16, training=True, seed=5, deterministic=True)
    first, second = _keys(dataset), _keys(dataset)
    assert first == _keys(load(two_shard_dir, "train", 16, training=True, seed=5,
                               deterministic=True))
    assert first != second  # still reshuffled each epoch, in the same way for every copy


def test_autotune_off_reads_the_same_batches_in_the_same_order(two_shard_dir):
    tuned = load(two_shard_dir, "train", 16, training=True, seed=5, repeat=True)
    fixed = load(two_shard_dir, "train", 16, training=True, seed=5, repeat=True, autotune=False)
    assert fixed.options().autotune.enabled is False and tuned.options().autotune.enabled is not False
    assert _keys(fixed.take(200)) == _keys(tuned.take(200))


class Pipeline(DigitsPipeline):
    """digits, counting the examples it decodes (`load(..., pipeline="tests.test_reader")`);
    its decode also looks up features that none of its outputs depends on."""

    decoded: list[int] = []

    def decode(self, features, info):
        unused = tf.strings.length(features["image/filename"]) + tf.size(features["image/format"])
        del unused
        images, labels = super().decode(features, info)
        counted = tf.numpy_function(lambda n: Pipeline.decoded.append(int(n)) or n,
                                    [tf.shape(labels)[0]], tf.int32)
        with tf.control_dependencies([counted]):
            return images, tf.identity(labels)


@pytest.mark.parametrize("cache,passes_decoded", [("none", 2), ("records", 2), ("decoded", 1)])
def test_cache_modes_give_the_same_examples_and_decoded_decodes_once(digits_dir, cache,
                                                                     passes_decoded):
    reference = _keys(load(digits_dir, "test", 20, training=False))
    Pipeline.decoded.clear()
    dataset = load(digits_dir, "test", 20, training=False, cache=cache, pipeline="tests.test_reader")
    assert _keys(dataset) == reference and _keys(dataset) == reference  # two passes
    num_test = manifest_lib.read(digits_dir)["splits"]["test"]["num_examples"]
    assert sum(Pipeline.decoded) == passes_decoded * num_test
    # Training: shuffled each epoch, every example once per epoch, from the cache.
    training = load(digits_dir, "test", 20, training=True, drop_remainder=False, cache=cache, seed=1)
    epochs = [_keys(training) for _ in range(2)]
    assert sorted(epochs[0]) == sorted(epochs[1]) == sorted(reference) and epochs[0] != epochs[1]


def test_decoded_cache_needs_fixed_shapes(digits_dir):
    from tftrain.data import reader
    from tftrain.errors import DataError

    ragged = tf.data.Dataset.from_tensors(tf.zeros([3])).map(lambda x: tf.boolean_mask(x, x > 0))
    with pytest.raises(DataError, match="data.cache=decoded needs decoded examples of a fixed shape"):
        reader.check_fixed_shapes(ragged, "p")
    with pytest.raises(DataError, match="not one of none, records, decoded"):
        load(digits_dir, "test", 20, training=False, cache="memory")


def test_repeat(digits_dir):
    repeated = load(digits_dir, "test", 20, training=True, repeat=True)
    assert len(list(repeated.take(50))) == 50  # more batches than one pass holds


def test_load_distributed_splits_the_global_batch_over_replicas(digits_dir):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    dataset = load_distributed(strategy, digits_dir, "train", 32, training=True, repeat=True)
    images, labels = next(iter(dataset))
    per_replica = strategy.experimental_local_results(images)
    assert [x.shape[0] for x in per_replica] == [16, 16]
    evaluation = load_distributed(strategy, digits_dir, "validation", 32, training=False)
    assert evaluation.element_spec[0].shape[0] in (None, 32)  # global batches, Keras splits them
    with pytest.raises(Exception, match="does not split over 2 replicas"):
        load_distributed(strategy, digits_dir, "train", 33, training=True)


def test_images_are_decoded_in_range(digits_dir):
    images, labels = next(iter(load(digits_dir, "test", 8, training=False)))
    assert images.dtype == tf.float32 and 0.0 <= float(tf.reduce_min(images))
    assert float(tf.reduce_max(images)) <= 1.0 and set(np.unique(labels)) <= set(range(10))


# The first 24 ids of the training stream below, as the reader yielded them before it was made
# faster: exact resume (and every run that resumes from an older checkpoint) relies on it.
PINNED_ORDER = [142, 41, 50, 88, 79, 156, 121, 64, 183, 153, 1, 43, 54, 59, 161, 125, 136, 40, 9,
                22, 187, 107, 165, 17]


def test_the_training_order_for_a_seed_is_pinned(tmp_path):
    x = np.zeros((200, 2), np.float32)
    x[:, 0] = np.arange(200)  # feature 0: the example's id
    np.savez(tmp_path / "ids.npz", x=x, y=np.arange(200) % 3)
    data_dir = str(tmp_path / "data")
    write_dataset(load_pipeline("numpy"), str(tmp_path / "ids.npz"), data_dir,
                  splits={"train": 1.0}, num_shards=3, workers=1, progress=False)

    def ids(**kwargs):
        dataset = load(data_dir, "train", 8, training=True, seed=11, shuffle_buffer=50,
                       repeat=True, **kwargs)
        return [int(i) for x, _ in dataset.take(3) for i in x[:, 0].numpy()]

    assert ids() == PINNED_ORDER
    # Batch 27 onwards: inside the second pass (200 records), after a resume.
    assert ids(start_batch=27) == [198, 38, 130, 113, 57, 22, 6, 13, 0, 80, 120, 42, 39, 91, 8,
                                   14, 155, 25, 144, 105, 192, 148, 23, 29]


def test_only_the_features_decode_uses_are_parsed(digits_dir, tmp_path):
    from tftrain.data.reader import features_reached, parse_spec

    manifest = manifest_lib.read(digits_dir)
    schema = parse_spec(manifest["features"])
    assert len(schema) == 7 and manifest["info"]["image_encoding"] == "raw"
    digits = load_pipeline("digits")
    assert features_reached(schema, digits, manifest["info"]) == {"image/encoded",
                                                                  "image/class/label"}
    assert features_reached(schema, digits, manifest["info"], part="inputs") == {"image/encoded"}
    parsed = next(iter(load(digits_dir, "test", 8, training=False, last_stage="parse")))
    assert set(parsed) == {"image/encoded", "image/class/label"}
    # PNGs: whether they are stored at the training size decides on a resize (height, width)
    png_dir = str(tmp_path / "png")
    write_dataset(load_pipeline("digits", image_encoding="png"), "", png_dir, workers=1,
                  progress=False)
    png = manifest_lib.read(png_dir)
    assert features_reached(parse_spec(png["features"]), digits, png["info"]) == {
        "image/encoded", "image/class/label", "image/height", "image/width"}
    # a decode looking up features that reach no output gets stand-ins, and the same batches
    reference = _keys(load(digits_dir, "test", 20, training=False))
    assert _keys(load(digits_dir, "test", 20, training=False, pipeline="tests.test_reader")) == reference
    assert _keys(load(png_dir, "test", 20, training=False)) == reference


def test_features_behind_a_control_dependency_are_parsed(digits_dir):
    """`Pipeline` above counts its batches with a stateful op that its label waits on."""
    from tftrain.data.reader import features_reached, parse_spec

    manifest = manifest_lib.read(digits_dir)
    reached = features_reached(parse_spec(manifest["features"]), Pipeline(), manifest["info"])
    assert reached == {"image/encoded", "image/class/label"}
