"""Runs .tflite models with the LiteRT interpreter: predictions, accuracy and latency.

`ai_edge_litert.interpreter.Interpreter` is used; `tf.lite.Interpreter` (deprecated) only when
LiteRT is not installed. Examples run one at a time (batch 1, the serving case), so `latency_ms`
is the mean time of one `invoke` per example; integer inputs are quantized and integer outputs
dequantized with the tensors' own scale and zero point.
"""
from __future__ import annotations

import time

import numpy as np
import tensorflow as tf

from tftrain import quiet_start
from tftrain.errors import TftrainError
from tftrain.fileio import read_bytes
from tftrain.optimize import metrics, sizes


def interpreter_class():
    """LiteRT's Interpreter, or `tf.lite.Interpreter` when `ai-edge-litert` is missing."""
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:  # pragma: no cover - LiteRT is a dependency; this is for old installs
        return tf.lite.Interpreter
    return Interpreter


class TfliteModel:
    """A .tflite model ready to run single examples.

    `model`: the flatbuffer's bytes or a path. `num_threads` defaults to 1 so latencies of
    different models compare on equal terms.
    """

    def __init__(self, model: bytes | str, num_threads: int = 1):
        if not isinstance(model, (bytes, bytearray)) and not tf.io.gfile.exists(model):
            raise TftrainError(f"no TFLite model at {model}")
        content = model if isinstance(model, (bytes, bytearray)) else read_bytes(model)
        self.size = len(content)
        with quiet_start.hiding_native_chatter():  # "Created TensorFlow Lite XNNPACK delegate"
            try:
                self.interpreter = interpreter_class()(model_content=bytes(content),
                                                       num_threads=num_threads)
            except (ValueError, RuntimeError) as e:
                where = "" if isinstance(model, (bytes, bytearray)) else f" {model}"
                raise TftrainError(f"cannot load the TFLite model{where}: {e}") from e
            self._inputs = self._input_details()
            for detail in self._inputs.values():
                shape = list(detail["shape_signature"])
                self.interpreter.resize_tensor_input(detail["index"], [1] + shape[1:])
            self.interpreter.allocate_tensors()
        self._output = self.interpreter.get_output_details()[0]

    def _input_details(self) -> dict:
        """Input details by signature input name (the Keras input names), else by position."""
        signatures = self.interpreter.get_signature_list()
        if len(signatures) == 1:
            runner = self.interpreter.get_signature_runner(next(iter(signatures)))
            details = runner.get_input_details()
            by_index = {d["index"]: d for d in self.interpreter.get_input_details()}
            return {name: by_index[d["index"]] for name, d in details.items()}
        return {i: d for i, d in enumerate(self.interpreter.get_input_details())}

    @staticmethod
    def _quantize(value: np.ndarray, detail: dict) -> np.ndarray:
        dtype = detail["dtype"]
        if np.issubdtype(dtype, np.integer) and not np.issubdtype(value.dtype, np.integer):
            scale, zero_point = detail["quantization"]
            info = np.iinfo(dtype)
            value = np.clip(np.round(value / scale + zero_point), info.min, info.max)
        return value.astype(dtype)

    def _set_inputs(self, example) -> None:
        if isinstance(example, dict):
            values = example
        else:
            if len(self._inputs) != 1:
                raise TftrainError(f"the TFLite model has {len(self._inputs)} inputs; the data "
                                   "gives one tensor")
            values = {next(iter(self._inputs)): example}
        for name, detail in self._inputs.items():
            if name not in values:
                raise TftrainError(f"the data has no input {name!r} for the TFLite model "
                                   f"(it has {sorted(values)})")
            self.interpreter.set_tensor(detail["index"], self._quantize(values[name], detail))

    def _get_output(self) -> np.ndarray:
        output = self.interpreter.get_tensor(self._output["index"])
        if np.issubdtype(output.dtype, np.integer):
            scale, zero_point = self._output["quantization"]
            if scale:
                output = (output.astype(np.float32) - zero_point) * scale
        return output

    def run(self, example) -> tuple[np.ndarray, float]:
        """Runs one example (arrays with a leading batch dimension of 1); returns (output, s)."""
        self._set_inputs(example)
        start = time.perf_counter()
        self.interpreter.invoke()
        seconds = time.perf_counter() - start
        return self._get_output(), seconds


