"""Input pipeline throughput: `tftrain.data.load` against a naive pipeline and a raw read.

    python bench/input.py [--examples=50000] [--data=/tmp/tftrain-bench/synthetic56k]

On the same 32x32x3 PNG TFRecord shards (created once, see bench/synthetic.py) it measures
examples per second of:
  raw          TFRecordDataset over the shards, batched, no parsing (the upper limit)
  naive        TFRecordDataset -> map(parse_single_example + decode one image) -> batch
  per-example  the naive pipeline with a parallel map and prefetch (a common hand-tuned version)
  tftrain      tftrain.data.load(training=True): interleave, shuffle, batch, parse_example,
               decode the batch, prefetch
  cache        the same with data.cache=decoded, timed after its first pass (from memory)
Each pipeline reads the whole split once to warm up (file cache, autotuning), then is timed
over --passes full passes; this is repeated --rounds times, the pipelines taking turns, and each
pipeline's fastest round counts (the machine may be shared). The CPU column is the process's
CPU time (all threads) per example in that round.
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
from bench.table import markdown_table  # noqa: E402
from tftrain.data import load, manifest as manifest_lib  # noqa: E402
from tftrain.data.reader import parse_spec  # noqa: E402

BATCH = 256
# The rows of the table, as README shows them.
RAW = "raw `TFRecordDataset` read (the limit)"
NAIVE = "naive (`parse_single_example` map → batch)"
PARALLEL = "per-example, parallel map + prefetch"
TFTRAIN = "`tftrain.data.load`"
CACHED = "`tftrain.data.load`, `data.cache=decoded`, after its first pass"


def decode_one_example(serialized, spec):
    """One record as people usually decode it: parse, decode, resize, scale (also bench/train.py)."""
    features = tf.io.parse_single_example(serialized, spec)
    image = tf.io.decode_image(features["image/encoded"], channels=3, expand_animations=False)
    image = tf.image.resize_with_pad(tf.cast(image, tf.float32), synthetic.SIZE, synthetic.SIZE)
    return image / 255.0, tf.cast(features["image/class/label"], tf.int32)


def pipelines(data_dir: str, split: str) -> dict:
    """name -> a function returning a fresh dataset of one pass."""
    manifest = manifest_lib.read(data_dir)
    files = manifest_lib.shard_files(data_dir, manifest, split)
    spec = parse_spec(manifest["features"])
    # One dataset for every pass, as across the epochs of a fit: the warm-up pass fills its cache.
    cached = load(data_dir, split, BATCH, training=True, seed=0, cache="decoded")
    return {
        RAW: lambda: tf.data.TFRecordDataset(files).batch(BATCH),
        NAIVE: lambda: tf.data.TFRecordDataset(files).map(
            lambda s: decode_one_example(s, spec)).batch(BATCH),
        PARALLEL: lambda: tf.data.TFRecordDataset(files).map(
            lambda s: decode_one_example(s, spec), num_parallel_calls=tf.data.AUTOTUNE).batch(BATCH)
        .prefetch(tf.data.AUTOTUNE),
        TFTRAIN: lambda: load(data_dir, split, BATCH, training=True, seed=0),
        CACHED: lambda: cached,
    }


def examples_per_second(make_dataset, passes: int) -> tuple[float, float]:
    """(examples/s, CPU seconds per example) over `passes` full passes, after one warm-up pass."""
    def one_pass():
        count = 0
        for batch in make_dataset():
            count += int(tf.shape(tf.nest.flatten(batch)[0])[0])
        return count

    one_pass()
    started, cpu_started = time.perf_counter(), time.process_time()
    total = sum(one_pass() for _ in range(passes))
    return total / (time.perf_counter() - started), (time.process_time() - cpu_started) / total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=56_000)  # train split >= 50,000
    parser.add_argument("--data", default="/tmp/tftrain-bench/synthetic56k")
    parser.add_argument("--passes", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    manifest = synthetic.make_dataset(args.data, args.examples)
    split = "train"
    count = manifest["splits"][split]["num_examples"]
    print(f"{count} records of 32x32x3 PNG in {len(manifest['splits'][split]['shards'])} shards, "
          f"batch {BATCH}, {os.cpu_count()} CPU cores")
    results: dict[str, tuple[float, float]] = {}
    per_round: dict[str, list[float]] = {}
    for round_index in range(args.rounds):
        for name, make in pipelines(args.data, split).items():
            rate, cpu = examples_per_second(make, args.passes)
            print(f"  round {round_index + 1}: {name} {rate:,.0f} examples/s", flush=True)
            per_round.setdefault(name, []).append(rate)
            if name not in results or rate > results[name][0]:
                results[name] = (rate, cpu)
    naive, raw = results[NAIVE][0], results[RAW][0]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\nbest of {args.rounds} rounds; load average {load}\n")
    print(markdown_table(
        ["pipeline", "examples/s", "vs naive", "vs raw", "CPU µs/example"],
        [[name, f"{rate:,.0f}", f"{rate / naive:.2f}x", f"{rate / raw:.2f}x", f"{cpu * 1e6:.1f}"]
         for name, (rate, cpu) in results.items()]))
    ratios = ", ".join(f"{ours / theirs:.2f}x" for ours, theirs in zip(per_round[TFTRAIN],
                                                                      per_round[NAIVE]))
    print(f"\nper round, {TFTRAIN} / naive: {ratios}")


if __name__ == "__main__":
    main()
