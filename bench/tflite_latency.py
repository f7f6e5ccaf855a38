"""Why int8 is (not) faster here: LiteRT times of float, dynamic, int8, float16 and QAT models.

    python bench/tflite_latency.py [--rounds=5] [--requests=256] [--calls=2]

Prints the table of docs/optimize.md ("Why int8 is not faster on the digits demo"): ms per
example of each model and conversion, in the LiteRT interpreter (`ai-edge-litert`), at batch 1
and batch 256, with 1 and 2 threads, XNNPACK on (the default) and, for float and int8, off (the
interpreter's built-in kernels: `OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES`).
Models, with their weights as initialized (dense kernels: the times do not depend on the values):
  empty      one reshape of an 8x8x1 input: what a request costs with (almost) nothing to compute;
             `invoke` alone is timed too
  digits cnn the registry's `cnn` of configs/digits.yaml on 8x8x1 (what `make demo` trains)
  bench cnn  bench/optimize.py's CNN on 32x32x3
Conversions are tftrain's (`tftrain.optimize.quantize.convert`; int8 calibrated on 100 inputs,
QAT from `quantization_aware_model` without fine-tuning). Inputs are uniform in [0, 1).
A request = `set_tensor` + `invoke` + `get_tensor` from Python. Each time is the fastest of
--rounds rounds in which every model of a thread count runs in turn (so a burst of load from
other processes hits them alike): --requests requests at batch 1 (their mean) and --calls calls
at batch 256 (per example).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tftrain  # noqa: E402,F401  (tf-keras before TensorFlow)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402
from ai_edge_litert.interpreter import Interpreter, OpResolverType  # noqa: E402

from bench import optimize as bench_optimize  # noqa: E402
from bench.table import markdown_table  # noqa: E402
from tftrain import config as config_lib, models  # noqa: E402
from tftrain.optimize import quantize, tflite_eval  # noqa: E402

BATCH = 256
SETTINGS = [(1, 1), (BATCH, 1), (1, 2), (BATCH, 2)]  # (batch, threads), the table's columns
# (row label, conversion mode, XNNPACK on)
CONVERSIONS = [("float", "float", True), ("float, XNNPACK off", "float", False),
               ("dynamic", "dynamic", True), ("int8", "int8", True),
               ("int8, XNNPACK off", "int8", False), ("float16", "float16", True),
               ("qat (int8)", "qat", True)]


def multiply_adds(model: keras.Model) -> int:
    """Multiply-adds of one example through the model's Conv2D and Dense layers."""
    total = 0
    for layer in model.layers:
        if isinstance(layer, keras.layers.Conv2D):
            kh, kw, cin, cout = layer.kernel.shape
            total += int(np.prod(layer.output_shape[1:3])) * kh * kw * cin * cout
        elif isinstance(layer, keras.layers.Dense):
            total += int(np.prod(layer.kernel.shape))
    return total


def digits_cnn() -> keras.Model:
    """The model of configs/digits.yaml."""
    params = config_lib.build_config("digits").model.params
    return models.build_model("cnn", dict(params), (8, 8, 1), 10)


def empty_model() -> keras.Model:
    """One reshape of an 8x8x1 input: a request with (almost) nothing to compute."""
    inputs = keras.Input((8, 8, 1), name="image")
    return keras.Model(inputs, keras.layers.Reshape((64,))(inputs), name="empty")


