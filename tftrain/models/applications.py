"""`application`: a `tf_keras.applications` backbone (ResNet50, MobileNetV2, EfficientNetV2B0, ...)
under a new head, trained from random weights or fine-tuned from a local weights file.

The model takes the dataset's images as they are (float32 in [0, 1], any size, 1 or 3
channels) and does what the backbone expects inside itself, so the export needs nothing else:
resize to `image_size` (at least the backbone's minimum, 32 for most, 71 for Xception, 75 for
the Inception ones), tile grayscale to 3 channels, scale to 0..255 and apply the backbone's own
`preprocess_input` (caffe, tf or torch mode, or nothing for the backbones that normalize inside).
Its layers are part of the model itself (no nested model), so `trainable_layers` counts them
the way the Keras transfer-learning guide does.

Weights are never downloaded at run time: `weights` is `none` or the path of a file the
backbone was saved to without its top (e.g. `MobileNetV2(include_top=False, weights="imagenet",
alpha=0.35).save_weights("mnv2_035.h5")` once, on a machine with network; or Keras's own
`*_no_top.h5` downloads). BatchNormalization layers stay in inference mode (frozen, with the
file's statistics) when fine-tuning from a file, as the guide advises; `train_batchnorm` says
otherwise. Freeze-then-unfreeze (`unfreeze_at_epoch`) is the `tftrain.callbacks.unfreeze`
callback, which the model requests.
"""
from __future__ import annotations

import difflib
import importlib
import os
import tempfile

from tftrain.errors import ConfigError, first_line
from tftrain.models import fine_tuning

# Backbones whose constructor refuses smaller inputs than 32x32 (tf_keras obtain_input_shape).
MIN_SIZE = {"InceptionV3": 75, "InceptionResNetV2": 75, "Xception": 71}
DEFAULT_MIN_SIZE = 32
NO_WEIGHTS = (None, "", "none", "None", "null")


def valid_backbones() -> list[str]:
    """The `tf_keras.applications` model names `model.params.backbone` may take."""
    import tf_keras as keras

    return sorted(name for name in dir(keras.applications)
                  if name[0].isupper() and callable(getattr(keras.applications, name)))


def backbone_constructor(name: str):
    """The `tf_keras.applications` function named `name`; ConfigError listing the valid names."""
    import tf_keras as keras

    valid = valid_backbones()
    if name not in valid:
        close = difflib.get_close_matches(str(name), valid, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"model.params.backbone={name!r} is not a tf_keras.applications model"
                          f"{hint}; valid: {', '.join(valid)}")
    return getattr(keras.applications, name)


def application(input_shape, outputs, backbone=None, weights=None, backbone_params=None,
                image_size="auto", trainable_layers="all", unfreeze_at_epoch=0,
                fine_tune_lr_factor=0.1, train_batchnorm="auto", batchnorm_momentum=None,
                dropout=0.2):
    """A `tf_keras.applications` backbone with global average pooling and the task's head.

    Args:
      input_shape: the dataset's image shape (H, W, C), C 1 or 3, pixels in [0, 1].
      outputs: the task's `OutputSpec` (or a number of classes).
      backbone: a `tf_keras.applications` name, e.g. ResNet50, MobileNetV2, EfficientNetV2B0.
      weights: none (random initialization) or a local weights file of the backbone without
        its top (`.h5`, or a TF checkpoint prefix); never downloaded.
      backbone_params: more keyword arguments of the constructor, e.g. `{alpha: 0.35}`.
      image_size: `auto` (the dataset's size, raised to the backbone's minimum), N or [H, W].
      trainable_layers: how many of the backbone's last layers train: `all`, or N (0: a frozen
        feature extractor; only the head trains).
      unfreeze_at_epoch: 0: `trainable_layers` train from the start. K > 0: the whole backbone
        is frozen for epochs 0..K-1 (the head learns first), then its last `trainable_layers`
        layers train, with the learning rate multiplied by `fine_tune_lr_factor`.
      fine_tune_lr_factor: the rate factor at `unfreeze_at_epoch` (0 < factor <= 1).
      train_batchnorm: `auto` (true from random weights, false from a weights file): whether
        the BatchNormalization layers among the trainable ones train; frozen ones run in
        inference mode.
      batchnorm_momentum: replaces the backbone's BatchNormalization momentum (MobileNetV2's
        0.999 needs thousands of steps before its moving statistics fit: from random weights
        on a small dataset, 0.9 evaluates far better); none keeps it.
      dropout: the dropout rate before the head.
    """
    from tftrain.models.outputs import as_output_spec

    import tf_keras as keras

    outputs = as_output_spec(outputs)
    constructor = backbone_constructor(_required_backbone(backbone))
    weights_path = _weights_path(weights)
    train_bn = _train_batchnorm(train_batchnorm, weights_path)
    _check_schedule(trainable_layers, unfreeze_at_epoch, fine_tune_lr_factor)
    _check_momentum(batchnorm_momentum)
    size = target_size(backbone, input_shape, image_size)
    extra = dict(backbone_params or {})
    label = backbone + (f"({', '.join(f'{k}={v}' for k, v in extra.items())})" if extra else "")

    inputs = keras.Input(shape=tuple(input_shape), name="inputs")
    preprocessed = preprocess(inputs, size, importlib.import_module(constructor.__module__))
    own = {id(layer) for layer in keras.Model(inputs, preprocessed).layers}
    base = _construct(constructor, label, extra, include_top=False, weights=None,
                      input_tensor=preprocessed)
    if weights_path:
        _load_weights(base, constructor, label, extra, size, weights_path)
    layers = [layer for layer in base.layers if id(layer) not in own]
    trainable = _trainable_slice(layers, trainable_layers, label)
    if not train_bn:
        trainable = [layer for layer in trainable if not _is_batchnorm(layer)]
    if batchnorm_momentum is not None:
        for layer in filter(_is_batchnorm, layers):
            layer.momentum = float(batchnorm_momentum)
    start, chosen = unfreeze_at_epoch == 0, {id(layer) for layer in trainable}
    for layer in layers:
        layer.trainable = start and id(layer) in chosen

    x = keras.layers.GlobalAveragePooling2D(name="backbone_pool")(base.output)
    if dropout:
        x = keras.layers.Dropout(dropout, name="head_dropout")(x)
    model = keras.Model(inputs, outputs.head(x), name=f"application_{backbone}")
    if not start and trainable:
        fine_tuning.schedule(model, fine_tuning.UnfreezeSchedule(
            tuple(trainable), unfreeze_at_epoch, fine_tune_lr_factor))
    return model


