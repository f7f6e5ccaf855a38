"""Tasks: what a model learns from a dataset's labels (head, loss, metrics, monitor, measure).

The engine (`engine.train` with its backends, `optimize` with `optimize.evaluate`) asks the task and
never names a loss, a metric or a number of classes itself. `from_config(config, manifest)`
builds the task a run's `task` section (or, for `task.type=auto`, the dataset's label) calls
for; see `registry`.
Nothing here imports TensorFlow at module level.
"""
from tftrain.tasks.base import Task  # noqa: F401
from tftrain.tasks.registry import TASKS, from_config, infer_type, resolve  # noqa: F401
