"""An embedded regression dataset: scikit-learn's bundled diabetes data (442 patients, no network).

Ten baseline measurements (age, sex, body mass index, blood pressure, six blood serum values),
stored as they were measured (`load_diabetes(scaled=False)`), and the target: a measure of
disease progression one year later (25..346). `prepare` records each feature's mean and
standard deviation and `decode` standardizes with them, as the CSV pipeline does; the target's
statistics go to `info["label_stats"]`, so `task.type=auto` trains it as regression. The source
has no splits of its own; the converter assigns train/validation/test from each row's key.
"""
from __future__ import annotations

import numpy as np

from pipelines.base import BasePipeline, Row
from pipelines.options import check_known
from tftrain.data import example_bytes

NUM_ROWS = 442  # len(sklearn.datasets.load_diabetes().target)
FEATURES = ("age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6")


def _load():
    from sklearn.datasets import load_diabetes

    return load_diabetes(scaled=False)


class Pipeline(BasePipeline):
    """`source` is ignored: the data ships inside scikit-learn."""

    name = "diabetes"
    default_splits = {"train": 0.8, "validation": 0.1, "test": 0.1}

    def __init__(self, **options):
        check_known(options, (), self.name)  # it has none
        super().__init__(**options)

    def known_num_rows(self, source):
        return NUM_ROWS

    def prepare(self, source):
        data = _load()
        x, y = data.data.astype(np.float64), data.target.astype(np.float64)
        std = np.where(x.std(axis=0) > 1e-12, x.std(axis=0), 1.0)
        return {"feature_names": list(FEATURES), "feature_mean": x.mean(axis=0).tolist(),
                "feature_std": std.tolist(),
                "label_stats": {"kind": "float", "shape": [], "count": len(y),
                                "distinct": len(np.unique(y)), "min": float(y.min()),
                                "max": float(y.max()), "mean": float(y.mean()),
                                "std": float(y.std())}}

    def read(self, source, info, worker=0, num_workers=1):
        data = _load()
        for index in range(worker, len(data.target), num_workers):
            yield Row(key=f"diabetes/{index:03d}", value=(data.data[index], data.target[index]))

    def features(self, info):
        return {"features": {"dtype": "float32", "shape": [len(FEATURES)]},
                "target": {"dtype": "float32", "shape": []}}

    def encode(self, row, info):
        features, target = row.value
        return example_bytes.example({"features": example_bytes.float_feature(features),
                                      "target": example_bytes.float_feature(float(target))})

    def decode(self, features, info):
        import tensorflow as tf

        mean = tf.constant(info["feature_mean"], tf.float32)
        std = tf.constant(info["feature_std"], tf.float32)
        return (features["features"] - mean) / std, features["target"]
