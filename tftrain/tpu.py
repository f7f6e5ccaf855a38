"""TPU readiness: what must hold before a TPUStrategy run starts, checked before training.

Errors (the run would fail or recompile on every step): the global batch must split evenly over
the replicas, and the training batches must have fully static shapes (`drop_remainder=True`).
Advice (the run works, but slowly): `mixed_bfloat16` (or `auto`) precision, and
`train.steps_per_execution` > 1 so that one host call runs many TPU steps.
"""
from __future__ import annotations

import tensorflow as tf
from absl import logging

from tftrain import config as config_lib
from tftrain.errors import ConfigError


def check_ready(config: config_lib.Config, strategy: tf.distribute.Strategy) -> list[str]:
    """Checks a TPU run before it starts (no-op for other strategies); returns the advice given."""
    from tftrain.distribute import strategy_name

    if strategy_name(strategy) != "tpu":
        return []
    from tftrain.data import reader

    replicas = strategy.num_replicas_in_sync
    config_lib.check_divisible(config.data.batch_size, replicas)
    per_replica = config.data.batch_size // replicas
    # The same reader call as training's (training batches drop the remainder).
    spec = reader.load(config.data.dir, config.data.train_split, per_replica, training=True).element_spec
    return check_static(spec, config, replicas)


def check_static(element_spec, config: config_lib.Config, replicas: int) -> list[str]:
    """Raises ConfigError for dynamic shapes or an uneven batch; returns advice (also logged).

    `element_spec` is that of one replica's training dataset.
    """
    config_lib.check_divisible(config.data.batch_size, replicas)
    for path, spec in _flatten(element_spec):
        if isinstance(spec, tf.RaggedTensorSpec) or isinstance(spec, tf.SparseTensorSpec):
            raise ConfigError(f"TPU needs dense, static shapes; the training input {path} is "
                              f"{type(spec).__name__}: pad it to a fixed length in the pipeline")
        if not spec.shape.is_fully_defined():
            batch_dim_unknown = spec.shape.rank and spec.shape[0] is None
            fix = ("batch with drop_remainder=True" if batch_dim_unknown else
                   "resize or pad it to a fixed shape in the pipeline's decode")
            raise ConfigError(f"TPU needs static shapes; the training input {path} has shape "
                              f"{spec.shape}: {fix}")
    advice = []
    if config.runtime.mixed_precision == "float32":
        advice.append("runtime.mixed_precision=float32 on TPU: mixed_bfloat16 (or auto) is the "
                      "usual choice, about twice as fast with the same accuracy for most models")
    if config.train.steps_per_execution == 1:
        advice.append("train.steps_per_execution=1 on TPU: every step returns to the host; set it "
                      "to e.g. 50-200 (or the steps per epoch) to keep the TPU busy")
    for line in advice:
        logging.warning("%s", line)
    return advice


def _flatten(spec, path: str = "element"):
    """(path, TypeSpec) pairs of a nested (features, label) element spec."""
    if isinstance(spec, dict):
        return [pair for key in sorted(spec) for pair in _flatten(spec[key], f"{path}[{key!r}]")]
    if isinstance(spec, (tuple, list)):
        return [pair for i, item in enumerate(spec) for pair in _flatten(item, f"{path}[{i}]")]
    return [(path, spec)]
