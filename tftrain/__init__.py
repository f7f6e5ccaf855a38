"""tftrain: train TensorFlow/Keras models on large datasets across devices and machines.

Importing this package selects the Keras 2 API (tf-keras) for TensorFlow, which
tensorflow-model-optimization requires. It must happen before TensorFlow is first imported,
so it is done here, at the top of the package, and nowhere else.

A `TF_USE_LEGACY_KERAS` that the environment already sets to another value (`0`, `false`, ...)
selects Keras 3 and is left as it is: importing tftrain neither changes it nor exits, and
`legacy_keras_problem()` says what is wrong. The `tftrain` command refuses to run under it
(tftrain/cli/__init__.py).
"""
from __future__ import annotations

import os

# The values for which TensorFlow routes `tf.keras` to tf-keras (tensorflow/__init__.py reads
# the variable once, when TensorFlow is imported); any other value means Keras 3.
LEGACY_KERAS_VALUES = ("1", "true", "True")

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
# TensorFlow's C++ start-up chatter (CUDA probes, oneDNN notes) hides the messages that matter.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

__version__ = "0.1.0"


def legacy_keras_problem() -> str | None:
    """Why this process's environment cannot use tf-keras, or None when it can.

    Returns one line when `TF_USE_LEGACY_KERAS` is set to a value other than those TensorFlow
    takes for "use tf-keras", i.e. the user's environment asks TensorFlow for Keras 3.
    """
    value = os.environ.get("TF_USE_LEGACY_KERAS")
    if value in LEGACY_KERAS_VALUES:
        return None
    return (f"TF_USE_LEGACY_KERAS={value!r} in the environment makes tf.keras Keras 3, but "
            "tftrain needs tf-keras (Keras 2, for tensorflow-model-optimization): unset it or "
            "set TF_USE_LEGACY_KERAS=1")
