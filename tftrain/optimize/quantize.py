"""TFLite conversion (float, dynamic range, full int8, float16) and quantization-aware training.

Every conversion reads a plain float32 SavedModel of the model (`save_float32`: its variables and
one serving signature, no Keras object, so no per-layer traces), written once and converted in
each mode. A mixed-precision model is rebuilt in float32 before conversion (it does not convert
cleanly otherwise). Quantization-aware training annotates only the layers TFMOT's default 8-bit scheme
supports and lists the others, which stay float; for a pruned model the pruning-preserving scheme
keeps the zeros.
"""
from __future__ import annotations

import os
import tempfile

import numpy as np
import tensorflow as tf
import tf_keras as keras
from absl import logging

from tftrain import host, quiet_start
from tftrain.engine import export
from tftrain.errors import ConfigError, TftrainError
from tftrain.optimize import finetune as finetune_lib
from tftrain.optimize.keras_model import check_tf_keras, clone_float32, is_mixed_precision
from tftrain.optimize.tfmot_lib import default_8bit_quantize_registry, tfmot

MODES = ("dynamic", "int8", "float16", "qat")
_CONVERSIONS = ("float",) + MODES
# LiteRT's flatbuffer cannot exceed 2 GiB (tensorflow#60570, #61995); a .tflite holds about
# this many bytes per weight in each conversion.
FLATBUFFER_LIMIT = 2 * 2**30
BYTES_PER_WEIGHT = {"float": 4, "float16": 2, "dynamic": 1, "int8": 1, "qat": 1}
# The float model every quantized one is measured against: its float .tflite, or, when that
# would exceed the flatbuffer limit, the float32 Keras model itself.
TFLITE, KERAS = "tflite", "keras"
# The one signature of the SavedModel every conversion reads (`save_float32`).
SIGNATURE = "serving_default"
# Peak memory of `tftrain quantize --mode=M --steps=1` ~ MEMORY_FIXED + k x the model's float32
# weight bytes, k = MEMORY_PER_WEIGHT_BYTE[reference][M]. Measured by bench/quantize_memory.py
# (the peak PSS of the command's process tree, sampled every 20 ms) on transformer_lm runs of
# lm_1b.yaml's blocks (width 2048, MLP 8192, 16 heads, remat) with 2 and 6 layers (105M, 307M
# weights) trained one step on lm_1b's data, on this project's 2-core AMD EPYC VM with 24 GB
# (TF 2.21, oneDNN on), in December 2026: k is the slope through the two (rounded up), and
# MEMORY_FIXED is above every fitted intercept (82-447 MiB). Checked at 10 layers (508M: Keras
# reference, dynamic, 10,046 MiB measured, 0.9% under the line) and on narrower models (width
# 512 and 768, 20M and 87M weights: 1.09x and 1.01x the line). Where it goes (105M, dynamic):
# the loaded Keras model holds ~2.2x its float32 weights, which TensorFlow's (oneDNN's)
# allocator keeps for its own later tensors once the model is let go; the conversion then peaks
# at ~5x (the converter alone, in a fresh process: ~5x too), int8's with its calibration, and a
# float .tflite reference is one conversion more. When each conversion re-saved the held Keras
# model (from_keras_model), k was 6.55, 6.99, 10.71 against Keras and 8.61, 9.02, 11.61 against
# the float .tflite, with 640 MiB. qat was not measured: dynamic, plus the loaded model it keeps
# (2.2) and fine-tuning's copy, gradients and two optimizer slots (4).
MEMORY_FIXED = 450 * 2**20
MEMORY_PER_WEIGHT_BYTE = {
    TFLITE: {"dynamic": 7.31, "float16": 7.90, "int8": 10.25},
    KERAS: {"dynamic": 5.01, "float16": 5.41, "int8": 9.20},
}
QAT_PER_WEIGHT_BYTE = 2.2 + 4  # over dynamic's


def _gib(nbytes: float) -> str:
    return f"~{nbytes / 2**30:.2f} GiB"


def tflite_bytes(parameters: int, mode: str) -> int:
    """The estimated size of the .tflite of `parameters` weights in conversion `mode`."""
    return parameters * BYTES_PER_WEIGHT[mode]


