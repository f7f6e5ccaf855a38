"""Python code inside a saved tf-keras model, found before the model is loaded.

A SavedModel (or .h5 file) from elsewhere is data, but tf-keras's `load_model` rebuilds a
`Lambda` layer from the marshalled bytecode (or the named function) stored in its config, and
calling the model then runs that code in tftrain's process. So every command that loads a
user-given model with `load_model` first reads the model's Keras config, without loading it,
and refuses one that carries Python unless the user passed ALLOW_FLAG (they trust the model).
"""
from __future__ import annotations

import json

import tensorflow as tf

from tftrain.errors import TftrainError
from tftrain.fileio import join

ALLOW_FLAG = "--allow_python_in_model"
KERAS_METADATA = "keras_metadata.pb"
_PYTHON_LAYERS = ("Lambda",)  # layers whose config holds code (function and output_shape)


def python_layers(path: str) -> list[str]:
    """The names of the layers of the model saved at `path` (a SavedModel directory or an .h5
    file) whose config carries Python code. Raises TftrainError for an unreadable config."""
    configs = _h5_configs(path) if path.endswith(".h5") else _saved_model_configs(path)
    found: list[str] = []
    for config in configs:
        _collect(config, found)
    return sorted(set(found))


def refuse_python(path: str, allow: bool) -> None:
    """Raises TftrainError, naming ALLOW_FLAG, when the model at `path` carries Python code
    and `allow` is False."""
    if allow:
        return
    layers = python_layers(path)
    if layers:
        raise TftrainError(
            f"the model at {path} carries Python code (Lambda layer(s) {', '.join(layers[:5])}), "
            "which loading it would run in this process; tftrain does not run code from a model "
            f"it was given. If you trust the model, pass {ALLOW_FLAG}.")


def _saved_model_configs(path: str) -> list:
    from tf_keras.protobuf import saved_metadata_pb2
    from google.protobuf.message import DecodeError

    metadata_path = join(path, KERAS_METADATA)
    if not tf.io.gfile.exists(metadata_path):
        return []  # no Keras config: load_model cannot rebuild layers from it
    metadata = saved_metadata_pb2.SavedMetadata()
    try:
        with tf.io.gfile.GFile(metadata_path, "rb") as f:
            metadata.ParseFromString(f.read())
        return [json.loads(node.metadata) for node in metadata.nodes if node.metadata]
    except (DecodeError, ValueError, RecursionError) as e:
        raise TftrainError(f"{metadata_path} is not a readable Keras metadata file "
                           f"({type(e).__name__}); the SavedModel is damaged.") from None


def _h5_configs(path: str) -> list:
    import h5py

    try:
        with tf.io.gfile.GFile(path, "rb") as f, h5py.File(f, "r") as h5:
            config = h5.attrs.get("model_config")
    except (OSError, ValueError) as e:
        raise TftrainError(f"{path} is not a readable .h5 model ({e}).") from None
    if config is None:
        return []
    return [json.loads(config.decode() if isinstance(config, bytes) else config)]


def _collect(config, found: list[str]) -> None:
    """Appends to `found` the names of Python-carrying layers anywhere in a Keras config."""
    stack = [config]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if item.get("class_name") in _PYTHON_LAYERS or "function_type" in item:
                inner = item.get("config") if isinstance(item.get("config"), dict) else item
                found.append(str(inner.get("name", item.get("name", "?"))))
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