def _examples(dataset, max_examples: int | None):
    """Yields `(inputs, label)` one example at a time from a dataset of batches."""
    count = 0
    for inputs, labels in dataset:
        batch = tf.nest.map_structure(np.asarray, inputs)
        labels = np.asarray(labels)
        for i in range(len(labels)):
            if max_examples is not None and count >= max_examples:
                return
            yield tf.nest.map_structure(lambda a: a[i:i + 1], batch), labels[i:i + 1]
            count += 1


def _run_examples(runner: TfliteModel, dataset, max_examples: int | None, keep: int = 0):
    """Runs every example once; returns outputs, labels, seconds and the first `keep` inputs."""
    outputs, labels, seconds, kept = [], [], [], []
    for i, (example, label) in enumerate(_examples(dataset, max_examples)):
        if i == 0:
            runner.run(example)  # warm-up: the first invoke prepares kernels and delegates
        output, elapsed = runner.run(example)
        outputs.append(output[0])
        labels.append(label[0])
        seconds.append(elapsed)
        if i < keep:
            kept.append(example)
    if not outputs:
        raise TftrainError("the evaluation dataset is empty")
    return np.stack(outputs), np.asarray(labels), seconds, kept


def predict_tflite(model: bytes | str | TfliteModel, dataset, *, max_examples: int | None = None,
                   num_threads: int = 1) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """Runs every example of `dataset`; returns (outputs, labels, seconds per example)."""
    runner = model if isinstance(model, TfliteModel) else TfliteModel(model, num_threads)
    outputs, labels, seconds, _ = _run_examples(runner, dataset, max_examples)
    return outputs, labels, seconds


def evaluate_tflite(path: bytes | str, dataset, *, max_examples: int | None = None,
                    num_threads: int = 1, latency_rounds: int = 3,
                    latency_examples: int = 256) -> dict:
    """Accuracy and mean latency of a .tflite classifier on a dataset of `(inputs, label)` batches.

    Accuracy covers every example (or the first `max_examples`). `latency_ms` is the mean
    `invoke` time per example of the fastest of `latency_rounds` rounds (the full pass, then
    passes over the first `latency_examples` examples): on a shared machine the fastest round is
    the one least disturbed by other processes.
    Returns `{"accuracy", "latency_ms", "num_examples", "tflite_bytes", "gzip_bytes"}`.
    """
    runner = TfliteModel(path, num_threads)
    outputs, labels, seconds, kept = _run_examples(runner, dataset, max_examples,
                                                   keep=latency_examples)
    latency = float(np.mean(seconds))
    for _ in range(latency_rounds - 1):
        latency = min(latency, float(np.mean([runner.run(example)[1] for example in kept])))
    content = path if isinstance(path, (bytes, bytearray)) else read_bytes(path)
    return {"accuracy": metrics.count_correct(outputs, labels) / len(labels),
            "latency_ms": 1000.0 * latency,
            "num_examples": int(len(labels)),
            "tflite_bytes": runner.size,
            "gzip_bytes": sizes.gzip_bytes(bytes(content))}


def compare_latencies(models: dict, dataset, *, rounds: int = 5, examples: int = 256,
                      num_threads: int = 1) -> dict[str, float]:
    """Mean `invoke` milliseconds per example of each model (name -> bytes or path), fairly.

    All models run the same first `examples` examples, in interleaved rounds (model A, B, ...,
    then again), so a burst of load from other processes hits them alike; each keeps its
    fastest round.
    """
    runners = {name: TfliteModel(model, num_threads) for name, model in models.items()}
    inputs = [example for example, _ in _examples(dataset, examples)]
    if not inputs:
        raise TftrainError("the evaluation dataset is empty")
    best = {name: float("inf") for name in runners}
    for runner in runners.values():
        runner.run(inputs[0])  # warm-up
    for _ in range(rounds):
        for name, runner in runners.items():
            best[name] = min(best[name], float(np.mean([runner.run(x)[1] for x in inputs])))
    return {name: 1000.0 * seconds for name, seconds in best.items()}
