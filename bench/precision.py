"""Mixed precision's speed-up per built-in model, beside what this CPU's matmul units offer.

    .venv/bin/python bench/precision.py [--steps=8] [--models=mlp,cnn,resnet,transformer,transformer_lm]

For each model, at a size where matrix multiplications are most of a step, the median training
step (Keras `fit`, Adam, on one repeated batch) under `float32`, `mixed_bfloat16` and
`mixed_float16`, without and with XLA (`jit_compile`), each setting in its own process. Beside
them, in the same run: a 1024² matmul's FLOP/s in each precision through oneDNN and through XLA
(the ratio the hardware offers), and for `transformer_lm` the same steps with tf_keras's own
einsum attention (what tftrain used before `MatmulAttention`) and where a bfloat16 step's time
goes, by op type (TensorFlow's profiler). Prints the CPU and the tables.
"""
from __future__ import annotations

import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.child import run_child  # noqa: E402
from bench.table import markdown_table, ms  # noqa: E402
from tftrain.host import cpu_name  # noqa: E402

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
# name: (model.params, per-example input shape, outputs, dataset info, batch size)
MODELS = {
    "mlp": ({"hidden_units": [2048, 2048, 2048, 2048], "dropout": 0.0}, [784], 10, {}, 256),
    "cnn": ({"filters": [64, 128], "dense_units": 256}, [32, 32, 3], 10, {}, 64),
    "resnet": ({"depth": 3, "width": 32, "stages": 3}, [32, 32, 3], 10, {}, 64),
    "transformer": ({"width": 256, "num_layers": 4, "num_heads": 4, "mlp_width": 1024,
                     "dropout": 0.0}, [128], 2, {"vocab_size": 8000, "sequence_length": 128}, 16),
    "transformer_lm": ({"width": 256, "num_layers": 4, "num_heads": 4, "mlp_width": 1024},
                       [128], 256, {"vocab_size": 256, "sequence_length": 128}, 16),
}

MATMUL = r'''
import json, sys, time
import tftrain  # noqa: F401  (tf-keras before TensorFlow)
import tensorflow as tf
from tftrain.runtime import peak_flops

args = json.loads(sys.argv[1])
result = {"onednn": peak_flops.measure_matmul(args["dtype"], seconds=1.0)}
size = peak_flops.MATMUL_SIZE
a = tf.cast(tf.random.stateless_normal([size, size], seed=[1, 2]), args["dtype"])
xla = tf.function(lambda x: tf.reduce_sum(tf.cast(x @ x, tf.float32)), jit_compile=True)
xla(a).numpy()
best, deadline = 0.0, time.perf_counter() + 1.0
while time.perf_counter() < deadline:
    started = time.perf_counter()
    xla(a).numpy()
    best = max(best, 2 * size**3 / (time.perf_counter() - started))
result["xla"] = best
print("RESULT " + json.dumps(result))
'''

STEP = r'''
import collections, json, statistics, sys, time
import tftrain  # noqa: F401  (tf-keras before TensorFlow)
import tensorflow as tf, tf_keras as keras
from tftrain import models
from tftrain.models import flops, outputs, transformer

args = json.loads(sys.argv[1])
keras.mixed_precision.set_global_policy(args["precision"])
if args["einsum_attention"]:  # tftrain's attention before MatmulAttention: tf_keras's own
    transformer.attention_class = lambda: keras.layers.MultiHeadAttention
keras.utils.set_random_seed(1)
model = models.build_model(args["model"], args["params"], tuple(args["shape"]),
                           outputs.OutputSpec(args["outputs"]), dataset_info=args["info"])
model.compile(optimizer=keras.optimizers.Adam(1e-4), jit_compile=args["jit"],
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
shape = [args["batch"], *args["shape"]]
if args["info"]:
    x = tf.random.stateless_uniform(shape, [1, 2], 1, args["info"]["vocab_size"], tf.int32)
    y = x if args["model"] == "transformer_lm" else x[:, 0] % args["outputs"]
else:
    x = tf.random.stateless_normal(shape, [1, 2])
    y = tf.range(args["batch"]) % args["outputs"]
batches = tf.data.Dataset.from_tensors((x, y)).repeat()

class Times(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        self.started = time.perf_counter()
    def on_train_batch_end(self, batch, logs=None):
        times.append(time.perf_counter() - self.started)

times = []
model.fit(batches, steps_per_epoch=2, epochs=1, verbose=0)  # traced, compiled, warmed
model.fit(batches, steps_per_epoch=args["steps"], epochs=1, verbose=0, callbacks=[Times()])
result = {"seconds": statistics.median(times), "parameters": model.count_params(),
          "flops": flops.training_flops_per_example(model) * args["batch"]}
if args["profile"]:
    from bench import trace
    space = trace.traced(lambda: model.fit(batches, steps_per_epoch=2, epochs=1, verbose=0))
    by_type = collections.Counter()
    for plane in space.planes:
        for line in plane.lines:
            if line.name.startswith("tf_Compute"):
                for event in line.events:
                    name = plane.event_metadata[event.metadata_id].name
                    if ":" in name and "::" not in name:  # `op name:op type`
                        by_type[name.rsplit(":", 1)[1]] += event.duration_ps / 1e12 / 2
    result["op_seconds"] = dict(by_type.most_common(6))
    result["op_total"] = sum(by_type.values())
print("RESULT " + json.dumps(result))
'''


