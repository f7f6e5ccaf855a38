"""Bounded measurement: the first N batches of an evaluation split, and how many examples that was.

`tftrain evaluate`, `tftrain prune` and `tftrain quantize` take `--steps=N`: each model is
measured on at most the first N batches of the split (0 or absent: the whole split). The split
is read in its fixed order (`training=False`), so every model one command compares is measured
on the same batches. The number of examples a measurement used is counted from what it
consumed, never computed as N x the batch size: the split's last batch may be short.
"""
from __future__ import annotations

from tftrain.errors import ConfigError


def check_steps(steps: int | None) -> int:
    """`steps` as a bound: a number of batches, 0 (or None) for the whole split; raises
    ConfigError when it is negative."""
    steps = steps or 0
    if steps < 0:
        raise ConfigError(f"--steps={steps} must be >= 0: the number of batches to measure, "
                          "or 0 for the whole split")
    return int(steps)


def bounded(dataset, steps: int):
    """The first `steps` batches of `dataset` (a `tf.data.Dataset`), or all of it for 0."""
    return dataset.take(steps) if steps else dataset


def describe(num_examples: int, steps: int | None) -> str:
    """`examples: 64, steps: 2 (the split's first 2 batches)`, or `examples: 180 (the whole
    split)`: what a measurement used, as the commands print it."""
    if steps:
        return f"examples: {num_examples}, steps: {steps} (the split's first {steps} batches)"
    return f"examples: {num_examples} (the whole split)"
