"""The `Task` interface: everything the engine needs to know about what is learned.

A task is built from the run's `task` config and the dataset's manifest `info` (see
`registry.from_config`), and says:
- `outputs()`: what the model's last layer gives (a `models.OutputSpec` for the builder);
- `loss()` and `metrics()`: what `compile` gets (Keras objects, created on demand);
- `monitor(name)` and `mode(name)`: the metric the best checkpoint, early stopping and the
  plateau schedule watch (`train.monitor=auto` is the task's own) and whether lower is better;
- `confusion()`: a classifier's per-class counts (`class_measures`), None for other tasks;
- `evaluate(outputs, labels)`: the metrics of a model's predictions, a pure numpy function shared
  by the SavedModel and the .tflite evaluation (`tftrain evaluate`, prune, quantize);
- `measure`, `change(before, after)`, `change_name` and `gate_flag`: the number prune and
  quantize compare the optimized model on, how much worse `after` is (reported as
  `change_name`), and the flag that bounds it.
"""
from __future__ import annotations

import abc

import numpy as np

from tftrain.errors import ConfigError


class Task(abc.ABC):
    """Base class of the tasks in `registry.TASKS`."""

    name = "task"
    losses: tuple[str, ...] = ()  # the first is the default (task.loss=auto)
    default_monitor = "val_loss"
    # metric name (as Keras logs it, without `val_`) -> "min" | "max"
    directions: dict[str, str] = {"loss": "min"}
    reported: tuple[str, ...] = ("loss",)  # the keys `evaluate` returns
    measure = "loss"  # what prune and quantize gate on
    change_name = "loss_change"  # how `change` is named in their reports
    gate_flag = ""  # the CLI flag that bounds `change`
    label_smoothing = 0.0  # task.label_smoothing: classes to smooth over (classification, LM)

    def __init__(self, info: dict, loss: str = "auto"):
        self.info = info
        self.loss_name = self.losses[0] if loss == "auto" else loss
        if self.loss_name not in self.losses:
            raise ConfigError(f"task.loss={loss!r} is not a loss of task.type={self.name}: "
                              f"choose auto or one of {', '.join(self.losses)}")

    # -- the model and its training ------------------------------------------------------------

    @abc.abstractmethod
    def outputs(self):
        """The `models.OutputSpec` the builder gives its last layer."""

    @abc.abstractmethod
    def loss(self, model=None):
        """The Keras loss `compile` gets; `model`: a model not built by tftrain whose own output
        layer may say more (see `ClassificationTask.loss`)."""

    @abc.abstractmethod
    def metrics(self) -> list:
        """The Keras metrics `compile` gets (new objects on each call)."""

    @classmethod
    def check_monitor(cls, monitor: str) -> None:
        """Raises ConfigError unless `monitor` (train.monitor) is auto or a metric of the task."""
        if monitor != "auto" and monitor.removeprefix("val_") not in cls.directions:
            names = [f"val_{m}" for m in cls.directions] + list(cls.directions)
            raise ConfigError(f"train.monitor={monitor} is not a metric of the {cls.name} task: "
                              f"choose auto (= {cls.default_monitor}) or one of {', '.join(names)}")

    @classmethod
    def monitor(cls, monitor: str) -> str:
        """`train.monitor` resolved: auto is the task's `default_monitor`."""
        cls.check_monitor(monitor)
        return cls.default_monitor if monitor == "auto" else monitor

    @classmethod
    def mode(cls, monitor: str) -> str:
        """"min" or "max": which way `monitor` improves (Keras callbacks' `mode`)."""
        return cls.directions[cls.monitor(monitor).removeprefix("val_")]

    # -- evaluation ----------------------------------------------------------------------------

    @abc.abstractmethod
    def evaluate(self, outputs: np.ndarray, labels: np.ndarray) -> dict[str, float]:
        """The task's metrics of `outputs` (the model's, one row per example) against `labels`."""

    def confusion(self):
        """A new, empty `class_measures.ConfusionMatrix` for the per-class measures of a split,
        or None for a task without classes (or with too many to count pairwise)."""
        return None

    def class_names(self) -> list[str]:
        """The names of the classes, by id, as the dataset records them ([] when it does not)."""
        return [str(name) for name in self.info.get("class_names") or []]

    def evaluate_keys(self, result: dict) -> list[str]:
        """The keys of `result` that `evaluate` wrote (it also holds sizes, times, ...)."""
        return [key for key in self.reported if key in result]

    def change(self, before: float, after: float) -> float:
        """How much worse the measure `after` is than `before` (> 0: worse), in the units the
        gate flag bounds."""
        if self.directions[self.measure] == "max":
            return before - after
        return (after - before) / before if before else after - before

    def resolved(self) -> dict:
        """The `task` config section this task resolves to (params.yaml, summary.json)."""
        return {"type": self.name, "loss": self.loss_name,
                "label_smoothing": self.label_smoothing}


def as_rows(array, name: str) -> np.ndarray:
    """`array` as float64 [examples, values]; a ValueError naming `name` when it is empty."""
    array = np.asarray(array, np.float64)
    if not array.size:
        raise ValueError(f"no {name} to evaluate: the evaluation dataset is empty")
    return array.reshape(len(array), -1)
