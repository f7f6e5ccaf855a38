"""Pruning and quantization of a larger CNN, each measured against the float model.

    .venv/bin/python bench/optimize.py [--train_examples=6000] [--epochs=5] [--prune_epochs=3]

Data (generated in memory, seeded): 32x32 RGB images in 10 classes; a class is a sinusoidal
grating of one of 5 orientations and one of 2 spatial frequencies, with a random phase,
contrast and colour, a random bright blob, and pixel noise. Model: conv 32-32-pool-64-64-pool-
128-pool, dense 256, dense 10 (~0.67M parameters, 2.6 MB float).

Steps: train the float model; prune a clone to 80% sparsity (`tftrain.optimize.prune`, polynomial
schedule, `--prune_epochs` of fine-tuning); convert float, pruned (float), dynamic, int8 (100
training examples for calibration) and float16 .tflite files; run each with the LiteRT
interpreter on the test split: accuracy on every example, and two times, each the fastest of 5
interleaved rounds over the first 256 test examples with `--tflite_threads` threads (default 1):
latency at batch 1 (one request: set input, invoke, read output) and ms per example at batch
`--throughput_batch_size` (default 256). Prints one table with every ratio to float, and the
targets:
  pruned: sparsity >= 0.8, accuracy drop <= 1 point, gzip size <= 0.4x dense
  int8:   size <= 0.3x float .tflite, accuracy drop <= 1 point, latency <= float (batch 1 and
          batch N, reported separately)
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

from tftrain.optimize import metrics, prune, quantize, report, sizes, tflite_eval  # noqa: E402

SIZE, CLASSES = 32, 10


def make_images(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`count` grating images in [0, 1] (float32, NHWC) and their int32 labels."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, count).astype(np.int32)
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32) / SIZE
    angle = (labels % 5) * np.pi / 5 + rng.normal(0, 0.12, count)
    cycles = np.where(labels < 5, 2.5, 3.5) + rng.normal(0, 0.25, count)
    phase = rng.uniform(0, 2 * np.pi, count)
    wave = np.sin(2 * np.pi * cycles[:, None, None]
                  * (np.cos(angle)[:, None, None] * xx + np.sin(angle)[:, None, None] * yy)
                  + phase[:, None, None])
    contrast = rng.uniform(0.12, 0.3, count)[:, None, None, None]
    colour = rng.uniform(0.4, 1.0, (count, 1, 1, 3))
    images = 0.5 + contrast * wave[..., None] * colour
    centre = rng.uniform(0, 1, (count, 2))
    blob = np.exp(-(((xx - centre[:, 0, None, None]) ** 2 + (yy - centre[:, 1, None, None]) ** 2)
                    / 0.01))
    images += 0.4 * blob[..., None]
    images += rng.normal(0, 0.2, images.shape)
    return np.clip(images, 0, 1).astype(np.float32), labels


def make_model() -> keras.Model:
    """The benchmark CNN (functional, float32 logits)."""
    inputs = keras.Input((SIZE, SIZE, 3), name="image")
    x = inputs
    for width, convs in ((32, 2), (64, 2), (128, 1)):
        for _ in range(convs):
            x = keras.layers.Conv2D(width, 3, padding="same", activation="relu")(x)
        x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(256, activation="relu")(x)
    x = keras.layers.Dropout(0.3)(x)
    return keras.Model(inputs, keras.layers.Dense(CLASSES, name="logits")(x), name="bench_cnn")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train_examples", type=int, default=6000)
    parser.add_argument("--test_examples", type=int, default=1000)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--prune_epochs", type=int, default=3)
    parser.add_argument("--target_sparsity", type=float, default=0.8)
    parser.add_argument("--tflite_threads", type=int, default=1)
    parser.add_argument("--throughput_batch_size", type=int,
                        default=tflite_eval.THROUGHPUT_BATCH_SIZE)
    args = parser.parse_args()
    started = time.monotonic()
    keras.utils.set_random_seed(0)

    x_train, y_train = make_images(args.train_examples, seed=1)
    x_test, y_test = make_images(args.test_examples, seed=2)
    steps = args.train_examples // args.batch_size
    train = (tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(10_000, seed=0)
             .repeat().batch(args.batch_size, drop_remainder=True).prefetch(2))
    test = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(256)

    model = make_model()
    model.compile(keras.optimizers.Adam(1e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(train, epochs=args.epochs, steps_per_epoch=steps, verbose=2)
    float_accuracy = metrics.keras_accuracy(model, test)
    print(f"float model: {model.count_params()} parameters, test accuracy {float_accuracy:.4f} "
          f"({time.monotonic() - started:.0f}s)")
    if float_accuracy < 0.5:
        print("WARNING: the float model did not learn the task; the comparisons below say little")

    pruned = prune.prune_model(model, train, steps_per_epoch=steps, epochs=args.prune_epochs,
                               target_sparsity=args.target_sparsity, learning_rate=5e-4, verbose=2)
    sparsity = prune.sparsity_report(pruned.model, pruned.pruned_weights)
    print(f"pruned: sparsity {sparsity['sparsity']:.3f}, test accuracy "
          f"{metrics.keras_accuracy(pruned.model, test):.4f} ({time.monotonic() - started:.0f}s)")

    calibration = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(
        10_000, seed=3).batch(32)
    converted = {
        "float": quantize.convert(model, "float"),
        "pruned": quantize.convert(pruned.model, "float"),
        "dynamic": quantize.convert(model, "dynamic"),
        "int8": quantize.convert(model, "int8", representative_data=calibration),
        "float16": quantize.convert(model, "float16"),
    }
    measured = {name: tflite_eval.evaluate_tflite(content, test, latency_rounds=1)
                for name, content in converted.items()}
    # Times from one interleaved comparison, so load from other processes hits all alike.
    timings = tflite_eval.compare_latencies(converted, test, num_threads=args.tflite_threads,
                                            batch_size=args.throughput_batch_size)
    for name, timing in timings.items():
        measured[name].update(timing)
    base = measured["float"]
    base_row = report.make_row("float", report.measured_of(base), None)
    rows = [base_row] + [
        report.make_row(name, report.measured_of(m), base_row,
                        f"{sparsity['sparsity']:.0%} sparse" if name == "pruned" else "")
        for name, m in measured.items() if name != "float"]
    print()
    print(report.format_table(rows))

    weights_ratio = sizes.gzip_weights_bytes(pruned.model) / sizes.gzip_weights_bytes(model)
    p, q = measured["pruned"], measured["int8"]
    targets = [
        ("pruned sparsity", sparsity["sparsity"], ">=", args.target_sparsity - 0.005),
        ("pruned accuracy drop (points)", 100 * (base["accuracy"] - p["accuracy"]), "<=", 1.0),
        ("pruned gzip .tflite / dense", p["gzip_bytes"] / base["gzip_bytes"], "<=", 0.4),
        ("pruned gzip weights / dense", weights_ratio, "<=", 0.4),
        ("int8 .tflite / float .tflite", q["tflite_bytes"] / base["tflite_bytes"], "<=", 0.3),
        ("int8 accuracy drop (points)", 100 * (base["accuracy"] - q["accuracy"]), "<=", 1.0),
        ("int8 latency / float (batch 1)", q["latency_ms"] / base["latency_ms"], "<=", 1.0),
    ]
    if q["throughput_ms_per_example"] and base["throughput_ms_per_example"]:
        targets.append((f"int8 ms/example / float (batch {args.throughput_batch_size})",
                        q["throughput_ms_per_example"] / base["throughput_ms_per_example"],
                        "<=", 1.0))
    print()
    print("| target | measured | limit | met |")
    print("|---|---|---|---|")
    for name, value, op, limit in targets:
        met = value >= limit if op == ">=" else value <= limit
        print(f"| {name} | {value:.3f} | {op} {limit:g} | {'yes' if met else 'NO'} |")
    print(f"\n{args.train_examples} training / {len(y_test)} test examples, "
          f"{time.monotonic() - started:.0f}s in all")


if __name__ == "__main__":
    main()
