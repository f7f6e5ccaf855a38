"""The model registry: `mlp`, `cnn`, `resnet`, `transformer`, `transformer_lm` (see
`models.transformer`), `application` (tf_keras.applications backbones, `models.applications`),
or a user's `package.module:function`; `auto` picks one by the dataset's kind (`choose`).

A builder gets what the dataset says: `input_shape`, and either `outputs` (a `OutputSpec` from
the task: how many values the last layer gives and what they are; `outputs.head(x)` builds that
layer) or, for builders written before tasks, `num_classes` (`outputs.size`). Which one is
decided by the builder's signature, so `def build(input_shape, num_classes, **params)` keeps
working. It also gets its own keyword parameters (`model.params` in the config) and returns an
uncompiled tf_keras model whose outputs are float32. Builders import tf_keras inside, so
checking a config does not start TensorFlow.
"""
from __future__ import annotations

import difflib
import importlib
import inspect
from typing import Callable

import tftrain
from tftrain.errors import ConfigError, DataError
from tftrain.models.applications import application
from tftrain.models.outputs import OutputSpec, as_output_spec  # noqa: F401  (the task/model contract)
from tftrain.models.transformer import transformer, transformer_lm

# What a builder receives besides model.params (never settable there). The last two come from
# the dataset's manifest `info` (text datasets), given to builders whose signature names them.
DATASET_ARGUMENTS = ("input_shape", "outputs", "num_classes", "vocab_size", "sequence_length")
INFO_KEYS = {"vocab_size": ("vocab_size",), "sequence_length": ("sequence_length", "max_length")}


def mlp(input_shape, outputs: OutputSpec, hidden_units=(256, 128), dropout=0.1):
    """A multi-layer perceptron over the flattened input."""
    outputs = as_output_spec(outputs)
    import tf_keras as keras

    inputs = keras.Input(shape=input_shape, name="inputs")
    x = keras.layers.Flatten()(inputs)
    for units in hidden_units:
        x = keras.layers.Dense(units, activation="relu")(x)
        if dropout:
            x = keras.layers.Dropout(dropout)(x)
    return keras.Model(inputs, outputs.head(x), name="mlp")


def cnn(input_shape, outputs: OutputSpec, filters=(32, 64), dense_units=128, dropout=0.25):
    """A small convolutional network: conv-conv-pool blocks, then a dense head."""
    outputs = as_output_spec(outputs)
    import tf_keras as keras

    inputs = keras.Input(shape=input_shape, name="inputs")
    x = inputs
    for index, width in enumerate(filters):
        x = keras.layers.Conv2D(width, 3, padding="same", activation="relu")(x)
        x = keras.layers.Conv2D(width, 3, padding="same", activation="relu")(x)
        if min(x.shape[1], x.shape[2]) >= 4 or index < len(filters) - 1:
            x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(dense_units, activation="relu")(x)
    if dropout:
        x = keras.layers.Dropout(dropout)(x)
    return keras.Model(inputs, outputs.head(x), name="cnn")


def resnet(input_shape, outputs: OutputSpec, depth=3, width=16, stages=3):
    """A small pre-activation-free ResNet: `stages` stages of `depth` residual blocks each,
    channel width doubling per stage from `width`."""
    outputs = as_output_spec(outputs)
    import tf_keras as keras

    layers = keras.layers

    def block(x, channels, stride):
        shortcut = x
        y = layers.Conv2D(channels, 3, strides=stride, padding="same", use_bias=False)(x)
        y = layers.BatchNormalization()(y)
        y = layers.ReLU()(y)
        y = layers.Conv2D(channels, 3, padding="same", use_bias=False)(y)
        y = layers.BatchNormalization()(y)
        if stride != 1 or shortcut.shape[-1] != channels:
            shortcut = layers.Conv2D(channels, 1, strides=stride, use_bias=False)(shortcut)
            shortcut = layers.BatchNormalization()(shortcut)
        return layers.ReLU()(layers.Add()([y, shortcut]))

    inputs = keras.Input(shape=input_shape, name="inputs")
    x = layers.Conv2D(width, 3, padding="same", use_bias=False)(inputs)
    x = layers.ReLU()(layers.BatchNormalization()(x))
    for stage in range(stages):
        for index in range(depth):
            stride = 2 if (stage > 0 and index == 0 and min(x.shape[1], x.shape[2]) >= 4) else 1
            x = block(x, width * 2**stage, stride)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, outputs.head(x), name="resnet")