def matmul_rates() -> dict:
    """{dtype: {"onednn": FLOP/s, "xla": FLOP/s}} of a 1024² matmul."""
    return {dtype: run_child(MATMUL, {"dtype": dtype})
            for dtype in ("float32", "bfloat16", "float16")}


def step(name: str, precision: str, jit: bool, steps: int, *, einsum: bool = False,
         profile: bool = False) -> dict:
    params, shape, outputs, info, batch = MODELS[name]
    return run_child(STEP, {"model": name, "params": params, "shape": shape, "outputs": outputs,
                            "info": info, "batch": batch, "precision": precision, "jit": jit,
                            "steps": steps, "einsum_attention": einsum, "profile": profile})


def peak_table(rates: dict) -> str:
    rows = []
    for dtype, rate in rates.items():
        rows.append([dtype, f"{rate['onednn'] / 1e9:.1f}",
                     f"{rate['onednn'] / rates['float32']['onednn']:.2f}x",
                     f"{rate['xla'] / 1e9:.1f}", f"{rate['xla'] / rates['float32']['xla']:.2f}x"])
    return markdown_table(["1024² matmul", "oneDNN GFLOP/s", "vs float32", "XLA GFLOP/s",
                           "vs float32"], rows, ["l", "r", "r", "r", "r"])


def model_table(results: dict, rates: dict) -> str:
    offered = {"mixed_bfloat16": rates["bfloat16"]["onednn"] / rates["float32"]["onednn"],
               "mixed_float16": rates["float16"]["onednn"] / rates["float32"]["onednn"]}
    rows = []
    for (name, jit), by_precision in results.items():
        base = by_precision["float32"]["seconds"]
        row = [name + (" (XLA)" if jit else ""), f"{by_precision['float32']['parameters']:,}",
               ms(1000 * base), f"{by_precision['float32']['flops'] / base / 1e9:.1f}"]
        for precision in PRECISIONS[1:]:
            seconds = by_precision[precision]["seconds"]
            speedup = base / seconds
            row += [ms(1000 * seconds), f"{speedup:.2f}x ({speedup / offered[precision]:.2f})"]
        rows.append(row)
    return markdown_table(
        ["model", "parameters", "float32 ms/step", "float32 GFLOP/s", "bf16 ms/step",
         "bf16 speed-up (of offered)", "fp16 ms/step", "fp16 speed-up (of offered)"], rows,
        ["l", "r", "r", "r", "r", "r", "r", "r"])


def attention_table(steps: int) -> str:
    rows = []
    for precision in ("float32", "mixed_bfloat16"):
        einsum = step("transformer_lm", precision, False, steps, einsum=True)["seconds"]
        matmul = step("transformer_lm", precision, False, steps)["seconds"]
        rows.append([precision, ms(1000 * einsum), ms(1000 * matmul), f"{einsum / matmul:.2f}x"])
    return markdown_table(["transformer_lm", "einsum attention ms/step",
                           "MatmulAttention ms/step", "speed-up"], rows, ["l", "r", "r", "r"])


def where_time_goes(steps: int) -> str:
    rows = []
    for precision in ("float32", "mixed_bfloat16"):
        profiled = step("transformer_lm", precision, False, steps, profile=True)
        total = profiled["op_total"]
        rows.append([precision, ms(1000 * total)] + [
            f"{op} {100 * seconds / total:.0f}%" for op, seconds in
            list(profiled["op_seconds"].items())[:5]])
    return markdown_table(["transformer_lm step", "op time ms", "1st", "2nd", "3rd", "4th",
                           "5th"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--models", default=",".join(MODELS))
    options = parser.parse_args()
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores", flush=True)
    rates = matmul_rates()
    print(peak_table(rates) + "\n", flush=True)
    results = {}
    for name in options.models.split(","):
        for jit in (False, True):
            results[(name, jit)] = {p: step(name, p, jit, options.steps) for p in PRECISIONS}
            print(f"  {name} {'XLA' if jit else ''} done", file=sys.stderr, flush=True)
    print("Median training step; speed-up over float32, and in brackets that speed-up over "
          "the one the matmul units offer (oneDNN's ratio above):\n")
    print(model_table(results, rates) + "\n")
    print(attention_table(options.steps) + "\n")
    print("Where a step's op time goes (TensorFlow profiler, by op type):\n")
    print(where_time_goes(options.steps))


if __name__ == "__main__":
    main()
