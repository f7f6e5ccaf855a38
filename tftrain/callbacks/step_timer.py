"""Steady-state speed: seconds per step and examples per second, without the first epoch.

The first epoch of a run pays for tracing and warming the input pipeline; it is left out
of the averages when there is more than one epoch. Validation time is not counted.
"""
from __future__ import annotations

import time

import tf_keras as keras


class StepTimer(keras.callbacks.Callback):
    """Times the training steps of each epoch (from epoch begin to its last step)."""

    def __init__(self, examples_per_step: int):
        super().__init__()
        self._supports_tf_logs = True
        self.examples_per_step = examples_per_step
        self.epochs: list[tuple[int, float]] = []  # (steps, seconds) of each epoch
        self._started = None
        self._steps = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._started, self._steps, self._first_step = time.perf_counter(), 0, None

    def on_train_batch_begin(self, batch, logs=None):
        if self._first_step is None:
            self._first_step = batch

    def on_train_batch_end(self, batch, logs=None):
        self._steps = batch - (self._first_step or 0) + 1
        self._ended = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        if self._steps:
            self.epochs.append((self._steps, self._ended - self._started))

    def seconds_per_step(self) -> float:
        """The mean step time over the epochs after the first (all epochs if only one ran)."""
        timed = self.epochs[1:] or self.epochs
        steps = sum(s for s, _ in timed)
        return sum(t for _, t in timed) / steps if steps else float("nan")

    def examples_per_second(self) -> float:
        """Training throughput in examples (over all replicas) per second."""
        return self.examples_per_step / self.seconds_per_step()
