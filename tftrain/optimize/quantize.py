"""TFLite conversion (float, dynamic range, full int8, float16) and quantization-aware training.

A mixed-precision model is rebuilt in float32 before conversion (it does not convert cleanly
otherwise). Quantization-aware training annotates only the layers TFMOT's default 8-bit scheme
supports and lists the others, which stay float; for a pruned model the pruning-preserving scheme
keeps the zeros.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf
import tensorflow_model_optimization as tfmot
import tf_keras as keras
from absl import logging
from tensorflow_model_optimization.python.core.quantization.keras.default_8bit import (
    default_8bit_quantize_registry)

from tftrain import quiet_start
from tftrain.errors import ConfigError, TftrainError
from tftrain.optimize import finetune as finetune_lib
from tftrain.optimize.keras_model import check_tf_keras, clone_float32, is_mixed_precision

MODES = ("dynamic", "int8", "float16", "qat")
_CONVERSIONS = ("float",) + MODES
# LiteRT's flatbuffer cannot exceed 2 GiB (tensorflow#60570, #61995); a .tflite holds about
# this many bytes per weight in each conversion.
FLATBUFFER_LIMIT = 2 * 2**30
BYTES_PER_WEIGHT = {"float": 4, "float16": 2, "dynamic": 1, "int8": 1, "qat": 1}


def check_flatbuffer_sizes(parameters: int) -> None:
    """Raises ConfigError, before any conversion, when the float .tflite of `parameters`
    weights (the reference every mode is measured against, and the largest conversion) would
    exceed LiteRT's flatbuffer limit."""
    def gib(mode: str) -> str:
        return f"~{parameters * BYTES_PER_WEIGHT[mode] / 2**30:.2f} GiB"

    if parameters * BYTES_PER_WEIGHT["float"] > FLATBUFFER_LIMIT:
        raise ConfigError(
            f"the model's {parameters:,} weights make a float .tflite of {gib('float')}, over "
            f"LiteRT's {FLATBUFFER_LIMIT / 2**30:g} GiB flatbuffer limit, and tftrain quantize "
            f"measures every quantized model against that float reference: models over "
            f"{FLATBUFFER_LIMIT // BYTES_PER_WEIGHT['float']:,} weights cannot be quantized by "
            f"it yet (float16 weights would be {gib('float16')}, int8 {gib('dynamic')}); "
            "measure the export with `tftrain evaluate --steps=N` instead")


def check_mode(mode: str) -> str:
    """Returns `mode` when it is a quantization mode, else raises ConfigError."""
    if mode not in MODES:
        raise ConfigError(f"--mode={mode!r} is not a quantization mode; choose one of "
                          f"{', '.join(MODES)}")
    return mode


def representative_dataset(dataset, num_examples: int = 100):
    """A generator function yielding up to `num_examples` single examples of `dataset`'s inputs.

    `dataset` yields `(inputs, label)` batches; inputs may be a tensor or a dict of tensors.
    """

    def generate():
        count = 0
        for inputs, _ in dataset:
            batch = tf.nest.map_structure(np.asarray, inputs)
            for i in range(len(tf.nest.flatten(batch)[0])):
                example = tf.nest.map_structure(lambda a: a[i:i + 1], batch)
                yield example if isinstance(example, dict) else [example]
                count += 1
                if count >= num_examples:
                    return

    return generate


