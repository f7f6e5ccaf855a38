"""Runs .tflite models with the LiteRT interpreter: predictions, the task's metrics, latency.

`ai_edge_litert.interpreter.Interpreter` is used; `tf.lite.Interpreter` (deprecated) only when
LiteRT is not installed. Integer inputs are quantized and integer outputs dequantized with the
tensors' own scale and zero point. Two times are measured, each with its batch size and threads:

- `latency_ms`: what one request costs at batch 1 — setting the input, `invoke`, reading the
  output, from Python — the mean over examples;
- `throughput_ms_per_example`: calls at batch `throughput_batch_size` (default 256), divided by
  their examples: the compute, with the fixed cost of a call spread over the batch.

The task's metrics (`Task.evaluate`: accuracy for classifiers, RMSE, MAE and R² for regression)
are computed from one example at a time, on every example.
"""
from __future__ import annotations

import itertools
import time

import numpy as np
import tensorflow as tf
from absl import logging

from tftrain import quiet_start
from tftrain.errors import TftrainError
from tftrain.fileio import read_bytes
from tftrain.host import cpu_name
from tftrain.optimize import sizes
from tftrain.tasks.classification import ClassificationTask

THROUGHPUT_BATCH_SIZE = 256


def interpreter_class():
    """LiteRT's Interpreter, or `tf.lite.Interpreter` when `ai-edge-litert` is missing."""
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:  # pragma: no cover - LiteRT is a dependency; this is for old installs
        return tf.lite.Interpreter
    return Interpreter


class TfliteModel:
    """A .tflite model ready to run batches of `batch_size` examples (default 1).

    `model`: the flatbuffer's bytes or a path. `num_threads` defaults to 1 so latencies of
    different models compare on equal terms. The inputs are resized to `[batch_size, ...]`
    (also when the model was converted with a fixed batch dimension).
    """

    def __init__(self, model: bytes | str, num_threads: int = 1, batch_size: int = 1):
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
            self.batch_size = None
            self.resize(batch_size)
        self._output = self.interpreter.get_output_details()[0]

    def resize(self, batch_size: int) -> None:
        """Makes the model run batches of `batch_size` examples from now on. Cheap (~0.1 ms for
        a small CNN and for ResNet50: the delegate stays, the tensors are reallocated), so a
        short batch runs at its size instead of being padded."""
        if batch_size == self.batch_size:
            return
        for detail in self._inputs.values():
            shape = list(detail["shape_signature"])
            self.interpreter.resize_tensor_input(detail["index"], [batch_size] + shape[1:])
        self.interpreter.allocate_tensors()
        self.batch_size = batch_size

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
        if value.dtype == dtype:  # the usual case: nothing to convert, no dtype checks
            return value
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
        if self._output["dtype"] != np.float32 and np.issubdtype(output.dtype, np.integer):
            scale, zero_point = self._output["quantization"]
            if scale:
                output = (output.astype(np.float32) - zero_point) * scale
        return output

    def run(self, example) -> tuple[np.ndarray, float]:
        """Runs one batch (arrays with a leading dimension of `batch_size`); returns (output, s).

        The seconds are the whole request: input set (and quantized), `invoke`, output read.
        """
        start = time.perf_counter()
        self._set_inputs(example)
        self.interpreter.invoke()
        output = self._get_output()
        return output, time.perf_counter() - start


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


