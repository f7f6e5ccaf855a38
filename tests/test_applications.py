"""`model.name: application`: tf_keras.applications backbones, fine-tuned from a local weights
file, with the backbone's own preprocessing inside the model; freeze-then-unfreeze; bad input.

The fine-tuning test is real training, kept small: MobileNetV2 (alpha 0.35) at 32x32 (its
minimum input), pretrained on the digits 0-4 of the training split, saved with save_weights,
then fine-tuned on all ten digits and compared with the same run from random weights (the
pretraining reuses that run's model and traced step: `from_random_weights`).
"""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tftrain import models
from tftrain.callbacks import unfreeze
from tftrain.data import load
from tftrain.errors import ConfigError
from tftrain.models import applications

MOBILENET = {"backbone": "MobileNetV2", "backbone_params": {"alpha": 0.35}}
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _built(params):
    """The application model built as `tftrain train` builds it, compiled."""
    keras.utils.set_random_seed(0)
    model = models.build_model("application", params, (8, 8, 1), 10)
    model.compile(keras.optimizers.Adam(1e-3), LOSS, metrics=["accuracy"])
    return model


def _fit_and_evaluate(model, digits_dir, steps=30):
    """Fits `model` `steps` steps with the callbacks it requests; returns its test accuracy."""
    train = load(digits_dir, "train", 32, training=True, repeat=True, seed=0)
    model.fit(train, epochs=1, steps_per_epoch=steps, verbose=0,
              callbacks=unfreeze.requested_by(model))
    return model.evaluate(load(digits_dir, "test", 200, training=False),
                          return_dict=True, verbose=0)["accuracy"]


def _fine_tune(digits_dir, params, steps=30):
    """Builds the application model as `tftrain train` does, fits it `steps` steps with the
    callbacks it requests and returns (model, test accuracy)."""
    model = _built(params)
    return model, _fit_and_evaluate(model, digits_dir, steps)


FINE_TUNING = {**MOBILENET, "batchnorm_momentum": 0.9}


@pytest.fixture(scope="module")
def from_random_weights(digits_dir, tmp_path_factory):
    """The fine-tuning test's control and its weights file, from one model whose training step
    is traced once (MobileNetV2's ~150 layers: most of what a run this short costs).

    The control is `_fine_tune` from random weights. The same model is then put back to its
    initial weights, its optimizer to its initial state (Adam at 3e-3), and pretrained on the
    digits 0-4 of the training split (3 passes, 66 steps); its backbone's weights are saved
    without a top with save_weights of a plain tf_keras MobileNetV2 (a file as a user saves
    one). Returns (the control's test accuracy, the file's path)."""
    model = _built({**FINE_TUNING, "weights": "none"})
    initial = model.get_weights()
    random_accuracy = _fit_and_evaluate(model, digits_dir)

    model.set_weights(initial)
    for variable in model.optimizer.variables():  # its step count and moments
        variable.assign(tf.zeros_like(variable))
    model.optimizer.learning_rate.assign(3e-3)
    digits_0_to_4 = (load(digits_dir, "train", 32, training=True, repeat=True, seed=1)
                     .unbatch().filter(lambda x, y: y < 5).batch(32, drop_remainder=True))
    # Batches of the control's shape and types: its traced step runs them.
    model.fit(digits_0_to_4, epochs=1, steps_per_epoch=66, verbose=0)
    base = keras.applications.MobileNetV2(include_top=False, weights=None, alpha=0.35,
                                          input_shape=(32, 32, 3))
    for layer in base.layers:
        if layer.weights:
            layer.set_weights(model.get_layer(layer.name).get_weights())
    path = str(tmp_path_factory.mktemp("weights") / "mobilenet_v2_035_digits04.h5")
    base.save_weights(path)
    return random_accuracy, path


@pytest.fixture(scope="module")
def pretrained_h5(from_random_weights):
    """A MobileNetV2 (alpha 0.35) backbone trained briefly on the digits 0-4, saved without
    its top with save_weights."""
    return from_random_weights[1]


def test_fine_tuned_from_a_weights_file_beats_the_same_run_from_random_weights(
        digits_dir, from_random_weights):
    # All layers train; from the file, BatchNormalization stays in inference mode (its
    # statistics are the file's); from random weights it trains (momentum 0.9: few steps).
    random_accuracy, weights_file = from_random_weights
    tuned, tuned_accuracy = _fine_tune(digits_dir, {**FINE_TUNING, "weights": weights_file})
    print(f"test accuracy: fine-tuned {tuned_accuracy:.3f}, random weights {random_accuracy:.3f}")
    assert tuned_accuracy >= 0.3 and tuned_accuracy >= random_accuracy + 0.15

    saved = keras.applications.MobileNetV2(include_top=False, weights=None, alpha=0.35,
                                           input_shape=(32, 32, 3))
    saved.load_weights(weights_file)
    after = {v.name: v.numpy() for v in tuned.weights}
    for v in saved.weights:  # the file's weights, trained on; its BN statistics kept
        if "moving_" in v.name:
            assert np.array_equal(after[v.name], v.numpy()), v.name
    kernel = next(v for v in saved.weights if v.name == "Conv1/kernel:0").numpy()
    assert not np.array_equal(after["Conv1/kernel:0"], kernel)
    assert np.corrcoef(after["Conv1/kernel:0"].ravel(), kernel.ravel())[0, 1] > 0.9