def _required_backbone(backbone) -> str:
    if not backbone:
        raise ConfigError("model application needs model.params.backbone: a tf_keras.applications "
                          f"model, e.g. ResNet50, MobileNetV2, EfficientNetV2B0 (valid: "
                          f"{', '.join(valid_backbones())})")
    return str(backbone)


def _weights_path(weights) -> str | None:
    """None for random weights; else the path, checked to exist (no download, ever)."""
    import tensorflow as tf

    if weights in NO_WEIGHTS:
        return None
    weights = str(weights)
    if weights == "imagenet":
        raise ConfigError("model.params.weights=imagenet would download at run time, which "
                          "tftrain never does: save the backbone once (e.g. MobileNetV2("
                          "include_top=False, weights='imagenet').save_weights('mnv2.h5')) and "
                          "set model.params.weights to that local file")
    if tf.io.gfile.isdir(weights):
        raise ConfigError(f"model.params.weights={weights} is a directory, not a weights file "
                          "(give the .h5 file, or the prefix of a TF checkpoint's .index file)")
    if not tf.io.gfile.exists(weights) and not tf.io.gfile.exists(weights + ".index"):
        raise ConfigError(f"model.params.weights={weights}: no such weights file (give a local "
                          ".h5 file or TF checkpoint prefix the backbone was saved to without its "
                          "top, or weights=none for random initialization)")
    return weights


def _train_batchnorm(value, weights_path) -> bool:
    if value == "auto":
        return weights_path is None
    if isinstance(value, bool):
        return value
    raise ConfigError(f"model.params.train_batchnorm={value!r} must be auto, true or false")


def _check_schedule(trainable_layers, unfreeze_at_epoch, factor) -> None:
    if trainable_layers != "all" and (isinstance(trainable_layers, bool) or not isinstance(
            trainable_layers, int) or trainable_layers < 0):
        raise ConfigError(f"model.params.trainable_layers={trainable_layers!r} must be all or a "
                          "number of layers >= 0 (0: the backbone is a frozen feature extractor)")
    if isinstance(unfreeze_at_epoch, bool) or not isinstance(unfreeze_at_epoch, int) or (
            unfreeze_at_epoch < 0):
        raise ConfigError(f"model.params.unfreeze_at_epoch={unfreeze_at_epoch!r} must be an "
                          "epoch number >= 0 (0: no frozen phase)")
    if unfreeze_at_epoch and trainable_layers == 0:
        raise ConfigError(f"model.params.unfreeze_at_epoch={unfreeze_at_epoch} unfreezes nothing "
                          "with trainable_layers=0: set trainable_layers to all or N")
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not 0 < factor <= 1:
        raise ConfigError(f"model.params.fine_tune_lr_factor={factor!r} must be in (0, 1]")


