"""Class weights on an imbalanced dataset: `train.class_weight` none against balanced, over seeds.

    python bench/class_weights.py [--seeds=5] [--steps=100] [--workdir=DIR]

For each seed, generates a 95/5 dataset of two overlapping Gaussian classes in 2 features (the
minority's mean 2 standard deviations away; 600 train / 200 validation / 1000 test rows, the
seed drawing the data too), converts it with the `numpy` pipeline, and trains the same small MLP
(16 hidden units, batch 30, Adam at 0.01, `--steps` steps) once per setting with that seed.
Prints the CPU and one markdown table: the test split's minority and majority recall, accuracy
and macro-F1 (`summary.json["eval"]`), mean ± standard deviation over the seeds.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tftrain  # noqa: E402,F401  (tf-keras before TensorFlow)
import numpy as np  # noqa: E402

from bench.table import markdown_table  # noqa: E402
from pipelines import load_pipeline  # noqa: E402
from tftrain import config as config_lib  # noqa: E402
from tftrain.data.writer import write_dataset  # noqa: E402
from tftrain.engine import train  # noqa: E402
from tftrain.host import cpu_name  # noqa: E402

SETTINGS = ("none", "balanced")
ROWS = (("train", 600), ("validation", 200), ("test", 1000))


def write_imbalanced(path: str, seed: int, minority: float = 0.05, gap: float = 2.0) -> None:
    """An .npz of `ROWS` per split: class 1 is `minority` of each, its first feature shifted
    by `gap` standard deviations."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for split, rows in ROWS:
        labels = (np.arange(rows) < round(rows * minority)).astype(np.int64)
        rng.shuffle(labels)
        features = rng.normal(size=(rows, 2)).astype(np.float32)
        features[:, 0] += gap * labels
        arrays.update({f"x_{split}": features, f"y_{split}": labels})
    np.savez(path, **arrays)


def one_run(work: str, seed: int, setting: str, steps: int) -> dict:
    """The test split's measures of one training."""
    overrides = (f"data.dir={work}/data-{seed},data.pipeline=numpy,data.batch_size=30,"
                 "model.name=mlp,model.params={hidden_units: [16]},train.epochs=1,"
                 f"train.steps={steps},train.learning_rate=0.01,train.seed={seed},"
                 f"train.class_weight={setting}")
    config = config_lib.build_config("digits", overrides=overrides)
    measures = train.train(config, f"{work}/run-{seed}-{setting}")["eval"]
    return {"minority recall": measures["per_class"]["1"]["recall"],
            "majority recall": measures["per_class"]["0"]["recall"],
            "accuracy": measures["accuracy"], "macro-F1": measures["macro_f1"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--workdir", default="", help="default: a temporary directory")
    args = parser.parse_args()
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores", flush=True)
    results = {setting: [] for setting in SETTINGS}
    with tempfile.TemporaryDirectory() as scratch:
        work = args.workdir or scratch
        for seed in range(args.seeds):
            write_imbalanced(f"{work}/d-{seed}.npz", seed)
            write_dataset(load_pipeline("numpy"), f"{work}/d-{seed}.npz", f"{work}/data-{seed}",
                          workers=1)
            for setting in SETTINGS:
                results[setting].append(one_run(work, seed, setting, args.steps))
    columns = list(results[SETTINGS[0]][0])
    rows = [[f"`{setting}`"] + [f"{np.mean([r[c] for r in runs]):.3f} ± "
                                f"{np.std([r[c] for r in runs]):.3f}" for c in columns]
            for setting, runs in results.items()]
    print(f"\n{args.seeds} seeds, {args.steps} steps each; test split: 950 majority, 50 minority\n")
    print(markdown_table(["train.class_weight"] + columns, rows, ["l"] + ["r"] * len(columns)))


if __name__ == "__main__":
    main()
