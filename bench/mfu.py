"""tftrain train against a hand-written training loop: throughput and model FLOPs utilization.

    .venv/bin/python bench/mfu.py [--width=512] [--num_layers=8] [--batch_size=16] [--steps=40]
                                  [--rounds=2]

The embedded text (Python's documentation) is converted once into 128-token windows; then the
same `transformer_lm` (tftrain's builder, Adam, float32, ~26M parameters at the defaults)
trains on the same batches three times, each in its own process:

- `tftrain train --config=text_lm` with the model and batch replaced by override, for
  `--steps` steps in two epochs (summary.json's steady-state examples/s is the second's);
- a plain loop: `tftrain.data.load` for the batches, a `tf.function` step with a
  `GradientTape` and `apply_gradients`, timed over the same number of steps after a warm-up;
- the same loop with tftrain's Adam, which measures each update's global gradient norm and
  clips it to 1.0 (`train.clip_global_norm`, text_lm's setting): what the norm costs a step.

The three alternate for `--rounds` rounds (which goes first rotates) and each reports its
best round: a shared machine's neighbours slow one process now and then (a whole run at half
speed has been seen), and the best round is the one least disturbed; the median of the rounds'
own ratios is printed beside it. MFU for each is the model's FLOPs per example (counted from
its layers) x examples/s over this host's matmul peak, timed again at the start (the cache
keeps the most this host has shown, see `runtime.peak_flops`). Prints the CPU, every round and
the table.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.big_data import TFTRAIN  # noqa: E402
from bench.child import run_child  # noqa: E402
from bench.table import markdown_table  # noqa: E402
from tftrain.host import cpu_name  # noqa: E402

PEAK = r'''
import json
import tftrain  # noqa: F401
from tftrain.runtime import peak_flops

peak = peak_flops.raise_cpu_peak("float32", peak_flops.measure_matmul("float32"))
print("RESULT " + json.dumps({"peak_flops_per_second": peak}))
'''

LOOP = r'''
import json, sys, time
import tftrain  # noqa: F401  (tf-keras before TensorFlow)
import tensorflow as tf, tf_keras as keras
from tftrain import data, models
from tftrain.models import flops
from tftrain.runtime import peak_flops

args = json.loads(sys.argv[1])
manifest = json.load(open(args["data"] + "/dataset.json"))
info = manifest["info"]
keras.utils.set_random_seed(42)
model = models.build_model("transformer_lm", args["params"], (info["sequence_length"],),
                           info["vocab_size"], info)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
if args["clip"] is None:  # tf-keras's Adam
    optimizer = keras.optimizers.Adam(args["learning_rate"])
else:  # tftrain's: the update's global norm measured (and clipped, when clip > 0)
    from tftrain.training import optimizers
    optimizer = optimizers.Adam(args["learning_rate"], clip_global_norm=args["clip"])

@tf.function
def step(x, y):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                  model.trainable_variables))
    return loss

batches = iter(data.load(args["data"], "train", args["batch_size"], training=True, repeat=True))
warmup = args["steps"] // 2
for _ in range(warmup):
    loss = step(*next(batches))
loss.numpy()
started = time.perf_counter()
for _ in range(args["steps"] - warmup):
    loss = step(*next(batches))
loss.numpy()
seconds = time.perf_counter() - started
rate = (args["steps"] - warmup) * args["batch_size"] / seconds
per_example = flops.training_flops_per_example(model)
peak = peak_flops.raise_cpu_peak("float32", per_example * rate)  # as `tftrain train` does
print("RESULT " + json.dumps({"examples_per_second": rate, "parameters": model.count_params(),
                              "mfu": per_example * rate / peak, "peak_flops_per_second": peak,
                              "model_flops_per_example": per_example}))
'''


def convert(directory: str) -> str:
    path = os.path.join(directory, "text128")
    subprocess.run([TFTRAIN, "convert", "--pipeline=text",
                    f"--output={path}", "--pipeline_options=sequence_length=128"],
                   check=True, capture_output=True, cwd=REPO,
                   env=dict(os.environ, PYTHONPATH=REPO))
    return path


def tftrain_run(directory: str, data_dir: str, args: dict, name: str = "run") -> dict:
    params = json.dumps(args["params"]).replace('"', "")
    run = os.path.join(directory, name)  # a new run directory each time: no resume
    overrides = (f"data.dir={data_dir},model.params={params},data.batch_size={args['batch_size']},"
                 f"train.steps={args['steps']},train.steps_per_epoch={args['steps'] // 2},"
                 f"train.learning_rate={args['learning_rate']},train.lr_schedule=constant,"
                 "train.warmup_steps=0,train.validation_steps=1,train.test_steps=1")
    subprocess.run([TFTRAIN, "train", "--config=text_lm",
                    f"--model_dir={run}", f"--params_override={overrides}"],
                   check=True, capture_output=True, cwd=REPO,
                   env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2"))
    with open(os.path.join(run, "summary.json"), encoding="utf-8") as f:
        return json.load(f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("width", 512), ("num_layers", 8), ("batch_size", 16), ("steps", 40),
                          ("rounds", 2)):
        parser.add_argument(f"--{name}", type=int, default=default)
    options = parser.parse_args()
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores", flush=True)
    args = {"params": {"width": options.width, "num_layers": options.num_layers, "num_heads": 8,
                       "mlp_width": 4 * options.width},
            "batch_size": options.batch_size, "steps": options.steps, "learning_rate": 3e-4}
    with tempfile.TemporaryDirectory() as directory:
        args["data"] = convert(directory)
        print(f"matmul peak now: {run_child(PEAK, {})['peak_flops_per_second'] / 1e9:.1f} "
              "GFLOP/s", flush=True)
        summaries, loops, clipped, ratios = [], [], [], []
        plain, measured = {**args, "clip": None}, {**args, "clip": 1.0}
        for round_ in range(options.rounds):
            runs = [lambda: summaries.append(tftrain_run(directory, args["data"], args,
                                                         f"run{round_}")),
                    lambda: loops.append(run_child(LOOP, plain)),
                    lambda: clipped.append(run_child(LOOP, measured))]
            for run in runs[round_ % 3:] + runs[:round_ % 3]:  # who goes first rotates
                run()
            ratios.append(summaries[-1]["examples_per_second"] / loops[-1]["examples_per_second"])
            print(f"round {round_ + 1}: tftrain {summaries[-1]['examples_per_second']:.2f}, "
                  f"loop {loops[-1]['examples_per_second']:.2f}, loop measuring and clipping "
                  f"the norm {clipped[-1]['examples_per_second']:.2f} examples/s "
                  f"(tftrain/loop {ratios[-1]:.3f})", flush=True)
    summary = max(summaries, key=lambda s: s["examples_per_second"])
    loop = max(loops, key=lambda s: s["examples_per_second"])
    norm = max(clipped, key=lambda s: s["examples_per_second"])
    # One peak for all: the highest any run saw (a run that computed faster than the cached
    # peak raised it, see runtime.peak_flops).
    peak = max(x["peak_flops_per_second"] for x in summaries + loops + clipped)
    rows = [[name, f"{x['parameters']:,}", f"{x['examples_per_second']:.2f}",
             f"{100 * x['model_flops_per_example'] * x['examples_per_second'] / peak:.1f}%",
             f"{x['examples_per_second'] / summary['examples_per_second']:.2f}x"]
            for name, x in (("tftrain train (clip_global_norm=1.0)", summary),
                            ("tf.function + GradientTape loop", loop),
                            ("the loop, its global norm measured and clipped", norm))]
    print(f"transformer_lm width {options.width}, {options.num_layers} blocks, 128 tokens, batch "
          f"{options.batch_size}, Adam, float32, {options.steps} steps (the second half timed), "
          f"best of {options.rounds} rounds; "
          f"{summary['model_flops_per_example'] / 1e9:.2f} GFLOP per example; peak "
          f"{peak / 1e9:.1f} GFLOP/s ({summary['peak_source']}); median of the rounds' "
          f"tftrain/loop ratios {statistics.median(ratios):.3f}; the norm's cost: loop "
          f"measuring it / loop {norm['examples_per_second'] / loop['examples_per_second']:.3f}"
          "\n")
    print(markdown_table(["run", "parameters", "examples/s", "MFU", "vs tftrain"], rows))


if __name__ == "__main__":
    main()