def evaluate_tflite(path: bytes | str, dataset, *, task=None, max_examples: int | None = None,
                    num_threads: int = 1, latency_rounds: int = 3,
                    latency_examples: int = 256, confusion=None) -> dict:
    """The task's metrics and the batch-1 latency of a .tflite model on `(inputs, label)` batches.

    `task` (a `tftrain.tasks.Task`; default: classification) scores the outputs, over every
    example (or the first `max_examples`). `latency_ms` is the mean time
    of one request per example (batch 1, `num_threads` threads) of the fastest of
    `latency_rounds` rounds (the full pass, then passes over the first `latency_examples`
    examples): on a shared machine the fastest round is the one least disturbed by other
    processes. Returns the task's metrics (`accuracy`, ... for a classifier) and `{"latency_ms",
    "latency_batch_size", "num_threads", "num_examples", "tflite_bytes", "gzip_bytes"}`.
    The outputs are also added to `confusion` (a `tasks.class_measures.ConfusionMatrix`) when
    given.
    """
    runner = TfliteModel(path, num_threads)
    outputs, labels, seconds, kept = _run_examples(runner, dataset, max_examples,
                                                   keep=latency_examples)
    if confusion is not None:
        confusion.add(outputs, labels)
    latency = float(np.mean(seconds))
    for _ in range(latency_rounds - 1):
        latency = min(latency, float(np.mean([runner.run(example)[1] for example in kept])))
    content = path if isinstance(path, (bytes, bytearray)) else read_bytes(path)
    task = task or ClassificationTask({})
    return {**task.evaluate(outputs, labels), "latency_ms": 1000.0 * latency, "latency_batch_size": 1, "num_threads": num_threads,
            "num_examples": int(len(labels)),
            "tflite_bytes": runner.size,
            "gzip_bytes": sizes.gzip_bytes(bytes(content))}


def _batch_of(inputs: list, batch_size: int):
    """`batch_size` examples from `inputs` (batch-1 examples), repeated when there are fewer."""
    chosen = list(itertools.islice(itertools.cycle(inputs), batch_size))
    return tf.nest.map_structure(lambda *arrays: np.concatenate(arrays), *chosen)


def _batched_runner(model, num_threads: int, batch) -> TfliteModel | None:
    """The model resized to the batch and warmed up on it, or None when it cannot run it."""
    size = len(tf.nest.flatten(batch)[0])
    try:
        runner = TfliteModel(model, num_threads, batch_size=size)
        output, _ = runner.run(batch)
    except (TftrainError, ValueError, RuntimeError) as e:
        logging.warning("the TFLite model does not run at batch %d (%s): no throughput", size, e)
        return None
    if len(output) != size:  # a model that ignores the resize (e.g. a reshape to a fixed batch)
        logging.warning("the TFLite model gives %d outputs for a batch of %d: no throughput",
                        len(output), size)
        return None
    return runner


def compare_latencies(models: dict, dataset, *, rounds: int = 5, examples: int = 256,
                      num_threads: int = 1,
                      batch_size: int = THROUGHPUT_BATCH_SIZE) -> dict[str, dict]:
    """Latency at batch 1 and time per example at `batch_size` of each model, fairly.

    `models`: name -> bytes or path. All models run the same first `examples` examples, in
    interleaved rounds (model A, B, ..., then again), so a burst of load from other processes
    hits them alike; each keeps its fastest round. A round runs every example as one request at
    batch 1, then as many calls at `batch_size` as it takes to cover the examples (the examples
    repeated to fill a batch when there are fewer).
    Returns name -> `{"latency_ms", "latency_batch_size": 1, "throughput_ms_per_example",
    "throughput_batch_size", "num_threads", "cpu"}`; the throughput is None for a model that
    cannot run at `batch_size`.
    """
    inputs = [example for example, _ in _examples(dataset, examples)]
    if not inputs:
        raise TftrainError("the evaluation dataset is empty")
    batch = _batch_of(inputs, batch_size)
    calls = -(-len(inputs) // batch_size)
    single = {name: TfliteModel(model, num_threads) for name, model in models.items()}
    batched = {name: _batched_runner(model, num_threads, batch) for name, model in models.items()}
    latency = {name: float("inf") for name in models}
    throughput = {name: float("inf") for name in models}
    for runner in single.values():
        runner.run(inputs[0])  # warm-up: the first invoke prepares kernels and delegates
    for _ in range(rounds):
        for name in models:
            latency[name] = min(latency[name],
                                float(np.mean([single[name].run(x)[1] for x in inputs])))
            if batched[name]:
                seconds = sum(batched[name].run(batch)[1] for _ in range(calls))
                throughput[name] = min(throughput[name], seconds / (calls * batch_size))
    cpu = cpu_name()
    return {name: {"latency_ms": 1000.0 * latency[name], "latency_batch_size": 1,
                   "throughput_ms_per_example": (1000.0 * throughput[name] if batched[name]
                                                 else None),
                   "throughput_batch_size": batch_size, "num_threads": num_threads, "cpu": cpu}
            for name in models}
