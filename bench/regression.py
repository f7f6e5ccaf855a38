"""Tabular regression: tftrain's `mlp` on the diabetes data against scikit-learn's Ridge.

    python bench/regression.py [--workdir=DIR]

Trains `configs/diabetes.yaml` as it ships (`tftrain.engine.train.train`, what `tftrain train
--config=diabetes` runs: conversion of the embedded data into DIR/data, 60 epochs), then fits
`sklearn.linear_model.Ridge(alpha=1)` on the same train split, read back from the TFRecords the
converter wrote (the inputs as the trainer reads them: standardized by the pipeline), and scores
both on the same test split. Prints one markdown table (RMSE and R² on the test split).
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
from tftrain import config as config_lib  # noqa: E402
from tftrain.data import load  # noqa: E402
from tftrain.engine import train  # noqa: E402


def split_arrays(data_dir: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Every (inputs, label) of a split, as the trainer reads them from the TFRecords."""
    pairs = [(x.numpy(), y.numpy()) for x, y in load(data_dir, split, 512, training=False)]
    return np.concatenate([x for x, _ in pairs]), np.concatenate([y for _, y in pairs])


def rmse_r2(predicted: np.ndarray, target: np.ndarray) -> tuple[float, float]:
    """Root mean squared error and the coefficient of determination."""
    predicted, target = np.ravel(predicted), np.ravel(target)
    residual = float(np.sum((predicted - target) ** 2))
    total = float(np.sum((target - target.mean()) ** 2))
    return float(np.sqrt(residual / len(target))), 1.0 - residual / total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="", help="default: a temporary directory")
    args = parser.parse_args()
    from sklearn.linear_model import Ridge

    with tempfile.TemporaryDirectory() as scratch:
        work = args.workdir or scratch
        data_dir = os.path.join(work, "data", "diabetes")
        config = config_lib.build_config("diabetes", overrides=f"data.dir={data_dir}")
        summary = train.train(config, os.path.join(work, "runs", "diabetes"))
        x_train, y_train = split_arrays(data_dir, "train")
        x_test, y_test = split_arrays(data_dir, "test")
    ridge_rmse, ridge_r2 = rmse_r2(Ridge(alpha=1.0).fit(x_train, y_train).predict(x_test), y_test)
    print(f"\n{len(y_train)} train / {len(y_test)} test rows; {summary['epochs']} epochs\n")
    print(markdown_table(
        [f"model (test split, {len(y_test)} rows)", "RMSE", "R²"],
        [["tftrain `mlp` (`configs/diabetes.yaml`)", f"{summary['eval']['rmse']:.2f}",
          f"{summary['eval']['r2']:.3f}"],
         ["scikit-learn `Ridge(alpha=1)` on the same train split (read from the TFRecords)",
          f"{ridge_rmse:.2f}", f"{ridge_r2:.3f}"]]))


if __name__ == "__main__":
    main()
