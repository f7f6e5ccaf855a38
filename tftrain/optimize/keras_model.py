"""Loads tf-keras models for optimization, rejects Keras 3, and clones them in float32.

Pruning and quantization-aware training (TFMOT) modify the layers of the model they wrap, work only
with tf-keras (Keras 2), and want float32 layers; so every pass starts from `clone_float32(model)`:
a new model, rebuilt layer by layer with a float32 policy, holding a copy of the weights.
"""
from __future__ import annotations

import json
import zipfile

import tensorflow as tf
import tf_keras as keras

import tftrain
from tftrain.engine import export, model_code
from tftrain.errors import TftrainError

_LOW_PRECISION = ("float16", "bfloat16")


def is_keras3(model) -> bool:
    """True when `model` is a Keras 3 object (the `keras` package, not `tf_keras`)."""
    module = type(model).__module__ or ""
    return module == "keras" or module.startswith("keras.")


def check_tf_keras(model, what: str = "model") -> None:
    """Raises `TftrainError` unless `model` is a tf-keras `Model`."""
    if is_keras3(model):
        raise TftrainError(
            f"the {what} is a Keras 3 model ({type(model).__module__}.{type(model).__name__}); "
            "pruning and quantization (tensorflow-model-optimization) work only with tf-keras: "
            "build the model with `import tf_keras as keras` (tftrain sets "
            "TF_USE_LEGACY_KERAS=1) and save it with model.save(path, save_format='tf').")
    if not isinstance(model, keras.Model):
        raise TftrainError(
            f"the {what} is a {type(model).__module__}.{type(model).__name__}, not a tf-keras "
            "Model; load or build it with tf_keras.")


def _check_keras_file(path: str) -> None:
    """Rejects a `.keras` archive written by Keras 3 before tf-keras tries to read it."""
    try:
        with tf.io.gfile.GFile(path, "rb") as f, zipfile.ZipFile(f) as archive:
            metadata = json.loads(archive.read("metadata.json"))
    except (KeyError, zipfile.BadZipFile, ValueError):
        return  # not a Keras v3 archive; let tf-keras report what it is
    version = str(metadata.get("keras_version", ""))
    if version.startswith("3"):
        raise TftrainError(
            f"{path} was saved by Keras {version}; tftrain optimizes tf-keras (Keras 2) models "
            "only: rebuild it with `import tf_keras as keras` and save it with "
            "model.save(path, save_format='tf').")


def load_keras_model(path: str, *, compile: bool = True,
                     allow_python: bool = False) -> keras.Model:
    """Loads the tf-keras model saved at `path` (SavedModel directory, a run's export/ with its
    version directories (the highest is loaded), `.keras` or `.h5` file).

    Raises `TftrainError` naming the path when it is missing, is not a tf-keras model (a
    Keras 3 archive, or a SavedModel without Keras metadata), carries Python code (a Lambda
    layer) and `allow_python` is False, or cannot be loaded.
    """
    tftrain.require_tf_keras()
    if not tf.io.gfile.exists(path):
        raise TftrainError(f"no model at {path}: train one first (tftrain train --model_dir=...) "
                           "or pass the path of a tf-keras SavedModel directory.")
    if tf.io.gfile.isdir(path):
        found = export.saved_model_dir(path)
        if found is None:
            raise TftrainError(f"{path} is not a SavedModel directory (no saved_model.pb, and no "
                               "version directory holding one).")
        path = found
        if not tf.io.gfile.exists(tf.io.gfile.join(path, "keras_metadata.pb")):
            raise TftrainError(
                f"the SavedModel at {path} has no Keras metadata (keras_metadata.pb): it was not "
                "saved by tf-keras (Keras 3's model.export() or tf.saved_model.save write such "
                "SavedModels). Save the model with tf-keras: model.save(path, save_format='tf').")
    elif path.endswith(".keras"):
        _check_keras_file(path)  # tf-keras reads .keras archives in safe mode (no Lambda code)
    if not path.endswith(".keras"):
        model_code.refuse_python(path, allow_python)
    export.register_text_ops()
    try:
        model = export.load_keras_model(path, compile=compile)
    except Exception as e:  # tf-keras raises many kinds; name the file and the reason
        raise TftrainError(f"cannot load the tf-keras model at {path}: {type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else ''}") from e
    check_tf_keras(model, f"model at {path}")
    return model


def is_mixed_precision(model: keras.Model) -> bool:
    """True when any layer computes in float16 or bfloat16 (a mixed-precision policy)."""
    for layer in model.submodules:
        policy = getattr(layer, "dtype_policy", None)
        if policy is not None and getattr(policy, "compute_dtype", None) in _LOW_PRECISION:
            return True
    return False


def _float32_layer(layer):
    """A fresh copy of `layer` (no weights yet) with a float32 dtype policy."""
    if isinstance(layer, keras.Model):
        return clone_float32(layer, copy_weights=False)
    config = layer.get_config()
    config["dtype"] = "float32"
    return layer.__class__.from_config(config)


def clone_float32(model: keras.Model, *, copy_weights: bool = True) -> keras.Model:
    """Returns a new float32 model with the architecture (and weights) of `model`.

    The original is never modified. A mixed-precision model comes back entirely float32 (its
    variables were float32 already, so the weights copy exactly). Subclassed models cannot be
    cloned: they raise `TftrainError`.
    """
    check_tf_keras(model)
    if not (isinstance(model, keras.Sequential) or getattr(model, "_is_graph_network", False)):
        raise TftrainError(
            f"model {model.name!r} is a subclassed Keras model ({type(model).__name__}); pruning, "
            "quantization-aware training and mixed-precision conversion need a Sequential or "
            "functional model (rebuild it with keras.Sequential or keras.Model(inputs, outputs)).")
    try:
        clone = keras.models.clone_model(model, clone_function=_float32_layer)
    except Exception as e:
        raise TftrainError(f"cannot clone model {model.name!r} in float32: {type(e).__name__}: "
                           f"{e}") from e
    if copy_weights:
        clone.set_weights(model.get_weights())
    return clone


# The names TensorFlow gives the gradient functions of tf.custom_gradient (tf.recompute_grad:
# a remat model's blocks) when a model is traced or loaded from a SavedModel.
_CUSTOM_GRADIENT = "CustomGradient-"


def custom_gradients() -> frozenset:
    """The custom gradient functions registered in this process so far (their names)."""
    return frozenset(name for name in _gradient_registry() if name.startswith(_CUSTOM_GRADIENT))


def forget_custom_gradients(since: frozenset) -> None:
    """Unregisters the custom gradient functions registered after `since` (`custom_gradients`).

    Loading a SavedModel with custom gradients (a remat model's export), or tracing such a
    model, registers gradient functions in TensorFlow's process-wide registry, and they hold the
    model's variables: after the model is dropped its weights stay in memory for the rest of the
    process (measured: 2.2x the float32 weights of a transformer_lm export) unless they are
    forgotten. Call it only once nothing will take a gradient through those models again.
    """
    registry = _gradient_registry()
    for name in [name for name in registry
                 if name.startswith(_CUSTOM_GRADIENT) and name not in since]:
        del registry[name]


def _gradient_registry() -> dict:
    """TensorFlow's gradient registry by op type (empty if its internals moved)."""
    from tensorflow.python.framework import ops  # no public way to unregister a gradient

    return getattr(ops.gradient_registry, "_registry", {})