def fits_flatbuffer(parameters: int, mode: str) -> bool:
    """Whether `mode`'s .tflite of `parameters` weights stays within LiteRT's limit."""
    return tflite_bytes(parameters, mode) <= FLATBUFFER_LIMIT


def float_reference(parameters: int) -> str:
    """What quantized models of `parameters` weights are measured against: `tflite`, the float
    conversion, when it fits a flatbuffer, else `keras`, the float32 Keras model."""
    return TFLITE if fits_flatbuffer(parameters, "float") else KERAS


def check_flatbuffer_sizes(parameters: int, modes: list[str]) -> None:
    """Raises ConfigError, before any conversion, when a mode's .tflite of `parameters` weights
    would exceed LiteRT's flatbuffer limit, naming the modes that fit."""
    over = [mode for mode in modes if not fits_flatbuffer(parameters, mode)]
    if not over:
        return
    fitting = [mode for mode in MODES if fits_flatbuffer(parameters, mode)]
    sizes = " and ".join(f"a {mode} .tflite of {_gib(tflite_bytes(parameters, mode))}"
                         for mode in over)
    fit = (f"modes that fit: {', '.join(fitting)} (int8 weights, "
           f"{_gib(tflite_bytes(parameters, 'dynamic'))})" if fitting else "no mode fits")
    raise ConfigError(
        f"--mode={','.join(over)}: the model's {parameters:,} weights make {sizes}, over "
        f"LiteRT's {FLATBUFFER_LIMIT / 2**30:g} GiB flatbuffer limit; {fit}")


def estimated_memory(parameters: int, mode: str, reference: str) -> int:
    """Bytes `tftrain quantize --mode=mode` is estimated to hold at its peak (see
    MEMORY_PER_WEIGHT_BYTE) for a model of `parameters` weights measured against `reference`."""
    per_byte = MEMORY_PER_WEIGHT_BYTE[reference]
    k = per_byte["dynamic"] + QAT_PER_WEIGHT_BYTE if mode == "qat" else per_byte[mode]
    return int(MEMORY_FIXED + k * tflite_bytes(parameters, "float"))


def check_memory(parameters: int, modes: list[str], reference: str,
                 available: int | None) -> None:
    """Raises ConfigError, before any conversion, when a mode's estimated peak exceeds the
    `available` bytes (None: unknown, not checked); the .tflite files of earlier modes are held
    until all are timed, so they count too. Names the modes that fit alone."""
    if available is None:
        return
    held = sum(tflite_bytes(parameters, mode) for mode in modes[:-1])
    need = max(estimated_memory(parameters, mode, reference) for mode in modes) + held
    if need <= available:
        return
    fitting = [f"{mode} ({_gib(estimated_memory(parameters, mode, reference))})"
               for mode in MODES if fits_flatbuffer(parameters, mode)
               and estimated_memory(parameters, mode, reference) <= available]
    raise ConfigError(
        f"--mode={','.join(modes)} on the model's {parameters:,} weights needs an estimated "
        f"{_gib(need)} of memory at its peak, and {_gib(available)} is available; "
        + (f"modes that fit: {', '.join(fitting)}" if fitting else "no mode fits: quantize "
           "on a machine with more memory"))


def check_quantizable(parameters: int, modes: list[str]) -> str:
    """The float reference (`float_reference`) of quantizing a model of `parameters` weights in
    `modes`, after refusing (ConfigError) a mode over the flatbuffer limit
    (`check_flatbuffer_sizes`), then conversions this process's memory cannot hold
    (`check_memory`)."""
    check_flatbuffer_sizes(parameters, modes)
    reference = float_reference(parameters)
    check_memory(parameters, modes, reference, host.memory_for_this_process())
    return reference


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


