"""Exact resume: what a restart costs by dataset position, and what `train.deterministic` costs.

    python bench/resume.py [--examples=20000] [--batch_size=64] [--steps_per_epoch=10]

On the 32x32x3 PNG TFRecord shards of bench/synthetic.py (16 shards; created once):
  position   the training reader of a resumed run (`tftrain.data.load(..., start_batch=N)`,
             what `tftrain train` builds after a restart) from its construction to its first
             batch, at several positions in the stream: the start, inside the first pass, and
             inside a later pass. The records of the current pass before the position are read
             and skipped unparsed; earlier passes are not read. Every first batch waits for the
             shuffle buffer (data.shuffle_buffer, 10,000 records by default) to fill, at the
             start too. Records skipped per second = (skipped records) / (time - time at the
             start). The rest of a restart (TensorFlow import, model build, checkpoint restore)
             does not depend on the position.
  steps      `tftrain train` (the registry's cnn, 16 and 32 filters, dropout, one device) with
             the default settings and with train.deterministic=true: mean step time after the
             first epoch (tracing excluded), and their ratio.
Each position is timed --rounds times and the fastest counts (the machine may be shared).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tftrain  # noqa: E402,F401  (tf-keras before TensorFlow)
import tensorflow as tf  # noqa: E402

from bench import synthetic  # noqa: E402
from bench import train as bench_train  # noqa: E402
from tftrain.data import load, manifest as manifest_lib  # noqa: E402


def first_batch_seconds(data_dir: str, batch_size: int, start_batch: int, rounds: int) -> float:
    """Fastest time from building the resumed training reader to holding its first batch."""
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        dataset = load(data_dir, "train", batch_size, training=True, repeat=True, seed=0,
                       start_batch=start_batch)
        next(iter(dataset))
        best = min(best, time.perf_counter() - started)
    return best


def step_seconds(data_dir: str, args, deterministic: bool) -> float:
    """Steady-state seconds per step of `tftrain train` (its summary's figure)."""
    return bench_train.run_step_seconds(data_dir, (
        f"data.batch_size={args.batch_size},train.epochs=3,"
        f"train.steps_per_epoch={args.steps_per_epoch},runtime.jit_compile=false,"
        f"train.deterministic={str(deterministic).lower()},model.name=cnn,"
        "model.params={filters: [16, 32], dense_units: 64, dropout: 0.25}"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=20_000)
    parser.add_argument("--data", default="")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--steps_per_epoch", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    data_dir = args.data or f"/tmp/tftrain-bench/synthetic{args.examples // 1000}k"
    synthetic.make_dataset(data_dir, args.examples)
    per_pass = manifest_lib.read(data_dir)["splits"]["train"]["num_examples"]
    tf.random.set_seed(0)

    print(f"Restart to the first batch, by position ({per_pass:,} training records per "
          f"pass, batch {args.batch_size}, {os.cpu_count()} CPUs, best of {args.rounds}):\n")
    print("| position | records skipped | first batch (s) | records skipped / s |")
    print("|---|---:|---:|---:|")
    batches_per_pass = per_pass / args.batch_size
    first_batch_seconds(data_dir, args.batch_size, int(batches_per_pass), 1)  # file cache warm
    start = first_batch_seconds(data_dir, args.batch_size, 0, args.rounds)
    print(f"| start | 0 | {start:.3f} | |")
    for label, fraction in (("25% of pass 1", 0.25), ("50% of pass 1", 0.5),
                            ("95% of pass 1", 0.95), ("50% of pass 4", 3.5)):
        batch = int(fraction * batches_per_pass)
        skipped = batch * args.batch_size % per_pass
        seconds = first_batch_seconds(data_dir, args.batch_size, batch, args.rounds)
        rate = f"{skipped / (seconds - start):,.0f}" if seconds > start else "(within noise)"
        print(f"| {label} (batch {batch}) | {skipped:,} | {seconds:.3f} | {rate} |")

    default = step_seconds(data_dir, args, deterministic=False)
    deterministic = step_seconds(data_dir, args, deterministic=True)
    print(f"\nStep time of `tftrain train`, cnn (16, 32 filters) with dropout, batch "
          f"{args.batch_size}, one device, {args.steps_per_epoch} steps x 3 epochs (first "
          "excluded):\n")
    print("| train.deterministic | ms / step | ratio |")
    print("|---|---:|---:|")
    print(f"| false (default) | {default * 1e3:.1f} | 1.00 |")
    print(f"| true | {deterministic * 1e3:.1f} | {deterministic / default:.2f} |")


if __name__ == "__main__":
    main()
