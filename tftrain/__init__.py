"""tftrain: train TensorFlow/Keras models on large datasets across devices and machines.

Importing this package selects the Keras 2 API (tf-keras) for TensorFlow, which
tensorflow-model-optimization requires. It must happen before TensorFlow is first imported,
so it is done here, at the top of the package, and nowhere else.
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
# TensorFlow's C++ start-up chatter (CUDA probes, oneDNN notes) hides the messages that matter.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

__version__ = "0.1.0"
