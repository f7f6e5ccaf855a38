"""Input pipeline throughput: `tftrain.data.load` against a naive pipeline and a raw read.

    python bench/input.py [--examples=56000] [--data=/tmp/tftrain-bench] [--passes=1] [--rounds=3]
                          [--warm_up=0.25] [--sets=numpy,numpy_raw,raw,png]

Four datasets of the same 32x32x3 images (bench/synthetic.py, made once into --data; the train
split, ~90% of --examples, is read), side by side:
  numpy   the images as arrays through the `numpy` pipeline: `x` float32 [32, 32, 3], `y` int64
  numpy_raw  the same arrays with `x_encoding=raw`: `x` stored as its uint8 bytes
  raw     image records (standard image keys) with `image_encoding=raw`: uint8 pixels
  png     image records holding 32x32x3 PNGs
For each, examples per second of:
  raw          TFRecordDataset over the shards, batched, no parsing (the upper limit)
  naive        TFRecordDataset -> map(parse_single_example + decode one example) -> batch
  per-example  the naive pipeline with a parallel map and prefetch (a common hand-tuned version)
  tftrain      tftrain.data.load(training=True, repeat=True): interleave, shuffle, batch,
               parse_example, decode the batch, prefetch (what `tftrain train` reads)
  untuned      the same with data.autotune=false (tf.data's autotuning off)
  cache        the same with data.cache=decoded, timed after its first pass (from memory)
  unshuffled   the least work a reader of these records can do: the raw read (one file after
               the other, batched), then load's parse and decode of whole batches in a parallel
               map; no shuffle (so not a training order) and no interleave
and the stages of `tftrain.data.load` (`last_stage=read`, `parse`, `decode`): the CPU each
stage adds per example, the difference between the CPU of the pipeline cut after it and of the
pipeline cut before it.
Every pipeline is measured as `fit` reads its input: one iterator over the repeated pipeline.
Its first batch (building the pipeline, starting its threads, filling a shuffle buffer) is
timed apart ("first batch s"); then it reads a quarter of the split (--warm_up; the decoded
cache its whole first pass) to warm up (file cache, autotuning, thread pools), and then
--passes passes' worth of examples are timed. This is repeated --rounds times, the pipelines
taking turns, and each pipeline's fastest round counts (the machine may be shared: the load
average is printed). The CPU column is the process's CPU time (all threads) per example in
that round. Ratios are of the best rounds; the per-round tftrain/naive and tftrain/raw ratios
show how much they move.
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
from tftrain.data.reader import STAGES as ALL_STAGES, batch_decoder, parse_spec  # noqa: E402
from pipelines import load_pipeline  # noqa: E402

# read, parse, decode: these datasets are not augmented (the last, "augment", is the whole load)
STAGES = ALL_STAGES[:ALL_STAGES.index("decode") + 1]

BATCH = 256
SPLIT = "train"
# The rows of the table, as docs/benchmarks.md shows them.
RAW = "raw `TFRecordDataset` read (the limit)"
NAIVE = "naive (`parse_single_example` map → batch)"
PARALLEL = "per-example, parallel map + prefetch"
TFTRAIN = "`tftrain.data.load`"
UNTUNED = "`tftrain.data.load`, `data.autotune=false`"
CACHED = "`tftrain.data.load`, `data.cache=decoded`, after its first pass"
UNSHUFFLED = "unshuffled: the raw read, then `load`'s parse and decode in a parallel map (the least work)"
STAGE_ROW = "`tftrain.data.load`, up to {stage}"
# Issue #15's targets: dataset -> (the row tftrain.data.load is compared with, the ratio).
TARGETS = {"numpy": ((NAIVE, 5.0), (RAW, 0.8)), "numpy_raw": ((NAIVE, 5.0), (RAW, 0.8)),
           "raw": ((RAW, 0.5),), "png": ((NAIVE, 3.5),)}
SETS = {  # name -> what the table's title says
    "numpy": "32x32x3 uint8 arrays, `numpy` pipeline (float32 `x`)",
    "numpy_raw": "32x32x3 uint8 arrays, `numpy` pipeline, `x_encoding=raw` (uint8 `x`)",
    "raw": "32x32x3 image records, `image_encoding=raw`",
    "png": "32x32x3 image records, PNG",
}


def decode_one_example(serialized, spec):
    """One image record as people usually decode it: parse, decode, resize, scale (also
    bench/train.py)."""
    features = tf.io.parse_single_example(serialized, spec)
    image = tf.io.decode_image(features["image/encoded"], channels=3, expand_animations=False)
    image = tf.image.resize_with_pad(tf.cast(image, tf.float32), synthetic.SIZE, synthetic.SIZE)
    return image / 255.0, tf.cast(features["image/class/label"], tf.int32)




def decode_raw_image(serialized, spec):
    """One `image_encoding=raw` record: parse, decode_raw, reshape, scale."""
    features = tf.io.parse_single_example(serialized, spec)
    image = tf.reshape(tf.io.decode_raw(features["image/encoded"], tf.uint8),
                       [synthetic.SIZE, synthetic.SIZE, 3])
    return tf.cast(image, tf.float32) / 255.0, tf.cast(features["image/class/label"], tf.int32)


def decode_array(serialized, spec):
    """One `numpy` record: parse, cast the label."""
    features = tf.io.parse_single_example(serialized, spec)
    return features["x"], tf.cast(features["y"], tf.int32)


def decode_raw_array(serialized, spec):
    """One `numpy` record with `x_encoding=raw`: parse, decode_raw, reshape, cast."""
    features = tf.io.parse_single_example(serialized, spec)
    x = tf.reshape(tf.io.decode_raw(features["x"], tf.uint8), [synthetic.SIZE, synthetic.SIZE, 3])
    return tf.cast(x, tf.float32), tf.cast(features["y"], tf.int32)


DECODE_ONE = {"numpy": decode_array, "numpy_raw": decode_raw_array, "raw": decode_raw_image,
              "png": decode_one_example}


def make_sets(root: str, examples: int, names: list[str]) -> dict:
    """name -> data dir of the datasets, made once under `root`."""
    made = {}
    for name in names:
        path = os.path.join(root, f"{name}{examples // 1000}k" if name != "png"
                            else f"synthetic{examples // 1000}k")
        if name in ("numpy", "numpy_raw"):
            synthetic.make_numpy_dataset(path, examples,
                                         x_encoding="raw" if name == "numpy_raw" else "float32")
        else:
            synthetic.make_dataset(path, examples, image_encoding="keep" if name == "png" else "raw")
        made[name] = path
    return made


def pipelines(name: str, data_dir: str) -> dict:
    """row -> a function returning a fresh repeated dataset (read by one iterator, as `fit` does)."""
    manifest = manifest_lib.read(data_dir)
    files = manifest_lib.shard_files(data_dir, manifest, SPLIT)
    spec = parse_spec(manifest["features"])
    decode = DECODE_ONE[name]

    pipeline, info = load_pipeline(manifest["pipeline"]), manifest.get("info", {})
    parse_and_decode = batch_decoder(spec, pipeline, info)  # what load maps over its batches

    def tftrain_load(**options):
        return lambda: load(data_dir, SPLIT, BATCH, training=True, seed=0, repeat=True, **options)

    made = {
        RAW: lambda: tf.data.TFRecordDataset(files).repeat().batch(BATCH),
        NAIVE: lambda: tf.data.TFRecordDataset(files).repeat().map(lambda s: decode(s, spec))
        .batch(BATCH),
        PARALLEL: lambda: tf.data.TFRecordDataset(files).repeat().map(
            lambda s: decode(s, spec), num_parallel_calls=tf.data.AUTOTUNE).batch(BATCH)
        .prefetch(tf.data.AUTOTUNE),
        TFTRAIN: tftrain_load(),
        UNTUNED: tftrain_load(autotune=False),
        CACHED: tftrain_load(cache="decoded"),
        UNSHUFFLED: lambda: tf.data.TFRecordDataset(files).repeat().batch(BATCH).map(
            parse_and_decode, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE),
    }
    for stage in STAGES[:-1]:
        made[STAGE_ROW.format(stage=stage)] = tftrain_load(last_stage=stage)
    return made


def examples_per_second(make_dataset, examples: int, warm_up: int) -> tuple[float, float, float]:
    """(examples/s, CPU seconds per example, seconds to the first batch) of one iterator over
    the repeated dataset `make_dataset()` makes: its first batch is timed apart, then `warm_up`
    examples are read, then `examples` are timed (whole batches, at least `examples`)."""
    def read(iterator, limit):
        count = 0
        while count < limit:
            count += int(tf.shape(tf.nest.flatten(next(iterator))[0])[0])
        return count

    started = time.perf_counter()
    iterator = iter(make_dataset())
    read(iterator, 1)
    first_batch = time.perf_counter() - started
    read(iterator, warm_up)
    started, cpu_started = time.perf_counter(), time.process_time()
    total = read(iterator, examples)
    return (total / (time.perf_counter() - started), (time.process_time() - cpu_started) / total,
            first_batch)


def tables(name: str, data_dir: str, results: dict, per_round: dict) -> str:
    """The dataset's two tables: the pipelines, and the CPU of tftrain's stages."""
    naive, raw = results[NAIVE][0], results[RAW][0]
    stage_rows = {STAGE_ROW.format(stage=s) for s in STAGES[:-1]}
    split = manifest_lib.read(data_dir)["splits"][SPLIT]
    bytes_per_example = sum(s["bytes"] for s in split["shards"]) / split["num_examples"]
    lines = [f"### {SETS[name]}: {split['num_examples']:,} records, {bytes_per_example:,.0f} "
             f"bytes/record, {len(split['shards'])} shards", "",
             markdown_table(
                 ["pipeline", "examples/s", "vs naive", "vs raw", "CPU µs/example", "first batch s"],
                 [[row, f"{rate:,.0f}", f"{rate / naive:.2f}x", f"{rate / raw:.2f}x",
                   f"{cpu * 1e6:.1f}", f"{first:.2f}"] for row, (rate, cpu, first) in results.items()
                  if row not in stage_rows], ["l", "r", "r", "r", "r", "r"]), ""]
    cut = [results[STAGE_ROW.format(stage=s)] for s in STAGES[:-1]] + [results[TFTRAIN]]
    before = 0.0
    stage_table = []
    for stage, (rate, cpu, _) in zip(STAGES, cut):
        stage_table.append([stage, f"{rate:,.0f}", f"{cpu * 1e6:.1f}", f"{(cpu - before) * 1e6:.1f}"])
        before = cpu
    lines += [markdown_table(["`tftrain.data.load` up to", "examples/s", "CPU µs/example",
                              "the stage's CPU µs/example"], stage_table, ["l", "r", "r", "r"]), ""]
    for other, label in ((NAIVE, "naive"), (RAW, "raw")):
        ratios = ", ".join(f"{ours / theirs:.2f}x"
                           for ours, theirs in zip(per_round[TFTRAIN], per_round[other]))
        lines.append(f"per round, tftrain / {label}: {ratios}")
    lines += ["", target_table(name, results)]
    return "\n".join(lines)


def target_table(name: str, results: dict) -> str:
    """Each target of the dataset against the CPU limit: on C cores a pipeline that spends
    T CPU µs per example yields at most C / T examples per second, however well it overlaps."""
    cores = os.cpu_count() or 1
    rows = []
    for other, ratio in TARGETS[name]:
        needed = ratio * results[other][0]
        for row, label in ((TFTRAIN, "`load`"), (UNTUNED, "`load`, `data.autotune=false`"),
                           (UNSHUFFLED, "unshuffled (the least work)")):
            rate, cpu, _ = results[row]
            rows.append([f"≥ {ratio}x {'naive' if other == NAIVE else 'raw read'}", label,
                         f"{needed:,.0f}", f"{rate:,.0f}", "yes" if rate >= needed else "no",
                         f"{cores / cpu:,.0f}", f"{cpu * 1e6:.1f}", f"{cores / needed * 1e6:.1f}"])
    return markdown_table(
        ["target", "pipeline", "needs examples/s", "examples/s", "met", f"limit on {cores} cores "
         "(cores / CPU per example)", "CPU µs/example", "CPU µs/example the target allows"],
        rows, ["l", "l", "r", "r", "l", "r", "r", "r"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=56_000)  # train split >= 50,000
    parser.add_argument("--data", default="/tmp/tftrain-bench")
    parser.add_argument("--passes", type=float, default=1, help="examples timed, in passes")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warm_up", type=float, default=0.25,
                        help="the warm-up before the timed examples, in passes (the cache: 1)")
    parser.add_argument("--sets", default=",".join(SETS), help="which datasets: numpy,numpy_raw,raw,png")
    args = parser.parse_args()
    names = [n for n in args.sets.split(",") if n]
    unknown = sorted(set(names) - set(SETS))
    if unknown:
        parser.error(f"unknown --sets {', '.join(unknown)}; choose from {', '.join(SETS)}")
    sets = make_sets(args.data, args.examples, names)
    print(f"batch {BATCH}, {os.cpu_count()} CPU cores, TensorFlow {tf.__version__}")
    results: dict[str, dict] = {n: {} for n in names}
    per_round: dict[str, dict] = {n: {} for n in names}
    for round_index in range(args.rounds):
        for name, data_dir in sets.items():
            one_pass = manifest_lib.read(data_dir)["splits"][SPLIT]["num_examples"]
            for row, make in pipelines(name, data_dir).items():
                # The decoded cache fills in its first pass: that one warms up in full.
                warm_up = one_pass if row == CACHED else int(args.warm_up * one_pass)
                rate, cpu, first = examples_per_second(make, int(args.passes * one_pass), warm_up)
                print(f"  round {round_index + 1} {name}: {row} {rate:,.0f} examples/s, "
                      f"{cpu * 1e6:.1f} CPU µs/example, first batch {first:.2f} s", flush=True)
                per_round[name].setdefault(row, []).append(rate)
                if row not in results[name] or rate > results[name][row][0]:
                    results[name][row] = (rate, cpu, first)
    load_average = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\nbest of {args.rounds} rounds; load average {load_average}\n")
    print("\n\n".join(tables(n, sets[n], results[n], per_round[n]) for n in names))


if __name__ == "__main__":
    main()
