"""What the forked-CLI server (`tests/forked_cli.py`) imports once: TensorFlow, quietly and
without touching the devices (each child configures its own), then tftrain's command modules
and the modules their commands import when they run, so that a child imports next to nothing.
None of them runs a TensorFlow op at import (tests/test_forked_cli.py checks it)."""
import importlib

from absl import logging

# `app.run` installs absl's handler on the root logger before a command imports TensorFlow, and
# TensorFlow's logger adds a handler of its own only when the root has none: keep that order.
logging.use_absl_handler()

from tftrain import quiet_start  # noqa: E402

quiet_start.import_tensorflow(list_devices=False)

from tftrain.cli import COMMANDS  # noqa: E402

MODULES = [f"tftrain.cli.{name}" for name in COMMANDS] + [
    "tftrain.data.worker_preload",  # the converter's own preload: it shares this forkserver
    "pipelines", "tftrain.config", "tftrain.data.writer", "tftrain.data.inspection",
    "tftrain.engine.train", "tftrain.engine.generate", "tftrain.check", "tftrain.doctor",
    "tftrain.report", "tftrain.optimize.prune", "tftrain.optimize.quantize",
    "tftrain.optimize.evaluate", "tftrain.optimize.runs", "tftrain.optimize.report",
]
for _name in MODULES:
    importlib.import_module(_name)
