"""What the converter's forkserver imports once: TensorFlow (quietly) and the worker's code.

The forkserver outlives a command that fails early, so anything it printed while importing
TensorFlow would land on the terminal after the command's own error message.
"""
from tftrain import quiet_start

quiet_start.import_tensorflow(list_devices=False)

with quiet_start.long_lived_imports():
    from tftrain.data import shard_worker  # noqa: F401  (after TensorFlow, as the worker needs)
