"""Mixed-precision policies: `runtime.mixed_precision` -> the global tf_keras policy."""
from __future__ import annotations

import tensorflow as tf
import tf_keras as keras


def resolve_policy(name: str, strategy: tf.distribute.Strategy) -> str:
    """`auto` becomes bfloat16 on TPU, float16 on GPU, float32 on CPU; others stay as they are."""
    if name != "auto":
        return name
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return "mixed_bfloat16"
    if tf.config.list_logical_devices("GPU"):
        return "mixed_float16"
    return "float32"


def set_policy(name: str, strategy: tf.distribute.Strategy) -> str:
    """Sets the global Keras policy and returns its name."""
    policy = resolve_policy(name, strategy)
    keras.mixed_precision.set_global_policy(policy)
    return policy
