"""Recomputation: a training step's peak memory and time with `model.params.remat` off and on.

    .venv/bin/python bench/remat.py [--width=512] [--num_layers=8] [--sequence_length=512]
                                    [--batch_size=8] [--steps=3]

The same `transformer_lm` (tftrain's builder, Adam, float32) trains `--steps` steps on random
token ids after one warm-up step, once per setting, each in its own process. Peak memory is the
process's maximum resident set (ru_maxrss); the model, its gradients and Adam's slots are the
same in both, so the difference is what the backward pass keeps: every block's activations, or
each block's input and one block's activations at a time. Prints the CPU and a table with the
ratios on/off.
"""
from __future__ import annotations

import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.child import run_child  # noqa: E402
from bench.table import markdown_table  # noqa: E402
from tftrain.host import cpu_name  # noqa: E402

CHILD = r'''
import json, resource, sys, time
import tftrain  # noqa: F401  (tf-keras before TensorFlow)
import numpy as np, tensorflow as tf, tf_keras as keras
from tftrain import models

args = json.loads(sys.argv[1])
length, vocab = args["sequence_length"], 1024
params = {k: args[k] for k in ("width", "num_layers", "num_heads", "mlp_width", "remat")}
model = models.build_model("transformer_lm", params, (length,), vocab,
                           {"vocab_size": vocab, "sequence_length": length})
model.compile(keras.optimizers.Adam(1e-4),
              keras.losses.SparseCategoricalCrossentropy(from_logits=True))
ids = tf.constant(np.random.default_rng(0).integers(1, vocab, (args["batch_size"], length)),
                  tf.int32)
model.train_on_batch(ids, ids)
started = time.perf_counter()
for _ in range(args["steps"]):
    loss = model.train_on_batch(ids, ids)
seconds = (time.perf_counter() - started) / args["steps"]
print("RESULT " + json.dumps({"peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                              * 1024, "seconds_per_step": seconds, "loss": float(loss),
                              "parameters": model.count_params()}))
'''


def run(args: dict) -> dict:
    """One setting in a fresh process."""
    return run_child(CHILD, args, CUDA_VISIBLE_DEVICES="")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("width", 512), ("num_layers", 8), ("num_heads", 8),
                          ("mlp_width", 2048), ("sequence_length", 512), ("batch_size", 8),
                          ("steps", 3)):
        parser.add_argument(f"--{name}", type=int, default=default)
    args = vars(parser.parse_args())
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores", flush=True)
    results = {remat: run({**args, "remat": remat}) for remat in (False, True)}
    off, on = results[False], results[True]
    gib = 1 << 30
    rows = [[f"remat={str(remat).lower()}", f"{r['parameters']:,}",
             f"{r['peak_bytes'] / gib:.2f}", f"{r['seconds_per_step']:.2f}", f"{r['loss']:.4f}"]
            for remat, r in results.items()]
    rows.append(["on/off", "", f"{on['peak_bytes'] / off['peak_bytes']:.2f}x",
                 f"{on['seconds_per_step'] / off['seconds_per_step']:.2f}x", ""])
    print(f"transformer_lm width {args['width']}, {args['num_layers']} blocks, sequence "
          f"{args['sequence_length']}, batch {args['batch_size']}, Adam, float32")
    print(markdown_table(["setting", "parameters", "peak GiB", "s/step", "loss"], rows))


if __name__ == "__main__":
    main()
