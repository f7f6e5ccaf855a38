"""What the server of forked `tftrain` commands imports once (`tftrain.forked`): TensorFlow,
quietly and without touching the devices (each child configures its own), then the modules the
commands import when they run, so that a child imports next to nothing. Not the command modules
themselves: each defines its flags, and a child must know only its own command's flags, as a
fresh process does. None of them runs a TensorFlow op at import (tests/test_forked_cli.py checks
it)."""
import importlib

from absl import logging

# `app.run` installs absl's handler on the root logger before a command imports TensorFlow, and
# TensorFlow's logger adds a handler of its own only when the root has none: keep that order.
logging.use_absl_handler()

from tftrain import quiet_start  # noqa: E402

quiet_start.import_tensorflow(list_devices=False)

MODULES = [
    "tftrain.cli",
    "tftrain.data.worker_preload",  # the converter's own preload: it may share this forkserver
    "pipelines", "tftrain.config", "tftrain.data.writer", "tftrain.data.inspection",
    "tftrain.engine.train", "tftrain.engine.generate", "tftrain.check", "tftrain.doctor",
    "tftrain.report", "tftrain.optimize.prune", "tftrain.optimize.quantize",
    "tftrain.optimize.evaluate", "tftrain.optimize.runs", "tftrain.optimize.report",
    # what curves.png is drawn with at the end of every train (0.4 s of CPU to import)
    "matplotlib.backends.backend_agg", "matplotlib.figure", "matplotlib.ticker",
]
with quiet_start.long_lived_imports():
    for _name in MODULES:
        importlib.import_module(_name)
