"""The moving average of the weights (`train.ema_decay`) on a small-data task, over seeds.

    python bench/ema.py [--seeds=5] [--decay=0.99] [--epochs=30] [--workdir=DIR]

Converts the embedded digits into a small training split (20 % of the 1,797 images: ~360) with
a large test split (70 %) and trains `configs/digits.yaml`'s CNN on it (`tftrain.engine.train.
train`, what `tftrain train` runs), once per seed, learning-rate schedule (the config's cosine,
which decays to 0, and a constant rate) and decay (0: off, and `--decay`). Each seed fixes the
initial weights and the data order, the same for both decays, so each pair differs only by the
average. Prints the CPU and one markdown table: the test accuracy and loss, mean ± standard
deviation over the seeds, and the paired difference (with the average minus without).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tftrain  # noqa: E402,F401  (tf-keras before TensorFlow)

from bench.table import markdown_table  # noqa: E402
from pipelines import load_pipeline  # noqa: E402
from tftrain import config as config_lib  # noqa: E402
from tftrain.data.writer import write_dataset  # noqa: E402
from tftrain.engine import train  # noqa: E402
from tftrain.host import cpu_name  # noqa: E402

SPLITS = {"train": 0.2, "validation": 0.1, "test": 0.7}


def spread(values: list[float], digits: int = 3) -> str:
    """`mean ± standard deviation` (sample) of `values`."""
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--decay", type=float, default=0.99)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--workdir", default="", help="default: a temporary directory")
    args = parser.parse_args()
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        work = args.workdir or scratch
        data_dir = os.path.join(work, "data", "digits_small")
        manifest = write_dataset(load_pipeline("digits"), "", data_dir, splits=SPLITS,
                                 progress=False)
        sizes = {split: manifest["splits"][split]["num_examples"] for split in SPLITS}
        for schedule in ("cosine", "constant"):
            results = {decay: [] for decay in (0.0, args.decay)}
            for seed in range(args.seeds):
                for decay in results:
                    overrides = (f"data.dir={data_dir},train.epochs={args.epochs},"
                                 f"train.lr_schedule={schedule},train.seed={seed},"
                                 f"train.ema_decay={decay}")
                    config = config_lib.build_config("digits", overrides=overrides)
                    run = os.path.join(work, "runs", f"{schedule}-{decay}-{seed}")
                    results[decay].append(train.train(config, run)["eval"])
                    print(f"{schedule} seed {seed} decay {decay}: {results[decay][-1]}",
                          flush=True)
            off, on = results[0.0], results[args.decay]
            for decay, evals in results.items():
                rows.append([schedule, f"{decay:g}" if decay else "off",
                             spread([e["accuracy"] for e in evals]),
                             spread([e["loss"] for e in evals]),
                             "" if not decay else spread(
                                 [b["accuracy"] - a["accuracy"] for a, b in zip(off, on)]),
                             "" if not decay else spread(
                                 [b["loss"] - a["loss"] for a, b in zip(off, on)])])
    print(f"\ndigits: {sizes['train']} train / {sizes['validation']} validation / "
          f"{sizes['test']} test images; CNN of configs/digits.yaml, {args.epochs} epochs, "
          f"{args.seeds} seeds (mean ± std)\n")
    print(markdown_table(
        ["lr schedule", "train.ema_decay", "test accuracy", "test loss",
         "Δ accuracy (paired)", "Δ loss (paired)"], rows, ["l", "l", "r", "r", "r", "r"]))


if __name__ == "__main__":
    main()
