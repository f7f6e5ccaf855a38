"""The strategy factory, and Mirrored over 2 virtual CPUs matching one device step for step."""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tftrain import models
from tftrain.runtime import distribute
from tftrain.config import RuntimeConfig
from tftrain.errors import ConfigError, TftrainError


def test_factory_builds_each_local_strategy():
    one = distribute.create_strategy(RuntimeConfig(strategy="one_device"))
    assert one.num_replicas_in_sync == 1 and distribute.strategy_name(one) == "one_device"
    auto = distribute.create_strategy(RuntimeConfig(strategy="auto"))  # no GPU, no TPU here
    assert distribute.strategy_name(auto) == "one_device"
    mirrored = distribute.create_strategy(RuntimeConfig(strategy="mirrored", cpu_devices=2))
    assert isinstance(mirrored, tf.distribute.MirroredStrategy)
    assert mirrored.num_replicas_in_sync == 2


def test_one_device_on_a_cpu_host_reads_the_dataset_directly(digits_dir):
    """No GPU: one_device is TensorFlow's default strategy, so the training input stays a plain
    tf.data.Dataset (a OneDeviceStrategy's distributed iterator slows every op of the step)."""
    from tftrain.data import reader

    one = distribute.create_strategy(RuntimeConfig(strategy="one_device"))
    dataset = reader.load_distributed(one, digits_dir, "train", 32, training=True, repeat=True)
    assert isinstance(dataset, tf.data.Dataset)
    assert one.experimental_distribute_dataset(dataset) is dataset  # what Keras `fit` does


def test_factory_errors_are_clear(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ConfigError, match="needs the TF_CONFIG environment variable"):
        distribute.create_strategy(RuntimeConfig(strategy="multi_worker_mirrored"))
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(ConfigError, match="TF_CONFIG is not valid"):
        distribute.create_strategy(RuntimeConfig(strategy="multi_worker_mirrored"))
    with pytest.raises(TftrainError, match="cpu_devices=8 but TensorFlow already started with 2"):
        distribute.create_strategy(RuntimeConfig(strategy="mirrored", cpu_devices=8))


def _train_steps(strategy, initial_weights, x, y, steps, batch):
    with strategy.scope():
        model = models.build_model("cnn", {"filters": [8, 16], "dense_units": 32, "dropout": 0.0},
                                   (8, 8, 1), 10)
        model.set_weights(initial_weights)
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).take(steps)
    model.fit(data, epochs=1, verbose=0, shuffle=False)
    return model.get_weights()


def test_mirrored_on_two_cpus_matches_one_device():
    rng = np.random.default_rng(0)
    x = rng.random((256, 8, 8, 1), dtype=np.float32)
    y = rng.integers(0, 10, 256)
    initial = models.build_model("cnn", {"filters": [8, 16], "dense_units": 32, "dropout": 0.0},
                                 (8, 8, 1), 10).get_weights()
    one = _train_steps(distribute.create_strategy(RuntimeConfig(strategy="one_device")),
                       initial, x, y, steps=8, batch=32)
    two = _train_steps(distribute.create_strategy(RuntimeConfig(strategy="mirrored", cpu_devices=2)),
                       initial, x, y, steps=8, batch=32)
    moved = max(float(np.abs(a - b).max()) for a, b in zip(one, initial))
    assert moved > 1e-3  # the steps really trained
    for a, b in zip(one, two):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