@pytest.mark.parametrize("backbone, module", [
    ("ResNet50", "resnet50"),  # caffe: BGR, ImageNet means subtracted
    ("MobileNetV2", "mobilenet_v2"),  # tf: [-1, 1]
    ("EfficientNetV2B0", "efficientnet_v2"),  # normalizes inside: 0..255 as they are
    ("DenseNet121", "densenet"),  # torch: ImageNet mean and std
])
def test_images_are_resized_tiled_and_normalized_as_the_backbone_expects(backbone, module):
    images = np.random.default_rng(0).random((2, 8, 8, 1)).astype(np.float32)
    size = applications.target_size(backbone, (8, 8, 1))
    assert size == (32, 32)
    inputs = keras.Input((8, 8, 1))
    own = getattr(keras.applications, module)
    got = keras.Model(inputs, applications.preprocess(inputs, size, own))(images).numpy()
    rgb = tf.image.resize(np.repeat(images, 3, axis=-1), size).numpy() * 255.0
    np.testing.assert_allclose(got, own.preprocess_input(rgb.copy()), rtol=1e-5, atol=1e-3)


def test_resnet50_and_efficientnetv2b0_build_on_digits_and_train_their_last_layers():
    for backbone, last in (("ResNet50", 12), ("EfficientNetV2B0", 0)):
        model = models.build_model("application", {"backbone": backbone,
                                                    "trainable_layers": last}, (8, 8, 1), 10)
        assert model.output_shape == (None, 10) and model.input_shape == (None, 8, 8, 1)
        trainable = [layer.name for layer in model.layers if layer.trainable_weights]
        # The head is pool, dropout, logits: the backbone's last 12 layers come before it.
        expected = [layer.name for layer in model.layers[-3 - last:-3] if layer.weights] if last \
            else []
        assert trainable == [*expected, "logits"] and len(trainable) > (3 if last else 0)


def test_unfreeze_at_epoch_builds_the_backbone_frozen_and_requests_the_callback():
    model = models.build_model("application", {**MOBILENET, "unfreeze_at_epoch": 2,
                                               "trainable_layers": 20, "train_batchnorm": False},
                               (8, 8, 1), 10)
    (callback,) = unfreeze.requested_by(model)
    assert isinstance(callback, unfreeze.Unfreeze) and callback.at_epoch == 2
    backbone = model.layers[model.layers.index(model.get_layer("Conv1")):-3]
    assert [layer.name for layer in model.layers if layer.trainable_weights] == ["logits"]
    assert [layer.name for layer in callback.layers] == [
        layer.name for layer in backbone[-20:]
        if not isinstance(layer, keras.layers.BatchNormalization)]
    assert unfreeze.requested_by(models.build_model("mlp", {}, (4,), 2)) == []


def _tiny(rate):
    inputs = keras.Input((4,))
    frozen = keras.layers.Dense(4, name="frozen", trainable=False)
    model = keras.Model(inputs, keras.layers.Dense(2, name="head")(frozen(inputs)))
    model.compile(keras.optimizers.Adam(rate), LOSS)
    return model, frozen


@pytest.mark.parametrize("rate", ["constant", "cosine"])
def test_unfreeze_trains_the_frozen_layers_from_its_epoch_at_the_lower_rate(rate):
    x, y = np.random.default_rng(0).random((16, 4)), np.arange(16) % 2
    schedule = 0.01 if rate == "constant" else keras.optimizers.schedules.CosineDecay(0.01, 100)
    model, frozen = _tiny(schedule)
    before = frozen.kernel.numpy().copy()
    callback = unfreeze.Unfreeze([frozen], at_epoch=1, lr_factor=0.1)
    seen = []
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[callback])
    assert np.array_equal(frozen.kernel.numpy(), before)  # epoch 0: frozen
    watch = keras.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: seen.append(
        keras.backend.get_value(model.optimizer._learning_rate(model.optimizer.iterations))
        if rate == "cosine" else float(model.optimizer.learning_rate.numpy())))
    model.fit(x, y, batch_size=8, epochs=3, initial_epoch=1, verbose=0,
              callbacks=[callback, watch])
    assert not np.array_equal(frozen.kernel.numpy(), before)  # from epoch 1: trains
    expected = 0.001 if rate == "constant" else 0.1 * float(schedule(model.optimizer.iterations))
    assert seen[-1] == pytest.approx(expected, rel=1e-5)


