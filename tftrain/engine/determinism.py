"""`train.deterministic`: the same run gives the same weights, also when killed and resumed.

`enable` (before the model is built) turns on TensorFlow's op determinism and makes tf_keras
draw its random numbers (dropout, noise, random augmentation layers) from `tf.random.Generator`
objects instead of TF1 stateful random ops, whose state lives inside the kernels and restarts
with the process. `random_generators(model)` collects those generators: the run adds them to
the backup (`Backup.trackables`), so a resumed run continues each random stream where the
backed-up state left it, and the dropout masks of every later step are those of the run
that was not interrupted. The input order is already exact (`tftrain.data.order`).
"""
from __future__ import annotations

import tensorflow as tf
import tf_keras as keras


def enable() -> None:
    """Deterministic ops and generator-backed random layers, for the models built after it."""
    tf.config.experimental.enable_op_determinism()
    keras.backend.experimental.enable_tf_random_generator()


class RandomState(tf.Module):
    """The random generators of a model's layers, as one trackable for a checkpoint."""

    def __init__(self, generators: dict):
        super().__init__(name="random_state")
        self.generators = generators


def random_generators(model: keras.Model) -> RandomState:
    """The `tf.random.Generator` of every random layer of `model` (nested ones included), by
    position. Call it after the model is built, inside the strategy's scope."""
    generators = {}
    for index, layer in enumerate(model._flatten_layers(include_self=False)):  # noqa: SLF001
        random = getattr(layer, "_random_generator", None)
        if random is None:
            continue
        random._maybe_init()  # noqa: SLF001  (created on first use otherwise)
        generator = getattr(random, "_generator", None)
        if isinstance(generator, tf.random.Generator):
            generators[f"layer_{index}"] = generator  # not by name: names vary per process
    return RandomState(generators)
