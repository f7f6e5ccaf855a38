"""TFLite conversion, quantization-aware training and interpreter evaluation on a small CNN."""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tests.test_optimize_models import (digits_eval, digits_train,  # noqa: F401
                                        trained)
from tftrain.errors import ConfigError, TftrainError
from tftrain.optimize import metrics, prune, quantize, tflite_eval


def _float_classes(model, dataset):
    return np.concatenate([metrics.predicted_classes(model(x, training=False)) for x, _ in dataset])


@pytest.fixture(scope="module")
def float_tflite(trained):
    return quantize.convert(trained, "float")


@pytest.mark.parametrize("mode,max_ratio", [("dynamic", 0.4), ("int8", 0.4), ("float16", 0.6)])
def test_post_training_modes_match_the_float_model(mode, max_ratio, trained, float_tflite,
                                                   digits_dir):
    calibration = digits_train(digits_dir, repeat=False)
    content = quantize.convert(trained, mode, representative_data=calibration)
    assert len(content) < max_ratio * len(float_tflite)
    outputs, labels, seconds = tflite_eval.predict_tflite(content, digits_eval(digits_dir))
    expected = _float_classes(trained, digits_eval(digits_dir))
    assert len(outputs) == len(expected) == len(seconds) == 189
    # The interpreter agrees with the float Keras model on nearly every example.
    assert (metrics.predicted_classes(outputs) == expected).mean() >= 0.95
    result = tflite_eval.evaluate_tflite(content, digits_eval(digits_dir))
    float_accuracy = metrics.keras_accuracy(trained, digits_eval(digits_dir))
    assert abs(result["accuracy"] - float_accuracy) <= 0.03
    assert result["latency_ms"] > 0 and result["tflite_bytes"] == len(content)
    assert result["latency_batch_size"] == 1 and result["num_threads"] == 1
    _check_runs_batched(content, digits_dir)


def _check_runs_batched(content, digits_dir, batch_size=32):
    """The model resized to a batch gives each example the output it gives it alone."""
    (images, _), = digits_eval(digits_dir).take(1)
    images = images.numpy()[:batch_size]
    single = tflite_eval.TfliteModel(content)
    alone = np.concatenate([single.run(images[i:i + 1])[0] for i in range(batch_size)])
    together, seconds = tflite_eval.TfliteModel(content, batch_size=batch_size).run(images)
    assert together.shape == (batch_size, 10) and seconds > 0
    np.testing.assert_allclose(together, alone, atol=1e-4, rtol=1e-5)


def test_compare_latencies_records_both_times_with_their_settings(trained, float_tflite,
                                                                  digits_dir):
    int8 = quantize.convert(trained, "int8",
                            representative_data=digits_train(digits_dir, repeat=False))
    times = tflite_eval.compare_latencies({"float": float_tflite, "int8": int8},
                                          digits_eval(digits_dir), rounds=2, examples=40,
                                          batch_size=64, num_threads=2)
    assert set(times) == {"float", "int8"}
    for timing in times.values():
        assert timing["latency_batch_size"] == 1 and timing["throughput_batch_size"] == 64
        assert timing["num_threads"] == 2 and timing["cpu"]
        for key in ("latency_ms", "throughput_ms_per_example"):
            assert isinstance(timing[key], float) and timing[key] > 0, key
    # 40 examples fill a batch of 64 by repetition; the default batch is 256.
    default = tflite_eval.compare_latencies({"float": float_tflite}, digits_eval(digits_dir),
                                            rounds=1, examples=8)["float"]
    assert default["throughput_batch_size"] == tflite_eval.THROUGHPUT_BATCH_SIZE == 256
    assert default["num_threads"] == 1 and default["throughput_ms_per_example"] > 0


def test_float_tflite_outputs_equal_keras_outputs(trained, float_tflite, digits_dir, tmp_path):
    path = tmp_path / "float.tflite"
    path.write_bytes(float_tflite)
    outputs, _, _ = tflite_eval.predict_tflite(str(path), digits_eval(digits_dir), max_examples=64)
    expected = np.concatenate([trained(x, training=False).numpy()
                               for x, _ in digits_eval(digits_dir)])
    np.testing.assert_allclose(outputs, expected[:64], atol=1e-4, rtol=1e-4)
    _check_runs_batched(float_tflite, digits_dir)


def test_int8_inputs_and_outputs(trained, digits_dir):
    content = quantize.convert(trained, "int8", int8_io=True,
                               representative_data=digits_train(digits_dir, repeat=False))
    runner = tflite_eval.TfliteModel(content)
    details = runner.interpreter.get_input_details()[0]
    assert details["dtype"] == np.int8
    assert runner.interpreter.get_output_details()[0]["dtype"] == np.int8
    outputs, _, _ = tflite_eval.predict_tflite(runner, digits_eval(digits_dir))
    expected = _float_classes(trained, digits_eval(digits_dir))
    assert (metrics.predicted_classes(outputs) == expected).mean() >= 0.95
    _check_runs_batched(content, digits_dir)


