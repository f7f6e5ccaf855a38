"""Helpers for the pipeline tests: convert real files with the writer, read them back with `load`."""
from __future__ import annotations

import math

import numpy as np
import pytest

from pipelines import load_pipeline
from tftrain.data import load
from tftrain.data.writer import write_dataset
from tftrain.errors import BadRow


def convert(name: str, source, output, /, *, num_shards: int = 2, splits=None, workers=None,
            max_bad_fraction: float = 0.5, **options) -> dict:
    """Converts `source` with pipeline `name` into `output`; returns the manifest.

    Bad rows up to half of the rows are tolerated, so tests can count them.
    """
    return write_dataset(load_pipeline(name, **options), str(source), str(output),
                         num_shards=num_shards, splits=splits, workers=workers,
                         max_bad_fraction=max_bad_fraction, progress=False)


def load_all(data_dir, split: str, batch_size: int = 64, **kwargs):
    """Every `(inputs, label)` of a split, in file order, as numpy (inputs may be a dict)."""
    batches = list(load(str(data_dir), split, batch_size, training=False, **kwargs).as_numpy_iterator())
    assert batches, f"split {split!r} of {data_dir} is empty"
    inputs = [b[0] for b in batches]
    if isinstance(inputs[0], dict):
        inputs = {k: np.concatenate([x[k] for x in inputs]) for k in inputs[0]}
    else:
        inputs = np.concatenate(inputs)
    return inputs, np.concatenate([b[1] for b in batches])


def bad_row_reason(pipeline, row, info) -> str:
    """The reason `pipeline.encode` rejects `row` with (it must raise BadRow)."""
    with pytest.raises(BadRow) as raised:
        pipeline.encode(row, info)
    return str(raised.value)


def assert_trains(data_dir, layers) -> None:
    """One epoch of a small Keras classifier on the train split lowers the loss and fits it."""
    import tf_keras as keras

    data = load(str(data_dir), "train", 32, training=True, seed=1)
    keras.utils.set_random_seed(0)
    model = keras.Sequential(layers())
    model.compile(keras.optimizers.Adam(0.05),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    before = model.evaluate(data, verbose=0)[0]
    history = model.fit(data, epochs=1, verbose=0)
    after, accuracy = model.evaluate(data, verbose=0)
    assert math.isfinite(history.history["loss"][0])
    assert after < before and accuracy > 0.8, (before, after, accuracy)
