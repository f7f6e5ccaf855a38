"""Training step time: `tftrain train` against a plain hand-written tf_keras `fit`.

    python bench/train.py [--image_encoding=raw|png] [--steps_per_epoch=40] [--epochs=3]
                          [--batch_size=128] [--repeats=2] [--data=DIR]

Same model (the registry's `cnn`), same data (bench/synthetic.py's 32x32x3 images, as records
with `image_encoding=raw` (uint8 pixels: what `auto` stores for images this small, the default
here) or PNG records (`--image_encoding=png`: decoding them shares the cores with the model on a
CPU-only machine); `--data` names another dataset of bench/synthetic.py), same batch size,
optimizer and strategy-free single device. Step time is the mean over the epochs after
the first (tracing and warm-up excluded), timed by the same callback in every run:
  plain keras      model.fit(x, y) on the decoded images held in memory as NumPy arrays: no
                   input pipeline cost at all, no extra callbacks (the floor)
  hand-written     model.fit over the same TFRecords through the tf.data pipeline people
                   usually write (parse_single_example + decode map with AUTOTUNE, shuffle,
                   batch, prefetch): what `tftrain train` replaces
  tftrain train    the real command: TFRecord reader, strategy, backups, TensorBoard, checkpoints
                   (and again with runtime.jit_compile=true: the steps compiled by XLA)
Input wait, on the tftrain model and reader, two ways:
  wait             the share of step time spent blocked on the next batch: a loop that takes
                   each batch from the reader's iterator (timed) and then runs the compiled train
                   step and waits for its loss (timed); wait = next() time / total time
  shared CPU       the same compiled model stepping over (a) the reader and (b) the same batches
                   replayed from memory: 1 - (b) / (a). On a CPU-only machine the reader decodes
                   on the cores the model computes on, so this also counts that competition
Prints two markdown tables, ratios to the floor: "XLA" (the floor, hand-written, tftrain train
without and with runtime.jit_compile=true) and "Training step" (the floor, hand-written,
tftrain train, the same model over the reader and over replayed batches), then the ratio
tftrain train / the floor of each repeat (how much it moves), and one line with the input
wait, the shared CPU and the two ratios tftrain / hand-written and XLA / without.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tftrain  # noqa: E402,F401  (tf-keras before TensorFlow)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from bench.table import markdown_table  # noqa: E402
from tftrain import config as config_lib, models  # noqa: E402
from tftrain.engine import train  # noqa: E402
from tftrain.callbacks.step_timer import StepTimer  # noqa: E402
from tftrain.data import load  # noqa: E402

MODEL = {"filters": [32, 64], "dense_units": 128, "dropout": 0.25}
# The rows of the two tables (XLA; training step), as docs/benchmarks.md shows them.
PLAIN = "plain tf_keras `fit` on decoded NumPy arrays (no input pipeline: the floor)"
HAND_WRITTEN = "plain tf_keras `fit` over a hand-written tf.data pipeline of the same records"
TFTRAIN = "`tftrain train` (reader, backup, TensorBoard, best checkpoint)"
TFTRAIN_XLA = "`tftrain train`, `runtime.jit_compile=true` (the steps compiled by XLA)"
READER = "same model: tftrain reader"
REPLAYED = "same model: batches replayed from memory"


def _compiled_model():
    keras.utils.set_random_seed(0)
    model = models.build_model("cnn", MODEL, (32, 32, 3), 10)
    model.compile(keras.optimizers.Adam(1e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def plain_keras(x, y, args) -> float:
    """Seconds per step of a hand-written fit over NumPy arrays."""
    model, timer = _compiled_model(), StepTimer(args.batch_size)
    model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs,
              steps_per_epoch=args.steps_per_epoch, callbacks=[timer], verbose=0)
    return timer.seconds_per_step()


def hand_written(data_dir, args) -> float:
    """Seconds per step of a plain fit over a typical hand-written tf.data pipeline."""
    from bench.input import DECODE_ONE
    from tftrain.data import manifest as manifest_lib
    from tftrain.data.reader import parse_spec

    manifest = manifest_lib.read(data_dir)
    spec = parse_spec(manifest["features"])
    decode = DECODE_ONE["raw" if manifest.get("info", {}).get("image_encoding") == "raw" else "png"]
    dataset = (tf.data.TFRecordDataset(manifest_lib.shard_files(data_dir, manifest, "train"))
               .map(lambda s: decode(s, spec), num_parallel_calls=tf.data.AUTOTUNE)
               .shuffle(10_000).repeat().batch(args.batch_size).prefetch(tf.data.AUTOTUNE))
    model, timer = _compiled_model(), StepTimer(args.batch_size)
    model.fit(dataset, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, callbacks=[timer],
              verbose=0)
    return timer.seconds_per_step()


def stored_encoding(data_dir: str) -> str:
    """The dataset's `image_encoding` as its manifest records it (`keep`: the PNGs)."""
    from tftrain.data import manifest as manifest_lib

    return manifest_lib.read(data_dir).get("info", {}).get("image_encoding", "keep")