class Request:
    """One interpreter at a batch size and thread count; `run()` times one request."""

    def __init__(self, content: bytes, batch: int, threads: int, xnnpack: bool):
        resolver = (OpResolverType.AUTO if xnnpack
                    else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
        self.interpreter = Interpreter(model_content=content, num_threads=threads,
                                       experimental_op_resolver_type=resolver)
        detail = self.interpreter.get_input_details()[0]
        self.interpreter.resize_tensor_input(detail["index"], [batch, *detail["shape"][1:]])
        self.interpreter.allocate_tensors()
        self.input = self.interpreter.get_input_details()[0]["index"]
        self.output = self.interpreter.get_output_details()[0]["index"]
        shape = [batch, *detail["shape"][1:]]
        self.value = np.random.default_rng(0).random(shape, dtype=np.float32)
        self.run()  # warm-up: the first invoke prepares the kernels and the delegate

    def run(self) -> float:
        """Seconds of one request: set the input, invoke, read the output."""
        started = time.perf_counter()
        self.interpreter.set_tensor(self.input, self.value)
        self.interpreter.invoke()
        self.interpreter.get_tensor(self.output)
        return time.perf_counter() - started

    def invoke_only(self) -> float:
        """Seconds of `invoke` alone (the input already set)."""
        started = time.perf_counter()
        self.interpreter.invoke()
        return time.perf_counter() - started


def per_example_ms(request: Request, batch: int, count: int, invoke_only=False) -> float:
    """Mean ms per example over `count` requests (calls) of `batch` examples."""
    timed = request.invoke_only if invoke_only else request.run
    return 1000.0 * sum(timed() for _ in range(count)) / (count * batch)


def converted(model: keras.Model, mode: str) -> bytes:
    """The model as a .tflite flatbuffer in `mode` (tftrain's conversions)."""
    if mode == "int8":
        inputs = np.random.default_rng(1).random((100, *model.input_shape[1:]), dtype=np.float32)
        data = tf.data.Dataset.from_tensor_slices((inputs, np.zeros(100, np.int32))).batch(32)
        return quantize.convert(model, "int8", representative_data=data)
    if mode == "qat":
        return quantize.convert(quantize.quantization_aware_model(model)[0], "qat")
    return quantize.convert(model, mode)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=256, help="batch-1 requests per round")
    parser.add_argument("--calls", type=int, default=2, help="batch-256 calls per round")
    args = parser.parse_args()
    keras.utils.set_random_seed(0)
    digits, bench = digits_cnn(), bench_optimize.make_model()
    # (model label, row label, .tflite, XNNPACK on)
    variants = [("empty (one reshape, 8×8×1)", "float", converted(empty_model(), "float"), True)]
    for label, model in ((f"digits cnn (8×8×1, ~{multiply_adds(digits) / 1e6:.1f}M "
                          "multiply-adds)", digits),
                         (f"bench cnn (32×32×3, ~{multiply_adds(bench) / 1e6:.0f}M "
                          "multiply-adds)", bench)):
        for name, mode, xnnpack in CONVERSIONS:
            variants.append((label, name, converted(model, mode), xnnpack))

    best = {}  # (variant index, setting) -> ms per example
    invoke = float("inf")  # the empty model's `invoke` alone, batch 1, 1 thread
    for threads in (1, 2):
        requests = {(i, batch): Request(content, batch, threads, xnnpack)
                    for i, (_, _, content, xnnpack) in enumerate(variants) for batch in (1, BATCH)}
        for _ in range(args.rounds):
            for (i, batch), request in requests.items():
                count = args.requests if batch == 1 else args.calls
                key = (i, (batch, threads))
                best[key] = min(best.get(key, float("inf")), per_example_ms(request, batch, count))
            if threads == 1:
                invoke = min(invoke, per_example_ms(requests[(0, 1)], 1, args.requests, True))

    def cell(value: float) -> str:
        return f"{value:.5f}" if value < 0.001 else f"{value:.4f}" if value < 0.1 else (
            f"{value:.3f}" if value < 10 else f"{value:.2f}")

    rows, previous = [], None
    for i, (label, name, _, _) in enumerate(variants):
        cells = [cell(best[(i, setting)]) for setting in SETTINGS]
        if i == 0:
            cells[0] += f" (`invoke` alone {cell(invoke)})"
        rows.append(["" if label == previous else label, name, *cells])
        previous = label
    print(f"\nLiteRT interpreter on {tflite_eval.cpu_name()}, {os.cpu_count()} cores, load "
          f"average {os.getloadavg()[0]:.1f}; ms per example, best of {args.rounds} rounds\n")
    print(markdown_table(["model", "mode", "batch 1, 1 thread", "batch 256, 1 thread",
                          "batch 1, 2 threads", "batch 256, 2 threads"], rows))


if __name__ == "__main__":
    main()
