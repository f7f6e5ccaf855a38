"""Image storage: `image_encoding` keep / raw / png / jpeg, side by side on small and large images.

    .venv/bin/python bench/image_encoding.py [--small=6000] [--photos=1024] [--rounds=3]

Two image folders (generated once into --workdir, converted by the `image_folder` pipeline):
  small   32x32x3 PNGs: the class-coloured gradients plus noise of bench/synthetic.py (CIFAR-like)
  photos  160x160x3 JPEGs (quality 90): random crops, at random scales, of scikit-learn's two
          sample photos (`load_sample_images`), the way a photo dataset is stored
Each folder is converted with every encoding (one worker process, so the time is the encoding's
own cost; 4 shards), and each dataset is read once to warm up and then timed over one full pass
of `tftrain.data.load(training=True)` (batch 128) and of the raw read of its shards
(`TFRecordDataset`, batched, no parsing), the faster of two passes. Each round converts with
every encoding, then reads every dataset (the reads back to back); --rounds rounds, and each
number is its best round (the machine may be shared).
Columns: bytes per example on disk (the shards, all keys), convert time and read examples/s with
their ratios to `keep`, and the read as a fraction of the raw read of the same shards.
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

from bench import synthetic  # noqa: E402
from bench.input import examples_per_second  # noqa: E402
from bench.table import markdown_table  # noqa: E402
from pipelines import load_pipeline  # noqa: E402
from tftrain.data import load, manifest as manifest_lib  # noqa: E402
from tftrain.data.writer import write_dataset  # noqa: E402

ENCODINGS = ("keep", "raw", "png", "jpeg")
BATCH = 128
PHOTO_SIZE = 160
CLASSES = 10


def make_small(root: str, count: int) -> None:
    """`count` 32x32x3 PNGs from bench/synthetic.py's generator, in class folders."""
    from PIL import Image

    for index in range(count):
        pixels, label = synthetic.pixels(index)
        folder = os.path.join(root, f"class{label}")
        os.makedirs(folder, exist_ok=True)
        Image.fromarray(pixels).save(os.path.join(folder, f"{index:06d}.png"))


def make_photos(root: str, count: int) -> None:
    """`count` PHOTO_SIZE^2 JPEG crops of scikit-learn's sample photos, in class folders."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    photos = [Image.fromarray(image) for image in load_sample_images().images]
    rng = np.random.default_rng(0)
    for index in range(count):
        photo = photos[index % len(photos)]
        side = int(rng.integers(PHOTO_SIZE, min(photo.size) + 1))
        left = int(rng.integers(0, photo.width - side + 1))
        top = int(rng.integers(0, photo.height - side + 1))
        crop = photo.crop((left, top, left + side, top + side)).resize((PHOTO_SIZE, PHOTO_SIZE),
                                                                       Image.BILINEAR)
        if rng.random() < 0.5:
            crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
        folder = os.path.join(root, f"class{index % CLASSES}")
        os.makedirs(folder, exist_ok=True)
        crop.save(os.path.join(folder, f"{index:06d}.jpg"), quality=90)


def source(workdir: str, name: str, make, count: int) -> str:
    """The image folder `name` with `count` images, made once."""
    root = os.path.join(workdir, f"{name}{count}")
    if not os.path.exists(os.path.join(root, ".done")):
        make(root, count)
        open(os.path.join(root, ".done"), "w").close()
    return root


def convert(folder: str, output: str, encoding: str) -> float:
    """Converts `folder` with `encoding`; returns the seconds it took."""
    started = time.perf_counter()
    write_dataset(load_pipeline("image_folder", image_encoding=encoding), folder, output,
                  splits={"train": 1.0}, num_shards=4, workers=1, overwrite=True, progress=False)
    return time.perf_counter() - started


def rate(dataset: tf.data.Dataset, examples: int) -> float:
    """Examples per second of two passes' worth of the repeated `dataset` (`examples` a pass),
    after a warm-up pass."""
    return examples_per_second(lambda: dataset, examples=2 * examples, warm_up=examples)[0]


def measure(folder: str, workdir: str, name: str, rounds: int) -> dict:
    """encoding -> {bytes, convert, read, raw}: bytes/example and the best of `rounds`.

    Each round converts with every encoding, then reads every dataset: the reads of one round
    run back to back, so they share the machine's load of that moment.
    """
    best: dict[str, dict] = {e: {} for e in ENCODINGS}
    for round_index in range(rounds):
        outputs = {e: os.path.join(workdir, f"{name}-{e}") for e in ENCODINGS}
        for encoding, output in outputs.items():
            seconds = convert(folder, output, encoding)
            best[encoding]["convert"] = min(best[encoding].get("convert", seconds), seconds)
        for encoding, output in outputs.items():
            manifest = manifest_lib.read(output)
            files = manifest_lib.shard_files(output, manifest, "train")
            split = manifest["splits"]["train"]
            read = rate(load(output, "train", BATCH, training=True, seed=0, repeat=True),
                        split["num_examples"])
            raw = rate(tf.data.TFRecordDataset(files).repeat().batch(BATCH), split["num_examples"])
            print(f"  round {round_index + 1} {name} {encoding}: load {read:,.0f} examples/s, "
                  f"raw read {raw:,.0f}", flush=True)
            found = best[encoding]
            found["bytes"] = sum(s["bytes"] for s in split["shards"]) / split["num_examples"]
            found["read"] = max(found.get("read", 0), read)
            found["raw"] = max(found.get("raw", 0), raw)
    return best


def rows(label: str, results: dict) -> list[list]:
    keep = results["keep"]
    return [[label, f"`{encoding}`", f"{r['bytes']:,.0f}", f"{r['bytes'] / keep['bytes']:.2f}x",
             f"{r['convert'] / keep['convert']:.2f}x", f"{r['read']:,.0f}",
             f"{r['read'] / keep['read']:.2f}x", f"{r['read'] / r['raw']:.2f}x"]
            for encoding, r in results.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", type=int, default=6000)
    parser.add_argument("--photos", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", default="/tmp/tftrain-bench/image_encoding")
    args = parser.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    sets = [("small", f"{args.small} x 32x32x3 PNG", source(args.workdir, "small", make_small, args.small)),
            ("photos", f"{args.photos} x {PHOTO_SIZE}x{PHOTO_SIZE}x3 JPEG",
             source(args.workdir, "photos", make_photos, args.photos))]
    table = []
    for name, label, folder in sets:
        table += rows(label, measure(folder, args.workdir, name, args.rounds))
    load_average = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\nbest of {args.rounds} rounds, {os.cpu_count()} CPU cores, load average {load_average}; "
          f"jpeg at quality 95, convert with 1 worker, read batch {BATCH}\n")
    print(markdown_table(
        ["source", "image_encoding", "bytes/example", "vs keep", "convert time vs keep",
         "load examples/s", "vs keep", "vs raw read"],
        table, ["l", "l", "r", "r", "r", "r", "r", "r"]))


if __name__ == "__main__":
    main()