def target_size(backbone: str, input_shape, image_size="auto") -> tuple[int, int]:
    """(height, width) the backbone sees: `image_size`, or the dataset's size raised to the
    backbone's minimum; ConfigError for images it cannot take."""
    if len(input_shape) != 3 or input_shape[-1] not in (1, 3):
        raise ConfigError(f"model application takes images (height, width, 1 or 3 channels); the "
                          f"dataset's inputs are shaped {tuple(input_shape)}")
    minimum = MIN_SIZE.get(backbone, DEFAULT_MIN_SIZE)
    if image_size == "auto":
        return max(int(input_shape[0]), minimum), max(int(input_shape[1]), minimum)
    size = [image_size] * 2 if isinstance(image_size, int) else list(image_size)
    if len(size) != 2 or not all(isinstance(s, int) and not isinstance(s, bool) for s in size):
        raise ConfigError(f"model.params.image_size={image_size!r} must be auto, N or [H, W]")
    if min(size) < minimum:
        raise ConfigError(f"model.params.image_size={image_size} is below {backbone}'s minimum "
                          f"input size {minimum}x{minimum}")
    return size[0], size[1]


def preprocess(images, size, module):
    """`images` (float [0, 1], 1 or 3 channels) resized, as RGB 0..255, through the backbone
    module's `preprocess_input`: all stock tf_keras layers, so the export reloads without code."""
    import tf_keras as keras

    x = images
    if tuple(x.shape[1:3]) != tuple(size):
        x = keras.layers.Resizing(size[0], size[1], name="resize")(x)
    if x.shape[-1] == 1:
        x = keras.layers.Concatenate(name="gray_to_rgb")([x, x, x])
    x = keras.layers.Rescaling(255.0, name="to_255")(x)
    return module.preprocess_input(x)


def _construct(constructor, label, extra, **kwargs):
    try:
        return constructor(**kwargs, **extra)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"model.params: cannot build {label}: {first_line(e)}") from None


def _load_weights(base, constructor, label, extra, size, path) -> None:
    """Loads `path` into `base`; ConfigError when the file does not fit.

    An h5 file loads in place (tf-keras matches the layers that hold weights, in order, so the
    preprocessing layers in front do not count). A TF checkpoint is matched by its object graph,
    whose layer numbering those layers would shift: it loads into a standalone copy of the
    backbone (the layout it was saved from), whose weights are then copied.
    """
    import tensorflow as tf

    in_place = path.endswith((".h5", ".hdf5"))
    target = base if in_place else _construct(constructor, label, extra, include_top=False,
                                              weights=None, input_shape=(size[0], size[1], 3))
    with _local(path) as local:
        try:
            status = target.load_weights(local)
            if status is not None and hasattr(status, "assert_existing_objects_matched"):
                status.expect_partial()
                status.assert_existing_objects_matched()
        except (ValueError, OSError, AssertionError, KeyError, tf.errors.OpError) as e:
            raise ConfigError(f"model.params.weights={path} does not fit backbone {label} "
                              f"(without its top): {first_line(e)}") from None
    if not in_place:
        base.set_weights(target.get_weights())


class _local:
    """An h5 file on a remote filesystem, copied to a local temporary file (h5py reads only
    local files); local paths and TF checkpoints as they are."""

    def __init__(self, path: str):
        self.path, self.copy = path, None

    def __enter__(self) -> str:
        import tensorflow as tf

        if "://" not in self.path or not self.path.endswith(".h5"):
            return self.path
        handle, self.copy = tempfile.mkstemp(suffix=".h5")
        os.close(handle)
        tf.io.gfile.copy(self.path, self.copy, overwrite=True)
        return self.copy

    def __exit__(self, *exc):
        import tensorflow as tf

        if self.copy:
            tf.io.gfile.remove(self.copy)


def _trainable_slice(layers, trainable_layers, label):
    if trainable_layers == "all":
        return list(layers)
    if trainable_layers > len(layers):
        raise ConfigError(f"model.params.trainable_layers={trainable_layers}: {label} has "
                          f"{len(layers)} layers (use all, or at most {len(layers)})")
    return list(layers[len(layers) - trainable_layers:]) if trainable_layers else []


def _check_momentum(momentum) -> None:
    if momentum is not None and (isinstance(momentum, bool) or not isinstance(
            momentum, (int, float)) or not 0 <= momentum < 1):
        raise ConfigError(f"model.params.batchnorm_momentum={momentum!r} must be in [0, 1) or none")


def _is_batchnorm(layer) -> bool:
    import tf_keras as keras

    return isinstance(layer, keras.layers.BatchNormalization)