def test_int8_needs_representative_data_and_int8_io_needs_int8(trained):
    with pytest.raises(ConfigError, match="representative"):
        quantize.convert(trained, "int8")
    with pytest.raises(ConfigError, match="int8 inputs/outputs"):
        quantize.convert(trained, "float16", int8_io=True)
    with pytest.raises(ConfigError, match="not a quantization mode"):
        quantize.check_mode("int4")


def test_qat_end_to_end(trained, float_tflite, digits_dir):
    # 10 steps at a low rate: the question is the path (annotate, fine-tune, convert, run),
    # whose every part can lose the float model's accuracy, not what more steps would gain.
    qat, float_layers = quantize.quantization_aware_training(
        trained, digits_train(digits_dir), steps_per_epoch=10, epochs=1, learning_rate=2e-4)
    assert float_layers == []
    assert any("Quantize" in type(layer).__name__ for layer in qat.layers)
    content = quantize.convert(qat, "qat")
    result = tflite_eval.evaluate_tflite(content, digits_eval(digits_dir))
    assert result["accuracy"] >= metrics.keras_accuracy(trained, digits_eval(digits_dir)) - 0.03
    assert result["tflite_bytes"] < 0.4 * len(float_tflite)
    _check_runs_batched(content, digits_dir)


def test_pruning_preserving_qat_keeps_the_zeros(trained, digits_dir):
    # 10 steps: the constant schedule sets the 60% at its first mask update.
    pruned = prune.prune_model(trained, digits_train(digits_dir), epochs=1, steps_per_epoch=10,
                               target_sparsity=0.6, schedule="constant", min_weights=0).model
    qat, _ = quantize.quantization_aware_training(
        pruned, digits_train(digits_dir), steps_per_epoch=10, epochs=1, preserve_sparsity=True)
    kernels = [w.numpy() for w in qat.weights if w.name.endswith("kernel:0")]
    assert len(kernels) == 4
    for kernel in kernels:
        assert (kernel == 0).mean() >= 0.59


def test_qat_leaves_unsupported_layers_in_float_and_lists_them(digits_dir):
    inputs = keras.Input((8, 8, 1))
    x = keras.layers.Conv2D(8, 3, activation="relu")(inputs)
    x = keras.layers.Flatten()(x)
    x = keras.layers.LayerNormalization(name="norm")(x)
    outputs = keras.layers.Dense(10)(x)
    model = keras.Model(inputs, outputs)
    qat, float_layers = quantize.quantization_aware_training(
        model, digits_train(digits_dir), steps_per_epoch=5, epochs=1)
    assert float_layers == ["norm (LayerNormalization)"]
    content = quantize.convert(qat, "qat")
    result = tflite_eval.evaluate_tflite(content, digits_eval(digits_dir), max_examples=20)
    assert result["num_examples"] == 20


def test_qat_on_a_subclassed_model_is_a_clear_error(digits_dir):
    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.flatten = keras.layers.Flatten()
            self.dense = keras.layers.Dense(10)

        def call(self, x):
            return self.dense(self.flatten(x))

    net = Net()
    net(tf.zeros((1, 8, 8, 1)))
    with pytest.raises(TftrainError, match="subclassed"):
        quantize.quantization_aware_training(net, digits_train(digits_dir), steps_per_epoch=2)


def test_a_model_that_fails_conversion_is_a_clear_error():
    inputs = keras.Input((4,))
    as_text = keras.layers.Lambda(lambda x: tf.strings.to_number(tf.strings.as_string(x)))(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2)(as_text))
    with pytest.raises(TftrainError, match="TFLite conversion of model .* failed"):
        quantize.convert(model, "dynamic")


def test_multi_input_model_runs_by_input_name():
    a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b")
    model = keras.Model([a, b], keras.layers.Dense(4)(keras.layers.Concatenate()([a, b])))
    rng = np.random.default_rng(0)
    inputs = {"a": rng.random((10, 3), dtype=np.float32),
              "b": rng.random((10, 2), dtype=np.float32)}
    dataset = tf.data.Dataset.from_tensor_slices((inputs, np.zeros(10, np.int32))).batch(4)
    outputs, _, _ = tflite_eval.predict_tflite(quantize.convert(model, "float"), dataset)
    np.testing.assert_allclose(outputs, model.predict(inputs, verbose=0), atol=1e-5)


def test_unreadable_tflite_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"not a flatbuffer")
    with pytest.raises(TftrainError, match="cannot load the TFLite model"):
        tflite_eval.TfliteModel(str(bad))
