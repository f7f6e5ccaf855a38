"""tensorflow-model-optimization (TFMOT), imported without importing Keras 3.

TFMOT 0.8.1's prune registry tries `from keras.engine import base_layer` (the layout of the
Keras 2 packages it was written for) and, when that fails, registers no `TensorFlowOpLayer`.
With TensorFlow 2.21 the `keras` package is Keras 3 (a dependency of TensorFlow): the attempt
loads all of it, and scikit-learn, SciPy and pyplot through it, ~0.7 s of CPU in every process
that prunes or quantizes, only to fail. Here it fails at once, with the same result.
"""
from __future__ import annotations

import contextlib
import sys


@contextlib.contextmanager
def _keras_3_not_imported():
    """An `import keras` raises ImportError at once (unless Keras 3 is already imported)."""
    if "keras" in sys.modules:
        yield
        return
    sys.modules["keras"] = None  # the import system's "not importable" marker
    try:
        yield
    finally:
        if sys.modules.get("keras", 0) is None:
            del sys.modules["keras"]


with _keras_3_not_imported():
    import tensorflow_model_optimization as tfmot
    from tensorflow_model_optimization.python.core.quantization.keras.default_8bit import (
        default_8bit_quantize_registry)
    from tensorflow_model_optimization.python.core.sparsity.keras import (
        prune_registry, pruning_wrapper)

__all__ = ["tfmot", "default_8bit_quantize_registry", "prune_registry", "pruning_wrapper"]