def run_step_seconds(data_dir: str, overrides: str) -> float:
    """Seconds per step of `tftrain train` on the synthetic dataset in `data_dir` (its summary's
    steady-state step time), under the digits config with `overrides`."""
    config = config_lib.build_config("digits", overrides=(
        f"data.dir={data_dir},data.pipeline=bench.synthetic,{overrides}"))
    with tempfile.TemporaryDirectory() as run:
        return train.train(config, run)["seconds_per_step"]


def tftrain_train(data_dir, args, jit_compile: str = "false") -> float:
    """Seconds per step of `tftrain train`, with the steps XLA-compiled or not
    (`runtime.jit_compile`)."""
    return run_step_seconds(data_dir, (
        f"data.batch_size={args.batch_size},runtime.jit_compile={jit_compile},"
        f"train.epochs={args.epochs},train.steps_per_epoch={args.steps_per_epoch},"
        "train.learning_rate=0.001,model.name=cnn,"
        "model.params={filters: [32, 64], dense_units: 128, dropout: 0.25}"))


def input_wait(data_dir, args) -> tuple[float, float]:
    """(seconds per step over the reader, over the same batches from memory)."""
    times = []
    reader = load(data_dir, "train", args.batch_size, training=True, repeat=True, seed=0)
    replay = reader.take(args.steps_per_epoch).cache().repeat()
    for _ in replay.take(args.steps_per_epoch):  # fill the cache before timing
        pass
    for dataset in (reader, replay):
        model, timer = _compiled_model(), StepTimer(args.batch_size)
        model.fit(dataset, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch,
                  callbacks=[timer], verbose=0)
        times.append(timer.seconds_per_step())
    return times[0], times[1]


def blocked_on_input(data_dir, args) -> float:
    """The share of step time spent in `next(iterator)` of the reader (after a warm-up epoch)."""
    model = _compiled_model()
    reader = load(data_dir, "train", args.batch_size, training=True, repeat=True, seed=0)
    step = tf.function(model.train_step)
    batches = iter(reader)
    waited = total = 0.0
    for index in range(args.steps_per_epoch * args.epochs):
        started = time.perf_counter()
        batch = next(batches)
        got = time.perf_counter()
        float(step(batch)["loss"])  # waits for the step to finish
        if index >= args.steps_per_epoch:  # the first epoch warms up, as elsewhere
            waited += got - started
            total += time.perf_counter() - started
    return waited / total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image_encoding", choices=["raw", "png"], default="raw")
    parser.add_argument("--data", help="a bench/synthetic.py dataset (default: made once under "
                        "/tmp/tftrain-bench, as bench/input.py makes it)")
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument("--steps_per_epoch", type=int, default=40)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2, help="runs per variant; the best counts")
    args = parser.parse_args()
    if args.data is None:
        from bench.input import make_sets

        args.data = make_sets("/tmp/tftrain-bench", 56_000, [args.image_encoding])[args.image_encoding]
    n = args.batch_size * args.steps_per_epoch * args.epochs
    x, y = [], []
    for images, labels in load(args.data, "train", 512, training=False).take(-(-n // 512)):
        x.append(images.numpy())
        y.append(labels.numpy())
    x, y = np.concatenate(x), np.concatenate(y)

    runs = []  # the variants interleaved in each repeat, so load changes hit all of them
    for _ in range(args.repeats):
        runs.append((plain_keras(x, y, args), hand_written(args.data, args),
                     tftrain_train(args.data, args), tftrain_train(args.data, args, "true"),
                     *input_wait(args.data, args), blocked_on_input(args.data, args)))
    plain, hand, ours, xla, real, memory, blocked = (min(column) for column in zip(*runs))
    shared = max(0.0, 1 - memory / real)
    print(f"\ncnn {MODEL['filters']} on 32x32x3 ({stored_encoding(args.data)} records), batch "
          f"{args.batch_size}, {args.steps_per_epoch} "
          f"steps x {args.epochs} epochs (first excluded), best of {args.repeats}, "
          f"{os.cpu_count()} CPU cores")
    floor = [(PLAIN, plain), (HAND_WRITTEN, hand), (TFTRAIN, ours)]
    for title, rows in (("XLA:", floor + [(TFTRAIN_XLA, xla)]),
                        ("Training step:", floor + [(READER, real), (REPLAYED, memory)])):
        print(f"\n{title}\n")
        print(markdown_table(["run", "ms/step", "ratio"],
                             [[name, f"{seconds * 1e3:.1f}", f"{seconds / plain:.2f}x"]
                              for name, seconds in rows]))
    per_repeat = ", ".join(f"{run[2] / run[0]:.2f}x" for run in runs)
    print(f"\nper repeat, tftrain train / the floor: {per_repeat}")
    print(f"\ninput wait (blocked on the next batch): {blocked:.1%} of the step time; shared CPU "
          f"(reader vs replay): {shared:.1%}; tftrain train / hand-written fit: {ours / hand:.2f}x; "
          f"with XLA / without: {xla / ours:.2f}x")


if __name__ == "__main__":
    main()