REGISTRY: dict[str, Callable] = {"mlp": mlp, "cnn": cnn, "resnet": resnet,
                                 "transformer": transformer, "transformer_lm": transformer_lm,
                                 "application": application}


def get_builder(name: str) -> Callable:
    """The builder for a registered name or for 'package.module:function'."""
    if name in REGISTRY:
        return REGISTRY[name]
    if ":" in name:
        module_name, _, function_name = name.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            raise ConfigError(f"model {name!r}: cannot import module {module_name!r} ({e})") from None
        builder = getattr(module, function_name, None)
        if not callable(builder):
            raise ConfigError(f"model {name!r}: module {module_name!r} has no function {function_name!r}")
        return builder
    close = difflib.get_close_matches(name, REGISTRY, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ConfigError(f"unknown model {name!r}{hint}: registered models are {', '.join(REGISTRY)}, "
                      "or give your own as package.module:function")


AUTO = "auto"  # model.name: the model that fits the dataset's kind (`choose`)


def choose(manifest: dict, task_type: str) -> tuple[str, str]:
    """The model `model.name: auto` takes for a dataset (from its manifest), and the kind of
    data that made the choice: token ids -> transformer_lm (language modeling) or transformer,
    images -> cnn, anything else (tabular features) -> mlp."""
    info = manifest.get("info") or {}
    if "vocab_size" in info:
        if task_type == "language_model":
            return "transformer_lm", "windows of token ids"
        return "transformer", "sequences of token ids"
    if any(name.startswith("image/") for name in manifest.get("features") or {}):
        return "cnn", "images"
    return "mlp", "tabular features"


IMAGE_MODELS = ("cnn", "resnet", "application")  # (height, width, channels) inputs
TOKEN_MODELS = ("transformer", "transformer_lm")  # (sequence length,) token ids


def takes_input(name: str, input_shape) -> bool:
    """Whether registered model `name` can take a dataset's inputs of `input_shape`."""
    if name in IMAGE_MODELS:
        return len(input_shape) == 3
    if name in TOKEN_MODELS:  # (their builders say what they need of the dataset's info)
        return len(input_shape) == 1
    return True


def check_input(name: str, input_shape, dataset_info: dict | None) -> None:
    """Refuses, before building, a registered model that cannot take the dataset's inputs,
    naming those that can (a user's own builder is trusted)."""
    if name not in REGISTRY or takes_input(name, input_shape):
        return
    tokens = "vocab_size" in (dataset_info or {})  # a dataset of token ids names its vocabulary
    fits = [model for model in REGISTRY if takes_input(model, input_shape)
            and (tokens or model not in TOKEN_MODELS)]
    raise ConfigError(f"model.name={name} cannot take this dataset's inputs (one example: "
                      f"shape {tuple(input_shape)}); models that can: {', '.join(fits)}. Set "
                      "model.name=auto to take the one that fits, or one of those")


def taken_params(name: str, params: dict) -> tuple[dict, list[str]]:
    """`params` split into those model `name` takes and the names of those it does not."""
    allowed, accepts_any = _parameters(name)
    kept = {k: v for k, v in params.items() if accepts_any or k in allowed}
    return kept, [k for k in params if k not in kept]


def _parameters(name: str) -> tuple[list[str], bool]:
    """The parameters model `name` takes in model.params, and whether it takes any (**kwargs)."""
    signature = inspect.signature(get_builder(name))
    accepts_any = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    return [p for p in signature.parameters if p not in DATASET_ARGUMENTS], accepts_any


def check_model(name: str, params: dict) -> None:
    """Checks that the model exists and accepts `params`, without building it (`auto`: once
    the dataset has chosen the model)."""
    if name == AUTO:  # a key no registered model takes is a typo, not another model's
        taken = sorted({p for model in REGISTRY for p in _parameters(model)[0]})
        for key in params:
            if key not in taken:
                close = difflib.get_close_matches(key, taken, n=2)
                hint = f"; did you mean {' or '.join(close)}?" if close else ""
                raise ConfigError(f"no model takes model.params.{key}{hint} (model.name=auto "
                                  "uses those of the model it picks)")
        return
    allowed, accepts_any = _parameters(name)
    for key in params:
        if key not in allowed and not accepts_any:
            close = difflib.get_close_matches(key, allowed, n=2)
            hint = f"; did you mean {' or '.join(close)}?" if close else ""
            raise ConfigError(f"model {name!r} has no parameter model.params.{key}{hint} "
                              f"(it takes: {', '.join(allowed) or 'none'}). model.params "
                              "comes from the config file and --params_override: after "
                              "changing model.name, give that model's, or none with "
                              "--params_override='model.params={}' (model.name=auto leaves "
                              "out another model's)")


# Past this many outputs (classes), the model's size is measured before it is built: a dataset
# that says 5 million classes would otherwise allocate a head of tens of GB before any check.
LARGE_OUTPUT = 100_000
TRAINING_BYTES_PER_PARAMETER = 16  # float32 weights, gradients and two optimizer slots


def check_fits(name: str, build: Callable, outputs: int) -> None:
    """Raises DataError when the model `build` returns needs more memory to train than this
    machine has; the model is built in a graph first, where variables take no memory."""
    import tensorflow as tf

    from tftrain.host import available_memory

    free = available_memory()
    if free is None:
        return
    with tf.Graph().as_default():
        parameters = build().count_params()
    needed = parameters * TRAINING_BYTES_PER_PARAMETER
    if needed > free:
        raise DataError(
            f"model {name!r} with {outputs:,} outputs (the dataset's number of classes) has "
            f"{parameters:,} parameters: ~{needed / 2**30:,.0f} GiB to train (weights, gradients "
            f"and optimizer slots), more than the {free / 2**30:,.0f} GiB this machine has free. "
            "Check the dataset's labels (integer labels are class ids 0..K-1).")


def build_model(name: str, params: dict, input_shape, outputs: OutputSpec | int,
                dataset_info: dict | None = None):
    """Builds the model; call inside `strategy.scope()`.

    `outputs`: the task's `OutputSpec`, or a number of classes. A builder that takes `outputs`
    gets the spec; one that takes `num_classes` (written before tasks) gets `outputs.size`.
    A builder that names `vocab_size` or `sequence_length` gets them from `dataset_info` (the
    manifest's `info`: `vocab_size`; `sequence_length` or `max_length`) when it has them.
    """
    tftrain.require_tf_keras()
    import tf_keras as keras

    check_input(name, input_shape, dataset_info)
    spec = as_output_spec(outputs)
    builder = get_builder(name)
    parameters = inspect.signature(builder).parameters
    given = {"outputs": spec} if "outputs" in parameters else {"num_classes": spec.size}
    for argument, keys in INFO_KEYS.items():
        found = [dataset_info[key] for key in keys if key in (dataset_info or {})]
        if argument in parameters and found:
            given[argument] = int(found[0])
    if spec.size > LARGE_OUTPUT:
        check_fits(name, lambda: builder(input_shape=tuple(input_shape), **given, **params),
                   spec.size)
    model = builder(input_shape=tuple(input_shape), **given, **params)
    if not isinstance(model, keras.Model):
        raise ConfigError(
            f"model {name!r} returned {type(model).__module__}.{type(model).__name__}, not a "
            "tf_keras Model: build models with `import tf_keras as keras` (Keras 3 is not supported "
            "by tensorflow-model-optimization)")
    return model
