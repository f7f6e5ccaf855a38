"""Loading, Keras 3 rejection and float32 cloning (`tftrain.optimize.keras_model`).

Also holds the small models and data the other `test_optimize_*` files share.
"""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tftrain import data as data_lib
from tftrain.errors import TftrainError
from tftrain.optimize import keras_model, metrics, quantize


def small_cnn(name="small_cnn", dtype=None):
    """A digits CNN whose kernels (after the first conv) have input channels divisible by 4."""
    inputs = keras.Input((8, 8, 1), name="image")
    conv = dict(kernel_size=3, padding="same", activation="relu", dtype=dtype)
    x = keras.layers.Conv2D(8, name="conv_a", **conv)(inputs)
    x = keras.layers.Conv2D(16, name="conv_b", **conv)(x)
    x = keras.layers.MaxPooling2D(dtype=dtype)(x)
    x = keras.layers.Flatten(dtype=dtype)(x)
    x = keras.layers.Dense(32, activation="relu", dtype=dtype, name="hidden")(x)
    outputs = keras.layers.Dense(10, dtype="float32", name="logits")(x)
    return keras.Model(inputs, outputs, name=name)


def digits_train(digits_dir, batch_size=32, repeat=True):
    return data_lib.load(digits_dir, "train", batch_size, training=True, repeat=repeat, seed=1)


def digits_eval(digits_dir, split="test"):
    return data_lib.load(digits_dir, split, 64, training=False)


def steps_per_epoch(digits_dir, batch_size=32):
    from tftrain.data import manifest

    return manifest.read(digits_dir)["splits"]["train"]["num_examples"] // batch_size


def train_small_cnn(digits_dir, epochs=4, model=None):
    """A small CNN trained on digits to ~90%+ test accuracy in a few seconds."""
    keras.utils.set_random_seed(0)
    model = model or small_cnn()
    model.compile(keras.optimizers.Adam(3e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(digits_train(digits_dir), epochs=epochs,
              steps_per_epoch=steps_per_epoch(digits_dir), verbose=0)
    return model


@pytest.fixture(scope="module")
def trained(digits_dir):
    return train_small_cnn(digits_dir)


def _keras3_model():
    import keras as keras3  # Keras 3, installed alongside tf-keras

    inputs = keras3.Input((4,))
    return keras3.Model(inputs, keras3.layers.Dense(2)(inputs))


def test_keras3_model_object_is_rejected():
    with pytest.raises(TftrainError, match="Keras 3 model.*tf_keras"):
        keras_model.check_tf_keras(_keras3_model())
    with pytest.raises(TftrainError, match="Keras 3"):
        quantize.convert(_keras3_model(), "float")


def test_keras3_files_are_rejected(tmp_path):
    model = _keras3_model()
    model.save(str(tmp_path / "k3.keras"))
    with pytest.raises(TftrainError, match="saved by Keras 3"):
        keras_model.load_keras_model(str(tmp_path / "k3.keras"))
    model.export(str(tmp_path / "k3_export"), format="tf_saved_model")
    with pytest.raises(TftrainError, match="no Keras metadata"):
        keras_model.load_keras_model(str(tmp_path / "k3_export"))


def test_missing_and_foreign_paths(tmp_path):
    with pytest.raises(TftrainError, match="no model at"):
        keras_model.load_keras_model(str(tmp_path / "nothing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(TftrainError, match="not a SavedModel"):
        keras_model.load_keras_model(str(tmp_path / "empty"))


def test_load_roundtrip_and_float32_clone_leaves_original_alone(tmp_path):
    model = small_cnn()
    model.save(str(tmp_path / "sm"), save_format="tf")
    loaded = keras_model.load_keras_model(str(tmp_path / "sm"))
    x = np.random.default_rng(0).random((5, 8, 8, 1), dtype=np.float32)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-5)

    clone = keras_model.clone_float32(model)
    assert clone is not model and all(a is not b for a, b in zip(clone.weights, model.weights))
    before = [w.copy() for w in model.get_weights()]
    clone.layers[1].kernel.assign(tf.zeros_like(clone.layers[1].kernel))
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_mixed_precision_model_is_rebuilt_in_float32(digits_dir):
    model = small_cnn(dtype="mixed_float16")
    assert keras_model.is_mixed_precision(model)
    clone = keras_model.clone_float32(model)
    assert not keras_model.is_mixed_precision(clone)
    assert all(layer.compute_dtype == "float32" for layer in clone.layers)
    for a, b in zip(model.get_weights(), clone.get_weights()):
        np.testing.assert_array_equal(a, b)
    # Conversion goes through the float32 copy and agrees with the mixed model's predictions.
    from tftrain.optimize import tflite_eval

    outputs, labels, _ = tflite_eval.predict_tflite(quantize.convert(model, "float"),
                                                    digits_eval(digits_dir), max_examples=50)
    expected = metrics.predicted_classes(
        model.predict(np.concatenate([x for x, _ in digits_eval(digits_dir)])[:50], verbose=0))
    assert (metrics.predicted_classes(outputs) == expected).mean() >= 0.9


def test_subclassed_model_is_a_clear_error():
    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(3)

        def call(self, x):
            return self.dense(x)

    net = Net()
    net(tf.zeros((1, 4)))
    with pytest.raises(TftrainError, match="subclassed.*Sequential or functional"):
        keras_model.clone_float32(net)