def test_unfreeze_does_not_lower_a_rate_the_resumed_backup_already_lowered():
    model, frozen = _tiny(0.01)
    model.optimizer.iterations.assign(5)  # restored: past epoch 1 (2 steps per epoch)
    model.optimizer.learning_rate.assign(0.001)
    callback = unfreeze.Unfreeze([frozen], at_epoch=1, lr_factor=0.1)
    x, y = np.zeros((4, 4)), np.zeros(4)
    model.fit(x, y, batch_size=2, epochs=3, initial_epoch=2, verbose=0, callbacks=[callback])
    assert float(model.optimizer.learning_rate.numpy()) == pytest.approx(0.001)
    assert frozen.trainable_weights


@pytest.mark.parametrize("params, message", [
    ({"backbone": "ResNet5O"}, "backbone='ResNet5O' is not a tf_keras.applications model (did "
     "you mean 'ResNet50'?); valid: ConvNeXtBase, "),
    ({}, "needs model.params.backbone"),
    ({**MOBILENET, "weights": "/no/such/file.h5"}, "weights=/no/such/file.h5: no such weights "
     "file"),
    ({**MOBILENET, "weights": "imagenet"}, "would download at run time"),
    ({**MOBILENET, "weights": "/"}, "weights=/ is a directory, not a weights file"),
    ({**MOBILENET, "image_size": 16}, "below MobileNetV2's minimum input size 32x32"),
    ({**MOBILENET, "trainable_layers": -1}, "trainable_layers=-1 must be all or a number"),
    ({**MOBILENET, "unfreeze_at_epoch": 2, "trainable_layers": 0}, "unfreezes nothing"),
    ({**MOBILENET, "fine_tune_lr_factor": 2}, "fine_tune_lr_factor=2 must be in (0, 1]"),
    ({**MOBILENET, "train_batchnorm": "yes"}, "train_batchnorm='yes' must be auto, true or"),
    ({**MOBILENET, "batchnorm_momentum": 1.5}, "batchnorm_momentum=1.5 must be in [0, 1)"),
])
def test_bad_parameters_are_one_config_error_line(params, message):
    with pytest.raises(ConfigError) as error:
        models.build_model("application", params, (8, 8, 1), 10)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_non_image_inputs_and_weights_that_do_not_fit_are_one_line(pretrained_h5, tmp_path):
    with pytest.raises(ConfigError, match=r"model.name=application cannot take this dataset's "
                       r"inputs \(one example: shape \(64,\)\); models that can: mlp\."):
        models.build_model("application", MOBILENET, (64,), 10)
    wider = {"backbone": "MobileNetV2", "backbone_params": {"alpha": 0.5}}
    with pytest.raises(ConfigError) as error:  # a MobileNetV2 alpha=0.35 file
        models.build_model("application", {**wider, "weights": pretrained_h5}, (8, 8, 1), 10)
    assert "does not fit backbone MobileNetV2(alpha=0.5)" in str(error.value)
    assert "\n" not in str(error.value)
    garbage = tmp_path / "notes.h5"
    garbage.write_text("not weights")
    with pytest.raises(ConfigError, match="notes.h5 does not fit backbone MobileNetV2"):
        models.build_model("application", {**MOBILENET, "weights": str(garbage)}, (8, 8, 1), 10)


def test_train_command_stops_on_an_unknown_backbone_with_one_line(cli, digits_dir, tmp_path,
                                                                  capsys):
    # The shipped fine-tuning config, with its backbone misspelled.
    override = f"data.dir={digits_dir},model.params.backbone=MobileNetV9"
    code = cli("train", "--config=finetune", f"--model_dir={tmp_path / 'run'}",
               f"--params_override={override}")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "Traceback" not in "\n".join(err)
    assert [line for line in err if "MobileNetV9" in line] == [err[-1]]
    assert "did you mean 'MobileNetV2'?" in err[-1] and "ResNet50, " in err[-1]


def test_train_adds_the_callbacks_a_model_asks_for(tmp_path, digits_dir, caplog):
    """The engine's side of freeze-then-unfreeze, on a tiny model: `tftrain train` runs the
    Unfreeze callback the builder requested (the frozen layer trains from epoch 2 at half the
    rate), so a model with `unfreeze_at_epoch` really unfreezes in a run."""
    import logging

    from tftrain import config as config_lib
    from tftrain.engine import train
    from tests.test_resume_state import curve

    model_dir = tmp_path / "run"
    config = config_lib.build_config("digits", overrides=(
        f"data.dir={digits_dir},model.name=tests.user_model:frozen_first_layer,"
        "model.params={},train.epochs=2,train.steps_per_epoch=5,train.lr_schedule=constant,"
        "train.learning_rate=0.01"))
    with caplog.at_level(logging.INFO, logger="absl"):
        summary = train.train(config, str(model_dir))
    assert summary["epochs"] == 2
    assert curve(str(model_dir), "learning_rate") == pytest.approx([0.01, 0.005])
    assert "epoch 2: 1 frozen layers now train; learning rate x0.5" in caplog.text
