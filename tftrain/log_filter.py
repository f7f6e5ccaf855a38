"""Quiet by default, loud on request: what the CLI's log shows at the default verbosity.

At the default verbosity a command shows tftrain's own lines (and those of a user's pipeline or
model module) at INFO and above, and of TensorFlow, tf-keras, TFMOT and the other libraries
only their warnings and errors, each once, less the known chatter that says nothing to a user
(saver internals, "No training configuration found", "Using new converter", ...). Native
(C++) lines of the TFLite converter and interpreter are hidden the same way by
`quiet_start.hiding_native_chatter`. `-v 1` (absl's verbosity flag) shows everything again.
"""
from __future__ import annotations

import logging
import re
import warnings

from absl import logging as absl_logging

# Libraries whose INFO lines are internals; matched on the record's file path.
LIBRARIES = ("tensorflow", "tf_keras", "keras", "tensorflow_model_optimization", "tensorboard",
             "tensorflow_datasets", "ai_edge_litert", "apache_beam", "absl", "etils")
_LIBRARY_PATH = re.compile(r"[/\\](" + "|".join(LIBRARIES) + r")[/\\]")
# Library warnings that are not the user's business.
CHATTER = tuple(re.compile(p) for p in (
    r"No training configuration found in save file",
    r"Found untraced functions such as",
    r"Compiled the loaded model, but the compiled metrics have yet to be built",
    r"Using new converter",
    r"Sharding callback duration",
    r"Writing fingerprint to",
    r"contains input name\(s\) .* with unsupported characters",
    r"Assets written to",
    r"Statistics for quantized inputs were expected",
    # loading a recomputed (remat) model's export: one per recomputed block's gradient function;
    # its gradients are the ones tf.recompute_grad saved (tests/test_remat.py fine-tunes one)
    r"with ops with unsaved custom gradients",
    # tftrain's own callbacks (timer, heartbeat, progress) on batches of a millisecond
    r"Callback method `\w+` is slow compared to the batch time",
))


class QuietFilter(logging.Filter):
    """Drops library INFO lines and known chatter; lets each other library warning through once."""

    def __init__(self):
        super().__init__()
        self._seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if not _LIBRARY_PATH.search(record.pathname or ""):
            return True  # tftrain's, a user's module's, or a script's own line
        if record.levelno < logging.WARNING:
            return False
        message = record.getMessage()
        if any(pattern.search(message) for pattern in CHATTER) or message in self._seen:
            return False
        self._seen.add(message)
        return True


def install() -> None:
    """Makes this process's log quiet (see the module docstring)."""
    absl_logging.set_verbosity(absl_logging.INFO)
    handler = absl_logging.get_absl_handler()
    if not any(isinstance(f, QuietFilter) for f in handler.filters):
        handler.addFilter(QuietFilter())
    for pattern in CHATTER:  # the same words, raised as Python warnings (the TFLite converter)
        warnings.filterwarnings("ignore", message=f".*{pattern.pattern}")
    from tftrain import quiet_start

    quiet_start.HIDE_NATIVE_CHATTER = True