def convert(model: keras.Model, mode: str = "float", *, representative_data=None,
            num_calibration_examples: int = 100, int8_io: bool = False) -> bytes:
    """Converts a tf-keras model to a .tflite flatbuffer; returns its bytes.

    `mode`: `float` (no optimization), `dynamic` (int8 weights, float activations), `int8` (int8
    weights and activations calibrated on `representative_data`, a dataset of `(inputs, label)`
    batches; int8 inputs/outputs with `int8_io`), `float16` (float16 weights), `qat` (a model from
    `quantization_aware_model`: int8 from its learned ranges). Raises `TftrainError` when the
    converter fails.
    """
    if mode not in _CONVERSIONS:
        raise ConfigError(f"unknown conversion mode {mode!r}; choose one of "
                          f"{', '.join(_CONVERSIONS)}")
    check_tf_keras(model)
    if is_mixed_precision(model):
        logging.info("model %s is mixed precision: converting a float32 copy", model.name)
        model = clone_float32(model)
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    if mode != "float":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if mode == "float16":
        converter.target_spec.supported_types = [tf.float16]
    if mode == "int8":
        if representative_data is None:
            raise ConfigError("int8 quantization needs representative data (the training split)")
        converter.representative_dataset = representative_dataset(
            representative_data, num_calibration_examples)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    if int8_io:
        if mode not in ("int8", "qat"):
            raise ConfigError(f"int8 inputs/outputs need --mode=int8 or qat, not {mode}")
        converter.inference_input_type = tf.int8
        converter.inference_output_type = tf.int8
    try:
        with quiet_start.hiding_native_chatter():
            return converter.convert()
    except Exception as e:  # ConverterError, ValueError, ...: one message naming the model
        lines = [line for line in str(e).splitlines() if "error" in line.lower()] or [str(e)]
        raise TftrainError(
            f"TFLite conversion of model {model.name!r} ({mode}) failed: {lines[0].strip()[:500]}. "
            "Only TFLite builtin ops are enabled: replace the unsupported op or layer.") from e


def annotate_supported_layers(model: keras.Model) -> tuple[keras.Model, list[str]]:
    """Annotates for quantization every layer the default 8-bit scheme supports.

    Returns the annotated model (sharing `model`'s layers; pass a clone) and the names of the
    layers left in float.
    """
    registry = default_8bit_quantize_registry.Default8BitQuantizeRegistry()
    float_layers: list[str] = []

    def annotate(layer):
        if isinstance(layer, keras.layers.InputLayer):
            return layer
        if isinstance(layer, keras.Model) or not registry.supports(layer):
            float_layers.append(f"{layer.name} ({type(layer).__name__})")
            return layer
        return tfmot.quantization.keras.quantize_annotate_layer(layer)

    return keras.models.clone_model(model, clone_function=annotate), float_layers


def quantization_aware_model(model: keras.Model, *, preserve_sparsity: bool = False,
                             strategy=None) -> tuple[keras.Model, list[str]]:
    """A float32 quantization-aware clone of `model` and the layers left in float.

    With `preserve_sparsity`, the pruning-preserving scheme keeps the zeros of a pruned model.
    """
    with finetune_lib.strategy_scope(strategy):
        clone = clone_float32(model)
        annotated, float_layers = annotate_supported_layers(clone)
        if len(float_layers) == len([l for l in clone.layers
                                     if not isinstance(l, keras.layers.InputLayer)]):
            raise TftrainError(f"no layer of model {model.name!r} can be quantization-aware "
                               f"trained (left in float: {', '.join(float_layers)})")
        if preserve_sparsity:
            scheme = tfmot.experimental.combine.Default8BitPrunePreserveQuantizeScheme()
        else:
            scheme = tfmot.quantization.keras.default_8bit.Default8BitQuantizeScheme()
        try:
            with tfmot.quantization.keras.quantize_scope():
                qat = tfmot.quantization.keras.quantize_apply(annotated, scheme)
        except Exception as e:
            raise TftrainError(
                f"quantization-aware training cannot handle model {model.name!r}: "
                f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                + (f" (layers left in float: {', '.join(float_layers)})" if float_layers else "")
            ) from e
    if float_layers:
        logging.warning("quantization-aware training leaves these layers in float: %s",
                        ", ".join(float_layers))
    return qat, float_layers


def quantization_aware_training(model: keras.Model, train_data, *, steps_per_epoch: int,
                                epochs: int = 1, preserve_sparsity: bool = False, loss=None,
                                learning_rate: float = 1e-3, optimizer_fn=None, strategy=None,
                                verbose: int = 0) -> tuple[keras.Model, list[str]]:
    """Fine-tunes a quantization-aware float32 clone of `model`; returns it and its float layers."""
    loss = loss or finetune_lib.training_loss(model)
    qat, float_layers = quantization_aware_model(model, preserve_sparsity=preserve_sparsity,
                                                 strategy=strategy)
    optimizer = None
    if optimizer_fn:
        with finetune_lib.strategy_scope(strategy):
            optimizer = optimizer_fn()
    finetune_lib.finetune(qat, train_data, epochs=epochs, steps_per_epoch=steps_per_epoch,
                          loss=loss, learning_rate=learning_rate, optimizer=optimizer,
                          strategy=strategy, verbose=verbose)
    return qat, float_layers