def save_float32(model: keras.Model, path: str) -> None:
    """Writes `model` to the new directory `path` as a plain float32 SavedModel for the TFLite
    converter: the model's variables and one `serving_default` signature, Keras's (the input
    tensors by input name -> the outputs by output name, in inference mode), and no Keras
    object. A Keras save would trace every layer's call for tf-keras's revival (most of a
    conversion's time) and carry what the model tracks besides (an export's tokenizer tables,
    which TFLite builtins cannot hold); the converter reads only the signature. A
    mixed-precision model is saved as its float32 clone (it does not convert cleanly otherwise).
    Raises TftrainError when the signature uses a TensorFlow resource other than the model's
    variables (a lookup table in the model: no TFLite builtin op holds one)."""
    check_tf_keras(model)
    if is_mixed_precision(model):
        logging.info("model %s is mixed precision: converting a float32 copy", model.name)
        model = clone_float32(model)
    holder = tf.Module()
    holder.model_variables = list(model.variables)
    try:
        # The debug info names the Python line of an op the converter cannot take, as a
        # Keras model's conversion does.
        # Without the custom gradients of a remat model: loading them registers functions
        # that keep the variables for the rest of the process (`forget_custom_gradients`).
        tf.saved_model.save(holder, path,
                            signatures={SIGNATURE: export.tensor_signature(model)},
                            options=tf.saved_model.SaveOptions(
                                save_debug_info=True, experimental_custom_gradients=False))
    except AssertionError as e:  # TensorFlow's "references an 'untracked' resource"
        raise TftrainError(
            f"TFLite conversion of model {model.name!r} failed: its call uses a TensorFlow "
            f"resource besides its weights ({str(e).splitlines()[0][:200]}), such as a lookup "
            "table, which no TFLite builtin op holds: look the ids up before the model.") from e


def _check_conversion(mode: str, representative_data, int8_io: bool) -> None:
    """Raises ConfigError for a conversion that cannot be asked for, before any work."""
    if mode not in _CONVERSIONS:
        raise ConfigError(f"unknown conversion mode {mode!r}; choose one of "
                          f"{', '.join(_CONVERSIONS)}")
    if mode == "int8" and representative_data is None:
        raise ConfigError("int8 quantization needs representative data (the training split)")
    if int8_io and mode not in ("int8", "qat"):
        raise ConfigError(f"int8 inputs/outputs need --mode=int8 or qat, not {mode}")


def convert_saved_model(path: str, mode: str = "float", *, representative_data=None,
                        num_calibration_examples: int = 100, int8_io: bool = False,
                        name: str | None = None) -> bytes:
    """Converts the SavedModel at `path` (`save_float32`'s) to a .tflite flatbuffer; returns
    its bytes. `mode` and the other arguments: see `convert`; `name` names the model in errors
    (default: the path)."""
    _check_conversion(mode, representative_data, int8_io)
    converter = tf.lite.TFLiteConverter.from_saved_model(path, signature_keys=[SIGNATURE])
    if mode != "float":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if mode == "float16":
        converter.target_spec.supported_types = [tf.float16]
    if mode == "int8":
        converter.representative_dataset = representative_dataset(
            representative_data, num_calibration_examples)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    if int8_io:
        converter.inference_input_type = tf.int8
        converter.inference_output_type = tf.int8
    try:
        with quiet_start.hiding_native_chatter():
            return converter.convert()
    except Exception as e:  # ConverterError, ValueError, ...: one message naming the model
        lines = [line for line in str(e).splitlines() if "error" in line.lower()] or [str(e)]
        raise TftrainError(
            f"TFLite conversion of model {name or path!r} ({mode}) failed: "
            f"{lines[0].strip()[:500]}. Only TFLite builtin ops are enabled: replace the "
            "unsupported op or layer.") from e


def convert(model: keras.Model, mode: str = "float", *, representative_data=None,
            num_calibration_examples: int = 100, int8_io: bool = False) -> bytes:
    """Converts a tf-keras model to a .tflite flatbuffer; returns its bytes.

    `mode`: `float` (no optimization), `dynamic` (int8 weights, float activations), `int8` (int8
    weights and activations calibrated on `representative_data`, a dataset of `(inputs, label)`
    batches; int8 inputs/outputs with `int8_io`), `float16` (float16 weights), `qat` (a model from
    `quantization_aware_model`: int8 from its learned ranges). The model goes through a plain
    SavedModel (`save_float32`) in a temporary directory, removed afterwards; to convert one
    model in several modes, write it once and call `convert_saved_model`. Raises `TftrainError`
    when the converter fails.
    """
    _check_conversion(mode, representative_data, int8_io)
    check_tf_keras(model)
    with tempfile.TemporaryDirectory(prefix="tftrain-tflite-") as directory:
        path = os.path.join(directory, "saved_model")
        save_float32(model, path)
        return convert_saved_model(path, mode, representative_data=representative_data,
                                   num_calibration_examples=num_calibration_examples,
                                   int8_io=int8_io, name=model.name)


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
