"""tftrain: train TensorFlow/Keras models on large datasets across devices and machines.

Importing this package selects the Keras 2 API (tf-keras) for TensorFlow, which
tensorflow-model-optimization requires: `TF_USE_LEGACY_KERAS=1`. TensorFlow reads the variable
when it is imported, so it is set here, at the top of the package, and nowhere else:

- unset: set to 1;
- set to another value (`0`, `false`, ... : Keras 3): forced to 1 for the Python API, and a
  warning (`LegacyKerasWarning`) says so once, when TensorFlow is imported; the `tftrain`
  command refuses to run instead, in one line (tftrain/cli/__init__.py), from the value the
  environment gave (`legacy_keras_problem()`);
- TensorFlow already imported with Keras 3 as `tf.keras` (too late to switch): the data API
  (`tftrain.data`, `pipelines`) works, as it needs no Keras; building or loading a model raises
  ImportError (`require_tf_keras`: import tftrain first, or set the variable before TensorFlow).
"""
from __future__ import annotations

import os
import sys
import warnings

VARIABLE = "TF_USE_LEGACY_KERAS"
# The values for which TensorFlow routes `tf.keras` to tf-keras (tensorflow/__init__.py reads
# the variable once, when TensorFlow is imported); any other value means Keras 3.
LEGACY_KERAS_VALUES = ("1", "true", "True")
# What the environment said before this package set it (None: unset).
ENVIRONMENT_VALUE = os.environ.get(VARIABLE)

__version__ = "0.1.0"


class LegacyKerasWarning(UserWarning):
    """tftrain set TF_USE_LEGACY_KERAS=1 over the environment's value."""


def legacy_keras_problem() -> str | None:
    """Why this process's environment asked for Keras 3, or None when it did not.

    One line when the environment set `TF_USE_LEGACY_KERAS` (before tftrain was imported) to a
    value other than those TensorFlow takes for "use tf-keras".
    """
    if ENVIRONMENT_VALUE is None or ENVIRONMENT_VALUE in LEGACY_KERAS_VALUES:
        return None
    return (f"{VARIABLE}={ENVIRONMENT_VALUE!r} in the environment makes tf.keras Keras 3, but "
            "tftrain needs tf-keras (Keras 2, for tensorflow-model-optimization): unset it or "
            f"set {VARIABLE}=1")


class _WarnWhenTensorFlowLoads:
    """A meta path finder that finds nothing: it warns once, when `tensorflow` is first imported
    (the moment the forced value takes effect), and removes itself."""

    def find_spec(self, name, path=None, target=None):  # noqa: D102  (importlib's protocol)
        if name == "tensorflow":
            sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
            warnings.warn(f"{VARIABLE}={ENVIRONMENT_VALUE!r} in the environment asks TensorFlow "
                          f"for Keras 3; tftrain set {VARIABLE}=1 for this process, since "
                          "tftrain and tensorflow-model-optimization need tf-keras (Keras 2). "
                          f"Set {VARIABLE}=1 yourself to silence this.", LegacyKerasWarning,
                          stacklevel=2)
        return None


def require_tf_keras() -> None:
    """Raises ImportError when TensorFlow was imported before tftrain with Keras 3 as its
    `tf.keras`; called where a model is built or loaded (the data API needs no Keras)."""
    tensorflow = sys.modules.get("tensorflow")
    if tensorflow is not None and getattr(tensorflow, "_tf_uses_legacy_keras", True) is False:
        raise ImportError(
            f"TensorFlow was imported before tftrain without {VARIABLE}=1, so its tf.keras "
            "is Keras 3, and it cannot switch afterwards; tftrain's models need tf-keras (Keras "
            "2, for tensorflow-model-optimization): import tftrain before tensorflow, or set "
            f"{VARIABLE}=1 in the environment")


def _select_tf_keras() -> None:
    """Sets TF_USE_LEGACY_KERAS=1 before TensorFlow starts (nothing when it already started:
    see `require_tf_keras`)."""
    if "tensorflow" in sys.modules:
        return
    if ENVIRONMENT_VALUE not in LEGACY_KERAS_VALUES:
        os.environ[VARIABLE] = "1"
        if ENVIRONMENT_VALUE is not None:
            sys.meta_path.insert(0, _WarnWhenTensorFlowLoads())


_select_tf_keras()
# TensorFlow's C++ start-up chatter (CUDA probes, oneDNN notes) hides the messages that matter.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
